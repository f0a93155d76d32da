#include <cstring>

#include "sparse_mla/error.hpp"
#include "sparse_mla/hisparse.hpp"

namespace sparse_mla {

HiSparseCacheHandle::HiSparseCacheHandle(Device& device, Stream& stream, const HiSparseConfig& config,
                                         std::int64_t row_bytes)
    : row_bytes_(row_bytes) {
  check_hisparse_row_bytes("HiSparseCacheHandle", row_bytes);
  const std::int64_t host_bytes = config.host_pool_rows * row_bytes;
  host_storage_ = device.allocate(static_cast<std::size_t>(host_bytes), MemoryKind::pinned_host);
  // Pinned memory is host memory: cleared here, before any kernel reads it.
  if (host_bytes) std::memset(host_storage_.data(), 0, static_cast<std::size_t>(host_bytes));
  host_pool_ = Tensor::of(host_storage_, DType::u8, {config.host_pool_rows, row_bytes});

  const std::int64_t blocks =
      static_cast<std::int64_t>(config.max_requests) * ((config.hot_slots + config.block_size - 1) / config.block_size);
  const std::int64_t stride = config.attention_block_stride;
  hot_storage_ = device.allocate(static_cast<std::size_t>(blocks * stride * row_bytes), MemoryKind::device);
  stream.fill(hot_storage_, 0, 0, hot_storage_.bytes());
  attention_cache_ = Tensor::of(hot_storage_, DType::u8, {blocks * stride, row_bytes});
  hot_cache_ = Tensor::of(hot_storage_, DType::u8, {blocks, stride, row_bytes}).narrow(1, 0, config.block_size);
  ready_ = device.create_event();
  prefill_ready_ = device.create_event();
}

HiSparseFootprint HiSparseCacheHandle::footprint() const {
  return HiSparseFootprint{host_storage_.bytes(), hot_storage_.bytes()};
}

}  // namespace sparse_mla
