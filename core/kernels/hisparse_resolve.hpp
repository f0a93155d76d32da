// The HiSparse residency resolve (SPEC section 5; Kernels::resolve_hisparse):
// one resolve, two kernels for it, chosen here by the launch's shape.
//   - Production rows (K = 2048, H = 4096, block sizes that are powers of
//     two, hot blocks of 16 rows or more): the resolve in LRU order
//     (hisparse_resolve_lru_order.hpp).
//   - Every other shape: the general resolve (hisparse_resolve_general.hpp).
// Both give the same outputs and state for the same inputs; what they share
// is hisparse_resolve_common.hpp.
#pragma once

#include <Kokkos_Core.hpp>

#include "hisparse_resolve_common.hpp"
#include "hisparse_resolve_general.hpp"
#include "hisparse_resolve_lru_order.hpp"

namespace sparse_mla::kernels {

// Whether the resolve in LRU order's team scratch fits level 0 (shared
// memory on GPUs; a host team's level 0 is smaller, and it takes level 1).
template <class Space>
bool lru_order_scratch_fits_level_0() {
  return resolve_hisparse_in_lru_order_scratch_bytes <= static_cast<std::size_t>(Kokkos::TeamPolicy<Space>::scratch_size_max(0));
}

// Whether the resolve in LRU order takes a launch of Space: production rows
// whose block sizes are powers of two (its splits are shifts) and whose hot
// block table fits its scratch copy, on a space where its scratch fits.
template <class Space>
bool resolves_in_lru_order(const HiSparseResolveArgs& a) {
  const auto power_of_two = [](std::int32_t n) { return exact_log2(n) >= 0; };
  return (lru_order_scratch_fits_level_0<Space>() || is_host_space<Space>) && a.top_k == hisparse::production_top_k &&
         a.hot_slots == hisparse::production_hot_slots && power_of_two(a.source_block_size) &&
         power_of_two(a.hot_block_size) && (a.resident_block_table == nullptr || power_of_two(a.resident_block_size)) &&
         hisparse::groups(a.hot_slots, a.hot_block_size) <= hisparse::max_cached_hot_blocks;
}

template <class Space>
void resolve_hisparse(const Space& space, const HiSparseResolveArgs& a) {
  if (a.num_rows == 0) return;
  if (!resolves_in_lru_order<Space>(a)) {
    resolve_hisparse_general(space, a);
  } else if (lru_order_scratch_fits_level_0<Space>()) {
    resolve_hisparse_in_lru_order<Space, 0>(space, a);
  } else if constexpr (is_host_space<Space>) {
    resolve_hisparse_in_lru_order<Space, 1>(space, a);
  }
}

// The team scratch one row of a launch of top_k, hot_slots and hot blocks of
// hot_block_size asks for, whichever kernel takes it: the general resolve's,
// which a production row's resolve in LRU order never exceeds.
static_assert(resolve_hisparse_in_lru_order_scratch_bytes <=
                  hisparse_general::Scratch::bytes(hisparse::production_top_k, hisparse::production_hot_slots, 0),
              "reserving the general resolve's scratch covers the resolve in LRU order");
inline std::size_t resolve_hisparse_scratch_bytes(std::int32_t top_k, std::int32_t hot_slots, std::int32_t hot_block_size) {
  return resolve_hisparse_general_scratch_bytes(top_k, hot_slots, hot_block_size);
}

}  // namespace sparse_mla::kernels
