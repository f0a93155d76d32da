// Kokkos is initialised once, on first use of any backend's kernels, and
// finalised at exit. An application that manages Kokkos itself initialises it
// first; the library then leaves it alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sparse_mla {

// `device_id` >= 0: the GPU whose device is opened first (open_device("cuda",
// N) initialises Kokkos on device N); -1: Kokkos' default. The first call
// decides.
// A Kokkos built with a GPU backend cannot start on a machine without that
// GPU, even for the host backend: then this and every later call throws
// Error ("Kokkos cannot start without its device: ...").
void ensure_kokkos_initialized(int device_id = -1);
// Why Kokkos cannot start, or "" when it has (initialising it if needed).
std::string kokkos_unavailable_reason();
// "4.6.1", "3.4.1"
std::string kokkos_version();
// The execution spaces the Kokkos in use was built with, default first:
// {"Cuda", "Serial"}, {"Serial"}.
std::vector<std::string> kokkos_execution_spaces();

// How this build's kernels were compiled: "native" (the CUDA and HIP forms of
// the device primitives on GPUs) or "portable" (SPARSE_MLA_PORTABLE_PRIMITIVES:
// the portable Kokkos forms everywhere).
std::string device_primitives();

// What Kokkos itself reports through its Tools interface, counted from when
// start_counting_kokkos_activity() was called: allocations (on any thread)
// and fences begun on threads that count them (count_kokkos_fences_on_this_thread).
// With Device::activity() it is the counting hook that proves a step path
// allocates nothing and never waits (SPEC section 7).
struct KokkosActivity {
  std::uint64_t allocations = 0;
  std::uint64_t fences = 0;
};
// Installs the counting callbacks (after initialising Kokkos). They replace
// any Kokkos Tools callbacks for allocations and fences that a profiler set:
// for tests and integration checks, not production runs.
void start_counting_kokkos_activity();
// Whether fences begun on the calling thread count. A host stream's own
// kernels fence on its worker thread, which is stream work, not a wait of the
// thread that drives the step; so only the driving thread opts in.
void count_kokkos_fences_on_this_thread(bool enabled);
KokkosActivity kokkos_activity();

}  // namespace sparse_mla
