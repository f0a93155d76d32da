// The team's exclusive prefix sum (teams of vector length 1 whose ranks are
// consecutive lanes, a whole number of lane groups, in the native forms; any
// team in the portable form).
#pragma once

#include <cstdint>

#include "compat.hpp"
#include "warp.hpp"

namespace sparse_mla::kernels::device {

// Words of team scratch team_exclusive_sum() needs per call: one per lane
// group of a team of up to 1024 threads.
inline constexpr std::int32_t team_exclusive_sum_words = 32;

// The exclusive prefix sum of `value` over the team's ranks, and in `total`
// the team's sum, on every thread. Every thread of the team calls it (it has
// a barrier). `totals` (team_exclusive_sum_words of team scratch) is written
// before the barrier and read after it: consecutive calls take alternate
// buffers, so that one barrier a call suffices. A team of one thread (host
// spaces) sums nothing.
template <class Member>
KOKKOS_INLINE_FUNCTION std::uint32_t team_exclusive_sum(const Member& team, std::uint32_t* totals, std::uint32_t value,
                                                        std::uint32_t& total) {
  if constexpr (form == Form::portable) {
    (void)totals;
    if (team.team_size() == 1) {
      total = value;
      return 0;
    }
    team.team_barrier();
    const std::uint32_t before = team.team_scan(value);
    std::uint32_t sum = value;
    team.team_reduce(Kokkos::Sum<std::uint32_t>(sum));
    total = sum;
    return before;
  } else {
    // A shuffle scan in each group, one word per group through scratch, one
    // barrier (Kokkos' team reductions and scans take several); then lane g
    // of every group reads group g's word, and two group sums give the team's
    // total and the groups ahead (not a loop over the groups on every thread).
    const int rank = team.team_rank();
    const int lane = rank & 31, group = rank >> 5;
    const std::uint32_t inclusive = group_inclusive_sum(value, lane);
    if (lane == 31) totals[group] = inclusive;
    team.team_barrier();
    const int groups = team.team_size() >> 5;
    const std::uint32_t word = lane < groups ? totals[lane] : 0u;
    total = group_sum(word);
    const std::uint32_t before = group_sum(lane < group ? word : 0u);
    return before + inclusive - value;
  }
}

}  // namespace sparse_mla::kernels::device
