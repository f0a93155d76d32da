// The Kokkos kernels of core/kernels on Kokkos::Cuda. Compiled only when the
// Kokkos found was built with Kokkos_ENABLE_CUDA (SPARSE_MLA_CUDA_KERNELS=1).
#include "cuda/cuda_runtime.hpp"
#include "cuda_hip/gpu_exec.hpp"

namespace sparse_mla::cuda {

const Kernels& Runtime::kokkos_kernels() { return gpu::kokkos_kernels<Kokkos::Cuda, Runtime>(); }

}  // namespace sparse_mla::cuda
