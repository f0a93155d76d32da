// An empty kernel of one block, in a translation unit that does not include
// Kokkos, whose module holds a __constant__ array of
// SPARSE_MLA_CONSTANT_BYTES (none when 0). The ctypes library
// (convert_ctypes.cpp) links this file compiled three times: no constant
// memory, 256 bytes, and 32 KiB, the size of the buffer that Kokkos 4.6
// defines in every CUDA translation unit that includes it
// (kokkos_impl_cuda_constant_memory_buffer, for its constant-memory
// launches), so the library's own kernels carry one in their module.
// reference_convert.py times the three beside an empty kernel of the
// library's translation unit and an empty Triton kernel: what a module's
// constant memory adds to every launch of its kernels (docs/PERFORMANCE.md).
#include <cuda_runtime.h>

#ifndef SPARSE_MLA_CONSTANT_BYTES
#error "SPARSE_MLA_CONSTANT_BYTES: the bytes of __constant__ memory in this module"
#endif

#define SPARSE_MLA_CAT2(a, b) a##b
#define SPARSE_MLA_CAT(a, b) SPARSE_MLA_CAT2(a, b)

#if SPARSE_MLA_CONSTANT_BYTES > 0
// Declared as Kokkos declares its buffer (external linkage, never read
// here): the compiler keeps it in the module.
__device__ __constant__ unsigned long SPARSE_MLA_CAT(sparse_mla_module_constant_,
                                                    SPARSE_MLA_CONSTANT_BYTES)[SPARSE_MLA_CONSTANT_BYTES / sizeof(unsigned long)];
#endif

namespace {
__global__ void empty_kernel() {}
}  // namespace

// One block of `threads`; 0 or the CUDA error code.
extern "C" int SPARSE_MLA_CAT(sparse_mla_ctypes_empty_constant_, SPARSE_MLA_CONSTANT_BYTES)(void* stream, int threads) {
  empty_kernel<<<1, threads, 0, static_cast<cudaStream_t>(stream)>>>();
  return static_cast<int>(cudaGetLastError());
}
