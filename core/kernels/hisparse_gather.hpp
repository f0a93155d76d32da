// HiSparse row gather (SPEC section 5): copies every swap pair of the resolve
// from the pinned host pool into the hot cache, reading host memory directly
// from the kernel (zero-copy over the host link) in 16-byte units, for one
// layer or for several layers of a group at once (one launch: the layers
// after a group's first share it, since nothing waits for them apart).
//
// The swap counts stay on the device: the launch covers the most swaps a row
// can have (top-k) and each team reads its row's count, so a decode step
// needs no host synchronisation. On GPUs a row's pairs are spread over
// several teams (more when there are few rows, to keep many host reads in
// flight); each team thread copies one pair with its vector lanes.
#pragma once

#include <Kokkos_Core.hpp>

#include "components/memory.hpp"
#include "space_traits.hpp"
#include "kernels.hpp"

namespace sparse_mla::kernels {

template <class Space>
struct HiSparseGather {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  HiSparseGatherArgs a;
  int teams_per_row;
  int lanes;  // the policy's vector length

  KOKKOS_INLINE_FUNCTION std::uint8_t* hot_row_bytes(std::int32_t layer, std::int32_t x) const {
    return a.hot_caches[layer] + (x / a.hot_block_size) * a.hot_block_stride_bytes + (x % a.hot_block_size) * a.row_bytes;
  }

  // One pair's copy, by the thread's vector lanes, two 16-byte units per
  // lane in flight: both loads go out before either store (the stores may
  // alias, so the compiler would not reorder them). A missing host row
  // (src == nullptr) writes zeros, never the bytes the slot held before.
  KOKKOS_INLINE_FUNCTION void copy_row(const member_type& team, const Int4* src, Int4* dst, std::int64_t units) const {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, lanes), [&](const std::int32_t lane) {
      for (std::int64_t u = lane; u < units; u += 2 * lanes) {
        const bool second = u + lanes < units;
        Int4 v0{0, 0, 0, 0}, v1{0, 0, 0, 0};
        if (src != nullptr) {
          v0 = src[u];
          if (second) v1 = src[u + lanes];
        }
        dst[u] = v0;
        if (second) dst[u + lanes] = v1;
      }
    });
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t row = team.league_rank() / teams_per_row;
    const int part = team.league_rank() % teams_per_row;
    std::int32_t count = a.swap_counts[row];
    count = count < 0 ? 0 : (count > a.max_swaps ? a.max_swaps : count);
    const std::int64_t units = a.row_bytes / 16;
    // Pairs part, part + teams_per_row, ... of this row, each into every
    // layer: copy k is pair k / num_layers into layer k % num_layers, one
    // copy per team thread.
    const std::int32_t mine = count > part ? (count - part + teams_per_row - 1) / teams_per_row : 0;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, mine * a.num_layers), [&](const std::int32_t k) {
      const std::int32_t layer = k % a.num_layers;
      const std::int64_t j = part + static_cast<std::int64_t>(k / a.num_layers) * teams_per_row;
      const std::int32_t g = a.swap_host_rows[row * a.swap_stride + j];
      const std::int32_t x = a.swap_device_rows[row * a.swap_stride + j];
      if (g < 0 || x < 0 || x >= a.hot_rows) return;
      copy_row(team, g < a.host_rows ? reinterpret_cast<const Int4*>(a.host_pools[layer] + g * a.row_bytes) : nullptr,
               reinterpret_cast<Int4*>(hot_row_bytes(layer, x)), units);
    });
  }
};

template <class Space>
void gather_hisparse(const Space& space, const HiSparseGatherArgs& a) {
  if (a.num_rows == 0 || a.max_swaps == 0 || a.num_layers == 0) return;
  // GPUs: 16 pair copiers of 32 lanes (512 threads) per team. A row's pairs
  // are spread over enough teams that the whole launch has about 512 teams
  // (4 per multiprocessor), so even a single row keeps every pair's host
  // reads in flight at once (1 row, 2048 pairs: 128 teams, one pair per
  // copier). The host: one team (of one) per row.
  constexpr int copiers = 16;
  const std::int64_t wanted = (512 + a.num_rows - 1) / a.num_rows;
  const std::int64_t useful = (a.max_swaps + copiers - 1) / copiers;
  const int teams_per_row = is_host_space<Space> ? 1 : static_cast<int>(wanted < useful ? wanted : useful);
  const int team_size = row_team_size<Space>(copiers);
  constexpr int vector_length = warp_lanes<Space>();
  Kokkos::parallel_for("sparse_mla::gather_hisparse",
                       Kokkos::TeamPolicy<Space>(space, static_cast<int>(a.num_rows) * teams_per_row, team_size,
                                                 vector_length),
                       HiSparseGather<Space>{a, teams_per_row, vector_length});
}

}  // namespace sparse_mla::kernels
