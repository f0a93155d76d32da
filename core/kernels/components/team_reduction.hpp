// Team sums over teams of vector length 1 whose ranks are consecutive lanes,
// a whole number of lane groups (native forms), or any team (portable form);
// and the team scratch at a fixed place that holds their partials.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compat.hpp"
#include "warp.hpp"

namespace sparse_mla::kernels::device {

// Ints of team scratch team_sum() needs for a team of `threads`: one per
// lane group (at least one, the portable form's counter).
KOKKOS_INLINE_FUNCTION constexpr std::size_t team_sum_ints(int threads) {
  return threads >= 32 ? static_cast<std::size_t>(threads) / 32 : 1;
}

// The sum of `value` over the team's `threads` threads, returned to thread
// 0, in two calls: begin_team_sum() before the work (the portable form zeroes
// a shared counter behind a barrier, best placed while loads are in flight),
// team_sum() after it. `partial` is team scratch of team_sum_ints(threads).
template <class Member>
KOKKOS_INLINE_FUNCTION void begin_team_sum(const Member& team, std::int32_t threads, std::int32_t* partial) {
  if constexpr (form == Form::portable) {
    if (threads == 1) return;
    if (team.team_rank() == 0) *partial = 0;
    team.team_barrier();
  } else {
    (void)team;
    (void)threads;
    (void)partial;
  }
}
template <class Member>
KOKKOS_INLINE_FUNCTION std::int32_t team_sum(const Member& team, std::int32_t threads, std::int32_t value,
                                             std::int32_t* partial) {
  if (threads == 1) return value;
  if constexpr (form == Form::portable) {
    // Shared-memory atomics on the counter begin_team_sum() zeroed.
    Kokkos::atomic_add(partial, value);
    team.team_barrier();
    return *partial;
  } else {
    // A group sum, one value per group through scratch, and a group sum of
    // those by the first group.
    const std::int32_t rank = team.team_rank();
    const std::int32_t group_value = group_sum(value);
    if ((rank & 31) == 0) partial[rank >> 5] = group_value;
    team.team_barrier();
    if (rank >= 32) return 0;
    return group_sum(rank < (threads >> 5) ? partial[rank] : 0);
  }
}

// `Ints` int32 of team scratch at a fixed place. The native forms use a
// static shared-memory array (a constant address; Kokkos' team scratch
// pointer costs arithmetic on launch parameters before the first load); the
// portable form (host spaces, portable builds) takes them from level-0 team
// scratch, which the launch must then reserve (where `static_team_ints` is
// false, and on host spaces). A kernel calls it once.
inline constexpr bool static_team_ints = !portable_build;
template <int Ints, class Member>
KOKKOS_INLINE_FUNCTION std::int32_t* team_ints(const Member& team) {
#if SPARSE_MLA_FORM_CUDA || SPARSE_MLA_FORM_HIP
  (void)team;
  __shared__ std::int32_t ints[Ints];
  return ints;
#else
  return static_cast<std::int32_t*>(team.team_scratch(0).get_shmem(sizeof(std::int32_t) * Ints));
#endif
}

}  // namespace sparse_mla::kernels::device
