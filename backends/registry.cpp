// Opens a device by backend name, from the backends compiled into this build.
#include <string>
#include <vector>

#include "host/host_device.hpp"
#include "sparse_mla/device.hpp"
#include "sparse_mla/kokkos_runtime.hpp"
#include "sparse_mla/error.hpp"

#ifdef SPARSE_MLA_WITH_CUDA
#include "cuda/cuda_device.hpp"
#endif
#ifdef SPARSE_MLA_WITH_HIP
#include "hip/hip_device.hpp"
#endif

namespace sparse_mla {

std::vector<std::string> compiled_backends() {
  std::vector<std::string> names{"host"};
#ifdef SPARSE_MLA_WITH_CUDA
  names.emplace_back("cuda");
#endif
#ifdef SPARSE_MLA_WITH_HIP
  names.emplace_back("hip");
#endif
  return names;
}

std::string backend_unavailable_reason(const std::string& backend) {
  // The host backend's kernels need Kokkos, which a GPU-enabled build can
  // start only where its GPU is.
  if (backend == "host") return kokkos_unavailable_reason();
#ifdef SPARSE_MLA_WITH_CUDA
  if (backend == "cuda") return cuda::unavailable_reason();
#endif
#ifdef SPARSE_MLA_WITH_HIP
  if (backend == "hip") return hip::unavailable_reason();
#endif
  if (backend == "cuda" || backend == "hip") return "the " + backend + " backend is not compiled into this build";
  return "unknown backend '" + backend + "' (known: host, cuda, hip)";
}

std::shared_ptr<Device> open_device(const std::string& backend, int index) {
  if (backend == "host") return host::open_host_device(index);
#ifdef SPARSE_MLA_WITH_CUDA
  if (backend == "cuda") return cuda::open_device(index);
#endif
#ifdef SPARSE_MLA_WITH_HIP
  if (backend == "hip") return hip::open_device(index);
#endif
  fail("open_device", backend_unavailable_reason(backend));
}

}  // namespace sparse_mla
