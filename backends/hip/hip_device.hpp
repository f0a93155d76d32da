// The HIP backend's entry points, called by backends/registry.cpp. Same
// contract as backends/cuda/cuda_device.hpp, for hipError_t codes.
#pragma once

#include <memory>
#include <string>

#include "sparse_mla/device.hpp"
#include "sparse_mla/error.hpp"

namespace sparse_mla::hip {

std::shared_ptr<Device> open_device(int index);
std::string unavailable_reason();  // "no HIP device: hipGetDeviceCount returned hipErrorNoDevice", or ""
Error runtime_error(const std::string& call, int code);

}  // namespace sparse_mla::hip
