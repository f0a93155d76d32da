// Kokkos is initialised once, on first use of any backend's kernels, and
// finalised at exit. An application that manages Kokkos itself initialises it
// first; the library then leaves it alone.
#pragma once

#include <string>

namespace sparse_mla {

void ensure_kokkos_initialized();
// "4.6.1", "3.4.1"
std::string kokkos_version();

}  // namespace sparse_mla
