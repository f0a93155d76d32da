// The operations a backend must run, as one interface.
//
// Every backend implements it with the same Kokkos sources in core/kernels/,
// instantiated for its execution space (core/kernels/kokkos_kernels.hpp).
// Arguments are plain views (pointers, sizes, strides in elements) that the
// public entry points have already validated: kernels never allocate, never
// synchronise and never check.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sparse_mla/fp8.hpp"
#include "sparse_mla/hisparse_ops.hpp"

namespace sparse_mla {

class Stream;

struct FillI32Args {
  std::int32_t* data;
  std::int64_t count;
  std::int32_t value;
};

// SPEC section 2. For t < num_tokens, j < num_topk, tok = logical[t, j]:
//   physical[t, j] = block_table[req_id[t], tok / block_size] * block_stride_rows + tok % block_size
// or -1 when tok < 0 or the block is outside the table. With the prefill
// workspace (workspace_request != nullptr), a token whose workspace_request
// p >= 0 maps to workspace_starts[p] + tok instead. Arithmetic wraps like
// the reference's int32.
struct TopkConvertArgs {
  const std::int32_t* req_id;       // [num_tokens]
  const std::int32_t* block_table;  // [*, blocks_per_request], row stride block_table_stride
  std::int64_t block_table_stride;
  std::int32_t blocks_per_request;
  const std::int32_t* logical;  // [num_tokens, num_topk], row stride logical_stride
  std::int64_t logical_stride;
  std::int32_t* physical;  // [num_tokens, num_topk], row stride physical_stride
  std::int64_t physical_stride;
  std::int32_t* valid_counts;  // [num_tokens], or nullptr
  std::int64_t num_tokens;
  std::int32_t num_topk;
  std::int32_t block_size;
  std::int32_t block_stride_rows;
  const std::int32_t* workspace_request;  // [num_tokens], or nullptr
  const std::int32_t* workspace_starts;   // [num_prefill_requests], or nullptr
  // SPEC section 2a (no prefill workspace then): rank dcp_rank of dcp_size
  // owns position p when (p / dcp_interleave) % dcp_size == dcp_rank and
  // converts its local position; other ranks' positions give -1. With
  // dcp_compact the valid outputs move to a prefix in input order and
  // valid_counts is not null. dcp_size == 1 is the plain conversion.
  std::int32_t dcp_size;
  std::int32_t dcp_rank;
  std::int32_t dcp_interleave;
  bool dcp_compact;
};

// SPEC section 3, in a cache of either format (kv_format; the kernel's
// Layout). Requests r < batch name their tokens one of two ways:
// - workspace (seq_lens == nullptr): request r fills output rows
//   [min(ws[r], T), min(ws[r+1] or T, T)) with T = total_rows; its i-th row
//   is source token s = seq_starts[r] + i (or i);
// - positions (seq_lens != nullptr): with g = gather_lens[r] (or
//   seq_lens[r]), request r fills rows first_output + i of its output slice
//   (dst + r * dst_request_stride), i < min(g, request_rows - first_output),
//   from source token s = seq_lens[r] - g + i.
// Token s is found through block_table[r, s / block_size] and
// s % block_size. An output row is the token's fp8 values times their
// scales, each product rounded to bf16, then a copy of its RoPE part. A row
// whose source is invalid (block past the table, block id or row id outside
// its cache, negative position) is not written.
struct Fp8UpconvertArgs {
  // Fields in the order the kernel reads them (a team's page, its block,
  // its rows, its outputs): they reach the kernel through the constant
  // cache, where what is read first should share the first lines.
  const std::int32_t* workspace_starts;  // [batch]
  const std::int32_t* seq_starts;        // [batch], or nullptr
  const std::int32_t* seq_lens;          // [batch]: a position-range gather; nullptr: a workspace gather
  const std::int32_t* gather_lens;       // [batch], or nullptr (every token of each request)
  std::int32_t batch;
  std::int32_t total_rows;
  std::int32_t first_output;  // positions: the slice row of a request's first gathered token
  std::int32_t request_rows;  // positions: rows of a request's output slice
  std::int32_t block_size;  // of the block table's pages
  std::int32_t blocks_per_request;
  const std::int32_t* block_table;  // [>= batch, blocks_per_request], row stride block_table_stride
  std::int64_t block_table_stride;
  // Host-backed variant (host_cache != nullptr; fp8_ds_mla only):
  // block_table holds staged blocks; staged row n = block_table[r, s /
  // block_size] * block_size + s % block_size reads device cache row
  // device_row_ids[n] when that is >= 0 (flat: row / cache_block_size, row %
  // cache_block_size), otherwise host_cache row host_row_ids[n], straight
  // from pinned host memory.
  const std::uint8_t* host_cache;  // [host_rows, 656], row stride host_row_stride bytes; or nullptr
  // The device cache, cache_blocks pages of cache_block_size tokens,
  // cache_block_stride bytes apart. fp8_ds_mla: token t's 656-byte row at
  // t * cache_row_stride. model1_fp8: token t's 576 data bytes at t *
  // cache_row_stride (576), its scale group at cache_scale_offset (576 *
  // cache_block_size) + 8 t.
  const std::uint8_t* cache;
  std::int64_t cache_block_stride;
  std::int64_t cache_row_stride;
  std::int64_t cache_scale_offset;
  std::int64_t cache_blocks;
  std::int32_t cache_block_size;
  KvFormat kv_format;
  Fp8Format format;
  std::uint16_t* dst;  // bf16 rows of upconverted_width(kv_format), row stride dst_row_stride elements
  std::int64_t dst_row_stride;
  std::int64_t dst_request_stride;  // positions: elements between requests' output slices
  // The rest of the host-backed variant.
  std::int64_t host_row_stride;
  std::int64_t host_rows;
  const std::int32_t* host_row_ids;    // [staged_rows]
  const std::int32_t* device_row_ids;  // [staged_rows]
  std::int64_t staged_rows;
};

// SPEC section 5, swap-in: one team per batch row resolves the row's logical
// top-k against its state row's hot slots (slot_rows, lru) and produces the
// hot and attention rows plus the compact swap list the row gather copies.
// Batch-row indexed: logical, request_ids, request_state_indices,
// hot_block_table and every output. State-row indexed: slot_rows, lru.
// top_k <= hot_slots <= hisparse_max_hot_slots (sparse_mla/hisparse_ops.hpp).
struct HiSparseResolveArgs {
  const std::int32_t* logical;  // [num_rows, top_k], row stride logical_stride
  std::int64_t logical_stride;
  const std::int32_t* request_ids;            // [num_rows]: row of the source/resident tables
  const std::int32_t* request_state_indices;  // [num_rows]: state row, -1 = padding; nullptr = batch row
  // Source (host pool) block table: host row g = block * source_block_size + offset.
  const std::int32_t* source_block_table;
  std::int64_t source_table_stride;
  std::int32_t source_num_requests;
  std::int32_t source_blocks_per_request;
  std::int32_t source_block_size;
  std::int64_t host_rows;  // g >= host_rows resolves to -1
  // Resident (device) block table, or nullptr; a block equal to
  // resident_null_block (or negative) is not resident.
  const std::int32_t* resident_block_table;
  std::int64_t resident_table_stride;
  std::int32_t resident_num_requests;
  std::int32_t resident_blocks_per_request;
  std::int32_t resident_block_size;
  std::int32_t resident_null_block;
  // Hot block table, by batch row: slot s is hot row
  // hot_block_table[row, s / hot_block_size] * hot_block_size + s % hot_block_size.
  const std::int32_t* hot_block_table;
  std::int64_t hot_table_stride;
  bool hot_table_by_state;  // index the hot block table by state row instead (a table owned per state)
  std::int32_t hot_block_size;
  std::int64_t attention_block_stride;  // attention index = (x / hot_block_size) * this + x % hot_block_size
  // Slot state, by state row: host row held by each slot (-1 empty) and the
  // LRU order (a permutation of [0, hot_slots), least recent first).
  std::int32_t* slot_rows;
  std::int64_t slot_rows_stride;
  std::int16_t* lru;
  std::int64_t lru_stride;
  std::int32_t num_state_rows;  // a state index outside [0, num_state_rows) is treated as padding
  // Outputs, [num_rows, top_k] with row stride out_stride unless noted.
  std::int32_t* hot_indices;
  std::int32_t* attention_indices;  // row stride attention_stride; nullptr = not written
  std::int64_t attention_stride;
  std::int32_t* resolved_rows;  // host row g of every entry, or nullptr
  std::int32_t* miss_mask;      // 1 at the first entry of each row loaded this step, or nullptr
  std::int32_t* swap_host_rows;    // compact swap list: only the first swap_counts[row] entries are written
  std::int32_t* swap_device_rows;  // (hot rows)
  std::int64_t out_stride;
  std::int32_t* valid_counts;  // [num_rows] or nullptr
  std::int32_t* swap_counts;   // [num_rows]
  std::uint64_t* hit_miss_counters;  // [2]: += hits, += misses (atomically), or nullptr
  std::int64_t num_rows;
  std::int32_t top_k;
  std::int32_t hot_slots;  // H, >= top_k, <= hisparse_max_hot_slots
};

// Speculative decoding, before the resolve (core/kernels/hisparse_union.hpp):
// a request is a maximal run of consecutive batch rows with equal state
// index and request id. The team of a request's first batch row f writes its
// union row f of union_logical: the distinct non-negative positions of the
// request's rows' selections in row-major order of first selection (row f's
// entries, then row f + 1's, ...), then -1 up to union_width, and
// union_state[f] = the state; every other union row is padding
// (union_state -1). entry_position[b, j] is the union position p of entry j
// of batch row b when that entry put p in the union, -(p + 2) for a later
// selection of the same position, -1 for a negative position; run_first[b]
// is f, or -1 for a row that is not resolved: padding (a state outside
// [0, num_state_rows)) or bad input on the device, which is treated as
// padding like a bad state index: a request of more than
// max_rows_per_request rows, or a request whose state row an earlier
// request of the batch has (rows of one state that are not contiguous, or a
// second request id on it; the first request on the state resolves). Nothing
// of a refused request is resolved: its union row is padding.
struct HiSparseUnionArgs {
  const std::int32_t* logical;  // [num_rows, top_k], row stride logical_stride
  std::int64_t logical_stride;
  const std::int32_t* request_ids;            // [num_rows]
  const std::int32_t* request_state_indices;  // [num_rows]
  std::int32_t num_state_rows;
  std::int32_t* union_logical;  // [num_rows, union_width], row stride union_stride
  std::int64_t union_stride;
  std::int32_t* union_state;     // [num_rows]: the union rows' state rows, -1 = padding
  std::int32_t* entry_position;  // [num_rows, top_k], row stride entry_stride
  std::int64_t entry_stride;
  std::int32_t* run_first;  // [num_rows]
  std::int64_t num_rows;
  std::int32_t top_k;
  std::int32_t max_rows_per_request;
  std::int32_t union_width;  // max_rows_per_request * top_k
};

// Speculative decoding, after the resolve of the union rows: batch row b
// with f = run_first[b] >= 0 (the request's row r = b - f) gets, for entry j
// with union position p (entry_position, decoded), hot_indices[b, j] =
// union_hot[f, p] and its attention index, miss_mask[b, j] = union_miss[f, p]
// at the entry that put p in the union and 0 at later selections of it (-1
// and 0 for a negative position), valid_counts[b] = its hot rows that are
// not -1, swap_counts[b] = clamp(union_swap_counts[f] - r * top_k, 0, top_k)
// and swap pair c = the union's pair r * top_k + c. A row with run_first -1
// gets -1 hot rows and attention indices, a zero miss mask and counts 0.
struct HiSparseUnionScatterArgs {
  const std::int32_t* run_first;       // [num_rows]
  const std::int32_t* entry_position;  // [num_rows, top_k], row stride entry_stride
  std::int64_t entry_stride;
  // The resolve's outputs for the union rows, [num_rows, union_width], row stride union_stride.
  const std::int32_t* union_hot;
  const std::int32_t* union_miss;
  const std::int32_t* union_swap_host_rows;
  const std::int32_t* union_swap_device_rows;
  std::int64_t union_stride;
  const std::int32_t* union_swap_counts;  // [num_rows]
  std::int32_t hot_block_size;
  std::int64_t attention_block_stride;  // attention index = (x / hot_block_size) * this + x % hot_block_size
  // Batch-row outputs, [num_rows, top_k] with row stride out_stride unless noted.
  std::int32_t* hot_indices;
  std::int32_t* attention_indices;  // row stride attention_stride; nullptr = not written
  std::int64_t attention_stride;
  std::int32_t* miss_mask;  // or nullptr
  std::int32_t* swap_host_rows;
  std::int32_t* swap_device_rows;
  std::int64_t out_stride;
  std::int32_t* valid_counts;  // [num_rows] or nullptr
  std::int32_t* swap_counts;   // [num_rows]
  std::int64_t num_rows;
  std::int32_t top_k;
};

// The most layers one gather fills (HiSparseGatherArgs::layers).
inline constexpr int max_gather_layers = 8;

// Copies swap pair j < swap_counts[row] of every row into each of
// `num_layers` layers: host row swap_host_rows[row, j] of layer l's pinned
// host pool into hot row swap_device_rows[row, j] of its hot cache (read over
// the host link, zero-copy). The layers share one geometry (row bytes, pool
// rows, hot layout). A host row >= host_rows zero-fills its hot row; a
// negative host row or a hot row outside [0, hot_rows) is skipped.
struct HiSparseGatherArgs {
  const std::uint8_t* host_pools[max_gather_layers];  // [host_rows, row_bytes] each
  std::uint8_t* hot_caches[max_gather_layers];  // hot row x at (x / hot_block_size) * hot_block_stride_bytes + (x % hot_block_size) * row_bytes
  std::int32_t num_layers;
  std::int64_t host_rows;
  std::int64_t hot_rows;
  std::int32_t hot_block_size;
  std::int64_t hot_block_stride_bytes;
  std::int64_t row_bytes;  // a multiple of 16
  const std::int32_t* swap_host_rows;  // [num_rows, max_swaps], row stride swap_stride
  const std::int32_t* swap_device_rows;
  std::int64_t swap_stride;
  const std::int32_t* swap_counts;  // [num_rows], read on the device (clamped to [0, max_swaps])
  std::int64_t num_rows;
  std::int32_t max_swaps;
};

// Host mirror (SPEC section 5): row n of `rows` (row stride rows_stride
// bytes) is written to host row host_row_ids[n] of the pinned host pool; a
// host row outside [0, host_rows) is skipped.
struct HiSparseWriteRowsArgs {
  const std::uint8_t* rows;
  std::int64_t rows_stride;
  const std::int32_t* host_row_ids;  // [num_rows]
  std::uint8_t* host_pool;           // [host_rows, row_bytes]
  std::int64_t host_rows;
  std::int64_t row_bytes;  // a multiple of 16
  std::int64_t num_rows;
};

// Every hot slot of state row state_rows[n] that holds host row
// host_row_ids[n] becomes empty (-1). Negative or out-of-range entries are
// skipped.
struct HiSparseInvalidateArgs {
  std::int32_t* slot_rows;  // [num_state_rows, >= hot_slots]
  std::int64_t slot_rows_stride;
  std::int32_t hot_slots;
  std::int32_t num_state_rows;
  const std::int32_t* host_row_ids;  // [num_rows]
  const std::int32_t* state_rows;    // [num_rows]
  std::int64_t num_rows;
};

// Prefill staging (SPEC section 5): staged row n is resident device row
// device_row_ids[n] when that is >= 0, else host row host_row_ids[n] of the
// pinned pool read directly (zero-copy); a row with neither (the unused
// tail, or a host row outside the pool) is zero-filled.
struct HiSparseStageArgs {
  const std::uint8_t* host_pool;  // [host_rows, row_bytes]
  std::int64_t host_rows;
  const std::uint8_t* resident_cache;  // row x at (x / resident_block_size) * resident_block_stride_bytes + ..., or nullptr
  std::int64_t resident_rows;
  std::int32_t resident_block_size;
  std::int64_t resident_block_stride_bytes;
  const std::int32_t* host_row_ids;    // [num_rows]
  const std::int32_t* device_row_ids;  // [num_rows] or nullptr
  std::uint8_t* staged;                // [num_rows, row_bytes]
  std::int64_t row_bytes;              // a multiple of 16
  std::int64_t num_rows;
};

// Prefill staging plan built on the device (SPEC section 5): the same plan
// as build_hisparse_prefill_staging_plan (core/src/hisparse_prefill.cpp) for
// the compact blocks in use, into storage sized once. Request p's context
// covers blocks b < ceil(context_lengths[p] / block_size); the distinct host
// blocks those use get compact ids 1, 2, ... in ascending host-block order
// (0 is the null block), plan_block_table[p, b] is the compact id of each
// (0 beyond the context), row_ids[c * block_size + off] = host_block *
// block_size + off, and gpu_row_ids the resident row from the resident table
// of the first (p, then b) entry that uses the block, or -1. Rows of compact
// blocks past the last used one are -1 in both. A bad entry (a context
// length < 0 or needing more than blocks_per_request blocks, a block id
// outside [0, pool_blocks) inside a context, a block that does not fit the
// max_staged_blocks compact blocks) counts as the null block, and the first
// one in (p, b) order, a context length before its request's blocks, goes
// to error_record.
struct HiSparsePlanArgs {
  const std::int32_t* block_table;  // [num_requests, blocks_per_request], row stride block_table_stride
  std::int64_t block_table_stride;
  const std::int32_t* context_lengths;  // [num_requests]
  // Resident table [num_requests, resident_blocks_per_request], or nullptr;
  // a page < 0 or equal to resident_null_block is not resident.
  const std::int32_t* resident_block_table;
  std::int64_t resident_table_stride;
  std::int32_t resident_blocks_per_request;
  std::int32_t resident_null_block;
  std::int32_t num_requests;
  std::int32_t blocks_per_request;  // (num_requests * (blocks_per_request + 1) < 2^31: entry keys)
  std::int32_t block_size;
  std::int32_t pool_blocks;        // host blocks of the pool (pool_blocks * block_size < 2^31)
  std::int32_t max_staged_blocks;  // compact blocks 1 .. max_staged_blocks
  // Outputs.
  std::int32_t* plan_block_table;  // [num_requests, blocks_per_request], packed
  std::int32_t* row_ids;           // [(1 + max_staged_blocks) * block_size]
  std::int32_t* gpu_row_ids;       // [(1 + max_staged_blocks) * block_size]
  std::int32_t* error_record;      // [4]: HiSparsePlanError code, request, block (-1: the length), value
  // Scratch, written before it is read.
  std::int32_t* first_use;          // [pool_blocks]: key of the first entry using each host block
  std::int32_t* compact_block;      // [pool_blocks]: compact id of each used host block
  std::int32_t* staged_host_block;  // [max_staged_blocks]: host block of compact id c + 1
  std::int32_t* totals;             // [2]: key of the first bad entry, distinct host blocks used
};

// The codes of HiSparsePlanArgs::error_record[0].
enum class HiSparsePlanError : std::int32_t {
  none = 0,
  bad_context_length = 1,  // value: the length
  negative_block = 2,      // value: the block id
  block_outside_pool = 3,  // value: the block id
  too_many_blocks = 4,     // value: the distinct host blocks used; (request, block): the first entry that does not fit
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  // Kokkos's name of the execution space: "Serial", "OpenMP", "Cuda", "HIP".
  virtual const char* execution_space() const = 0;
  // Binds an execution-space instance to the stream, for its launches.
  virtual void bind(Stream& stream) const = 0;

  // data[0 .. count) = value: poisoning outputs, resetting tables.
  virtual void fill_i32(Stream& stream, const FillI32Args& args) const = 0;
  // Grows the stream's team scratch to `bytes` per team now, so that no
  // launch of a step grows it (core/kernels/team_scratch.hpp).
  virtual void reserve_team_scratch(Stream& stream, std::size_t bytes) const = 0;
  // The team scratch one row of the HiSparse resolve asks for.
  virtual std::size_t resolve_hisparse_scratch_bytes(std::int32_t top_k, std::int32_t hot_slots,
                                                     std::int32_t hot_block_size) const = 0;
  // core/kernels/topk_convert.hpp
  virtual void convert_topk(Stream& stream, const TopkConvertArgs& args) const = 0;
  // core/kernels/fp8_upconvert.hpp
  virtual void gather_upconvert_fp8(Stream& stream, const Fp8UpconvertArgs& args) const = 0;
  // core/kernels/hisparse_resolve.hpp
  virtual void resolve_hisparse(Stream& stream, const HiSparseResolveArgs& args) const = 0;
  // core/kernels/hisparse_union.hpp: speculative decoding's passes around
  // the resolve, and the team scratch a union row asks for.
  virtual void union_hisparse_requests(Stream& stream, const HiSparseUnionArgs& args) const = 0;
  virtual void scatter_hisparse_union(Stream& stream, const HiSparseUnionScatterArgs& args) const = 0;
  virtual std::size_t union_hisparse_scratch_bytes(std::int32_t union_width) const = 0;
  // core/kernels/hisparse_gather.hpp
  virtual void gather_hisparse(Stream& stream, const HiSparseGatherArgs& args) const = 0;
  // core/kernels/hisparse_mirror.hpp
  virtual void write_hisparse_rows(Stream& stream, const HiSparseWriteRowsArgs& args) const = 0;
  virtual void invalidate_hisparse_slots(Stream& stream, const HiSparseInvalidateArgs& args) const = 0;
  // core/kernels/hisparse_stage.hpp
  virtual void stage_hisparse_rows(Stream& stream, const HiSparseStageArgs& args) const = 0;
  // core/kernels/hisparse_plan.hpp
  virtual void plan_hisparse_prefill(Stream& stream, const HiSparsePlanArgs& args) const = 0;
};

}  // namespace sparse_mla
