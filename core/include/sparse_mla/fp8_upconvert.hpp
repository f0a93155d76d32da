// The FP8 gather-upconvert (SPEC section 3) as validated public operations:
// paged FP8 cache tokens (fp8_ds_mla rows or DeepSeek V4's model1_fp8
// pages, sparse_mla/fp8.hpp) to bf16 rows for prefill attention, gathered
// by workspace starts (gather_upconvert_fp8) or by position ranges
// (gather_upconvert_fp8_range). Each call checks shapes, dtypes, devices
// and capacities, throws sparse_mla::Error naming the argument and the
// values, and queues nothing when it rejects. Implemented by
// core/src/fp8_upconvert.cpp over core/kernels/fp8_upconvert.hpp.
#pragma once

#include <cstdint>

#include "sparse_mla/device.hpp"
#include "sparse_mla/fp8.hpp"
#include "sparse_mla/tensor.hpp"

namespace sparse_mla {

struct Fp8GatherParams {
  Fp8Format format = Fp8Format::e4m3fn;  // of the fp8 values
  Tensor seq_starts;  // int32 [>= batch], optional: first source token of each request
  // Host-backed variant: all three, or none. block_table then holds staged
  // blocks: staged row n = block_table[r, s / block_size] * block_size +
  // s % block_size reads src_cache's flat row device_row_ids[n] when that is
  // >= 0, else host_cache row host_row_ids[n] (zero-copy from pinned memory).
  Tensor host_cache;      // uint8 [rows, 656], pinned_host memory
  Tensor host_row_ids;    // int32, N entries ([N], or [1, N] as a staging plan holds them)
  Tensor device_row_ids;  // int32, the same N entries
  // Rows per page of block_table; 0 means src_cache.dim(1). Only the
  // host-backed variant's staged pages may differ from the cache's blocks;
  // a model1_fp8 cache given as [num_blocks, bytes] needs it (its tokens a
  // page).
  std::int64_t block_size = 0;
  // The cache's format (the layouts in sparse_mla/fp8.hpp).
  KvFormat kv_format = KvFormat::fp8_ds_mla;
};

// The cache (src_cache) of each format:
// - fp8_ds_mla: uint8 [num_blocks, block_size, 656] (rows packed, blocks may
//   be further apart);
// - model1_fp8: uint8 [num_blocks, B, 584] or [num_blocks, B, 1, 584] (the
//   views FlashMLA, vLLM and SGLang hold of a page of B tokens), or
//   [num_blocks, bytes] with bytes >= 584 B (B = params.block_size); pages
//   stride(0) bytes apart, at least model1_page_bytes(B) (the padded page
//   every writer allocates) when there are several.
// Outputs are bf16 rows of upconverted_width(kv_format) values: 576 or 512.

// dst: bf16 [T, upconverted_width]; block_table: int32 [>= batch, M];
// workspace_starts: int32 [>= batch], non-decreasing. Request r fills dst rows
// [ws[r], ws[r+1]) (the last one up to T, ends clamped to T). Rows whose
// source is not in the table or the cache are left unwritten; the values are
// not read on the host (check_fp8_gather_values does that for validating
// callers).
void gather_upconvert_fp8(Stream& stream, const Tensor& src_cache, const Tensor& dst, const Tensor& block_table,
                          const Tensor& workspace_starts, std::int64_t batch_size,
                          const Fp8GatherParams& params = Fp8GatherParams());

// The position-range gather DeepSeek V4's prefill uses (vLLM's
// dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens,
// block_table, block_size, offset)): request r < R = seq_lens.dim(0) with
// g = gather_lens[r] (or seq_lens[r] when gather_lens is not given)
// upconverts its last g tokens, positions seq_lens[r] - g + i in order,
// into out[r, offset + i, :] for i < min(g, N - offset). out: bf16 [>= R,
// N, upconverted_width] (rows packed); seq_lens, gather_lens: int32 [>= R]
// (gather_lens optional); block_table: int32 [>= R, M]; 0 <= offset <= N.
// Every other element of out keeps what it held. As in the workspace gather
// a row whose token is not in the table or the cache (or a request with g
// < 0 or g > seq_lens[r]) is left unwritten, the values are not read on the
// host (check_fp8_range_values does that), and params' seq_starts and
// host-backed tensors do not apply.
void gather_upconvert_fp8_range(Stream& stream, const Tensor& src_cache, const Tensor& out, const Tensor& seq_lens,
                                const Tensor& gather_lens, const Tensor& block_table, std::int64_t offset,
                                const Fp8GatherParams& params = Fp8GatherParams());

// Host-side deep check of a plain (not host-backed) gather for validating
// entry points: workspace_starts non-decreasing in [0, total_rows],
// seq_starts >= 0, and every block a request reads inside the table and the
// cache. Throws naming the first bad position.
void check_fp8_gather_values(const std::int32_t* block_table, std::int64_t blocks_per_request,
                             const std::int32_t* workspace_starts, const std::int32_t* seq_starts,
                             std::int64_t batch, std::int64_t total_rows, std::int64_t block_size,
                             std::int64_t num_blocks);

// The same for a position-range gather into slices of `slice_rows` rows
// after the offset (N - offset): 0 <= gather_lens[r] <= seq_lens[r] and
// gather_lens[r] <= slice_rows (gather_lens may be nullptr: every token),
// and every block a request reads inside the table and the cache. Throws
// naming the first bad position.
void check_fp8_range_values(const std::int32_t* block_table, std::int64_t blocks_per_request,
                            const std::int32_t* seq_lens, const std::int32_t* gather_lens, std::int64_t batch,
                            std::int64_t slice_rows, std::int64_t block_size, std::int64_t num_blocks);

}  // namespace sparse_mla
