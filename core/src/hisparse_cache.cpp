#include "sparse_mla/hisparse_cache.hpp"

#include <cstring>

#include "sparse_mla/error.hpp"

namespace sparse_mla {

namespace {

std::int64_t hot_blocks(const HiSparseConfig& config) {
  return static_cast<std::int64_t>(config.max_requests) * ((config.hot_slots + config.block_size - 1) / config.block_size);
}

}  // namespace

HiSparseCacheHandle::HiSparseCacheHandle(Device& device, Stream& stream, const HiSparseConfig& config,
                                         std::int64_t row_bytes)
    : row_bytes_(row_bytes) {
  check_hisparse_row_bytes("HiSparseCacheHandle", row_bytes);
  owned_pool_ = OwnedTensor(device, DType::u8, {config.host_pool_rows, row_bytes}, MemoryKind::pinned_host);
  // Pinned memory is host memory: cleared here, before any kernel reads it.
  if (owned_pool_.bytes()) std::memset(owned_pool_.data(), 0, owned_pool_.bytes());
  host_pool_ = owned_pool_;

  const std::int64_t blocks = hot_blocks(config);
  const std::int64_t stride = config.attention_block_stride;
  owned_hot_ = OwnedTensor(device, DType::u8, {blocks * stride, row_bytes});
  stream.fill(owned_hot_.buffer(), 0, 0, owned_hot_.bytes());
  attention_cache_ = owned_hot_;
  hot_cache_ = Tensor::of(owned_hot_.buffer(), DType::u8, {blocks, stride, row_bytes}).narrow(1, 0, config.block_size);
  ready_ = device.create_event();
  prefill_ready_ = device.create_event();
}

HiSparseCacheHandle::HiSparseCacheHandle(Device& device, const HiSparseConfig& config, std::int64_t row_bytes,
                                         const HiSparseLayerStorage& storage)
    : row_bytes_(row_bytes) {
  constexpr const char* where = "HiSparseCacheHandle";
  check_hisparse_row_bytes(where, row_bytes);
  check(where, "storage.host_pool", storage.host_pool).dtype(DType::u8).rank(2).rows_contiguous()
      .dim_at_least(0, config.host_pool_rows, "host_pool_rows of the configuration").dim(1, row_bytes, "the layer's row bytes")
      .kind(MemoryKind::pinned_host).on(device);
  const std::int64_t blocks = hot_blocks(config);
  const std::int64_t stride = config.attention_block_stride;
  check(where, "storage.hot_cache", storage.hot_cache).dtype(DType::u8).rank(3).rows_contiguous()
      .dim(0, blocks, "hot blocks (max_requests * ceil(H / block_size))").dim(1, config.block_size, "block_size")
      .dim(2, row_bytes, "the layer's row bytes").kind(MemoryKind::device).on(device);
  if (storage.hot_cache.stride(1) != row_bytes) {
    fail(where, "storage.hot_cache has row stride ", storage.hot_cache.stride(1), " bytes; rows within a block must be packed (",
         row_bytes, " bytes)");
  }
  if (storage.hot_cache.stride(0) != stride * row_bytes) {
    fail(where, "storage.hot_cache has a block stride of ", storage.hot_cache.stride(0), " bytes but attention_block_stride ",
         stride, " rows of ", row_bytes, " bytes is ", stride * row_bytes,
         ": attention indices would point at other blocks");
  }
  host_pool_ = storage.host_pool.rows(0, config.host_pool_rows);
  hot_cache_ = storage.hot_cache;
  const std::int64_t rows = blocks == 0 ? 0 : (blocks - 1) * stride + config.block_size;
  attention_cache_ = Tensor(storage.hot_cache.data(), DType::u8, {rows, row_bytes}, MemoryKind::device, &device);
  ready_ = device.create_event();
  prefill_ready_ = device.create_event();
}

HiSparseFootprint HiSparseCacheHandle::footprint() const {
  return HiSparseFootprint{owned_pool_.buffer().bytes(), owned_hot_.buffer().bytes()};
}

}  // namespace sparse_mla
