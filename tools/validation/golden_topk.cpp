// validate --golden, kinds topk_convert and topk_convert_dcp
// (golden/README.md): runs the top-k conversion on the file's inputs (for
// DCP files filtered to the file's rank, compacted as it says), with and
// without valid counts, and compares physical indices and counts with the
// file's.
#include <limits>
#include <string>

#include "validation/golden_cases.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/topk_convert.hpp"
#include "sparse_mla/fp8_upconvert.hpp"

namespace sparse_mla::validation {

namespace {

struct TopkCase {
  std::int64_t tokens, topk, requests, blocks, block_size, block_stride_rows;
  bool counts;
  DcpConfig dcp;
};

std::int32_t meta_i32(const SafetensorsFile& f, const char* key) {
  const std::int64_t v = f.meta_int(key);
  if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max()) {
    fail(f.origin(), "metadata ", key, " = ", v, " does not fit in int32");
  }
  return static_cast<std::int32_t>(v);
}

// The DCP split of a topk_convert_dcp file, checked as the operation checks it.
DcpConfig read_dcp(const SafetensorsFile& f, std::int64_t block_size) {
  DcpConfig d;
  d.size = meta_i32(f, "dcp_size");
  d.rank = meta_i32(f, "dcp_rank");
  d.interleave = meta_i32(f, "dcp_interleave");
  d.compact = f.meta_bool("compact_to_front");
  if (d.size < 1 || d.rank < 0 || d.rank >= d.size) {
    fail(f.origin(), "metadata dcp_rank ", d.rank, " is not a rank of dcp_size ", d.size);
  }
  if (d.interleave < 1 || block_size % d.interleave != 0) {
    fail(f.origin(), "metadata dcp_interleave ", d.interleave, " does not divide block_size ", block_size);
  }
  if (!f.meta_bool("return_valid_counts")) fail(f.origin(), "topk_convert_dcp files always hold valid_counts");
  return d;
}

TopkCase read_case(const SafetensorsFile& f, bool dcp) {
  TopkCase c{f.meta_int("num_tokens"), f.meta_int("num_topk"), f.meta_int("num_requests"),
             f.meta_int("max_num_blocks_per_req"), f.meta_int("block_size"), f.meta_int("block_stride_rows"),
             f.meta_bool("return_valid_counts"), DcpConfig{}};
  if (c.block_size < 1) fail(f.origin(), "metadata block_size must be positive, got ", c.block_size);
  if (c.block_size > std::numeric_limits<std::int32_t>::max()) fail(f.origin(), "metadata block_size ", c.block_size, " does not fit in int32");
  if (dcp) c.dcp = read_dcp(f, c.block_size);
  if (c.block_stride_rows < c.block_size) {
    fail(f.origin(), "metadata block_stride_rows ", c.block_stride_rows, " is less than block_size ", c.block_size);
  }
  if (f.has_meta("has_prefill_workspace") && f.meta_bool("has_prefill_workspace")) {
    fail(f.origin(), "has_prefill_workspace is true, but topk_convert files define no workspace tensors");
  }
  f.require("req_id", DType::i32, {c.tokens});
  f.require("block_table", DType::i32, {c.requests, c.blocks});
  f.require("logical", DType::i32, {c.tokens, c.topk});
  f.require("physical", DType::i32, {c.tokens, c.topk});
  if (c.counts) f.require("valid_counts", DType::i32, {c.tokens});
  // Block ids are checked where the file says how many blocks there are.
  const std::int64_t physical_blocks = f.has_meta("num_physical_blocks")
                                           ? f.meta_int("num_physical_blocks")
                                           : std::int64_t{std::numeric_limits<std::int32_t>::max()} + 1;
  try {
    check_topk_table_values(f.tensor("req_id").data<std::int32_t>(), c.tokens,
                            f.tensor("block_table").data<std::int32_t>(), c.requests, c.blocks, physical_blocks);
  } catch (const Error& e) {
    fail(f.origin(), e.what());
  }
  return c;
}

std::string show_i32(std::int32_t v) { return std::to_string(v); }

// One conversion into poisoned caller-owned outputs; compares what the file
// holds.
void run_once(const SafetensorsFile& f, const TopkCase& c, bool with_counts, DeviceScratch& scratch, MismatchLog& log) {
  TopkConvertParams params;
  params.block_size = static_cast<std::int32_t>(c.block_size);
  params.block_stride_rows = c.block_stride_rows;
  params.return_valid_counts = with_counts;
  params.dcp = c.dcp;
  const bool counts = params.writes_valid_counts();  // DCP conversions always count
  const Tensor physical = scratch.filled(DType::i32, {c.tokens, c.topk}, 0xA5);
  const Tensor valid_counts = counts ? scratch.filled(DType::i32, {c.tokens}, 0xA5) : Tensor();
  convert_logical_to_physical_topk(scratch.stream(), scratch.upload(f.tensor("req_id")),
                                   scratch.upload(f.tensor("block_table")), scratch.upload(f.tensor("logical")),
                                   params, physical, valid_counts);
  const std::string name = counts || !c.counts ? "physical" : "physical_without_counts";
  const auto got = values_of<std::int32_t>(scratch.download(physical));
  log.compare(name, {c.tokens, c.topk}, got.data(), f.tensor("physical").data<std::int32_t>(),
              c.tokens * c.topk, show_i32);
  if (counts) {
    const auto got_counts = values_of<std::int32_t>(scratch.download(valid_counts));
    log.compare("valid_counts", {c.tokens}, got_counts.data(), f.tensor("valid_counts").data<std::int32_t>(),
                c.tokens, show_i32);
  }
}

PreparedCase prepare_topk(std::shared_ptr<const SafetensorsFile> file, const char* kind, bool dcp) {
  const TopkCase c = read_case(*file, dcp);
  return [file, c, kind](const ValidateContext& context) {
    CaseResult result{file->origin(), kind, 0, 0, {}, {}};
    DeviceScratch scratch(context.device);
    MismatchLog log(result);
    run_once(*file, c, c.counts, scratch, log);
    // The reference gives the same physical indices without counting.
    if (c.counts && !c.dcp.enabled()) run_once(*file, c, false, scratch, log);
    result.details["tokens"] = c.tokens;
    result.details["topk"] = c.topk;
    result.details["block_size"] = c.block_size;
    if (c.dcp.enabled()) {
      result.details["dcp_size"] = c.dcp.size;
      result.details["dcp_rank"] = c.dcp.rank;
      result.details["dcp_interleave"] = c.dcp.interleave;
      result.details["compact_to_front"] = c.dcp.compact;
    }
    return result;
  };
}

}  // namespace

PreparedCase prepare_topk_convert(std::shared_ptr<const SafetensorsFile> file) {
  return prepare_topk(std::move(file), "topk_convert", false);
}

PreparedCase prepare_topk_convert_dcp(std::shared_ptr<const SafetensorsFile> file) {
  return prepare_topk(std::move(file), "topk_convert_dcp", true);
}

}  // namespace sparse_mla::validation
