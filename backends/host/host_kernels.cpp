// The Kokkos kernels of core/kernels, instantiated for the host backend.
//
// A kernel runs on the stream's worker thread, in stream order. Kokkos's host
// execution space must not be entered from two threads at once (Kokkos 3.4's
// Serial space keeps global state), so entry is serialised by one mutex; the
// queues keep their ordering because each queue runs its tasks one by one.
#include <Kokkos_Core.hpp>

#include <mutex>

#include "host_device.hpp"
#include "kokkos_kernels.hpp"
#include "sparse_mla/kokkos_runtime.hpp"

namespace sparse_mla::host {

namespace {

std::mutex& kokkos_entry() {
  static std::mutex mutex;
  return mutex;
}

struct HostExec {
  using execution_space = Kokkos::DefaultHostExecutionSpace;

  static void bind(Stream&) {}

  template <class F>
  static void launch(Stream& stream, F f) {
    HostStream& host_stream = as_host_stream(stream, "host kernel launch");
    host_stream.enqueue([f] {
      std::lock_guard<std::mutex> lock(kokkos_entry());
      f(execution_space());
      execution_space().fence();
    });
  }
};

}  // namespace

const Kernels& host_kernels() {
  ensure_kokkos_initialized();
  static const kernels::KokkosKernels<HostExec> instance;
  return instance;
}

}  // namespace sparse_mla::host
