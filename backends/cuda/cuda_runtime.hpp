// The CUDA runtime traits (sparse_mla::cuda::Runtime) for the native layer in
// backends/cuda_hip. Compiled with the ordinary host compiler against the
// toolkit's cudart; nothing here needs nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda_hip/gpu_runtime.hpp"

namespace sparse_mla::cuda {

// SPARSE_MLA_CUDA_KERNELS is defined by the build (cmake/SparseMlaGpu.cmake):
// 1 when the Kokkos found has the Cuda execution space, else 0.
SPARSE_MLA_GPU_RUNTIME(cuda, CUDA, HostAlloc, FreeHost, DeviceProp, PointerAttributes, SPARSE_MLA_CUDA_KERNELS);

}  // namespace sparse_mla::cuda
