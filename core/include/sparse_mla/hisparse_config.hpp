// HiSparse configuration and per-step tables (SPEC section 5). Kept apart
// from hisparse_group.hpp so that the index-group headers can carry them without
// depending on the HiSparse group itself.
#pragma once

#include <cstdint>

#include "sparse_mla/tensor.hpp"

namespace sparse_mla {

// Engine-owned slot state of a HiSparse group (SPEC section 7): tensors the
// engine allocated and keeps alive while the group lives. Undefined tensors
// are allocated by the group.
struct HiSparseStateStorage {
  Tensor slot_rows;        // int32 [max_requests, H] on the device: emptied by the group's constructor
  Tensor lru;              // int16 [max_requests, H] on the device: reset to 0 .. H-1 by the constructor
  Tensor hot_block_table;  // int32 [max_requests, ceil(H / block_size)]: hot block of each state's slot
                           // block, the engine's placement, read as it is
};

// Engine-owned caches of one layer (SPEC section 7), given to
// register_layer through LayerConfig::hisparse_storage. The library never
// frees, clears or resizes them, and writes only the hot rows it gathers.
struct HiSparseLayerStorage {
  // uint8 [>= host_pool_rows, row_bytes]: pinned host memory the engine
  // allocated or registered (mapped into the device's address space).
  Tensor host_pool;
  // uint8 [max_requests * ceil(H / block_size), block_size, row_bytes] on the
  // device, rows packed within a block and a block stride of
  // attention_block_stride rows: a view into the engine's KV slab, where
  // other layers' pages may sit between this layer's blocks.
  Tensor hot_cache;
};

// What a HiSparse index group needs to size its caches. A LayerConfig that
// carries one makes the builder create HiSparse groups.
struct HiSparseConfig {
  std::int32_t top_k = 0;                    // K; 0 = the group's K (a different K is refused)
  std::int32_t hot_slots = 0;                // H hot row slots per request; 0 = (max_rows_per_request + 1) * K
  std::int64_t host_pool_rows = 0;           // rows of each layer's pinned host pool
  std::int32_t max_requests = 0;             // requests (state rows) held at once
  std::int64_t max_tokens_per_request = 0;   // longest context; 0 = K. The pool must hold max_requests of them
  std::int64_t row_bytes = 0;                // row size of layers whose LayerConfig does not give one
  std::int32_t block_size = 64;              // rows per block of the host pool and of the hot cache
  std::int64_t attention_block_stride = 0;   // rows between hot blocks as attention reads them; 0 = block_size
  // Speculative decoding (multi-token prediction): the most consecutive batch
  // rows one request may have in a decode step (1 + speculative tokens). Rows
  // of one request share its state row and are resolved as one union of their
  // selections, max_union_rows() = max_rows_per_request * K wide, which must
  // fit the hot slots (H >= max_union_rows; default H then (R + 1) * K).
  // 1: every batch row is its own request.
  std::int32_t max_rows_per_request = 1;
  HiSparseStateStorage state;                // engine-owned slot state; undefined = allocated by the group
};

// The configuration with defaults filled in, after every check. Throws
// Error naming the field and the values for a configuration that cannot
// work (H < K, H > 32768, H < max_rows_per_request * K, a pool too small for
// the requests, ...).
HiSparseConfig resolve_hisparse_config(const HiSparseConfig& config, std::int64_t group_top_k);

// The width of a request's union of selections: max_rows_per_request * K.
inline std::int64_t max_union_rows(const HiSparseConfig& config) {
  return static_cast<std::int64_t>(config.max_rows_per_request) * config.top_k;
}

// A row size a layer's KV cache can have: a positive multiple of 16 bytes
// (rows move in 16-byte units). Throws otherwise.
void check_hisparse_row_bytes(const char* where, std::int64_t row_bytes);

// Per-step tables of a HiSparse decode step (BatchMetadata::hisparse), by
// batch row (decode token). BatchMetadata::block_table is the source (host
// pool) block table and BatchMetadata::block_size its block size.
struct HiSparseBatch {
  Tensor request_state_indices;  // int32 [>= T]: state row of each batch row, -1 = padding
  Tensor resident_block_table;   // optional int32 [R, B']: device-resident pages (block size = block_size)
  std::int32_t resident_null_block = 0;
  Tensor hot_block_table;        // optional int32 [>= T, blocks]; undefined = the group's own hot blocks
};

// Bytes a HiSparse group holds.
struct HiSparseFootprint {
  std::uint64_t host_bytes = 0;    // pinned host pools
  std::uint64_t device_bytes = 0;  // hot caches, slot state, workspaces
};

// Hit and miss counters (distinct host rows, summed over batch rows and
// steps) and the bytes the row gathers moved from host to device.
struct HiSparseCounters {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t bytes_moved = 0;
};

}  // namespace sparse_mla
