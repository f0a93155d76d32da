// The runtime-traits type that the GPU native layer (gpu_device.hpp,
// gpu_exec.hpp) is written against, generated once for both runtimes.
//
// The CUDA and HIP runtime APIs mirror each other name for name
// (cudaMemcpyAsync / hipMemcpyAsync, cudaStreamNonBlocking /
// hipStreamNonBlocking, ...), so the traits are made by pasting the API prefix
// onto each name instead of being written out twice. A backend's runtime
// header (backends/cuda/cuda_runtime.hpp, backends/hip/hip_runtime.hpp)
// includes its runtime API header and expands SPARSE_MLA_GPU_RUNTIME once,
// naming the few things that are spelt differently:
//
//   SPARSE_MLA_GPU_RUNTIME(api, Label, HostAlloc, FreeHost, DeviceProp, PointerAttributes, kernels)
//     api         cuda | hip: the prefix of every runtime name, and the Backend enumerator
//     Label       CUDA | HIP: used in messages ("no CUDA device: ...")
//     HostAlloc   cudaHostAlloc / hipHostMalloc (the mapped and portable flags
//                 share that name: cudaHostAllocMapped / hipHostMallocMapped)
//     FreeHost    cudaFreeHost / hipHostFree
//     DeviceProp  cudaDeviceProp / hipDeviceProp_t
//     PointerAttributes  cudaPointerAttributes / hipPointerAttribute_t
//     kernels     1 when this build compiles the backend's Kokkos kernels
//                 (backends/<api>/<api>_kernels.cpp), else 0
//
// It defines `struct Runtime` in the current namespace. The backend defines
// the two members that differ in substance: Runtime::architecture() (in
// <api>_device.cpp) and Runtime::kokkos_kernels() (in <api>_kernels.cpp, only
// compiled when kernels is 1).
//
// Every runtime function is forwarded unchecked (it returns the runtime's
// error code); gpu_device.hpp checks the codes and names the call in errors.
#pragma once

#include <string>

#include "sparse_mla/device.hpp"
#include "kernels.hpp"

// One forwarding member: Runtime::MemcpyAsync(...) calls cudaMemcpyAsync(...).
#define SPARSE_MLA_GPU_FORWARD(api, Fn) \
  template <class... Args>              \
  static error_t Fn(Args... args) {     \
    return api##Fn(args...);            \
  }

#define SPARSE_MLA_GPU_RUNTIME(api, Label, HostAlloc, FreeHost, DeviceProp, PointerAttributes, kernels) \
  struct Runtime {                                                                                 \
    using error_t = api##Error_t;                                                                  \
    using stream_t = api##Stream_t;                                                                \
    using event_t = api##Event_t;                                                                  \
    using device_prop_t = api##DeviceProp;                                                         \
    using pointer_attributes_t = api##PointerAttributes;                                           \
    using graph_t = api##Graph_t;                                                                  \
    using graph_exec_t = api##GraphExec_t;                                                         \
                                                                                                   \
    static constexpr ::sparse_mla::Backend backend = ::sparse_mla::Backend::api;                   \
    static constexpr const char* prefix = #api;   /* names of calls: prefix + "MemcpyAsync" */    \
    static constexpr const char* label = #Label;  /* "no CUDA device" */                          \
    static constexpr bool has_kernels = (kernels) != 0;                                            \
    static constexpr error_t success = api##Success;                                               \
    static constexpr error_t not_ready = api##ErrorNotReady;                                       \
    static constexpr unsigned stream_non_blocking = api##StreamNonBlocking;                        \
    static constexpr unsigned event_disable_timing = api##EventDisableTiming;                      \
    static constexpr unsigned event_default = api##EventDefault;                                   \
    /* Our own thread may make no unsafe call (an allocation, a sync) while */                     \
    /* it captures; other threads are not affected. */                                             \
    static constexpr auto capture_mode = api##StreamCaptureModeThreadLocal;                        \
    using capture_status_t = api##StreamCaptureStatus;                                             \
    static constexpr auto capture_none = api##StreamCaptureStatusNone;                             \
    static constexpr auto memcpy_default = api##MemcpyDefault;                                     \
                                                                                                   \
    static const char* error_name(error_t error) { return api##GetErrorName(error); }              \
    static const char* error_string(error_t error) { return api##GetErrorString(error); }          \
                                                                                                   \
    SPARSE_MLA_GPU_FORWARD(api, GetLastError)                                                      \
    SPARSE_MLA_GPU_FORWARD(api, GetDeviceCount)                                                    \
    SPARSE_MLA_GPU_FORWARD(api, GetDeviceProperties)                                               \
    SPARSE_MLA_GPU_FORWARD(api, GetDevice)                                                         \
    SPARSE_MLA_GPU_FORWARD(api, SetDevice)                                                         \
    SPARSE_MLA_GPU_FORWARD(api, Malloc)                                                            \
    SPARSE_MLA_GPU_FORWARD(api, Free)                                                              \
    SPARSE_MLA_GPU_FORWARD(api, HostGetDevicePointer)                                              \
    SPARSE_MLA_GPU_FORWARD(api, PointerGetAttributes)                                              \
    SPARSE_MLA_GPU_FORWARD(api, StreamCreateWithFlags)                                             \
    SPARSE_MLA_GPU_FORWARD(api, StreamDestroy)                                                     \
    SPARSE_MLA_GPU_FORWARD(api, StreamSynchronize)                                                 \
    SPARSE_MLA_GPU_FORWARD(api, StreamWaitEvent)                                                   \
    SPARSE_MLA_GPU_FORWARD(api, MemcpyAsync)                                                       \
    SPARSE_MLA_GPU_FORWARD(api, MemsetAsync)                                                       \
    SPARSE_MLA_GPU_FORWARD(api, StreamAddCallback)                                                 \
    SPARSE_MLA_GPU_FORWARD(api, EventCreateWithFlags)                                              \
    SPARSE_MLA_GPU_FORWARD(api, EventDestroy)                                                      \
    SPARSE_MLA_GPU_FORWARD(api, EventRecord)                                                       \
    SPARSE_MLA_GPU_FORWARD(api, EventQuery)                                                        \
    SPARSE_MLA_GPU_FORWARD(api, EventSynchronize)                                                  \
    SPARSE_MLA_GPU_FORWARD(api, EventElapsedTime)                                                  \
    SPARSE_MLA_GPU_FORWARD(api, StreamBeginCapture)                                                \
    SPARSE_MLA_GPU_FORWARD(api, StreamEndCapture)                                                  \
    SPARSE_MLA_GPU_FORWARD(api, StreamIsCapturing)                                                 \
    SPARSE_MLA_GPU_FORWARD(api, GraphInstantiateWithFlags)                                         \
    SPARSE_MLA_GPU_FORWARD(api, GraphLaunch)                                                       \
    SPARSE_MLA_GPU_FORWARD(api, GraphExecDestroy)                                                  \
    SPARSE_MLA_GPU_FORWARD(api, GraphDestroy)                                                      \
                                                                                                   \
    /* Page-locked host memory, mapped into every device's address space. */                       \
    static constexpr const char* host_alloc_call = #HostAlloc;                                     \
    static error_t HostAllocMapped(void** data, std::size_t bytes) {                               \
      return api##HostAlloc(data, bytes, api##HostAlloc##Mapped | api##HostAlloc##Portable);       \
    }                                                                                              \
    static error_t HostFree(void* data) { return api##FreeHost(data); }                            \
                                                                                                   \
    /* "sm_90", "gfx942": defined by the backend. */                                               \
    static std::string architecture(const device_prop_t& prop);                                    \
    /* The backend's Kokkos kernels; defined only when has_kernels. */                             \
    static const ::sparse_mla::Kernels& kokkos_kernels();                                          \
  }
