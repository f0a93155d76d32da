// The HIP backend: the native layer of backends/cuda_hip over libamdhip64.
#include "hip/hip_device.hpp"

#include "cuda_hip/gpu_device.hpp"
#include "hip/hip_runtime.hpp"

namespace sparse_mla::hip {

// gcnArchName carries the target features after the name ("gfx942:sramecc+:xnack-").
std::string Runtime::architecture(const hipDeviceProp_t& prop) {
  const std::string name = prop.gcnArchName;
  return name.substr(0, name.find(':'));
}

std::shared_ptr<Device> open_device(int index) { return gpu::open_device<Runtime>(index); }
std::string unavailable_reason() { return gpu::unavailable_reason<Runtime>(); }
Error runtime_error(const std::string& call, int code) {
  return gpu::runtime_error<Runtime>(call, static_cast<hipError_t>(code));
}

}  // namespace sparse_mla::hip
