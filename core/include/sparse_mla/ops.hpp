// The kernels as validated public operations. Each call checks shapes,
// dtypes, devices and capacities, throws sparse_mla::Error naming the
// argument and the values, and queues nothing when it rejects.
#pragma once

#include <cstdint>

#include "sparse_mla/device.hpp"
#include "sparse_mla/fp8.hpp"
#include "sparse_mla/tensor.hpp"

namespace sparse_mla {

// ---- Top-k conversion (SPEC section 2) ----

struct TopkConvertParams {
  std::int32_t block_size = 64;
  // Rows between consecutive physical blocks; 0 means block_size.
  std::int64_t block_stride_rows = 0;
  bool return_valid_counts = true;
  // Prefill-workspace variant: both defined, or neither.
  Tensor workspace_request;  // int32 [>= T]: -1 for a decode token, else its prefill request p
  Tensor workspace_starts;   // int32 [P]
};

struct TopkConversion {
  Tensor physical;      // int32 [T, K]
  Tensor valid_counts;  // int32 [T]; undefined unless requested
  // Own the outputs when the library allocated them (no caller buffers).
  // Keep them alive until the stream has run the conversion.
  Buffer physical_storage;
  Buffer valid_counts_storage;
};

// req_id: int32 [>= T] (the first T entries are used), block_table: int32
// [R, B], logical: int32 [T, K]. `out` (int32 [>= T, K]) and
// `valid_counts_out` (int32 [>= T]) are optional caller-owned outputs; when
// given, nothing is allocated.
TopkConversion convert_logical_to_physical_topk(Stream& stream, const Tensor& req_id, const Tensor& block_table,
                                                const Tensor& logical, const TopkConvertParams& params,
                                                const Tensor& out = Tensor(),
                                                const Tensor& valid_counts_out = Tensor());
// Every check of convert_logical_to_physical_topk, queueing nothing: for
// callers that queue other work (a stream wait) before the conversion and
// must reject before that (the index groups).
void check_logical_to_physical_topk(const Device& device, const Tensor& req_id, const Tensor& block_table,
                                    const Tensor& logical, const TopkConvertParams& params,
                                    const Tensor& out = Tensor(), const Tensor& valid_counts_out = Tensor());

// Host-side deep check for the validating entry points (CLI, debug): reads
// req_id and block_table (host-visible copies) and checks that every request
// id is a row of the table and every block id is in [0, num_physical_blocks).
// Throws naming the first bad position.
void check_topk_table_values(const std::int32_t* req_id, std::int64_t num_tokens, const std::int32_t* block_table,
                             std::int64_t num_requests, std::int64_t blocks_per_request,
                             std::int64_t num_physical_blocks);

// ---- FP8 gather-upconvert (SPEC section 3) ----

struct Fp8GatherParams {
  Fp8Format format = Fp8Format::e4m3fn;
  Tensor seq_starts;  // int32 [>= batch], optional: first source token of each request
  // Host-backed variant: all three, or none. block_table then holds staged
  // blocks: staged row n = block_table[r, s / block_size] * block_size +
  // s % block_size reads src_cache's flat row device_row_ids[n] when that is
  // >= 0, else host_cache row host_row_ids[n] (zero-copy from pinned memory).
  Tensor host_cache;      // uint8 [rows, 656], pinned_host memory
  Tensor host_row_ids;    // int32, N entries ([N], or [1, N] as a staging plan holds them)
  Tensor device_row_ids;  // int32, the same N entries
  // Rows per page of block_table; 0 means src_cache.dim(1). Only the
  // host-backed variant's staged pages may differ from the cache's blocks.
  std::int64_t block_size = 0;
};

// src_cache: uint8 [num_blocks, block_size, 656] (rows packed, blocks may be
// further apart); dst: bf16 [T, 576]; block_table: int32 [>= batch, M];
// workspace_starts: int32 [>= batch], non-decreasing. Request r fills dst rows
// [ws[r], ws[r+1]) (the last one up to T, ends clamped to T). Rows whose
// source is not in the table or the cache are left unwritten; the values are
// not read on the host (check_fp8_gather_values does that for validating
// callers).
void gather_upconvert_fp8(Stream& stream, const Tensor& src_cache, const Tensor& dst, const Tensor& block_table,
                          const Tensor& workspace_starts, std::int64_t batch_size,
                          const Fp8GatherParams& params = Fp8GatherParams());

// Host-side deep check of a plain (not host-backed) gather for validating
// entry points: workspace_starts non-decreasing in [0, total_rows],
// seq_starts >= 0, and every block a request reads inside the table and the
// cache. Throws naming the first bad position.
void check_fp8_gather_values(const std::int32_t* block_table, std::int64_t blocks_per_request,
                             const std::int32_t* workspace_starts, const std::int32_t* seq_starts,
                             std::int64_t batch, std::int64_t total_rows, std::int64_t block_size,
                             std::int64_t num_blocks);

}  // namespace sparse_mla
