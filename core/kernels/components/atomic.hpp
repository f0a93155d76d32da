// Atomics on team scratch (and global memory), relaxed, as Kokkos' are. The
// native ones let the compiler use shared-memory atomics for level-0 scratch;
// Kokkos' are inline assembly on a generic address, which it cannot narrow.
#pragma once

#include <cstdint>

#include "compat.hpp"

namespace sparse_mla::kernels::device {

KOKKOS_INLINE_FUNCTION std::uint32_t atomic_cas(std::uint32_t* p, std::uint32_t expected, std::uint32_t desired) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  return atomicCAS(p, expected, desired);
#else
  return Kokkos::atomic_compare_exchange(p, expected, desired);
#endif
}
KOKKOS_INLINE_FUNCTION void atomic_min(std::uint32_t* p, std::uint32_t value) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  atomicMin(p, value);
#else
  Kokkos::atomic_fetch_min(p, value);
#endif
}
KOKKOS_INLINE_FUNCTION std::uint32_t atomic_max(std::uint32_t* p, std::uint32_t value) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  return atomicMax(p, value);
#else
  return Kokkos::atomic_fetch_max(p, value);
#endif
}
// 64 bits, on global memory too.
KOKKOS_INLINE_FUNCTION std::uint64_t atomic_cas(std::uint64_t* p, std::uint64_t expected, std::uint64_t desired) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  using Word = unsigned long long;
  static_assert(sizeof(Word) == sizeof(std::uint64_t), "64-bit words");
  return atomicCAS(reinterpret_cast<Word*>(p), static_cast<Word>(expected), static_cast<Word>(desired));
#else
  return Kokkos::atomic_compare_exchange(p, expected, desired);
#endif
}

}  // namespace sparse_mla::kernels::device
