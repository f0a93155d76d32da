// validate --synthetic --dump DIR: writes the synthetic schedule's
// conversions as golden files (kind topk_convert, golden/README.md: the same
// tensor names, dtypes and metadata keys), so that `validate --golden` reads
// them back and a user can check their own engine against them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace sparse_mla::cli {

struct TopkDumpCase {
  std::int64_t tokens = 0;  // T
  std::int64_t topk = 0;    // K
  std::int64_t requests = 0;
  std::int64_t blocks_per_request = 0;
  std::int64_t num_physical_blocks = 0;
  std::int64_t block_size = 0;
  const std::vector<std::int32_t>* req_id = nullptr;       // [T]
  const std::vector<std::int32_t>* block_table = nullptr;  // [R, B]
  const std::vector<std::int32_t>* logical = nullptr;      // [T, K]
  const std::vector<std::int32_t>* physical = nullptr;     // [T, K]: the scalar reference's
  const std::vector<std::int32_t>* valid_counts = nullptr; // [T]
  std::map<std::string, std::string> extra_metadata;       // provenance: seed, step, ...
};

// Creates `dir` if needed and writes `dir`/`name`.safetensors; returns its
// path. Throws sparse_mla::Error when the directory or the file cannot be
// written.
std::string write_topk_dump(const std::string& dir, const std::string& name, const TopkDumpCase& c);

}  // namespace sparse_mla::cli
