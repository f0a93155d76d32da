// Lane groups: the native forms work on groups of 32 consecutive team ranks
// (a team of vector length 1 lays its ranks out along consecutive GPU
// threads): a CUDA warp, half of a 64-wide CDNA wavefront (gfx90a, gfx942),
// a whole 32-wide RDNA wavefront. HIP's shuffles take a width of 32 and its
// 64-bit ballots are cut to the group's half, so every kernel sees 32-lane
// groups on every GPU and needs teams of whole groups (multiples of 32
// threads; the launches guarantee it). The portable form has groups of one
// lane, where a ballot is the lane's own bit and a shuffle its own value.
#pragma once

#include <cstdint>
#include <type_traits>

#include "compat.hpp"

namespace sparse_mla::kernels::device {

// Lanes of a lane group: 32 in the native forms, 1 in the portable one.
inline constexpr int group_lanes = form == Form::portable ? 1 : 32;
// A lane group's ballot: bit l for lane l.
using LaneMask = std::uint32_t;

// Lane l's bit set when `predicate` holds there, for every lane of the group.
KOKKOS_INLINE_FUNCTION LaneMask ballot(bool predicate) {
#if SPARSE_MLA_FORM_CUDA
  return __ballot_sync(0xffffffffu, predicate);
#elif SPARSE_MLA_FORM_HIP
  // A 64-bit wavefront ballot; this group's 32 bits (lanes 32-63 are the
  // upper group of a CDNA wavefront).
  return static_cast<LaneMask>(__ballot(predicate) >> (__lane_id() & 32));
#else
  return predicate ? 1u : 0u;
#endif
}

// Set bits of a mask.
KOKKOS_INLINE_FUNCTION int popc(LaneMask mask) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  return __popc(mask);
#else
  int bits = 0;
  for (; mask != 0; mask &= mask - 1) ++bits;
  return bits;
#endif
}

// The lowest set bit's lane (mask != 0).
KOKKOS_INLINE_FUNCTION int first_lane(LaneMask mask) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  return __ffs(mask) - 1;
#else
  int lane = 0;
  while ((mask & 1u) == 0) {
    mask >>= 1;
    ++lane;
  }
  return lane;
#endif
}

// The lanes below `lane`, as a mask.
KOKKOS_INLINE_FUNCTION LaneMask lanes_below(int lane) { return (LaneMask{1} << lane) - 1u; }

// Lane `source`'s value, on every lane of the group.
template <class T>
KOKKOS_INLINE_FUNCTION T shuffle(T value, int source) {
#if SPARSE_MLA_FORM_CUDA
  return __shfl_sync(0xffffffffu, value, source);
#elif SPARSE_MLA_FORM_HIP
  return __shfl(value, source, 32);
#else
  (void)source;
  return value;
#endif
}

// Lane l - delta's value on lane l (lanes below delta keep their own).
template <class T>
KOKKOS_INLINE_FUNCTION T shuffle_up(T value, int delta) {
#if SPARSE_MLA_FORM_CUDA
  return __shfl_up_sync(0xffffffffu, value, delta);
#elif SPARSE_MLA_FORM_HIP
  return __shfl_up(value, delta, 32);
#else
  (void)delta;
  return value;
#endif
}

// The sum of `value` over the group, on every lane: int32, or uint32 where
// the sum must wrap (packed words).
template <class Int>
KOKKOS_INLINE_FUNCTION Int group_sum(Int value) {
  static_assert(std::is_same<Int, std::int32_t>::value || std::is_same<Int, std::uint32_t>::value,
                "group_sum takes 32-bit integers");
#if SPARSE_MLA_FORM_CUDA && __CUDA_ARCH__ >= 800
  return __reduce_add_sync(0xffffffffu, value);
#elif SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  for (int mask = 16; mask > 0; mask >>= 1) {
#if SPARSE_MLA_FORM_CUDA
    value += __shfl_xor_sync(0xffffffffu, value, mask);
#else
    value += __shfl_xor(value, mask, 32);
#endif
  }
  return value;
#else
  return value;
#endif
}

// Orders the group's team-scratch stores before its lanes' loads that
// follow (a CUDA warp's __syncwarp; on HIP the group's wavefront runs in
// step, so a wavefront fence suffices). The portable form's groups are one
// lane.
KOKKOS_INLINE_FUNCTION void group_sync() {
#if SPARSE_MLA_FORM_CUDA
  __syncwarp();
#elif SPARSE_MLA_FORM_HIP
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#endif
}

// The inclusive prefix sum of `value` over the group's lanes up to `lane`.
KOKKOS_INLINE_FUNCTION std::uint32_t group_inclusive_sum(std::uint32_t value, int lane) {
  for (int d = 1; d < group_lanes; d <<= 1) {
    const std::uint32_t up = shuffle_up(value, d);
    if (lane >= d) value += up;
  }
  return value;
}

}  // namespace sparse_mla::kernels::device
