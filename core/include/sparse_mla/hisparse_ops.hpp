// The HiSparse kernels as validated public operations (SPEC section 5):
// the residency resolve and the host-to-hot row gather. Each call checks
// shapes, dtypes, devices and capacities, throws sparse_mla::Error naming the
// argument and the values, and queues nothing when it rejects.
#pragma once

#include <cstdint>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/tensor.hpp"

namespace sparse_mla {

// The most hot slots a request may have: slot ids are int16 in the LRU, and
// the resolve kernels' scratch packs entry indices, slots and miss numbers in
// 15 or 16 bits (top_k <= hot_slots <= this).
inline constexpr std::int32_t hisparse_max_hot_slots = 32768;

// Where the rows of one selection live. Batch-row indexed: logical,
// request_ids, request_state_indices, hot_block_table.
struct HiSparseResolveInputs {
  Tensor logical;                // int32 [T, K]: request-relative positions, < 0 unused
  Tensor request_ids;            // int32 [>= T]: row of the source and resident tables
  Tensor request_state_indices;  // int32 [>= T]: state row, -1 = padding; undefined = the batch row
  Tensor source_block_table;     // int32 [R, B]: host-pool block of each logical block
  std::int32_t source_block_size = 64;
  std::int64_t host_rows = 0;          // rows of the host pool; a host row past it resolves to -1
  Tensor resident_block_table;         // int32 [R', B'] or undefined: device-resident pages
  std::int32_t resident_block_size = 0;  // 0 = source_block_size
  std::int32_t resident_null_block = 0;  // this block id (or a negative one) is not resident
  Tensor hot_block_table;              // int32 [>= T, blocks]: hot-cache blocks of each batch row
  bool hot_table_by_state = false;     // hot_block_table is [state rows, blocks], one row per state row
  std::int32_t hot_block_size = 64;
  std::int64_t attention_block_stride = 0;  // 0 = hot_block_size
};

// Per state row: host row held in each hot slot (-1 empty) and the LRU order.
// The non-padding rows of one call must have distinct state rows; rows
// sharing one give undefined results.
struct HiSparseSlotState {
  Tensor slot_rows;  // int32 [S, >= H]
  Tensor lru;        // int16 [S, H]: a permutation of [0, H), least recent first
};

// Outputs, row r for batch row r. Optional ones may be left undefined.
struct HiSparseResolveOutputs {
  Tensor hot_indices;        // int32 [>= T, K]: hot (or resident) row of each entry, -1 invalid
  Tensor attention_indices;  // optional int32 [>= T, K]
  Tensor resolved_rows;      // optional int32 [>= T, K]: host row g of each entry, or -1
  Tensor miss_mask;          // optional int32 [>= T, K]
  Tensor swap_host_rows;     // int32 [>= T, K]: compact swap list, first swap_counts[r] entries defined
  Tensor swap_device_rows;   // int32 [>= T, K]
  Tensor valid_counts;       // optional int32 [>= T]
  Tensor swap_counts;        // int32 [>= T]
  Tensor hit_miss_counters;  // optional int64 [2]: hits and misses are added to it
};

// hot_indices, resolved_rows, miss_mask and the swap lists must share one row stride.
void resolve_hisparse(Stream& stream, const HiSparseResolveInputs& inputs, const HiSparseSlotState& state,
                      std::int32_t hot_slots, const HiSparseResolveOutputs& outputs);
// Every check of resolve_hisparse, queueing nothing (for callers that queue
// other work first and must reject before it).
void check_resolve_hisparse(const Device& device, const HiSparseResolveInputs& inputs, const HiSparseSlotState& state,
                            std::int32_t hot_slots, const HiSparseResolveOutputs& outputs);

// One layer's copy of the swap pairs of `num_rows` batch rows.
struct HiSparseGatherTensors {
  Tensor host_pool;         // uint8 [host_rows, row_bytes], row_bytes a multiple of 16
  Tensor hot_cache;         // uint8 [blocks, block_size, row_bytes] (block stride may be larger)
  Tensor swap_host_rows;    // int32 [>= num_rows, K]
  Tensor swap_device_rows;  // int32 [>= num_rows, K], same row stride
  Tensor swap_counts;       // int32 [>= num_rows], read on the device
};

void gather_hisparse(Stream& stream, const HiSparseGatherTensors& tensors, std::int64_t num_rows);

// One layer's host pool and hot cache (as in HiSparseGatherTensors).
struct HiSparseLayerRows {
  Tensor host_pool;  // uint8 [host_rows, row_bytes], row_bytes a multiple of 16
  Tensor hot_cache;  // uint8 [blocks, block_size, row_bytes] (block stride may be larger)
};

// The same copy into several layers from one swap list (the layers of a
// group after the first): one launch for each run of up to eight consecutive
// layers of one geometry (row bytes, pool rows, hot blocks and their stride).
// Returns the launches queued.
int gather_hisparse_layers(Stream& stream, const std::vector<HiSparseLayerRows>& layers, const Tensor& swap_host_rows,
                           const Tensor& swap_device_rows, const Tensor& swap_counts, std::int64_t num_rows);

// Host mirror: row n of `rows` (uint8 [n, row_bytes] on the device) becomes
// host row host_row_ids[n] (int32 [>= n]; -1 or past the pool: skipped) of
// `host_pool` (uint8 [host_rows, row_bytes]).
void write_hisparse_rows(Stream& stream, const Tensor& rows, const Tensor& host_row_ids, const Tensor& host_pool);

// Empties every hot slot of state row state_rows[n] that holds host row
// host_row_ids[n] (both int32 [n]; negative entries are skipped).
void invalidate_hisparse_slots(Stream& stream, const HiSparseSlotState& state, std::int32_t hot_slots,
                               const Tensor& host_row_ids, const Tensor& state_rows);

// Prefill staging: staged row n (uint8 [n, row_bytes], contiguous) is
// resident row device_row_ids[n] of `resident_cache` (uint8 [blocks,
// block_size, row_bytes]) when device_row_ids is defined and that id is
// >= 0, else host row host_row_ids[n] of `host_pool`, else zeros.
void stage_hisparse_rows(Stream& stream, const Tensor& host_pool, const Tensor& host_row_ids, const Tensor& resident_cache,
                         const Tensor& device_row_ids, const Tensor& staged);

}  // namespace sparse_mla
