#include "sparse_mla/kokkos_runtime.hpp"

#include <Kokkos_Core.hpp>

#include <cstdlib>
#include <mutex>

namespace sparse_mla {

namespace {
bool library_initialized_kokkos = false;
void finalize_at_exit() {
  if (library_initialized_kokkos && Kokkos::is_initialized()) Kokkos::finalize();
}
}  // namespace

void ensure_kokkos_initialized(int device_id) {
  static std::once_flag once;
  std::call_once(once, [device_id] {
    if (Kokkos::is_initialized()) return;
#if KOKKOS_VERSION >= 30700
    Kokkos::InitializationSettings settings;
    if (device_id >= 0) settings.set_device_id(device_id);
    Kokkos::initialize(settings);
#else
    Kokkos::InitArguments arguments;
    arguments.device_id = device_id;
    Kokkos::initialize(arguments);
#endif
    library_initialized_kokkos = true;
    std::atexit(finalize_at_exit);
  });
}

std::string kokkos_version() {
  return std::to_string(KOKKOS_VERSION / 10000) + "." + std::to_string(KOKKOS_VERSION / 100 % 100) + "." +
         std::to_string(KOKKOS_VERSION % 100);
}

std::vector<std::string> kokkos_execution_spaces() {
  std::vector<std::string> spaces{Kokkos::DefaultExecutionSpace::name()};
  auto add = [&spaces](const char* name) {
    if (name != spaces.front()) spaces.emplace_back(name);
  };
#ifdef KOKKOS_ENABLE_CUDA
  add(Kokkos::Cuda::name());
#endif
#ifdef KOKKOS_ENABLE_HIP
#if KOKKOS_VERSION >= 40000
  add(Kokkos::HIP::name());
#else
  add(Kokkos::Experimental::HIP::name());
#endif
#endif
#ifdef KOKKOS_ENABLE_OPENMP
  add(Kokkos::OpenMP::name());
#endif
#ifdef KOKKOS_ENABLE_THREADS
  add(Kokkos::Threads::name());
#endif
#ifdef KOKKOS_ENABLE_SERIAL
  add(Kokkos::Serial::name());
#endif
  return spaces;
}

}  // namespace sparse_mla
