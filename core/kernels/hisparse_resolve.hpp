// HiSparse swap-in (SPEC section 5): one team per batch row resolves the
// row's logical top-k against the hot slots of its state row.
//
// The row's distinct host rows go into a team-scratch hash set (open
// addressing, 2K entries, so it is at most half full). The LRU walk, the miss
// numbering and the LRU rewrite are team-parallel passes joined by prefix
// sums (parallel_scan over TeamThreadRange), so a GPU team spreads the 4096
// slots of a production row over its threads; on the host a team is one
// thread and the same passes run as plain loops.
//
// Passes (barriers between them):
//   1. map every entry to its host row g and its resident row; write the
//      resolved rows, the resident and invalid outputs and the valid count.
//      A row with nothing left to look up returns here (its LRU untouched).
//   2. insert the pending host rows into the hash set; each key remembers
//      the first top-k entry that selected it (duplicates collapse to it).
//   3. walk the slots: a slot whose host row is in the set is a hit (and
//      owns that key); a prefix sum places hits forward and evictable slots
//      backward in `order`, both in LRU order.
//   4. a prefix sum over the entries numbers the distinct misses; miss m takes
//      the m-th oldest evictable slot and appends (host row, hot row) to the
//      swap list.
//   5. write the hot and attention rows of every pending entry, and the new
//      LRU order: untouched evictable, newly loaded, hits.
#pragma once

#include <Kokkos_Core.hpp>

#include "space_traits.hpp"
#include "sparse_mla/kernels.hpp"

namespace sparse_mla::kernels {

namespace hisparse {

constexpr std::int32_t done = -1;       // entry needs no slot (resident, invalid)
constexpr std::int32_t empty_key = -1;  // free hash position

// Knuth's multiplicative hash.
KOKKOS_INLINE_FUNCTION std::int32_t hash_position(std::int32_t key, std::int32_t size) {
  return static_cast<std::int32_t>((static_cast<std::uint32_t>(key) * 2654435761u) % static_cast<std::uint32_t>(size));
}

// The team's scratch arrays, carved from one allocation.
struct ResolveScratch {
  std::int32_t* entry;    // [K]: host row (pass 1), then its hash position (pass 2), or done
  std::int32_t* keys;     // [2K]: host rows of the set
  std::int32_t* first;    // [2K]: first top-k entry selecting the key
  std::int32_t* slot_of;  // [2K]: hot slot serving the key (hit or newly loaded), -1 before
  std::int32_t* totals;   // [2]: hit slots, misses
  std::int16_t* order;    // [H]: hit slots forward from 0, evictable slots backward from H-1
  std::uint8_t* hit;      // [H]: slot at LRU position p is a hit

  KOKKOS_INLINE_FUNCTION static std::size_t bytes(std::int32_t top_k, std::int32_t hot_slots) {
    const std::size_t k = static_cast<std::size_t>(top_k), h = static_cast<std::size_t>(hot_slots);
    return 4 * (k + 3 * 2 * k + 2) + 2 * h + h + 16;
  }
  KOKKOS_INLINE_FUNCTION static ResolveScratch carve(void* base, std::int32_t top_k) {
    ResolveScratch s;
    s.entry = static_cast<std::int32_t*>(base);
    s.keys = s.entry + top_k;
    s.first = s.keys + 2 * top_k;
    s.slot_of = s.first + 2 * top_k;
    s.totals = s.slot_of + 2 * top_k;
    s.order = reinterpret_cast<std::int16_t*>(s.totals + 2);
    return s;
  }
  KOKKOS_INLINE_FUNCTION void place_hit_flags(std::int32_t hot_slots) { hit = reinterpret_cast<std::uint8_t*>(order + hot_slots); }
};

}  // namespace hisparse

template <class Space>
struct HiSparseResolve {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  HiSparseResolveArgs a;
  int scratch_level;

  KOKKOS_INLINE_FUNCTION std::int32_t hash_size() const { return 2 * a.top_k; }

  // Host row of request-relative position `tok`, or -1 (SPEC section 5, step 1).
  KOKKOS_INLINE_FUNCTION std::int32_t host_row(std::int32_t request, std::int32_t tok) const {
    if (tok < 0 || request < 0 || request >= a.source_num_requests) return -1;
    const std::int32_t block = tok / a.source_block_size;
    if (block >= a.source_blocks_per_request) return -1;
    const std::int32_t physical = a.source_block_table[request * a.source_table_stride + block];
    if (physical < 0) return -1;
    const std::int64_t g = static_cast<std::int64_t>(physical) * a.source_block_size + tok % a.source_block_size;
    return g < a.host_rows ? static_cast<std::int32_t>(g) : -1;
  }

  // Device row of `tok` when its page is resident, else -1.
  KOKKOS_INLINE_FUNCTION std::int32_t resident_row(std::int32_t request, std::int32_t tok) const {
    if (a.resident_block_table == nullptr || tok < 0 || request < 0 || request >= a.resident_num_requests) return -1;
    const std::int32_t block = tok / a.resident_block_size;
    if (block >= a.resident_blocks_per_request) return -1;
    const std::int32_t physical = a.resident_block_table[request * a.resident_table_stride + block];
    if (physical < 0 || physical == a.resident_null_block) return -1;
    return static_cast<std::int32_t>(static_cast<std::int64_t>(physical) * a.resident_block_size +
                                     tok % a.resident_block_size);
  }

  // `row` is the batch row, or the state row with hot_table_by_state.
  KOKKOS_INLINE_FUNCTION std::int32_t hot_row(std::int64_t row, std::int32_t slot) const {
    const std::int32_t block = a.hot_block_table[row * a.hot_table_stride + slot / a.hot_block_size];
    return static_cast<std::int32_t>(static_cast<std::int64_t>(block) * a.hot_block_size + slot % a.hot_block_size);
  }

  // Writes the hot row of entry j and its attention index.
  KOKKOS_INLINE_FUNCTION void store(std::int64_t row, std::int32_t j, std::int32_t x) const {
    a.hot_indices[row * a.out_stride + j] = x;
    if (a.attention_indices != nullptr) {
      a.attention_indices[row * a.attention_stride + j] =
          x < 0 ? -1
                : static_cast<std::int32_t>((x / a.hot_block_size) * a.attention_block_stride + x % a.hot_block_size);
    }
  }

  KOKKOS_INLINE_FUNCTION std::int32_t find(const hisparse::ResolveScratch& s, std::int32_t g) const {
    std::int32_t h = hisparse::hash_position(g, hash_size());
    while (true) {
      const std::int32_t key = s.keys[h];
      if (key == g) return h;
      if (key == hisparse::empty_key) return -1;
      h = h + 1 == hash_size() ? 0 : h + 1;
    }
  }

  KOKKOS_INLINE_FUNCTION std::int32_t insert(const hisparse::ResolveScratch& s, std::int32_t g) const {
    std::int32_t h = hisparse::hash_position(g, hash_size());
    while (true) {
      const std::int32_t old = Kokkos::atomic_compare_exchange(&s.keys[h], hisparse::empty_key, g);
      if (old == hisparse::empty_key || old == g) return h;
      h = h + 1 == hash_size() ? 0 : h + 1;
    }
  }

  KOKKOS_INLINE_FUNCTION void padding_row(const member_type& team, std::int64_t row) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, a.top_k), [&](const std::int32_t j) {
      store(row, j, -1);
      if (a.resolved_rows != nullptr) a.resolved_rows[row * a.out_stride + j] = -1;
      if (a.miss_mask != nullptr) a.miss_mask[row * a.out_stride + j] = 0;
    });
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      if (a.valid_counts != nullptr) a.valid_counts[row] = 0;
      a.swap_counts[row] = 0;
    });
  }

  // Pass 1. Returns the number of entries that need a hot slot.
  KOKKOS_INLINE_FUNCTION std::int32_t map_entries(const member_type& team, const hisparse::ResolveScratch& s,
                                                  std::int64_t row) const {
    const std::int32_t request = a.request_ids[row];
    const std::int32_t* in = a.logical + row * a.logical_stride;
    long long counts = 0;  // valid entries in the low 32 bits, pending entries in the high
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, a.top_k),
        [&](const std::int32_t j, long long& sum) {
          const std::int32_t tok = in[j];
          const std::int32_t g = host_row(request, tok);
          const std::int32_t resident = resident_row(request, tok);
          if (a.resolved_rows != nullptr) a.resolved_rows[row * a.out_stride + j] = g;
          if (a.miss_mask != nullptr) a.miss_mask[row * a.out_stride + j] = 0;
          const bool pending = resident < 0 && g >= 0;
          if (!pending) store(row, j, resident);
          s.entry[j] = pending ? g : hisparse::done;
          sum += (resident >= 0 || g >= 0 ? 1LL : 0LL) + (pending ? (1LL << 32) : 0LL);
        },
        counts);
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      if (a.valid_counts != nullptr) a.valid_counts[row] = static_cast<std::int32_t>(counts & 0xffffffffLL);
    });
    return static_cast<std::int32_t>(counts >> 32);
  }

  // Pass 2.
  KOKKOS_INLINE_FUNCTION void build_set(const member_type& team, const hisparse::ResolveScratch& s) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, hash_size()), [&](const std::int32_t h) {
      s.keys[h] = hisparse::empty_key;
      s.first[h] = a.top_k;
      s.slot_of[h] = -1;
    });
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, a.top_k), [&](const std::int32_t j) {
      if (s.entry[j] == hisparse::done) return;
      const std::int32_t h = insert(s, s.entry[j]);
      Kokkos::atomic_fetch_min(&s.first[h], j);
      s.entry[j] = h;
    });
    team.team_barrier();
  }

  // Pass 3.
  KOKKOS_INLINE_FUNCTION void classify_slots(const member_type& team, const hisparse::ResolveScratch& s,
                                             const std::int32_t* slot_rows, const std::int16_t* lru) const {
    const std::int32_t H = a.hot_slots;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, H), [&](const std::int32_t p) {
      const std::int32_t slot = lru[p];
      const std::int32_t g = slot_rows[slot];
      const std::int32_t h = g >= 0 ? find(s, g) : -1;
      if (h >= 0) s.slot_of[h] = slot;
      s.hit[p] = h >= 0 ? 1 : 0;
    });
    team.team_barrier();
    Kokkos::parallel_scan(Kokkos::TeamThreadRange(team, H), [&](const std::int32_t p, std::int32_t& hits_before,
                                                                 const bool final) {
      const std::int32_t is_hit = s.hit[p];
      if (final) {
        const std::int16_t slot = lru[p];
        if (is_hit) {
          s.order[hits_before] = slot;
        } else {
          s.order[H - 1 - (p - hits_before)] = slot;
        }
        if (p == H - 1) s.totals[0] = hits_before + is_hit;
      }
      hits_before += is_hit;
    });
    team.team_barrier();
  }

  KOKKOS_INLINE_FUNCTION bool is_miss(const hisparse::ResolveScratch& s, std::int32_t j) const {
    const std::int32_t h = s.entry[j];
    return h != hisparse::done && s.first[h] == j && s.slot_of[h] < 0;
  }

  // Pass 4.
  KOKKOS_INLINE_FUNCTION void load_misses(const member_type& team, const hisparse::ResolveScratch& s,
                                          std::int64_t row, std::int64_t hot_table_row, std::int32_t* slot_rows) const {
    const std::int32_t H = a.hot_slots;
    Kokkos::parallel_scan(Kokkos::TeamThreadRange(team, a.top_k), [&](const std::int32_t j, std::int32_t& misses_before,
                                                                      const bool final) {
      const bool miss = is_miss(s, j);
      if (final) {
        if (miss) {
          const std::int32_t h = s.entry[j];
          const std::int32_t slot = s.order[H - 1 - misses_before];
          const std::int32_t g = s.keys[h];
          s.slot_of[h] = slot;
          slot_rows[slot] = g;
          a.swap_host_rows[row * a.out_stride + misses_before] = g;
          a.swap_device_rows[row * a.out_stride + misses_before] = hot_row(hot_table_row, slot);
          if (a.miss_mask != nullptr) a.miss_mask[row * a.out_stride + j] = 1;
        }
        if (j == a.top_k - 1) s.totals[1] = misses_before + (miss ? 1 : 0);
      }
      misses_before += miss ? 1 : 0;
    });
    team.team_barrier();
  }

  // Pass 5.
  KOKKOS_INLINE_FUNCTION void write_results(const member_type& team, const hisparse::ResolveScratch& s,
                                            std::int64_t row, std::int64_t hot_table_row, std::int16_t* lru) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, a.top_k), [&](const std::int32_t j) {
      const std::int32_t h = s.entry[j];
      if (h != hisparse::done) store(row, j, hot_row(hot_table_row, s.slot_of[h]));
    });
    const std::int32_t H = a.hot_slots;
    const std::int32_t hits = s.totals[0];
    const std::int32_t misses = s.totals[1];
    const std::int32_t untouched = H - hits - misses;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, H), [&](const std::int32_t p) {
      if (p < untouched) {
        lru[p] = s.order[H - 1 - misses - p];  // evictable slots misses.. in old order
      } else if (p < untouched + misses) {
        lru[p] = s.order[H - 1 - (p - untouched)];  // newly loaded, in miss order
      } else {
        lru[p] = s.order[p - untouched - misses];  // hits, in old order
      }
    });
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      a.swap_counts[row] = misses;
      if (a.hit_miss_counters != nullptr) {
        Kokkos::atomic_add(&a.hit_miss_counters[0], static_cast<unsigned long long>(hits));
        Kokkos::atomic_add(&a.hit_miss_counters[1], static_cast<unsigned long long>(misses));
      }
    });
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t row = team.league_rank();
    const std::int32_t state = a.request_state_indices != nullptr ? a.request_state_indices[row]
                                                                  : static_cast<std::int32_t>(row);
    if (state < 0 || state >= a.num_state_rows) {
      padding_row(team, row);
      return;
    }
    hisparse::ResolveScratch s = hisparse::ResolveScratch::carve(
        team.team_scratch(scratch_level).get_shmem(hisparse::ResolveScratch::bytes(a.top_k, a.hot_slots)), a.top_k);
    s.place_hit_flags(a.hot_slots);
    const std::int32_t pending = map_entries(team, s, row);
    if (pending == 0) {
      // Nothing can consult the hot slots: leave the LRU as it is.
      Kokkos::single(Kokkos::PerTeam(team), [&]() { a.swap_counts[row] = 0; });
      return;
    }
    team.team_barrier();
    std::int32_t* slot_rows = a.slot_rows + state * a.slot_rows_stride;
    std::int16_t* lru = a.lru + state * a.lru_stride;
    const std::int64_t hot_table_row = a.hot_table_by_state ? state : row;
    build_set(team, s);
    classify_slots(team, s, slot_rows, lru);
    load_misses(team, s, row, hot_table_row, slot_rows);
    write_results(team, s, row, hot_table_row, lru);
  }
};

template <class Space>
void resolve_hisparse(const Space& space, const HiSparseResolveArgs& a) {
  if (a.num_rows == 0) return;
  using policy_type = Kokkos::TeamPolicy<Space>;
  const std::size_t bytes = hisparse::ResolveScratch::bytes(a.top_k, a.hot_slots);
  // Production rows (K = 2048, H = 4096) need about 70 KB: shared memory on
  // GPUs that allow it, else the level-1 (global) scratch.
  const int level = bytes <= static_cast<std::size_t>(policy_type::scratch_size_max(0)) ? 0 : 1;
  policy_type policy(space, static_cast<int>(a.num_rows), row_team_size<Space>(512));
  policy.set_scratch_size(level, Kokkos::PerTeam(bytes));
  Kokkos::parallel_for("sparse_mla::resolve_hisparse", policy, HiSparseResolve<Space>{a, level});
}

}  // namespace sparse_mla::kernels
