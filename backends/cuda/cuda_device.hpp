// The CUDA backend's entry points, called by backends/registry.cpp.
#pragma once

#include <memory>
#include <string>

#include "sparse_mla/device.hpp"
#include "sparse_mla/error.hpp"

namespace sparse_mla::cuda {

// Throws Error with unavailable_reason() when there is no device or driver.
std::shared_ptr<Device> open_device(int index);
// "no CUDA device: cudaGetDeviceCount returned cudaErrorNoDevice (...)", or "".
std::string unavailable_reason();
// The Error a failed call gives ("cudaMemcpyAsync: cudaErrorInvalidValue
// (invalid argument)"), for a cudaError_t code; `call` without the prefix.
Error runtime_error(const std::string& call, int code);

}  // namespace sparse_mla::cuda
