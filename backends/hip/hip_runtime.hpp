// The HIP runtime traits (sparse_mla::hip::Runtime) for the native layer in
// backends/cuda_hip. The runtime API header compiles with the ordinary host
// compiler (g++) once the platform is named; hipcc and amdclang++ name it
// themselves.
#pragma once

#if !defined(__HIP_PLATFORM_AMD__) && !defined(__HIP_PLATFORM_NVIDIA__)
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_runtime_api.h>

#include "cuda_hip/gpu_runtime.hpp"

namespace sparse_mla::hip {

// SPARSE_MLA_HIP_KERNELS is defined by the build (cmake/SparseMlaGpu.cmake):
// 1 when the Kokkos found has the HIP execution space, else 0.
SPARSE_MLA_GPU_RUNTIME(hip, HIP, HostMalloc, HostFree, DeviceProp_t, PointerAttribute_t, SPARSE_MLA_HIP_KERNELS);

}  // namespace sparse_mla::hip
