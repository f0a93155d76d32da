#include "sparse_mla/kokkos_runtime.hpp"

#include <Kokkos_Core.hpp>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "sparse_mla/error.hpp"

namespace sparse_mla {

namespace {
// Kokkos' messages run over many lines (a backtrace, advice); the first says what failed.
std::string first_line(const std::string& text) {
  const std::size_t end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}
}  // namespace

namespace {
bool library_initialized_kokkos = false;
std::string initialize_failure;  // what Kokkos::initialize threw, once
void finalize_at_exit() {
  if (library_initialized_kokkos && Kokkos::is_initialized()) Kokkos::finalize();
}
}  // namespace

void ensure_kokkos_initialized(int device_id) {
  static std::once_flag once;
  std::call_once(once, [device_id] {
    if (Kokkos::is_initialized()) return;
    try {
#if KOKKOS_VERSION >= 30700
      Kokkos::InitializationSettings settings;
      if (device_id >= 0) settings.set_device_id(device_id);
      Kokkos::initialize(settings);
#else
      Kokkos::InitArguments arguments;
      arguments.device_id = device_id;
      Kokkos::initialize(arguments);
#endif
    } catch (const std::exception& e) {
      initialize_failure = e.what();
      if (initialize_failure.empty()) initialize_failure = "Kokkos::initialize threw";
      return;
    }
    library_initialized_kokkos = true;
    std::atexit(finalize_at_exit);
  });
  if (!initialize_failure.empty()) {
    fail("ensure_kokkos_initialized", "Kokkos cannot start without its device: ", first_line(initialize_failure));
  }
}

std::string kokkos_unavailable_reason() {
  try {
    ensure_kokkos_initialized();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

namespace {
std::atomic<std::uint64_t> kokkos_allocations{0};
std::atomic<std::uint64_t> kokkos_fences{0};
thread_local bool fences_count_here = false;

void count_allocation(const Kokkos_Profiling_SpaceHandle, const char*, const void*, const uint64_t) {
  kokkos_allocations.fetch_add(1, std::memory_order_relaxed);
}
void count_fence(const char*, const uint32_t, uint64_t* handle) {
  if (handle != nullptr) *handle = 0;
  if (fences_count_here) kokkos_fences.fetch_add(1, std::memory_order_relaxed);
}
void end_fence(uint64_t) {}
}  // namespace

void start_counting_kokkos_activity() {
  ensure_kokkos_initialized();
  Kokkos::Tools::Experimental::set_allocate_data_callback(&count_allocation);
  Kokkos::Tools::Experimental::set_begin_fence_callback(&count_fence);
  Kokkos::Tools::Experimental::set_end_fence_callback(&end_fence);
}

void count_kokkos_fences_on_this_thread(bool enabled) { fences_count_here = enabled; }

KokkosActivity kokkos_activity() {
  return KokkosActivity{kokkos_allocations.load(std::memory_order_relaxed), kokkos_fences.load(std::memory_order_relaxed)};
}

std::string kokkos_version() {
  return std::to_string(KOKKOS_VERSION / 10000) + "." + std::to_string(KOKKOS_VERSION / 100 % 100) + "." +
         std::to_string(KOKKOS_VERSION % 100);
}

std::string device_primitives() {
#if defined(SPARSE_MLA_PORTABLE_PRIMITIVES)
  return "portable";
#else
  return "native";
#endif
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
