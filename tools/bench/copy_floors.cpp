// Floors under the benchmark's cases (docs/PERFORMANCE.md): plain CUDA
// kernels that move exactly the bytes of a case and do nothing else, timed
// the way `sparse-mla bench` times (median per launch over CUDA graph
// replays, inputs rotated through 200 MiB), beside the same run's copy
// ceiling.
//
//   build/cuda/bin/sparse-mla-floors
//
// - A conversion row at K = 2048 is 8 KiB read and 8 KiB written: the copy
//   kernels copy T such rows, one block per row (the conversion's layout)
//   with the conversion's shapes, and a driver copy (a graph memcpy node)
//   moves the same bytes. A conversion also loads its request id and block
//   table and counts, so it cannot take less time than these.
// - An upconverted row reads 656 bytes and writes 1152: upconvert_traffic
//   reads every byte of contiguous rows and writes every output byte (fp8
//   bytes widened, RoPE copied), one 16-byte unit per thread and no page
//   lookup, block table or arithmetic worth the name: the most this mix of
//   reads and writes moves on this device.
//
// Built only in CUDA builds (a Kokkos with CUDA); not part of the library.
// Every kernel's output is checked against a host loop before it is timed.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda_timing.hpp"

namespace {

using sparse_mla::bench::check;
using sparse_mla::bench::time_graph;

constexpr std::size_t row_bytes = 2048 * 4;  // a conversion row: K = 2048 int32
constexpr std::size_t cache_row = 656;       // fp8_ds_mla: 512 fp8, 4 float scales, 64 bf16 RoPE
constexpr std::size_t output_row = 1152;     // 576 bf16
constexpr std::size_t rotate_bytes = std::size_t{200} << 20;

// Rotation sets of `set_bytes` each: enough to pass through 200 MiB.
int sets_for(std::size_t set_bytes) {
  return static_cast<int>(std::clamp<std::size_t>((rotate_bytes + set_bytes - 1) / set_bytes, 1, 16384));
}

// T rows of 8 KiB, one block per row: THREADS threads, IN_FLIGHT 16-byte
// loads issued before any store.
template <int THREADS, int IN_FLIGHT>
__global__ void __launch_bounds__(THREADS) copy_rows(const int4* __restrict__ in, int4* __restrict__ out, int units) {
  const int4* src = in + static_cast<long long>(blockIdx.x) * units;
  int4* dst = out + static_cast<long long>(blockIdx.x) * units;
  for (int q0 = static_cast<int>(threadIdx.x); q0 < units; q0 += THREADS * IN_FLIGHT) {
    int4 v[IN_FLIGHT];
#pragma unroll
    for (int u = 0; u < IN_FLIGHT; ++u) {
      if (q0 + u * THREADS < units) v[u] = __ldg(src + q0 + u * THREADS);
    }
#pragma unroll
    for (int u = 0; u < IN_FLIGHT; ++u) {
      if (q0 + u * THREADS < units) dst[q0 + u * THREADS] = v[u];
    }
  }
}

// Two fp8 bytes of `w` (selected by `pair`) widened to two 16-bit halves,
// xor the scale word (so that the scale load is used).
__host__ __device__ inline std::uint32_t widen(std::uint32_t w, int pair, std::uint32_t scale) {
  const std::uint32_t lo = (w >> (16 * pair)) & 0xFFu, hi = (w >> (16 * pair + 8)) & 0xFFu;
  return (lo | hi << 16) ^ scale;
}

// Read-only loads of 16 and 4 bytes; Wide ones ask the L2 to fetch the
// whole 256-byte block from DRAM, as the library's many-page upconvert does.
template <bool Wide>
__device__ int4 load_int4(const std::uint8_t* p) {
  if constexpr (Wide) {
    int4 v;
    asm volatile("ld.global.nc.L2::256B.v4.s32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
  }
  return __ldg(reinterpret_cast<const int4*>(p));
}
template <bool Wide>
__device__ int load_int(const std::uint8_t* p) {
  if constexpr (Wide) {
    int v;
    asm volatile("ld.global.nc.L2::256B.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
  }
  return __ldg(reinterpret_cast<const int*>(p));
}

// One thread per 16-byte unit of a row, 40 a row: unit k < 32 reads 16 fp8
// bytes and their scale and writes 32 bytes; unit k >= 32 copies 16 RoPE
// bytes. Rows are contiguous in the cache and in the output.
constexpr int traffic_threads = 256;
template <bool Wide>
__global__ void __launch_bounds__(traffic_threads)
    upconvert_traffic(const std::uint8_t* __restrict__ cache, std::uint8_t* __restrict__ out, long long units) {
  const long long u = static_cast<long long>(blockIdx.x) * traffic_threads + threadIdx.x;
  if (u >= units) return;
  const long long row = u / 40;
  const int k = static_cast<int>(u % 40);
  const std::uint8_t* src = cache + row * static_cast<long long>(cache_row);
  std::uint8_t* dst = out + row * static_cast<long long>(output_row);
  if (k < 32) {
    const int4 v = load_int4<Wide>(src + 16 * k);
    const auto s = static_cast<std::uint32_t>(load_int<Wide>(src + 512 + 4 * (k / 8)));
    const auto x = static_cast<std::uint32_t>(v.x), y = static_cast<std::uint32_t>(v.y);
    const auto z = static_cast<std::uint32_t>(v.z), w = static_cast<std::uint32_t>(v.w);
    auto* o = reinterpret_cast<int4*>(dst + 32 * k);
    o[0] = make_int4(static_cast<int>(widen(x, 0, s)), static_cast<int>(widen(x, 1, s)), static_cast<int>(widen(y, 0, s)),
                     static_cast<int>(widen(y, 1, s)));
    o[1] = make_int4(static_cast<int>(widen(z, 0, s)), static_cast<int>(widen(z, 1, s)), static_cast<int>(widen(w, 0, s)),
                     static_cast<int>(widen(w, 1, s)));
  } else {
    *reinterpret_cast<int4*>(dst + 1024 + 16 * (k - 32)) = load_int4<Wide>(src + 528 + 16 * (k - 32));
  }
}

// The host model of upconvert_traffic for one row.
std::vector<std::uint8_t> traffic_row(const std::uint8_t* src) {
  std::vector<std::uint8_t> out(output_row);
  for (int k = 0; k < 32; ++k) {
    std::uint32_t scale, in[4];
    std::copy_n(src + 512 + 4 * (k / 8), 4, reinterpret_cast<std::uint8_t*>(&scale));
    std::copy_n(src + 16 * k, 16, reinterpret_cast<std::uint8_t*>(in));
    for (int i = 0; i < 8; ++i) {
      const std::uint32_t word = widen(in[i / 2], i % 2, scale);
      std::copy_n(reinterpret_cast<const std::uint8_t*>(&word), 4, out.data() + 32 * k + 4 * i);
    }
  }
  std::copy_n(src + 528, 128, out.data() + 1024);
  return out;
}

// Device buffers of `sets` rotation sets, the first set's input random.
struct Buffers {
  std::size_t in_bytes, out_bytes;
  int sets;
  std::uint8_t *in = nullptr, *out = nullptr;
  std::vector<std::uint8_t> host_in;
  Buffers(std::size_t in_set, std::size_t out_set, int num_sets) : in_bytes(in_set), out_bytes(out_set), sets(num_sets) {
    check(cudaMalloc(&in, in_bytes * static_cast<std::size_t>(sets)), "cudaMalloc");
    check(cudaMalloc(&out, out_bytes * static_cast<std::size_t>(sets)), "cudaMalloc");
    host_in.resize(in_bytes);
    std::uint64_t x = 0x9E3779B97F4A7C15ULL ^ in_bytes;
    for (auto& b : host_in) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      b = static_cast<std::uint8_t>(x);
    }
    for (int s = 0; s < sets; ++s) {
      check(cudaMemcpy(input(s), host_in.data(), in_bytes, cudaMemcpyHostToDevice), "upload");
    }
  }
  ~Buffers() {
    cudaFree(in);
    cudaFree(out);
  }
  std::uint8_t* input(int s) const { return in + in_bytes * static_cast<std::size_t>(s); }
  std::uint8_t* output(int s) const { return out + out_bytes * static_cast<std::size_t>(s); }
  std::vector<std::uint8_t> poisoned_output0_after(cudaStream_t stream, const std::function<void(int)>& launch) const {
    check(cudaMemsetAsync(out, 0xA5, out_bytes, stream), "poison");
    launch(0);
    std::vector<std::uint8_t> got(out_bytes);
    check(cudaMemcpyAsync(got.data(), out, out_bytes, cudaMemcpyDeviceToHost, stream), "download");
    check(cudaStreamSynchronize(stream), "check run");
    return got;
  }
};

struct Row {
  std::string name;
  double us;
  double bytes;  // read + written
  std::string check;
};

void print(const Row& r, double ceiling) {
  const double gbs = r.bytes / (r.us * 1e3);
  std::printf("%-52s %10.2f %10.1f %8.0f%%  %s\n", r.name.c_str(), r.us, gbs, 100 * gbs / ceiling, r.check.c_str());
}

int launches_for(int sets, int at_least) { return sets * ((at_least + sets - 1) / sets); }

}  // namespace

int main() {
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  std::printf("%-52s %10s %10s %9s  %s\n", "floor", "us", "GB/s", "ceiling", "check");

  // The copy ceiling, as `sparse-mla bench` measures it: 200 MiB each way.
  double ceiling = 0;
  {
    const std::size_t bytes = rotate_bytes;
    Buffers b(bytes, bytes, 1);
    const double us = time_graph(stream, 10, 1, [&](int s) {
      check(cudaMemcpyAsync(b.output(s), b.input(s), bytes, cudaMemcpyDeviceToDevice, stream), "copy");
    });
    ceiling = 2.0 * static_cast<double>(bytes) / (us * 1e3);
    print({"device copy, 200 MiB (the ceiling)", us, 2.0 * static_cast<double>(bytes), "-"}, ceiling);
  }

  int status = 0;
  for (const int T : {1, 256, 1024}) {
    const std::size_t bytes = row_bytes * static_cast<std::size_t>(T);
    const int sets = sets_for(2 * bytes);
    Buffers b(bytes, bytes, sets);
    const int units = static_cast<int>(row_bytes / 16);
    auto rows = [&](auto kernel, int threads) {
      return [&, kernel, threads](int s) {
        kernel<<<T, threads, 0, stream>>>(reinterpret_cast<const int4*>(b.input(s)), reinterpret_cast<int4*>(b.output(s)),
                                          units);
      };
    };
    const std::vector<std::pair<std::string, std::function<void(int)>>> kernels = {
        {"memcpy node", [&](int s) {
           check(cudaMemcpyAsync(b.output(s), b.input(s), bytes, cudaMemcpyDeviceToDevice, stream), "copy");
         }},
        {"copy, block per row, 512 x 1", rows(copy_rows<512, 1>, 512)},
        {"copy, block per row, 256 x 2", rows(copy_rows<256, 2>, 256)},
        {"copy, block per row, 128 x 4", rows(copy_rows<128, 4>, 128)},
    };
    for (const auto& [name, launch] : kernels) {
      const bool same = b.poisoned_output0_after(stream, launch) == b.host_in;
      status |= same ? 0 : 1;
      const double us = time_graph(stream, launches_for(sets, 200), sets, launch);
      print({"T=" + std::to_string(T) + " rows of 8 KiB: " + name, us, 2.0 * static_cast<double>(bytes), same ? "ok" : "DIFFERS"},
            ceiling);
    }
  }

  for (const long long rows : {2048LL, 524288LL}) {
    const int sets = sets_for(static_cast<std::size_t>(rows) * (cache_row + output_row));
    Buffers b(static_cast<std::size_t>(rows) * cache_row, static_cast<std::size_t>(rows) * output_row, sets);
    const long long units = rows * 40;
    const auto blocks = static_cast<unsigned>((units + traffic_threads - 1) / traffic_threads);
    const std::vector<std::pair<std::string, std::function<void(int)>>> kernels = {
        {"plain loads",
         [&](int s) { upconvert_traffic<false><<<blocks, traffic_threads, 0, stream>>>(b.input(s), b.output(s), units); }},
        {"256-byte fetches",
         [&](int s) { upconvert_traffic<true><<<blocks, traffic_threads, 0, stream>>>(b.input(s), b.output(s), units); }},
    };
    for (const auto& [name, launch] : kernels) {
      const std::vector<std::uint8_t> got = b.poisoned_output0_after(stream, launch);
      std::string verdict = "ok";
      for (long long r = 0; r < rows && verdict == "ok"; r += rows > 65536 ? 7 : 1) {
        const std::vector<std::uint8_t> want = traffic_row(b.host_in.data() + r * static_cast<long long>(cache_row));
        if (!std::equal(want.begin(), want.end(), got.begin() + r * static_cast<long long>(output_row))) {
          verdict = "row " + std::to_string(r) + " DIFFERS";
          status = 1;
        }
      }
      const double us = time_graph(stream, launches_for(sets, rows > 65536 ? 20 : 200), sets, launch);
      print({std::to_string(rows) + " rows, 656 B read + 1152 B written each, " + name, us,
             static_cast<double>(rows) * static_cast<double>(cache_row + output_row), verdict},
            ceiling);
    }
  }
  check(cudaStreamDestroy(stream), "stream");
  return status;
}
