// What the kernels need to know about an execution space, and the 16-byte
// vector type they load and store with.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

namespace sparse_mla::kernels {

// True for spaces that run on the CPU: there a team is one thread, and the
// kernels use plain loops instead of wide teams.
template <class Space>
constexpr bool is_host_space = std::is_same<typename Space::memory_space, Kokkos::HostSpace>::value;

// Team size for kernels that give one team a row of work.
template <class Space>
constexpr int row_team_size(int gpu_threads) {
  return is_host_space<Space> ? 1 : gpu_threads;
}

// 16 bytes, loaded and stored as one unit on GPUs (ld.global.v4).
#if defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define SPARSE_MLA_MAY_ALIAS __attribute__((__may_alias__))
#else
#define SPARSE_MLA_MAY_ALIAS
#endif
struct SPARSE_MLA_MAY_ALIAS Int4 {
  alignas(16) std::int32_t x;
  std::int32_t y, z, w;
};
static_assert(sizeof(Int4) == 16 && alignof(Int4) == 16, "Int4 is one 16-byte unit");

KOKKOS_INLINE_FUNCTION bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

}  // namespace sparse_mla::kernels
