#include "synthetic_dump.hpp"

#include <filesystem>
#include <system_error>

#include "sparse_mla/error.hpp"
#include "validation/safetensors.hpp"

namespace sparse_mla::cli {

std::string write_topk_dump(const std::string& dir, const std::string& name, const TopkDumpCase& c) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) fail("validate --dump", "cannot create directory '", dir, "': ", error.message());

  SafetensorsFile file;
  file.add(TensorRecord::from_values("req_id", {c.tokens}, *c.req_id));
  file.add(TensorRecord::from_values("block_table", {c.requests, c.blocks_per_request}, *c.block_table));
  file.add(TensorRecord::from_values("logical", {c.tokens, c.topk}, *c.logical));
  file.add(TensorRecord::from_values("physical", {c.tokens, c.topk}, *c.physical));
  file.add(TensorRecord::from_values("valid_counts", {c.tokens}, *c.valid_counts));
  // The keys of golden/README.md for topk_convert; a synthetic case has no
  // peer kernel, so the peer_* keys and the peer's launch details (block_n,
  // count_path) are left out and produced_by says where the file came from.
  file.set_meta("kind", "topk_convert");
  file.set_meta("num_tokens", std::to_string(c.tokens));
  file.set_meta("num_topk", std::to_string(c.topk));
  file.set_meta("num_requests", std::to_string(c.requests));
  file.set_meta("max_num_blocks_per_req", std::to_string(c.blocks_per_request));
  file.set_meta("num_physical_blocks", std::to_string(c.num_physical_blocks));
  file.set_meta("block_size", std::to_string(c.block_size));
  file.set_meta("block_stride_rows", std::to_string(c.block_size));
  file.set_meta("return_valid_counts", "true");
  file.set_meta("has_prefill_workspace", "false");
  file.set_meta("produced_by", "sparse-mla validate --synthetic --dump (outputs: the scalar reference, "
                               "tools/validation/reference/topk_reference.hpp)");
  for (const auto& [key, value] : c.extra_metadata) file.set_meta(key, value);

  const std::string path = (std::filesystem::path(dir) / (name + ".safetensors")).string();
  file.write(path);
  return path;
}

}  // namespace sparse_mla::cli
