// The library's top-k conversion kernel behind a C interface, built as a
// shared library for Python's ctypes, so that tools/bench/reference_convert.py
// (--ours) can time it beside the reference engine's Triton kernel in one
// process by one method: the same CUDA graphs, the same inputs, outputs from
// the same allocator. Comparing two programs' figures (ours from
// `sparse-mla bench`, the reference's from Python) had flattered us: the
// same kernel launched from Python measured 0.33-0.41 us a launch slower
// than in `sparse-mla bench` (H200).
//
// The kernel is launched as the library launches it (kernels::convert_topk
// on a Kokkos::Cuda instance bound to the caller's stream); the library's
// argument checks and Tensor plumbing are host work that a graph replay
// never repeats. A CUDA build target outside `all`, because a shared
// library needs a Kokkos built with position-independent code
// (-DCMAKE_POSITION_INDEPENDENT_CODE=ON):
//   cmake --build --preset cuda --target sparse-mla-convert-ctypes
//   python3 tools/bench/reference_convert.py sparse_utils.py --ours build/cuda/lib/libsparse-mla-convert-ctypes.so
#include <Kokkos_Core.hpp>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>

#include "kernels.hpp"
#include "topk_convert.hpp"

namespace {

using Space = Kokkos::Cuda;

// One Kokkos instance per caller stream, made on the stream's first call.
// Making one allocates and synchronises, so the first call must not be
// inside a graph capture (sparse_mla_ctypes_convert refuses then).
std::map<cudaStream_t, Space>& instances() {
  static std::map<cudaStream_t, Space> bound;
  return bound;
}

__global__ void empty_kernel() {}

}  // namespace

extern "C" {

// 0 once Kokkos is initialised (on the current CUDA device).
int sparse_mla_ctypes_init() {
  if (!Kokkos::is_initialized()) Kokkos::initialize();
  return 0;
}

// Releases the instances and finalises Kokkos.
void sparse_mla_ctypes_finalize() {
  instances().clear();
  if (Kokkos::is_initialized()) Kokkos::finalize();
}

// physical[t, j] and valid_counts[t] of SPEC section 2 for K = num_topk
// entries a token, block_stride_rows = block_size, no prefill workspace.
// Returns 0, a CUDA error code, or -1 for a stream first seen during a
// capture (call once outside the capture first).
// With dcp_size > 1 the DCP filter-and-convert of SPEC section 2a (rank
// dcp_rank, dcp_interleave, compacted when dcp_compact is not 0); -2 for a
// split the library's entry point refuses (this one calls the kernel
// directly, so it checks the split itself).
int sparse_mla_ctypes_convert_dcp(void* stream, const std::int32_t* req_id, const std::int32_t* block_table,
                                  std::int64_t block_table_stride, std::int32_t blocks_per_request,
                                  const std::int32_t* logical, std::int32_t* physical, std::int32_t* valid_counts,
                                  std::int64_t num_tokens, std::int32_t num_topk, std::int32_t block_size,
                                  std::int32_t dcp_size, std::int32_t dcp_rank, std::int32_t dcp_interleave,
                                  std::int32_t dcp_compact) {
  if (dcp_size < 1 || (dcp_size > 1 && (dcp_rank < 0 || dcp_rank >= dcp_size || dcp_interleave <= 0 ||
                                        block_size % dcp_interleave != 0))) {
    return -2;
  }
  auto native = static_cast<cudaStream_t>(stream);
  auto found = instances().find(native);
  if (found == instances().end()) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(native, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) return -1;
    found = instances().emplace(native, Space(native, Kokkos::Impl::ManageStream::no)).first;
  }
  sparse_mla::TopkConvertArgs a{};
  a.req_id = req_id;
  a.block_table = block_table;
  a.block_table_stride = block_table_stride;
  a.blocks_per_request = blocks_per_request;
  a.logical = logical;
  a.logical_stride = num_topk;
  a.physical = physical;
  a.physical_stride = num_topk;
  a.valid_counts = valid_counts;
  a.num_tokens = num_tokens;
  a.num_topk = num_topk;
  a.block_size = block_size;
  a.block_stride_rows = block_size;
  a.dcp_size = dcp_size;
  a.dcp_rank = dcp_rank;
  a.dcp_interleave = dcp_interleave;
  a.dcp_compact = dcp_compact != 0;
  sparse_mla::kernels::convert_topk(found->second, a);
  return static_cast<int>(cudaGetLastError());
}

int sparse_mla_ctypes_convert(void* stream, const std::int32_t* req_id, const std::int32_t* block_table,
                              std::int64_t block_table_stride, std::int32_t blocks_per_request,
                              const std::int32_t* logical, std::int32_t* physical, std::int32_t* valid_counts,
                              std::int64_t num_tokens, std::int32_t num_topk, std::int32_t block_size) {
  return sparse_mla_ctypes_convert_dcp(stream, req_id, block_table, block_table_stride, blocks_per_request, logical,
                                       physical, valid_counts, num_tokens, num_topk, block_size, 1, 0, 1, 0);
}

// An empty kernel of one block of `threads` in this translation unit, which
// includes Kokkos as the library's kernel sources do: the launch floor of a
// kernel whose module holds Kokkos' 32 KiB constant-memory buffer (and
// desul's lock pointers, also __constant__). The
// sparse_mla_ctypes_empty_constant_* kernels (empty_kernel.cpp) are the same
// without Kokkos, with 0, 256 or 32768 bytes of constant memory.
int sparse_mla_ctypes_empty(void* stream, int threads) {
  empty_kernel<<<1, threads, 0, static_cast<cudaStream_t>(stream)>>>();
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
