// One layer's HiSparse caches (SPEC section 5): the pinned host pool that
// holds the layer's full KV cache, and the hot cache attention reads (H
// slots per state row). Implemented by core/src/hisparse_cache.cpp.
#pragma once

#include <cstdint>
#include <memory>

#include "sparse_mla/device.hpp"
#include "sparse_mla/hisparse_config.hpp"
#include "sparse_mla/tensor.hpp"

namespace sparse_mla {

// One layer's caches: the pinned host pool (the layer's full KV cache) and
// the hot cache attention reads (H slots per state row).
class HiSparseCacheHandle {
 public:
  // Allocates both caches; the hot cache is zeroed on `stream`.
  HiSparseCacheHandle(Device& device, Stream& stream, const HiSparseConfig& config, std::int64_t row_bytes);
  // Binds the engine's caches (checked against `config` and `row_bytes`);
  // allocates nothing but the two events.
  HiSparseCacheHandle(Device& device, const HiSparseConfig& config, std::int64_t row_bytes,
                      const HiSparseLayerStorage& storage);

  std::int64_t row_bytes() const { return row_bytes_; }
  // uint8 [host_pool_rows, row_bytes], pinned host memory.
  const Tensor& host_pool() const { return host_pool_; }
  // uint8 [hot blocks, block_size, row_bytes] with a block stride of
  // attention_block_stride rows: state row s owns blocks s * hot_blocks_per_state ...
  const Tensor& hot_cache() const { return hot_cache_; }
  // The hot cache as attention reads it: uint8 [rows, row_bytes] from the
  // first hot block's first row, hot block b at row b * attention_block_stride.
  const Tensor& attention_cache() const { return attention_cache_; }
  // Whether the caches are the engine's (HiSparseLayerStorage).
  bool engine_owned() const { return !owned_pool_.defined(); }
  Event& ready() const { return *ready_; }
  Event& prefill_ready() const { return *prefill_ready_; }
  HiSparseFootprint footprint() const;

 private:
  std::int64_t row_bytes_;
  OwnedTensor owned_pool_, owned_hot_;  // undefined when the engine's
  Tensor host_pool_;
  Tensor attention_cache_;
  Tensor hot_cache_;  // blocks of attention_cache_
  std::unique_ptr<Event> ready_;
  std::unique_ptr<Event> prefill_ready_;
};

}  // namespace sparse_mla
