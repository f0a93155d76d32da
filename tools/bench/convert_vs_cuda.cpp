// The top-k conversion's Kokkos kernel next to plain CUDA kernels of the same
// algorithm, on the same data, timed the same way (median per launch over
// CUDA graph replays, inputs rotated): how much of a miss in
// docs/PERFORMANCE.md is the Kokkos form and how much the algorithm.
//
//   build/cuda/bin/sparse-mla-convert-vs-cuda
//   CVC_T=256 CVC_V="kokkos 256" build/cuda/bin/sparse-mla-convert-vs-cuda   # one T, matching kernels
//
// It also runs the library's kernel at other team shapes (threads x units
// in flight), which is how convert_split() chose its shapes, the DCP
// kernels (compacted, rank 3 of 8) at every compaction and shape it
// chooses among (`CVC_V=dcp`), and the
// reference engine's Triton kernel written in CUDA, with switches that undo
// its differences from ours one at a time. Its rotation is short (32 sets
// at T <= 256, about 256 KiB), so small-T inputs stay in the L2:
// `sparse-mla bench`, which rotates over 200 MiB, gives the figures in
// docs/PERFORMANCE.md; this program compares kernels with each other.
//
// Built only in CUDA builds (a Kokkos with CUDA); not part of the library.
// Every kernel's output is checked against a scalar loop before it is timed.
#include <Kokkos_Core.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda_timing.hpp"
#include "topk_convert.hpp"

namespace {

using Space = Kokkos::Cuda;
constexpr int K = 2048;                 // DeepSeek-V3.2's top-k
constexpr int block_size = 64;          // rows per page (the raw kernels shift by 6)
constexpr int blocks_per_request = 512;  // a 32768-token context
constexpr int requests = 128;

using sparse_mla::bench::check;
using sparse_mla::bench::time_graph;

__global__ void empty_kernel() {}

// One block per token, THREADS threads, each converting IN_FLIGHT 16-byte
// units whose loads are issued before any is used; the count is a warp
// shuffle sum, then one barrier.
template <int THREADS, int IN_FLIGHT>
__global__ void __launch_bounds__(THREADS)
    raw_convert(const int* __restrict__ req, const int* __restrict__ table, const int4* __restrict__ in,
                int4* __restrict__ out, int* __restrict__ counts, int units) {
  const int t = static_cast<int>(blockIdx.x);
  const int* row = table + static_cast<long long>(__ldg(req + t)) * blocks_per_request;
  const int4* src = in + static_cast<long long>(t) * units;
  int4* dst = out + static_cast<long long>(t) * units;
  int count = 0;
  for (int q0 = static_cast<int>(threadIdx.x); q0 < units; q0 += THREADS * IN_FLIGHT) {
    int4 v[IN_FLIGHT];
#pragma unroll
    for (int u = 0; u < IN_FLIGHT; ++u) {
      if (q0 + u * THREADS < units) v[u] = __ldg(src + q0 + u * THREADS);
    }
#pragma unroll
    for (int u = 0; u < IN_FLIGHT; ++u) {
      const int q = q0 + u * THREADS;
      if (q >= units) break;
      int r[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int tok = r[i];
        const int b = tok >> 6;
        const bool inside = tok >= 0 && b < blocks_per_request;
        const int start = __ldg(row + (inside ? b : 0));
        r[i] = inside ? start * block_size + (tok & (block_size - 1)) : -1;
        count += r[i] != -1;
      }
      dst[q] = make_int4(r[0], r[1], r[2], r[3]);
    }
  }
  for (int o = 16; o > 0; o >>= 1) count += __shfl_xor_sync(0xffffffffu, count, o);
  __shared__ int partial[THREADS / 32];
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = count;
  __syncthreads();
  if (threadIdx.x < 32) {
    int sum = threadIdx.x < THREADS / 32 ? partial[threadIdx.x] : 0;
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (threadIdx.x == 0) counts[t] = sum;
  }
}

// The reference engine's Triton kernel (vLLM's
// _convert_req_index_to_global_index_kernel at K = 2048 with counts) written
// in CUDA, for K = 2048 at 256 threads x 2 units only: one straight-line
// block, the valid count taken from the indices alone and warp-summed while
// the table loads are in flight, the table loads predicated, 32-bit row
// arithmetic. Loaded from a cubin and timed beside Triton in one process
// (H200) it matched Triton at T = 1 and 256 and beat it by 7-8% at
// T = 1024, where raw 256 x 2 above, loaded the same way, was 0.33 us slower
// at T = 1. The library's Convert lacked this structure (0.15-0.2 us at
// T = 1) besides a leaner launch (Kokkos' wrapper, and the constant memory
// Kokkos puts in every translation unit's module, 0.107 us a launch: this
// file's kernels pay it too, the cubin did not); the library's ConvertRounds
// has most of the structure for rows of whole rounds. Timed in this program
// on the H200: 1.47 / 2.70 / 5.62 us at T = 1 / 256 / 1024.
//
// Three switches undo one difference each from the library's kernel, to find
// which of them cost (all true is the kernel as measured; on the H200: 0.02,
// 0.01 and 0.07 us at T = 1, 0.05, 0.19 and 0.20 at T = 1024, all three
// 0.09 and 0.79):
//   CountFirst: the count from the indices, warp-summed before the table
//     loads are used (else from the outputs after the stores, as the library);
//   Predicated: a table load only for a valid entry (else entry 0 for an
//     invalid one, branch-free, as the library);
//   FixedShape: page size, valid range and row stride compile-time constants
//     (else kernel arguments and 64-bit row offsets, as the library).
struct RuntimeShape {
  int shift;
  unsigned limit;
  long long row_stride;
  int stride_rows;
};

template <bool CountFirst, bool Predicated, bool FixedShape>
__global__ void __launch_bounds__(256)
    triton_like_convert(const int* __restrict__ req_id, const int* __restrict__ table, const int4* __restrict__ in,
                        int4* __restrict__ out, int* __restrict__ counts, int units, RuntimeShape shape) {
  const int t = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int req = req_id[t];
  const int4 a = in[t * units + tid];
  const int4 b = in[t * units + tid + 256];
  const int* row = FixedShape ? table + req * blocks_per_request : table + req * shape.row_stride;
  const unsigned limit = FixedShape ? static_cast<unsigned>(blocks_per_request * block_size) : shape.limit;
  const int shift = FixedShape ? 6 : shape.shift;
  const int stride_rows = FixedShape ? block_size : shape.stride_rows;
  const int v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  bool ok[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) ok[i] = static_cast<unsigned>(v[i]) < limit;
  __shared__ int partial[8];
  if (CountFirst) {
    int valid = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) valid += ok[i];
    const int warp_valid = __reduce_add_sync(0xffffffffu, valid);
    if ((tid & 31) == 0) partial[tid >> 5] = warp_valid;
  }
  int start[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (Predicated) {
      start[i] = 0;
      if (ok[i]) start[i] = row[v[i] >> shift];
    } else {
      start[i] = row[(v[i] >> shift) & -static_cast<int>(ok[i])];
    }
  }
  int r[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) r[i] = ok[i] ? start[i] * stride_rows + (v[i] & ((1 << shift) - 1)) : -1;
  out[t * units + tid] = make_int4(r[0], r[1], r[2], r[3]);
  out[t * units + tid + 256] = make_int4(r[4], r[5], r[6], r[7]);
  if (!CountFirst) {
    int valid = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) valid += r[i] != -1;
    const int warp_valid = __reduce_add_sync(0xffffffffu, valid);
    if ((tid & 31) == 0) partial[tid >> 5] = warp_valid;
  }
  __syncthreads();
  if (tid < 32) {
    const int sum = __reduce_add_sync(0xffffffffu, tid < 8 ? partial[tid] : 0);
    if (tid == 0) counts[t] = sum;
  }
}

// The library's kernel at a team shape of our choosing (threads x N units
// in flight), for choosing the shapes convert_split() launches.
namespace shapes {
template <int N>
void launch(const Space& space, const sparse_mla::TopkConvertArgs& a, int threads) {
  using namespace sparse_mla::kernels;
  const auto p = topk::params_of(a, BlockShift::of(64));  // block_size 64
  topk::launch<Space, Int4, N>(space, p, topk::NoDcp{}, a.num_tokens, threads);
}
}  // namespace shapes

// The library's compacted DCP kernels (rank 3 of 8, interleave 1: the split
// of `sparse-mla bench`'s DCP figures) at the compactions and team shapes
// convert_split() chooses among.
namespace dcp_shapes {
using sparse_mla::kernels::topk::Compaction;
constexpr int size = 8, rank = 3, interleave = 1;
using Dcp = sparse_mla::kernels::topk::Dcp<true>;

sparse_mla::TopkConvertArgs with_dcp(sparse_mla::TopkConvertArgs a) {
  a.dcp_size = size;
  a.dcp_rank = rank;
  a.dcp_interleave = interleave;
  a.dcp_compact = true;
  return a;
}
template <int Threads, int N, Compaction How, bool Shifts>
void rounds(const Space& space, const sparse_mla::TopkConvertArgs& a) {
  using namespace sparse_mla::kernels;
  const auto p = topk::params_of(a, BlockShift::of(64));
  const Dcp dcp = Dcp::of(size, rank, interleave);
  const bool launched = Shifts ? topk::launch_rounds<Space, Threads, N, How>(space, p, dcp.shifted(), a.num_tokens, K / 4)
                               : topk::launch_rounds<Space, Threads, N, How>(space, p, dcp, a.num_tokens, K / 4);
  if (!launched) check(cudaErrorInvalidConfiguration, "launch_rounds: not whole rounds");
}
template <int Threads, int N>
void convert(const Space& space, const sparse_mla::TopkConvertArgs& a) {
  using namespace sparse_mla::kernels;
  topk::launch<Space, Int4, N>(space, topk::params_of(a, BlockShift::of(64)), Dcp::of(size, rank, interleave),
                               a.num_tokens, Threads);
}
}  // namespace dcp_shapes

struct EmptyTeam {
  KOKKOS_INLINE_FUNCTION void operator()(const Kokkos::TeamPolicy<Space>::member_type&) const {}
};

// Inputs like `sparse-mla bench`'s: token t reads request t % 128's row of a
// shuffled block table; about 3% of positions are -1.
struct Inputs {
  int tokens, sets;
  std::vector<int> req, table, logical;
  int *d_req = nullptr, *d_table = nullptr, *d_in = nullptr, *d_out = nullptr, *d_counts = nullptr;

  Inputs(int num_tokens, int num_sets) : tokens(num_tokens), sets(num_sets) {
    std::mt19937 rng(static_cast<unsigned>(num_tokens));
    req.resize(static_cast<std::size_t>(tokens));
    for (int i = 0; i < tokens; ++i) req[static_cast<std::size_t>(i)] = i % std::min(tokens, requests);
    table.resize(static_cast<std::size_t>(requests) * blocks_per_request);
    for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int>(i);
    std::shuffle(table.begin(), table.end(), rng);
    logical.resize(static_cast<std::size_t>(tokens) * K);
    for (int& x : logical) {
      const unsigned d = rng() % 3276800u;
      x = d < 98304u ? -1 : static_cast<int>(d % 32768u);
    }
    const std::size_t entries = static_cast<std::size_t>(tokens) * K;
    check(cudaMalloc(&d_req, req.size() * 4), "cudaMalloc");
    check(cudaMalloc(&d_table, table.size() * 4), "cudaMalloc");
    check(cudaMalloc(&d_in, entries * 4 * static_cast<std::size_t>(sets)), "cudaMalloc");
    check(cudaMalloc(&d_out, entries * 4 * static_cast<std::size_t>(sets)), "cudaMalloc");
    check(cudaMalloc(&d_counts, static_cast<std::size_t>(tokens) * 4 * static_cast<std::size_t>(sets)), "cudaMalloc");
    check(cudaMemcpy(d_req, req.data(), req.size() * 4, cudaMemcpyHostToDevice), "upload");
    check(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "upload");
    for (int s = 0; s < sets; ++s) {
      check(cudaMemcpy(d_in + entries * static_cast<std::size_t>(s), logical.data(), entries * 4, cudaMemcpyHostToDevice),
            "upload");
    }
  }
  ~Inputs() {
    cudaFree(d_req);
    cudaFree(d_table);
    cudaFree(d_in);
    cudaFree(d_out);
    cudaFree(d_counts);
  }
  std::size_t entries() const { return static_cast<std::size_t>(tokens) * K; }
  int* in(int s) const { return d_in + entries() * static_cast<std::size_t>(s); }
  int* out(int s) const { return d_out + entries() * static_cast<std::size_t>(s); }
  int* counts(int s) const { return d_counts + static_cast<std::size_t>(tokens) * static_cast<std::size_t>(s); }

  sparse_mla::TopkConvertArgs args(int s, bool with_counts) const {
    sparse_mla::TopkConvertArgs a{};
    a.req_id = d_req;
    a.block_table = d_table;
    a.block_table_stride = blocks_per_request;
    a.blocks_per_request = blocks_per_request;
    a.logical = in(s);
    a.logical_stride = K;
    a.physical = out(s);
    a.physical_stride = K;
    a.valid_counts = with_counts ? counts(s) : nullptr;
    a.num_tokens = tokens;
    a.num_topk = K;
    a.block_size = block_size;
    a.block_stride_rows = block_size;
    return a;
  }

  // Token t's row for a position in its request's table (every position the
  // inputs hold is inside it).
  int row_of(int t, int position) const {
    return table[static_cast<std::size_t>(req[static_cast<std::size_t>(t)]) * blocks_per_request +
                 static_cast<std::size_t>(position / block_size)] * block_size + position % block_size;
  }

  // "" or the first difference from the scalar conversion.
  std::string compare(bool with_counts) const {
    std::vector<int> physical(entries()), valid(static_cast<std::size_t>(tokens));
    check(cudaMemcpy(physical.data(), out(0), entries() * 4, cudaMemcpyDeviceToHost), "download");
    check(cudaMemcpy(valid.data(), counts(0), valid.size() * 4, cudaMemcpyDeviceToHost), "download");
    for (int t = 0; t < tokens; ++t) {
      int count = 0;
      for (int j = 0; j < K; ++j) {
        const std::size_t e = static_cast<std::size_t>(t) * K + static_cast<std::size_t>(j);
        const int tok = logical[e];
        const int want = tok < 0 ? -1 : row_of(t, tok);
        count += want != -1;
        if (physical[e] != want) return "physical[" + std::to_string(t) + ", " + std::to_string(j) + "] differs";
      }
      if (with_counts && valid[static_cast<std::size_t>(t)] != count) return "count of token " + std::to_string(t) + " differs";
    }
    return "";
  }

  // The same for dcp_shapes' split, compacted (SPEC section 2a): a row's
  // owned positions, localized and converted, in input order, then -1.
  std::string compare_dcp() const {
    using namespace dcp_shapes;
    std::vector<int> physical(entries()), valid(static_cast<std::size_t>(tokens));
    check(cudaMemcpy(physical.data(), out(0), entries() * 4, cudaMemcpyDeviceToHost), "download");
    check(cudaMemcpy(valid.data(), counts(0), valid.size() * 4, cudaMemcpyDeviceToHost), "download");
    for (int t = 0; t < tokens; ++t) {
      int count = 0;
      const std::size_t row = static_cast<std::size_t>(t) * K;
      for (int j = 0; j < K; ++j) {
        const int tok = logical[row + static_cast<std::size_t>(j)];
        if (tok < 0 || (tok / interleave) % size != rank) continue;
        const int local = tok / (size * interleave) * interleave + tok % interleave;
        if (physical[row + static_cast<std::size_t>(count++)] != row_of(t, local)) {
          return "physical[" + std::to_string(t) + ", " + std::to_string(count - 1) + "] differs";
        }
      }
      for (int j = count; j < K; ++j) {
        if (physical[row + static_cast<std::size_t>(j)] != -1) return "tail of token " + std::to_string(t) + " not -1";
      }
      if (valid[static_cast<std::size_t>(t)] != count) return "count of token " + std::to_string(t) + " differs";
    }
    return "";
  }
};

}  // namespace

int main(int argc, char** argv) {
  Kokkos::initialize(argc, argv);
  int status = 0;
  {
    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    const Space space(stream, Kokkos::Impl::ManageStream::no);
    std::printf("%-8s %-26s %10s %10s  %s\n", "T", "kernel", "us", "GB/s", "check");
    const char* only_t = std::getenv("CVC_T");
    const char* only_v = std::getenv("CVC_V");
    for (const int T : {1, 132, 256, 480, 1024, 8192, 32768}) {
      if (only_t && std::atoi(only_t) != T) continue;
      const int sets = T >= 8192 ? 2 : (T >= 1024 ? 8 : 32);
      Inputs in(T, sets);
      const int units = K / 4;
      auto raw = [&](auto kernel, int threads) {
        return [&, kernel, threads](int s) {
          kernel<<<T, threads, 0, stream>>>(in.d_req, in.d_table, reinterpret_cast<const int4*>(in.in(s)),
                                             reinterpret_cast<int4*>(in.out(s)), in.counts(s), units);
        };
      };
      // K = 2048 at 256 threads only (units == 512).
      auto tri = [&](auto kernel) {
        return [&, kernel](int s) {
          const RuntimeShape shape{6, static_cast<unsigned>(blocks_per_request * block_size), blocks_per_request, block_size};
          kernel<<<T, 256, 0, stream>>>(in.d_req, in.d_table, reinterpret_cast<const int4*>(in.in(s)),
                                        reinterpret_cast<int4*>(in.out(s)), in.counts(s), units, shape);
        };
      };
      enum class Check { none, plain, counts, dcp };
      struct Variant {
        std::string name;
        std::function<void(int)> launch;
        Check check;
      };
      using dcp_shapes::Compaction;
      // A launch of dcp_shapes' split on input set s.
      auto dcp = [&](auto launcher) {
        return [&, launcher](int s) { launcher(space, dcp_shapes::with_dcp(in.args(s, true))); };
      };
      const std::vector<Variant> variants = {
          {"kokkos (library)", [&](int s) { sparse_mla::kernels::convert_topk(space, in.args(s, true)); }, Check::counts},
          {"kokkos, no counts", [&](int s) { sparse_mla::kernels::convert_topk(space, in.args(s, false)); }, Check::plain},
          {"kokkos 256 x 2 units", [&](int s) { shapes::launch<2>(space, in.args(s, true), 256); }, Check::counts},
          {"kokkos 512 x 1 unit", [&](int s) { shapes::launch<1>(space, in.args(s, true), 512); }, Check::counts},
          {"kokkos 128 x 4 units", [&](int s) { shapes::launch<4>(space, in.args(s, true), 128); }, Check::counts},
          {"kokkos 512 x 2 units", [&](int s) { shapes::launch<2>(space, in.args(s, true), 512); }, Check::counts},
          {"kokkos 128 x 2 units", [&](int s) { shapes::launch<2>(space, in.args(s, true), 128); }, Check::counts},
          {"raw 512 x 1 unit", raw(raw_convert<512, 1>, 512), Check::counts},
          {"raw 256 x 2 units", raw(raw_convert<256, 2>, 256), Check::counts},
          {"raw 128 x 4 units", raw(raw_convert<128, 4>, 128), Check::counts},
          {"triton-like 256 x 2 units", tri(triton_like_convert<true, true, true>), Check::counts},
          {"triton-like, count after stores", tri(triton_like_convert<false, true, true>), Check::counts},
          {"triton-like, unpredicated loads", tri(triton_like_convert<true, false, true>), Check::counts},
          {"triton-like, runtime shape", tri(triton_like_convert<true, true, false>), Check::counts},
          {"triton-like, none of the three", tri(triton_like_convert<false, false, false>), Check::counts},
          {"kokkos empty team kernel",
           [&](int) {
             Kokkos::TeamPolicy<Space> policy(space, T, 16, 32);
             policy.set_scratch_size(0, Kokkos::PerTeam(64));
             Kokkos::parallel_for(policy, EmptyTeam{});
           },
           Check::none},
          {"raw empty kernel", [&](int) { empty_kernel<<<T, 512, 0, stream>>>(); }, Check::none},
          {"dcp (library)", dcp(sparse_mla::kernels::convert_topk<Space>), Check::dcp},
          {"dcp gather 512 x 1", dcp(dcp_shapes::rounds<512, 1, Compaction::gather, true>), Check::dcp},
          {"dcp gather 512 x 1, division", dcp(dcp_shapes::rounds<512, 1, Compaction::gather, false>), Check::dcp},
          {"dcp gather 256 x 1", dcp(dcp_shapes::rounds<256, 1, Compaction::gather, true>), Check::dcp},
          {"dcp stage 256 x 1", dcp(dcp_shapes::rounds<256, 1, Compaction::stage, false>), Check::dcp},
          {"dcp stage 256 x 1, shifts", dcp(dcp_shapes::rounds<256, 1, Compaction::stage, true>), Check::dcp},
          {"dcp stage 512 x 1", dcp(dcp_shapes::rounds<512, 1, Compaction::stage, false>), Check::dcp},
          {"dcp stage 256 x 2", dcp(dcp_shapes::rounds<256, 2, Compaction::stage, false>), Check::dcp},
          {"dcp stage 256 x 2, shifts", dcp(dcp_shapes::rounds<256, 2, Compaction::stage, true>), Check::dcp},
          {"dcp convert 128 x 2", dcp(dcp_shapes::convert<128, 2>), Check::dcp},
          {"dcp convert 256 x 2", dcp(dcp_shapes::convert<256, 2>), Check::dcp},
          {"dcp convert 128 x 4", dcp(dcp_shapes::convert<128, 4>), Check::dcp},
      };
      for (const Variant& v : variants) {
        if (only_v && v.name.find(only_v) == std::string::npos) continue;
        std::string verdict = "-";
        if (v.check != Check::none) {
          check(cudaMemsetAsync(in.out(0), 0xA5, in.entries() * 4, stream), "poison");
          check(cudaMemsetAsync(in.counts(0), 0xA5, static_cast<std::size_t>(T) * 4, stream), "poison");
          v.launch(0);
          check(cudaStreamSynchronize(stream), "check run");
          verdict = v.check == Check::dcp ? in.compare_dcp() : in.compare(v.check == Check::counts);
          if (!verdict.empty()) status = 1;
          if (verdict.empty()) verdict = "ok";
        }
        const double us = time_graph(stream, T >= 8192 ? 20 : 200, sets, v.launch);
        const double gbs = (8.0 * T * K + 4.0 * T) / (us * 1e3);
        std::printf("%-8d %-26s %10.2f %10.0f  %s\n", T, v.name.c_str(), us, gbs, verdict.c_str());
      }
    }
    check(cudaStreamDestroy(stream), "stream");
  }
  Kokkos::finalize();
  return status;
}
