#include "sparse_mla/hisparse_cache.hpp"

#include <cstring>

#include "sparse_mla/error.hpp"

namespace sparse_mla {

HiSparseCacheHandle::HiSparseCacheHandle(Device& device, Stream& stream, const HiSparseConfig& config,
                                         std::int64_t row_bytes)
    : row_bytes_(row_bytes) {
  check_hisparse_row_bytes("HiSparseCacheHandle", row_bytes);
  host_pool_ = OwnedTensor(device, DType::u8, {config.host_pool_rows, row_bytes}, MemoryKind::pinned_host);
  // Pinned memory is host memory: cleared here, before any kernel reads it.
  if (host_pool_.bytes()) std::memset(host_pool_.data(), 0, host_pool_.bytes());

  const std::int64_t blocks =
      static_cast<std::int64_t>(config.max_requests) * ((config.hot_slots + config.block_size - 1) / config.block_size);
  const std::int64_t stride = config.attention_block_stride;
  attention_cache_ = OwnedTensor(device, DType::u8, {blocks * stride, row_bytes});
  stream.fill(attention_cache_.buffer(), 0, 0, attention_cache_.bytes());
  hot_cache_ = Tensor::of(attention_cache_.buffer(), DType::u8, {blocks, stride, row_bytes}).narrow(1, 0, config.block_size);
  ready_ = device.create_event();
  prefill_ready_ = device.create_event();
}

HiSparseFootprint HiSparseCacheHandle::footprint() const {
  return HiSparseFootprint{host_pool_.buffer().bytes(), attention_cache_.buffer().bytes()};
}

}  // namespace sparse_mla
