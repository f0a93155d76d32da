// What the kernels need to know about an execution space, and how they split
// positions into blocks.
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

// Whether Space is Kokkos::Cuda.
template <class Space>
constexpr bool is_cuda_space =
#if defined(KOKKOS_ENABLE_CUDA)
    std::is_same<Space, Kokkos::Cuda>::value;
#else
    false;
#endif

// Launch bounds measured on CUDA: `MinTeams` teams of `Threads` an SM, which
// caps the registers a thread may use (docs/PERFORMANCE.md has the figures).
// Elsewhere only the team size is bounded: AMD's compiler reads the same
// minimum as a register cap for an occupancy the kernel was not written for
// (gfx90a: 64 VGPRs, and spills), and no AMD GPU has measured a better one.
template <class Space, unsigned Threads, unsigned MinTeams>
using MeasuredLaunchBounds = Kokkos::LaunchBounds<Threads, is_cuda_space<Space> ? MinTeams : 1>;

KOKKOS_INLINE_FUNCTION bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

// How a non-negative position splits into (block, offset) for a block size,
// with what the kernel knows at compile time (`By`):
// - shift: the size is a power of two (every production cache): a shift and
//   a mask;
// - divide: any size: a division, about twenty instructions (a hundred in 64
//   bits);
// - either: decided per call by a branch on the shift, for kernels with
//   several block sizes, each combination of which would be another kernel.
// with_block_split() picks shift or divide for a launch.
enum class SplitBy { shift, divide, either };

// log2(n) when n is a power of two, else -1.
inline int exact_log2(std::int32_t n) {
  for (int s = 0; s < 31; ++s) {
    if (n == (std::int32_t{1} << s)) return s;
  }
  return -1;
}

// What a split keeps: the shift, the size, or both (a kernel's parameters
// stay as small as they were for the first two).
template <SplitBy By>
struct SplitFields {
  std::int32_t size;
  std::int32_t shift;  // log2(size), or -1
};
template <>
struct SplitFields<SplitBy::shift> {
  std::int32_t shift;
};
template <>
struct SplitFields<SplitBy::divide> {
  std::int32_t size;
};

template <SplitBy By>
struct BlockSplit : SplitFields<By> {
  static BlockSplit of(std::int32_t size) {
    BlockSplit split{};
    if constexpr (By != SplitBy::divide) split.shift = exact_log2(size);
    if constexpr (By != SplitBy::shift) split.size = size;
    return split;
  }
  KOKKOS_INLINE_FUNCTION bool shifts() const {
    if constexpr (By == SplitBy::either) return this->shift >= 0;
    return By == SplitBy::shift;
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION T divide(T x) const {
    if constexpr (By == SplitBy::shift) {
      return x >> this->shift;
    } else if constexpr (By == SplitBy::divide) {
      return x / this->size;
    } else {
      return this->shift >= 0 ? x >> this->shift : x / this->size;
    }
  }
  KOKKOS_INLINE_FUNCTION std::int32_t block(std::int32_t x) const { return divide(x); }
  KOKKOS_INLINE_FUNCTION std::int64_t block(std::int64_t x) const { return divide(x); }
  KOKKOS_INLINE_FUNCTION std::int32_t offset(std::int32_t x) const {
    if constexpr (By == SplitBy::shift) {
      return x & ((std::int32_t{1} << this->shift) - 1);
    } else if constexpr (By == SplitBy::divide) {
      return x % this->size;
    } else {
      return this->shift >= 0 ? x & ((std::int32_t{1} << this->shift) - 1) : x % this->size;
    }
  }
};
using BlockShift = BlockSplit<SplitBy::shift>;
using BlockDivide = BlockSplit<SplitBy::divide>;

// Division of n in [0, 2^31) by a fixed d in [1, 2^31] as a multiply and
// a shift (Granlund and Montgomery, "Division by invariant integers using
// multiplication", 1994, theorem 4.2): with l = ceil(log2 d) and
// m = ceil(2^(31 + l) / d), which fits in 32 bits, n / d = (n * m) >> (31 + l)
// for every n < 2^31. A power of two is m = 1 and a plain shift.
struct FastDivide {
  std::uint32_t m = 1;
  std::uint32_t s = 0;
  static FastDivide of(std::int64_t d) {
    std::uint32_t l = 0;
    while ((std::uint64_t{1} << l) < static_cast<std::uint64_t>(d)) ++l;
    if ((std::int64_t{1} << l) == d) return FastDivide{1, l};
    const std::uint64_t k = 31 + l;
    return FastDivide{static_cast<std::uint32_t>(((std::uint64_t{1} << k) + static_cast<std::uint64_t>(d) - 1) / static_cast<std::uint64_t>(d)),
                      static_cast<std::uint32_t>(k)};
  }
  KOKKOS_INLINE_FUNCTION std::uint32_t div(std::uint32_t n) const {
    return static_cast<std::uint32_t>((std::uint64_t{n} * m) >> s);
  }
};

// Calls f(split) with the cheapest split for `block_size` (> 0).
template <class F>
void with_block_split(std::int32_t block_size, F&& f) {
  if (BlockSplit<SplitBy::either>::of(block_size).shifts()) {
    f(BlockShift::of(block_size));
  } else {
    f(BlockDivide::of(block_size));
  }
}

}  // namespace sparse_mla::kernels
