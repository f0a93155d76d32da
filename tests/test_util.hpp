// Moving test data to and from a device, and poison values.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <random>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/error.hpp"
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

// Copies `values` into a new buffer of `kind` and waits for the copy
// (sparse_mla::upload, kept as a Buffer for tests that slice raw memory).
template <class T>
Buffer upload(Device& device, Stream& stream, const std::vector<T>& values, MemoryKind kind = MemoryKind::device) {
  Buffer buffer = device.allocate(values.size() * sizeof(T), kind);
  if (buffer) upload_bytes(stream, values.data(), buffer.bytes(), Tensor::of(buffer, DType::u8, {std::int64_t(buffer.bytes())}));
  return buffer;
}

// The first `count` values of `buffer` (sparse_mla::download).
template <class T>
std::vector<T> download(Device&, Stream& stream, const Buffer& buffer, std::size_t count) {
  std::vector<T> values(count);
  if (count) download_bytes(stream, Tensor::of(buffer, DType::u8, {std::int64_t(count * sizeof(T))}), values.data());
  return values;
}

// A device tensor holding `values` with `shape`: sparse_mla::upload's
// OwnedTensor, as its Buffer and view.
struct DeviceTensor {
  Buffer buffer;
  Tensor tensor;
};

template <class T>
DeviceTensor device_tensor(Device&, Stream& stream, const std::vector<T>& values, const std::vector<std::int64_t>& shape,
                           MemoryKind kind = MemoryKind::device) {
  OwnedTensor owned = sparse_mla::upload(stream, values, shape, kind);
  const Tensor view = owned.tensor();
  return DeviceTensor{std::move(owned.buffer()), view};
}

// The message of the Error `f` throws, or "no error".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
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
// Tensor::rows), packed row-major (sparse_mla::download).
template <class T>
std::vector<T> download_rows(Device&, Stream& stream, const Tensor& view) {
  return sparse_mla::download<T>(stream, view);
}

}  // namespace sparse_mla::testing
