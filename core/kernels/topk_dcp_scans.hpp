// The team scans of the DCP compaction (topk_convert.hpp): exclusive
// offsets of small per-thread counts, of a unit's valid entries and of
// per-group counts, one barrier a call (teams of vector length 1 whose ranks
// are consecutive lanes, a whole number of lane groups, in the native forms;
// any team in the portable form).
#pragma once

#include <cstddef>
#include <cstdint>

#include "components/compat.hpp"
#include "components/warp.hpp"

namespace sparse_mla::kernels::device {

// Ints of team scratch team_round_offsets() needs for N units a thread: two
// buffers (alternate calls take alternate ones, so that one barrier a call
// suffices between a call's reads and the next call's writes) of one int per
// lane group and unit.
KOKKOS_INLINE_FUNCTION constexpr std::size_t team_round_ints(int units) {
  return 2 * 32 * static_cast<std::size_t>(units);
}

// The end of team_round_offsets and team_entry_offsets: each group's
// count of each unit (partial[u * 32 + group]) is written; after the
// barrier, lane g of every group reads group g's and two group sums give the
// unit's total and the groups ahead, which `in_group` (the thread's count
// within its group: exclusive or inclusive, as the caller computed it) is
// moved by.
template <int N, class Member>
KOKKOS_INLINE_FUNCTION void group_offsets(const Member& team, std::int32_t threads, const std::int32_t* partial,
                                          const std::int32_t (&in_group)[N], std::int32_t (&offset)[N],
                                          std::int32_t& total) {
  const std::int32_t rank = team.team_rank();
  const std::int32_t lane = rank & 31, group = rank >> 5, groups = threads >> 5;
  team.team_barrier();
  total = 0;
  for (int u = 0; u < N; ++u) {
    const std::int32_t sum = lane < groups ? partial[u * 32 + lane] : 0;
    const std::int32_t unit_total = group_sum(sum);
    const std::int32_t earlier_groups = group_sum(lane < group ? sum : 0);
    offset[u] = total + earlier_groups + in_group[u];
    total += unit_total;
  }
}

// The set bits of a unit's four entries (bit e of `entries`) on the
// group's lanes up to and including this one (`upto`: those lanes' bits),
// in the order (lane, entry): a ballot per entry.
KOKKOS_INLINE_FUNCTION std::int32_t group_entries_through(std::uint32_t entries, LaneMask upto) {
  std::int32_t through = 0;
  for (int e = 0; e < 4; ++e) through += popc(ballot((entries >> e) & 1u) & upto);
  return through;
}

// Exclusive offsets of N small counts per thread, in the order (unit u,
// rank): all threads' unit 0, then all threads' unit 1, ... count[u] (0 to
// MaxCount) becomes before[u], the counts ahead of it, and `total` is the sum
// of all, on every thread. `threads` is the team's size; every thread calls
// it (it has a barrier); `parity` alternates the scratch buffer
// (team_round_ints(N) ints).
template <int N, int MaxCount, class Member>
KOKKOS_INLINE_FUNCTION void team_round_offsets(const Member& team, std::int32_t threads, const std::int32_t (&count)[N],
                                               std::int32_t (&before)[N], std::int32_t& total, std::int32_t* scratch,
                                               int& parity) {
  if (threads == 1) {
    total = 0;
    for (int u = 0; u < N; ++u) {
      before[u] = total;
      total += count[u];
    }
    return;
  }
  std::int32_t* partial = scratch + 32 * N * parity;
  parity ^= 1;
  const std::int32_t rank = team.team_rank();
  if constexpr (form == Form::portable) {
    // One Kokkos team scan per unit, and the last thread's inclusive sum
    // through scratch for each unit's total.
    total = 0;
    for (int u = 0; u < N; ++u) {
      const std::int32_t exclusive = team.team_scan(count[u]);
      if (rank == threads - 1) partial[u] = exclusive + count[u];
      team.team_barrier();
      before[u] = total + exclusive;
      total += partial[u];
      team.team_barrier();
    }
  } else {
    // In a group, each bit of a count is a ballot: the lanes below hold
    // popc(ballot & below) of each, and lane 31's count after those is the
    // group's sum. The groups' sums of each unit go through scratch, one
    // barrier, and then lane g of every group reads group g's sum: two group
    // sums give the unit's total and the groups ahead.
    const std::int32_t lane = rank & 31, group = rank >> 5;
    const LaneMask below = lanes_below(lane);
    std::int32_t in_group[N];
    for (int u = 0; u < N; ++u) {
      std::int32_t ahead = 0;
      for (int bit = 0; (MaxCount >> bit) != 0; ++bit) ahead += popc(ballot((count[u] >> bit) & 1) & below) << bit;
      in_group[u] = ahead;
      if (lane == 31) partial[u * 32 + group] = ahead + count[u];
    }
    group_offsets(team, threads, partial, in_group, before, total);
  }
}

// The same for N units of four entries a thread, from which of them are
// valid (bit e of valid[u]: entry e of unit u): through[u] becomes the valid
// entries up to and including unit u's, in the order of team_round_offsets
// (and `total` their sum). A ballot per entry, not per bit of a count: no
// count to form, and lane 31's inclusive count is its group's sum. Same
// scratch and parity as team_round_offsets.
template <int N, class Member>
KOKKOS_INLINE_FUNCTION void team_entry_offsets(const Member& team, std::int32_t threads, const std::uint32_t (&valid)[N],
                                               std::int32_t (&through)[N], std::int32_t& total, std::int32_t* scratch,
                                               int& parity) {
  if (form == Form::portable || threads == 1) {
    std::int32_t count[N], before[N];
    for (int u = 0; u < N; ++u) count[u] = popc(valid[u]);
    team_round_offsets<N, 4>(team, threads, count, before, total, scratch, parity);
    for (int u = 0; u < N; ++u) through[u] = before[u] + count[u];
    return;
  }
  std::int32_t* partial = scratch + 32 * N * parity;
  parity ^= 1;
  const std::int32_t rank = team.team_rank();
  const std::int32_t lane = rank & 31, group = rank >> 5;
  const LaneMask upto = 0xFFFFFFFFu >> (31 - lane);
  std::int32_t in_group[N];
  for (int u = 0; u < N; ++u) {
    in_group[u] = group_entries_through(valid[u], upto);
    if (lane == 31) partial[u * 32 + group] = in_group[u];
  }
  group_offsets(team, threads, partial, in_group, through, total);
}

// Exclusive offsets of N counts that are the same on every lane of a group
// (a group's count of each unit), in the order (unit u, group): count[u]
// becomes before[u], the counts of the groups ahead of this one and of all
// groups' units before u, and `total` is the sum of all, on every thread.
// Same barrier, scratch and parity as team_round_offsets; the portable form's
// groups are one lane, whose counts are at most 4.
template <int N, class Member>
KOKKOS_INLINE_FUNCTION void team_group_offsets(const Member& team, std::int32_t threads, const std::int32_t (&count)[N],
                                               std::int32_t (&before)[N], std::int32_t& total, std::int32_t* scratch,
                                               int& parity) {
  if (form == Form::portable || threads == 1) {
    team_round_offsets<N, 4>(team, threads, count, before, total, scratch, parity);
    return;
  }
  std::int32_t* partial = scratch + 32 * N * parity;
  parity ^= 1;
  const std::int32_t rank = team.team_rank();
  std::int32_t in_group[N];
  for (int u = 0; u < N; ++u) {
    in_group[u] = 0;
    if ((rank & 31) == 0) partial[u * 32 + (rank >> 5)] = count[u];
  }
  group_offsets(team, threads, partial, in_group, before, total);
}

}  // namespace sparse_mla::kernels::device
