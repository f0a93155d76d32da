#include "sparse_mla/topk_convert.hpp"

#include "kernels.hpp"
#include "sparse_mla/error.hpp"

namespace sparse_mla {

namespace {
constexpr const char* where = "convert_logical_to_physical_topk";

void check_dcp(const TopkConvertParams& params, bool prefill) {
  const DcpConfig& d = params.dcp;
  check_dcp_split(where, d);
  if (d.interleave < 1 || params.block_size % d.interleave != 0) {
    fail(where, "dcp.interleave must be positive and divide block_size ", params.block_size, ", got ", d.interleave);
  }
  if (d.enabled() && prefill) fail(where, "the prefill-workspace variant has no DCP form (dcp.size is ", d.size, ")");
}
}  // namespace

void check_dcp_split(const std::string& where_, const DcpConfig& dcp) {
  if (dcp.size < 1) fail(where_, "dcp.size must be at least 1, got ", dcp.size);
  if (dcp.rank < 0 || dcp.rank >= dcp.size) {
    fail(where_, "dcp.rank must be in [0, dcp.size) = [0, ", dcp.size, "), got ", dcp.rank);
  }
}

void check_logical_to_physical_topk(const Device& device, const Tensor& req_id, const Tensor& block_table,
                                    const Tensor& logical, const TopkConvertParams& params, const Tensor& out,
                                    const Tensor& valid_counts_out) {
  check(where, "logical top-k", logical).dtype(DType::i32).rank(2).rows_contiguous().on(device);
  const std::int64_t T = logical.dim(0);
  const std::int64_t K = logical.dim(1);
  if (K < 1 || K > int32_max) fail(where, "top-k width K must be in [1, 2^31), got ", K);
  if (T > int32_max) fail(where, "logical top-k has ", T, " rows, more than 2^31 - 1");
  check(where, "req_id", req_id).dtype(DType::i32).rank(1).contiguous().dim_at_least(0, T, "one per token").on(device);
  check(where, "block_table", block_table).dtype(DType::i32).rank(2).rows_contiguous().on(device);
  if (block_table.dim(1) > int32_max) fail(where, "block_table has ", block_table.dim(1), " columns, more than 2^31 - 1");
  if (params.block_size < 1) fail(where, "block_size must be positive, got ", params.block_size);
  const std::int64_t stride = params.block_stride_rows == 0 ? params.block_size : params.block_stride_rows;
  if (stride < params.block_size || stride > int32_max) {
    fail(where, "block_stride_rows must be in [block_size, 2^31) = [", params.block_size, ", 2^31), got ", stride);
  }
  if (T > 0 && block_table.dim(0) < 1 && block_table.dim(1) > 0) fail(where, "block_table has no rows");
  const bool prefill = params.workspace_request.defined() || params.workspace_starts.defined();
  if (prefill) {
    check(where, "workspace_request", params.workspace_request).dtype(DType::i32).rank(1).contiguous()
        .dim_at_least(0, T, "one per token").on(device);
    check(where, "workspace_starts", params.workspace_starts).dtype(DType::i32).rank(1).contiguous().on(device);
  }
  check_dcp(params, prefill);
  if (out.defined()) {
    check(where, "out", out).dtype(DType::i32).rank(2).rows_contiguous().dim_at_least(0, T, "rows of logical top-k")
        .dim(1, K, "K of logical top-k").on(device);
  }
  if (valid_counts_out.defined()) {
    if (!params.writes_valid_counts()) fail(where, "valid_counts_out given but return_valid_counts is false");
    check(where, "valid_counts_out", valid_counts_out).dtype(DType::i32).rank(1).contiguous()
        .dim_at_least(0, T, "one per token").on(device);
  }
}

TopkConversion convert_logical_to_physical_topk(Stream& stream, const Tensor& req_id, const Tensor& block_table,
                                                const Tensor& logical, const TopkConvertParams& params,
                                                const Tensor& out, const Tensor& valid_counts_out) {
  Device& device = stream.device();
  check_logical_to_physical_topk(device, req_id, block_table, logical, params, out, valid_counts_out);
  const std::int64_t T = logical.dim(0);
  const std::int64_t K = logical.dim(1);
  const std::int64_t stride = params.block_stride_rows == 0 ? params.block_size : params.block_stride_rows;
  const bool prefill = params.workspace_request.defined() || params.workspace_starts.defined();

  TopkConversion result;
  if (out.defined()) {
    result.physical = out.rows(0, T);
  } else {
    result.physical_storage = OwnedTensor(device, DType::i32, {T, K});
    result.physical = result.physical_storage;
  }
  const bool counts = params.writes_valid_counts();
  if (counts) {
    if (valid_counts_out.defined()) {
      result.valid_counts = valid_counts_out.rows(0, T);
    } else {
      result.valid_counts_storage = OwnedTensor(device, DType::i32, {T});
      result.valid_counts = result.valid_counts_storage;
    }
  }

  TopkConvertArgs args{};
  args.req_id = req_id.data_as<std::int32_t>();
  args.block_table = block_table.data_as<std::int32_t>();
  args.block_table_stride = block_table.stride(0);
  args.blocks_per_request = static_cast<std::int32_t>(block_table.dim(1));
  args.logical = logical.data_as<std::int32_t>();
  args.logical_stride = logical.stride(0);
  args.physical = result.physical.data_as<std::int32_t>();
  args.physical_stride = result.physical.stride(0);
  args.valid_counts = counts ? result.valid_counts.data_as<std::int32_t>() : nullptr;
  args.num_tokens = T;
  args.num_topk = static_cast<std::int32_t>(K);
  args.block_size = params.block_size;
  args.block_stride_rows = static_cast<std::int32_t>(stride);
  args.dcp_size = params.dcp.size;
  args.dcp_rank = params.dcp.rank;
  args.dcp_interleave = params.dcp.interleave;
  args.dcp_compact = params.dcp.compact;
  if (prefill) {
    args.workspace_request = params.workspace_request.data_as<std::int32_t>();
    args.workspace_starts = params.workspace_starts.data_as<std::int32_t>();
  }
  detail::kernels_of(device).convert_topk(stream, args);
  return result;
}

void check_topk_table_values(const std::int32_t* req_id, std::int64_t num_tokens, const std::int32_t* block_table,
                             std::int64_t num_requests, std::int64_t blocks_per_request,
                             std::int64_t num_physical_blocks) {
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    if (req_id[t] < 0 || req_id[t] >= num_requests) {
      fail(where, "req_id[", t, "] = ", req_id[t], " is not a row of the block table (", num_requests, " rows)");
    }
  }
  for (std::int64_t r = 0; r < num_requests; ++r) {
    for (std::int64_t b = 0; b < blocks_per_request; ++b) {
      const std::int32_t id = block_table[r * blocks_per_request + b];
      if (id < 0 || id >= num_physical_blocks) {
        fail(where, "block_table[", r, ", ", b, "] = ", id, " is outside the cache's ", num_physical_blocks, " blocks");
      }
    }
  }
}

}  // namespace sparse_mla
