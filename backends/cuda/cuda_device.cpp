// The CUDA backend: the native layer of backends/cuda_hip over cudart.
#include "cuda/cuda_device.hpp"

#include "cuda/cuda_runtime.hpp"
#include "cuda_hip/gpu_device.hpp"

namespace sparse_mla::cuda {

std::string Runtime::architecture(const cudaDeviceProp& prop) {
  return "sm_" + std::to_string(prop.major * 10 + prop.minor);
}

std::shared_ptr<Device> open_device(int index) { return gpu::open_device<Runtime>(index); }
std::string unavailable_reason() { return gpu::unavailable_reason<Runtime>(); }
Error runtime_error(const std::string& call, int code) {
  return gpu::runtime_error<Runtime>(call, static_cast<cudaError_t>(code));
}

}  // namespace sparse_mla::cuda
