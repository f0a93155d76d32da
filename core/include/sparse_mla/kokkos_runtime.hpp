// Kokkos is initialised once, on first use of any backend's kernels, and
// finalised at exit. An application that manages Kokkos itself initialises it
// first; the library then leaves it alone.
#pragma once

#include <string>
#include <vector>

namespace sparse_mla {

// `device_id` >= 0: the GPU whose device is opened first (open_device("cuda",
// N) initialises Kokkos on device N); -1: Kokkos' default. The first call
// decides.
void ensure_kokkos_initialized(int device_id = -1);
// "4.6.1", "3.4.1"
std::string kokkos_version();
// The execution spaces the Kokkos in use was built with, default first:
// {"Cuda", "Serial"}, {"Serial"}.
std::vector<std::string> kokkos_execution_spaces();

}  // namespace sparse_mla
