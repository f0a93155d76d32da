// The launch policy of core/kernels/kokkos_kernels.hpp for a GPU backend,
// written once over the Kokkos execution space (Kokkos::Cuda, Kokkos::HIP)
// and the runtime traits R (gpu_runtime.hpp). Included only by
// backends/<api>/<api>_kernels.cpp, which is compiled only when the Kokkos
// found has that execution space.
//
// bind() runs once per stream (Device::create_stream): it makes the Kokkos
// instance that runs on our native stream, which stays ours (Kokkos does not
// destroy it), and keeps it in the GpuStream (GpuStream::kernel_instance).
// launch() only reads it: creating an instance allocates and synchronises,
// which would break CUDA graph capture and cost a round trip per kernel.
#pragma once

#include <Kokkos_Core.hpp>

#include <memory>

#include "cuda_hip/gpu_device.hpp"
#include "kokkos_kernels.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/kokkos_runtime.hpp"

namespace sparse_mla::gpu {

template <class Space, class R>
struct GpuExec {
  using execution_space = Space;

  struct Context {
    Space space;
    int device;
  };

  // Kokkos 4.2 replaced the (stream, bool manage) constructor by one taking
  // Impl::ManageStream; before that the one-argument form leaves the stream
  // unmanaged.
  static Space instance_on(typename R::stream_t stream) {
#if KOKKOS_VERSION >= 40200
    return Space(stream, Kokkos::Impl::ManageStream::no);
#else
    return Space(stream);
#endif
  }

  static void bind(Stream& stream) {
    GpuStream<R>& gpu = as_gpu_stream<R>(stream, "Kernels::bind");
    // Kokkos reads the device from the stream and may make it current.
    DeviceGuard<R> guard(gpu.device_index());
    gpu.set_kernel_instance(std::make_shared<Context>(Context{instance_on(gpu.native()), gpu.device_index()}));
  }

  // Every stream of a device of this backend is a GpuStream<R>.
  static const Context& context(const Stream& stream) {
    if (stream.device().backend() != R::backend) {
      fail("Kernels::launch", "the stream belongs to the ", backend_name(stream.device().backend()), " backend, not ",
           backend_name(R::backend));
    }
    const auto& gpu = static_cast<const GpuStream<R>&>(stream);
    const auto* bound = static_cast<const Context*>(gpu.kernel_instance().get());
    if (bound == nullptr) {
      fail("Kernels::launch", "the ", backend_name(R::backend), " stream has no Kokkos instance bound to it");
    }
    return *bound;
  }

  template <class F>
  static void launch(Stream& stream, F f) {
    const Context& c = context(stream);
    DeviceGuard<R> guard(c.device);
    f(c.space);
  }
};

// The backend's Kernels: one instance, made on first use (which initialises
// Kokkos, so only once a device is known to exist).
template <class Space, class R>
const Kernels& kokkos_kernels() {
  ensure_kokkos_initialized();
  static const kernels::KokkosKernels<GpuExec<Space, R>> instance;
  return instance;
}

}  // namespace sparse_mla::gpu
