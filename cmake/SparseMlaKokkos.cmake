# Finds Kokkos like any user's build would, and repairs what Debian's
# Kokkos 3.4 (libtrilinos-kokkos-dev) gets wrong, without touching the system:
# its Kokkos::kokkos target points its include directory at <prefix>/include
# (/usr/lib/include), which does not exist; the headers are in
# Kokkos_INCLUDE_DIRS (/usr/include/trilinos).
find_package(Threads REQUIRED)
find_package(Kokkos REQUIRED)
include(${CMAKE_CURRENT_LIST_DIR}/SparseMlaKokkosFixup.cmake)
sparse_mla_fix_kokkos_target()
message(STATUS "sparse-mla: Kokkos ${Kokkos_VERSION} (CUDA: ${Kokkos_ENABLE_CUDA}, HIP: ${Kokkos_ENABLE_HIP})")
