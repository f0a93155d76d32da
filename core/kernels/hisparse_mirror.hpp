// HiSparse host mirror (SPEC section 5): rows written during a step are
// copied into the pinned host pool (the device writes host memory directly),
// and hot slots that cache a rewritten row are emptied, so the host pool
// stays the source of truth and an evicted or reloaded slot never serves
// stale bytes.
#pragma once

#include <Kokkos_Core.hpp>

#include "components/memory.hpp"
#include "space_traits.hpp"
#include "kernels.hpp"

namespace sparse_mla::kernels {

// One 16-byte unit per work item: consecutive items of a row are adjacent,
// so GPU warps write whole host cache lines.
struct HiSparseWriteRows {
  HiSparseWriteRowsArgs a;
  std::int64_t units;  // 16-byte units per row

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    const std::int64_t n = i / units, u = i % units;
    const std::int32_t g = a.host_row_ids[n];
    if (g < 0 || g >= a.host_rows) return;
    const Int4* src = reinterpret_cast<const Int4*>(a.rows + n * a.rows_stride);
    Int4* dst = reinterpret_cast<Int4*>(a.host_pool + g * a.row_bytes);
    dst[u] = src[u];
  }
};

template <class Space>
void write_hisparse_rows(const Space& space, const HiSparseWriteRowsArgs& a) {
  if (a.num_rows == 0) return;
  const std::int64_t units = a.row_bytes / 16;
  Kokkos::parallel_for("sparse_mla::write_hisparse_rows",
                       Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, a.num_rows * units),
                       HiSparseWriteRows{a, units});
}

// One team per written row scans the hot slots of the row's state.
template <class Space>
struct HiSparseInvalidate {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  HiSparseInvalidateArgs a;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t n = team.league_rank();
    const std::int32_t g = a.host_row_ids[n];
    const std::int32_t state = a.state_rows[n];
    if (g < 0 || state < 0 || state >= a.num_state_rows) return;
    std::int32_t* slot_rows = a.slot_rows + state * a.slot_rows_stride;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, a.hot_slots), [&](const std::int32_t slot) {
      if (slot_rows[slot] == g) slot_rows[slot] = -1;
    });
  }
};

template <class Space>
void invalidate_hisparse_slots(const Space& space, const HiSparseInvalidateArgs& a) {
  if (a.num_rows == 0) return;
  Kokkos::parallel_for("sparse_mla::invalidate_hisparse_slots",
                       Kokkos::TeamPolicy<Space>(space, static_cast<int>(a.num_rows), row_team_size<Space>(256)),
                       HiSparseInvalidate<Space>{a});
}

}  // namespace sparse_mla::kernels
