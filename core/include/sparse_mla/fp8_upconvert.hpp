// The FP8 gather-upconvert (SPEC section 3) as a validated public
// operation: paged fp8_ds_mla rows to bf16 rows for prefill attention. The
// call checks shapes, dtypes, devices and capacities, throws
// sparse_mla::Error naming the argument and the values, and queues nothing
// when it rejects. Implemented by core/src/fp8_upconvert.cpp over
// core/kernels/fp8_upconvert.hpp.
#pragma once

#include <cstdint>

#include "sparse_mla/device.hpp"
#include "sparse_mla/fp8.hpp"
#include "sparse_mla/tensor.hpp"

namespace sparse_mla {

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
