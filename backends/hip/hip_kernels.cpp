// The Kokkos kernels of core/kernels on the Kokkos HIP space. Compiled only
// when the Kokkos found was built with Kokkos_ENABLE_HIP (SPARSE_MLA_HIP_KERNELS=1).
#include "hip/hip_runtime.hpp"  // first: it names the HIP platform

#include "cuda_hip/gpu_exec.hpp"

namespace sparse_mla::hip {

#if KOKKOS_VERSION >= 40000
using Space = Kokkos::HIP;
#else
using Space = Kokkos::Experimental::HIP;
#endif

const Kernels& Runtime::kokkos_kernels() { return gpu::kokkos_kernels<Space, Runtime>(); }

}  // namespace sparse_mla::hip
