// Reserving team scratch ahead of the step path: Kokkos grows an execution
// space instance's scratch the first time a launch asks for more than it
// holds (an allocation, and on GPUs for level-1 scratch a synchronisation).
// A group reserves, at construction, the most its step's kernels ask for.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace sparse_mla::kernels {

struct ReserveTeamScratch {
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member&) const {}
};

// One team of one thread asking for `bytes` of level-`level` scratch.
template <class Space>
void launch_asking_for_scratch(const Space& space, int level, std::size_t bytes) {
  Kokkos::TeamPolicy<Space> policy(space, 1, 1);
  policy.set_scratch_size(level, Kokkos::PerTeam(bytes));
  Kokkos::parallel_for("sparse_mla::reserve_team_scratch", policy, ReserveTeamScratch{});
}

// `bytes` per team, at the level a step kernel asking for as much would use.
template <class Space>
void reserve_team_scratch(const Space& space, std::size_t bytes) {
  if (bytes == 0) return;
  const int level = bytes <= static_cast<std::size_t>(Kokkos::TeamPolicy<Space>::scratch_size_max(0)) ? 0 : 1;
  launch_asking_for_scratch(space, level, bytes);
}

// Kokkos 4.6 (CUDA and HIP) gives every team launch an entry of the
// instance's level-1 scratch pool and, where that entry has never held any,
// allocates what the launch asks for, nothing included: a size-0 device
// allocation (and a Kokkos Tools allocation event) on every launch of a
// kernel without level-1 scratch. One launch that takes level-1 scratch when
// a stream is bound gives the entry a size, which every later launch from
// the thread that drives the stream finds there (a thread takes entry 0).
constexpr std::size_t claimed_team_scratch_bytes = 256;

template <class Space>
void claim_team_scratch_pool(const Space& space) {
  launch_asking_for_scratch(space, 1, claimed_team_scratch_bytes);
}

}  // namespace sparse_mla::kernels
