// Host-backend throughput of the two kernels, next to memcpy of the same
// bytes, in one Google Benchmark run (docs/PERFORMANCE.md, "Host").
//
// Each kernel runs through its public op on a host stream and is waited for,
// so a figure includes the queue hand-off (a few microseconds). Byte counts:
//   top-k conversion  reads 4*T*K, writes 4*T*K + 4*T
//   gather-upconvert  reads 656, writes 1152 per row
// GB/s counts read + written bytes; memcpy of n bytes counts 2n. Every kernel
// output is checked against the scalar reference once before it is timed.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "validation/reference/fp8_reference.hpp"
#include "validation/reference/topk_reference.hpp"
#include "sparse_mla/device.hpp"
#include "sparse_mla/topk_convert.hpp"
#include "sparse_mla/fp8_upconvert.hpp"

namespace {

using namespace sparse_mla;

std::shared_ptr<Device> host_device() {
  static std::shared_ptr<Device> device = open_device("host");
  return device;
}

template <class T>
Tensor device_copy(Device& device, Stream& stream, const std::vector<T>& values, DType dtype,
                   const std::vector<std::int64_t>& shape, std::vector<Buffer>& keep) {
  keep.push_back(device.allocate(values.size() * sizeof(T), MemoryKind::device));
  if (!values.empty()) stream.copy_bytes(keep.back().data(), values.data(), values.size() * sizeof(T));
  stream.synchronize();
  return Tensor::of(keep.back(), dtype, shape);
}

void report(benchmark::State& state, double elements, double bytes_read, double bytes_written) {
  using benchmark::Counter;
  const auto iterations = static_cast<double>(state.iterations());
  state.counters["elements/s"] = Counter(elements * iterations, Counter::kIsRate);
  state.counters["GB/s"] = Counter((bytes_read + bytes_written) * iterations, Counter::kIsRate, Counter::kIs1000);
}

[[noreturn]] void wrong(const char* what) {
  std::cerr << what << " differs from the scalar reference; not timing it\n";
  std::exit(1);
}

// ---- top-k conversion: T tokens, K = 2048, block size 64, 8 requests ----

void BM_TopkConvert(benchmark::State& state) {
  const std::int64_t T = state.range(0), K = 2048, R = 8, B = 128, bs = 64;
  Device& device = *host_device();
  auto stream = device.create_stream();
  std::mt19937_64 rng(1);
  reference::TopkInputs in;
  in.num_tokens = T, in.num_topk = K, in.blocks_per_request = B, in.block_size = bs, in.block_stride_rows = bs;
  for (std::int64_t t = 0; t < T; ++t) in.req_id.push_back(static_cast<std::int32_t>(t % R));
  for (std::int64_t i = 0; i < R * B; ++i) in.block_table.push_back(static_cast<std::int32_t>(rng() % (R * B)));
  std::uniform_int_distribution<std::int32_t> token(-1, static_cast<std::int32_t>(B * bs - 1));
  for (std::int64_t i = 0; i < T * K; ++i) in.logical.push_back(token(rng));
  std::vector<Buffer> keep;
  const Tensor req_id = device_copy(device, *stream, in.req_id, DType::i32, {T}, keep);
  const Tensor table = device_copy(device, *stream, in.block_table, DType::i32, {R, B}, keep);
  const Tensor logical = device_copy(device, *stream, in.logical, DType::i32, {T, K}, keep);
  const Tensor out = device_copy(device, *stream, std::vector<std::int32_t>(static_cast<std::size_t>(T * K)), DType::i32, {T, K}, keep);
  const Tensor counts = device_copy(device, *stream, std::vector<std::int32_t>(static_cast<std::size_t>(T)), DType::i32, {T}, keep);
  TopkConvertParams params;
  params.block_size = static_cast<std::int32_t>(bs);

  convert_logical_to_physical_topk(*stream, req_id, table, logical, params, out, counts);
  stream->synchronize();
  const auto want = reference::convert_topk(in);
  if (std::memcmp(out.data(), want.physical.data(), want.physical.size() * 4) != 0 ||
      std::memcmp(counts.data(), want.valid_counts.data(), want.valid_counts.size() * 4) != 0) {
    wrong("top-k conversion");
  }
  for (auto _ : state) {
    convert_logical_to_physical_topk(*stream, req_id, table, logical, params, out, counts);
    stream->synchronize();
  }
  report(state, static_cast<double>(T * K), 4.0 * T * K, 4.0 * T * K + 4.0 * T);
}

// ---- FP8 gather-upconvert: `rows` rows of 8 requests, block size 64 ----

void BM_GatherUpconvertFp8(benchmark::State& state) {
  const std::int64_t rows = state.range(0), batch = 8, bs = 64;
  const std::int64_t blocks_per_request = (rows / batch + bs - 1) / bs;
  Device& device = *host_device();
  auto stream = device.create_stream();
  std::mt19937_64 rng(2);
  reference::Fp8GatherInputs in;
  in.batch = batch, in.total_rows = rows, in.block_size = in.cache_block_size = bs;
  in.blocks_per_request = blocks_per_request;
  in.num_blocks = batch * blocks_per_request;
  in.cache.resize(static_cast<std::size_t>(in.num_blocks * bs) * 656);
  for (auto& b : in.cache) b = static_cast<std::uint8_t>(rng());
  for (std::size_t row = 0; row < in.cache.size() / 656; ++row) {  // finite scales of real data
    for (int g = 0; g < 4; ++g) {
      const float scale = 0.001f + static_cast<float>(rng() % 1000) * 1e-5f;
      std::memcpy(&in.cache[row * 656 + 512 + 4 * static_cast<std::size_t>(g)], &scale, 4);
    }
  }
  in.block_table.resize(static_cast<std::size_t>(in.num_blocks));
  std::iota(in.block_table.begin(), in.block_table.end(), 0);
  std::shuffle(in.block_table.begin(), in.block_table.end(), rng);
  for (std::int64_t r = 0; r < batch; ++r) in.workspace_starts.push_back(static_cast<std::int32_t>(r * rows / batch));
  std::vector<Buffer> keep;
  const Tensor cache = device_copy(device, *stream, in.cache, DType::u8, {in.num_blocks, bs, 656}, keep);
  const Tensor table = device_copy(device, *stream, in.block_table, DType::i32, {batch, blocks_per_request}, keep);
  const Tensor starts = device_copy(device, *stream, in.workspace_starts, DType::i32, {batch}, keep);
  const Tensor dst = device_copy(device, *stream, std::vector<std::uint16_t>(static_cast<std::size_t>(rows * 576)), DType::bf16, {rows, 576}, keep);

  gather_upconvert_fp8(*stream, cache, dst, table, starts, batch);
  stream->synchronize();
  std::vector<std::uint16_t> want(static_cast<std::size_t>(rows * 576));
  reference::gather_upconvert(in, want);
  if (std::memcmp(dst.data(), want.data(), want.size() * 2) != 0) wrong("FP8 gather-upconvert");
  for (auto _ : state) {
    gather_upconvert_fp8(*stream, cache, dst, table, starts, batch);
    stream->synchronize();
  }
  report(state, static_cast<double>(rows * 576), 656.0 * rows, 1152.0 * rows);
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(rows * state.iterations()), benchmark::Counter::kIsRate);
}

// ---- memcpy of n bytes (the kernels' output size), direct and through a stream ----

void BM_Memcpy(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<std::uint8_t> src(n, 1), dst(n, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  report(state, static_cast<double>(n), static_cast<double>(n), static_cast<double>(n));
}

void BM_StreamCopy(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Device& device = *host_device();
  auto stream = device.create_stream();
  Buffer src = device.allocate(n, MemoryKind::device), dst = device.allocate(n, MemoryKind::device);
  stream->fill(src, 0, 1, n);
  for (auto _ : state) {
    stream->copy(dst, 0, src, 0, n);
    stream->synchronize();
  }
  report(state, static_cast<double>(n), static_cast<double>(n), static_cast<double>(n));
}

// T = 64 is a decode batch, 4096 a prefill chunk; 2048 and 65536 rows of
// upconvert likewise. memcpy sizes: the same kernels' output bytes.
BENCHMARK(BM_TopkConvert)->Arg(64)->Arg(4096)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_GatherUpconvertFp8)->Arg(2048)->Arg(65536)->Unit(benchmark::kMicrosecond)->UseRealTime();
void kernel_output_sizes(benchmark::internal::Benchmark* b) {
  b->Arg(64 * 2048 * 4)->Arg(4096 * 2048 * 4)->Arg(2048 * 1152)->Arg(65536 * 1152);
}
BENCHMARK(BM_Memcpy)->Apply(kernel_output_sizes)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_StreamCopy)->Apply(kernel_output_sizes)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
