// Moving test data to and from a device, and poison values.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <random>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/host_debug.hpp"
#include "sparse_mla/tensor.hpp"

namespace sparse_mla::testing {

// Holds the host backend's debug delay (SPARSE_MLA_HOST_DELAY_US) for one
// test: every host-stream task sleeps up to `us` microseconds first.
class DelayScope {
 public:
  explicit DelayScope(std::uint32_t us) : saved_(host::debug_delay_us()) { host::set_debug_delay_us(us); }
  ~DelayScope() { host::set_debug_delay_us(saved_); }
  DelayScope(const DelayScope&) = delete;
  DelayScope& operator=(const DelayScope&) = delete;

 private:
  std::uint32_t saved_;
};

// The fill that marks "never written by the kernel" in outputs.
constexpr std::int32_t poison_i32 = -123456789;
constexpr std::uint8_t poison_byte = 0xA5;

// Copies `values` into a new buffer of `kind` (through a plain host buffer and
// the stream, so it works for device memory too) and waits for the copy.
template <class T>
Buffer upload(Device& device, Stream& stream, const std::vector<T>& values, MemoryKind kind = MemoryKind::device) {
  const std::size_t bytes = values.size() * sizeof(T);
  Buffer staging = device.allocate(bytes, MemoryKind::host);
  if (bytes) std::memcpy(staging.data(), values.data(), bytes);
  Buffer buffer = device.allocate(bytes, kind);
  stream.copy(buffer, 0, staging, 0, bytes);
  stream.synchronize();
  return buffer;
}

template <class T>
std::vector<T> download(Device& device, Stream& stream, const Buffer& buffer, std::size_t count) {
  std::vector<T> values(count);
  Buffer staging = device.allocate(count * sizeof(T), MemoryKind::host);
  stream.copy(staging, 0, buffer, 0, count * sizeof(T));
  stream.synchronize();
  if (count) std::memcpy(values.data(), staging.data(), count * sizeof(T));
  return values;
}

// A device tensor holding `values` with `shape`.
struct DeviceTensor {
  Buffer buffer;
  Tensor tensor;
};

template <class T>
DeviceTensor device_tensor(Device& device, Stream& stream, const std::vector<T>& values,
                           const std::vector<std::int64_t>& shape, MemoryKind kind = MemoryKind::device) {
  DeviceTensor t{upload(device, stream, values, kind), Tensor()};
  t.tensor = Tensor::of(t.buffer, dtype_of<T>::value, shape);
  return t;
}

// Fresh random data every run; SPARSE_MLA_TEST_SEED=<n> replays a failure.
// Tests print the seed with SCOPED_TRACE(seed_trace()).
inline std::uint64_t test_seed() {
  static const std::uint64_t seed = [] {
    const char* env = std::getenv("SPARSE_MLA_TEST_SEED");
    return env ? std::strtoull(env, nullptr, 10) : (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  }();
  return seed;
}
inline std::string seed_trace() { return "SPARSE_MLA_TEST_SEED=" + std::to_string(test_seed()); }
inline std::mt19937_64 seeded_rng(std::uint64_t salt = 0) {
  return std::mt19937_64(test_seed() ^ (salt * 0x9E3779B97F4A7C15ULL));
}

}  // namespace sparse_mla::testing

namespace sparse_mla::testing {

// The elements of a view whose rows may be strided (Tensor::narrow,
// Tensor::rows), packed row-major: dim(0) rows of numel() / dim(0) elements.
template <class T>
std::vector<T> download_rows(Device& device, Stream& stream, const Tensor& view) {
  const std::int64_t rows = view.dim(0);
  const std::int64_t width = rows ? view.numel() / rows : 0;
  const std::int64_t span = rows && width ? (rows - 1) * view.stride(0) + width : 0;
  std::vector<T> packed(static_cast<std::size_t>(rows * width));
  if (span == 0) return packed;
  Buffer staging = device.allocate(static_cast<std::size_t>(span) * sizeof(T), MemoryKind::host);
  stream.copy_bytes(staging.data(), view.data(), staging.bytes());
  stream.synchronize();
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(packed.data() + r * width, staging.as<T>() + r * view.stride(0), static_cast<std::size_t>(width) * sizeof(T));
  }
  return packed;
}

}  // namespace sparse_mla::testing
