// Filling a benchmark's rotation sets and reading results back, on any
// backend (device memory is reached only through stream copies).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/tensor.hpp"

namespace sparse_mla::cli {

// splitmix64: fast enough to fill hundreds of megabytes of inputs, and
// seeded, so a run's data can be replayed with --seed.
class BenchRng {
 public:
  explicit BenchRng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) (n > 0); the modulo bias is irrelevant for timing data.
  std::uint32_t below(std::uint32_t n) { return static_cast<std::uint32_t>(next() % n); }

 private:
  std::uint64_t state_;
};

// `bytes` bytes of `buffer` from byte `offset`, as a u8 tensor.
inline Tensor bytes_at(const Buffer& buffer, std::size_t offset, std::size_t bytes) {
  return Tensor::of(buffer, DType::u8, {static_cast<std::int64_t>(buffer.bytes())})
      .rows(static_cast<std::int64_t>(offset), static_cast<std::int64_t>(offset + bytes));
}

// Copies host `values` to `dst` at byte `offset` and waits for the copy
// (sparse_mla::upload_bytes).
template <class T>
void upload_to(Device&, Stream& stream, Buffer& dst, std::size_t offset, const std::vector<T>& values) {
  const std::size_t bytes = values.size() * sizeof(T);
  if (bytes == 0) return;
  upload_bytes(stream, values.data(), bytes, bytes_at(dst, offset, bytes));
}

// `count` values of `src` from byte `offset` (sparse_mla::download_bytes).
template <class T>
std::vector<T> download_from(Device&, Stream& stream, const Buffer& src, std::size_t offset, std::size_t count) {
  std::vector<T> values(count);
  if (count == 0) return values;
  download_bytes(stream, bytes_at(src, offset, count * sizeof(T)), values.data());
  return values;
}

// Sets 1 .. sets-1 of `buffer` (laid out as `sets` slices of `slice_bytes`)
// become copies of slice 0: the same data at other addresses is all the
// rotation needs, and copying is much faster than drawing new data.
inline void replicate_slices(Stream& stream, Buffer& buffer, std::size_t slice_bytes, int sets) {
  for (int s = 1; s < sets; ++s) stream.copy(buffer, static_cast<std::size_t>(s) * slice_bytes, buffer, 0, slice_bytes);
  stream.synchronize();
}

}  // namespace sparse_mla::cli
