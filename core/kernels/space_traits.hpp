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

// Vector length for kernels whose team threads work with vector lanes: a
// warp (32 lanes) on GPUs, one lane on CPUs.
template <class Space>
constexpr int warp_lanes() {
  return is_host_space<Space> ? 1 : 32;
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

// How a position splits into (block, offset) for a block size: a shift and a
// mask when the size is a power of two (every production cache), else a
// division, which costs about twenty instructions (a hundred in 64 bits).
// Positions are non-negative.
struct BlockDivide {
  std::int32_t size;
  KOKKOS_INLINE_FUNCTION std::int32_t block(std::int32_t tok) const { return tok / size; }
  KOKKOS_INLINE_FUNCTION std::int64_t block(std::int64_t pos) const { return pos / size; }
  KOKKOS_INLINE_FUNCTION std::int32_t offset(std::int32_t tok) const { return tok % size; }
};
struct BlockShift {
  std::int32_t shift;
  KOKKOS_INLINE_FUNCTION std::int32_t block(std::int32_t tok) const { return tok >> shift; }
  KOKKOS_INLINE_FUNCTION std::int64_t block(std::int64_t pos) const { return pos >> shift; }
  KOKKOS_INLINE_FUNCTION std::int32_t offset(std::int32_t tok) const { return tok & ((1 << shift) - 1); }
};

// log2(n) when n is a power of two, else -1.
inline int exact_log2(std::int32_t n) {
  for (int s = 0; s < 31; ++s) {
    if (n == (std::int32_t{1} << s)) return s;
  }
  return -1;
}

// Calls f(split) with the cheapest split for `block_size` (> 0).
template <class F>
void with_block_split(std::int32_t block_size, F&& f) {
  const int shift = exact_log2(block_size);
  if (shift >= 0) {
    f(BlockShift{shift});
  } else {
    f(BlockDivide{block_size});
  }
}

}  // namespace sparse_mla::kernels
