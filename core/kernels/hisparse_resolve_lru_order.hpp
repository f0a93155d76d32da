// HiSparse swap-in (SPEC section 5) for production rows (K = 2048, H = 4096,
// power-of-two blocks; hisparse_resolve.hpp chooses): the slots are
// classified in LRU order, so that one team sum places every LRU position and
// a second numbers the misses.
//
// A thread owns N consecutive groups: entries 2i, 2i + 1 and LRU positions
// 4i .. 4i + 3 of group i (N = 1 in a GPU team of 1024 threads, N = 1024 in a
// host team of one thread). It loads all of them, and the state's slots and
// their host rows, before the first barrier, and keeps them in registers to
// the end; the team scratch holds only the set of the row's host rows (keys,
// and a word per key beside them), the evicted slots and the hot block table.
//
// Steps (each ends at a barrier; the team sums are the barriers of B to D):
//   A. load: entries, their source and resident rows; the old LRU order and
//      the host row each of its slots holds; clear the set; copy the hot
//      block table.
//   B. enter: write the outputs of entries that need no slot (resident,
//      invalid); enter every other entry's host row in the set (its word
//      keeps the first entry that selected it). Team sum: valid entries and
//      distinct host rows.
//   C. classify: each LRU position's slot is a hit when the set holds its
//      host row; the key's word takes the slot (the largest, for a state that
//      holds a row twice). Team sum: hit slots and hit keys, ahead of each.
//   D. order: each LRU position goes to its new place (untouched evictable,
//      newly loaded, hits) and the oldest evictable slots are listed for the
//      misses; hit entries write their outputs. Team sum: the first entries
//      of missing keys, which numbers them in order of first selection.
//   E. load: miss m takes the m-th listed slot, writes the swap pair and the
//      slot's host row; an entry that repeats a missing key reads the slot
//      from the key's word after one more barrier, only when there is one.
#pragma once

#include <Kokkos_Core.hpp>

#include "hisparse_resolve_common.hpp"

namespace sparse_mla::kernels {

namespace hisparse_lru_order {

constexpr std::int32_t top_k = hisparse::production_top_k;
constexpr std::int32_t hot_slots = hisparse::production_hot_slots;
constexpr std::int32_t groups = top_k / hisparse::entries_per_group;
static_assert(groups == hot_slots / hisparse::slots_per_group, "a group holds entries and LRU positions in step");
// The set: keys and, beside each, a word.
constexpr std::int32_t positions = hisparse::set_positions(top_k);
static_assert((positions & (positions - 1)) == 0, "next_bucket wraps with a mask");
// A word: the first entry that selected the key in bits 0-15 (atomic min,
// from no_entry), slot + 1 of a slot that holds it in bits 16-31 (atomic max).
constexpr std::uint32_t no_entry = 0xFFFFu;

struct Scratch {
  std::uint32_t* keys;         // [positions], 16-byte aligned
  std::uint32_t* words;        // [positions], 16-byte aligned
  std::uint32_t* totals;       // [hisparse::team_total_words]
  std::int32_t* hot_blocks;    // [hisparse::max_cached_hot_blocks]
  std::int16_t* evicted;       // [top_k]: the e-th evictable slot in LRU order
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t bytes() {
    return 4 * (2 * static_cast<std::size_t>(positions) + hisparse::team_total_words + hisparse::max_cached_hot_blocks) +
           2 * static_cast<std::size_t>(top_k);
  }
  KOKKOS_INLINE_FUNCTION static Scratch carve(void* base) {
    Scratch s;
    s.keys = static_cast<std::uint32_t*>(base);
    s.words = s.keys + positions;
    s.totals = s.words + positions;
    s.hot_blocks = reinterpret_cast<std::int32_t*>(s.totals + hisparse::team_total_words);
    s.evicted = reinterpret_cast<std::int16_t*>(s.hot_blocks + hisparse::max_cached_hot_blocks);
    return s;
  }
};

}  // namespace hisparse_lru_order

// N: groups a thread owns (hisparse_lru_order::groups / team size); Level:
// the team scratch level (0, shared memory, on GPUs; 1 where level 0 is
// smaller than the set, as on host spaces).
template <class Space, int Level, int N>
struct HiSparseResolveInLruOrder : ResolveTables<SplitBy::shift> {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  static constexpr int E = hisparse::entries_per_group;
  static constexpr int S = hisparse::slots_per_group;
  static constexpr std::int32_t K = hisparse_lru_order::top_k;
  static constexpr std::int32_t H = hisparse_lru_order::hot_slots;
  static constexpr std::int32_t threads = hisparse_lru_order::groups / N;

  KOKKOS_INLINE_FUNCTION static std::int32_t first_bucket(std::uint32_t key) {
    using hisparse_lru_order::positions;
    return hisparse::hash_position(static_cast<std::int32_t>(key), positions / hisparse::bucket) * hisparse::bucket;
  }
  KOKKOS_INLINE_FUNCTION static std::int32_t next_bucket(std::int32_t b) {
    return (b + hisparse::bucket) & (hisparse_lru_order::positions - 1);
  }

  // Enters host row g >= 0 (entry j) and returns its position; `added` counts
  // a key this call put in the set. A position seen holding a key keeps it; a
  // position seen empty may be taken before the compare-and-swap, which then
  // returns the key stored there.
  KOKKOS_INLINE_FUNCTION static std::int32_t enter(const hisparse_lru_order::Scratch& s, std::uint32_t g,
                                                   std::uint32_t j, std::uint32_t& added) {
    using namespace hisparse_lru_order;
    std::int32_t b = first_bucket(g);
    for (std::int32_t round = 0; round < positions / hisparse::bucket; ++round, b = next_bucket(b)) {
      const Int4 v = *reinterpret_cast<const Int4*>(s.keys + b);
      const std::uint32_t k[hisparse::bucket] = {static_cast<std::uint32_t>(v.x), static_cast<std::uint32_t>(v.y),
                                                 static_cast<std::uint32_t>(v.z), static_cast<std::uint32_t>(v.w)};
      std::int32_t at = -1;
      for (int i = 0; i < hisparse::bucket; ++i) {  // leaves by break: unrolled whole, the bucket kept in registers
        std::uint32_t key = k[i];
        if (key == hisparse::empty_word) {
          key = device::atomic_cas(s.keys + b + i, hisparse::empty_word, g);
          if (key == hisparse::empty_word) {
            ++added;
            at = b + i;
            break;
          }
        }
        if (key == g) {
          at = b + i;
          break;
        }
      }
      if (at >= 0) {
        device::atomic_min(s.words + at, j);
        return at;
      }
    }
    return -1;  // not reached: the set has room for every key
  }

  // The position of host row g in the set, or -1 (g < 0, or not there).
  KOKKOS_INLINE_FUNCTION static std::int32_t find(const hisparse_lru_order::Scratch& s, std::int32_t g) {
    using namespace hisparse_lru_order;
    if (g < 0) return -1;
    const auto key = static_cast<std::uint32_t>(g);
    std::int32_t b = first_bucket(key);
    for (std::int32_t round = 0; round < positions / hisparse::bucket; ++round, b = next_bucket(b)) {
      const Int4 v = *reinterpret_cast<const Int4*>(s.keys + b);
      const std::uint32_t k[hisparse::bucket] = {static_cast<std::uint32_t>(v.x), static_cast<std::uint32_t>(v.y),
                                                 static_cast<std::uint32_t>(v.z), static_cast<std::uint32_t>(v.w)};
      for (int i = 0; i < hisparse::bucket; ++i) {
        if (k[i] == key) return b + i;
        if (k[i] == hisparse::empty_word) return -1;
      }
    }
    return -1;
  }

  // What a thread holds from step A to the end.
  struct Owned {
    std::int32_t g[N][E];         // host row of each entry
    std::int32_t at[N][E];        // its position in the set; -1: the entry needs no slot
    std::int16_t slot[N][S];      // the old LRU order
    std::int32_t holds[N][S];     // the host row each of those slots holds
  };

  // Step A.
  KOKKOS_INLINE_FUNCTION void load(const member_type& team, const hisparse_lru_order::Scratch& s, std::int64_t row,
                                   std::int32_t request, std::int64_t hot_table_row, const std::int32_t* slot_rows,
                                   const std::int16_t* lru, bool padding, Owned& o,
                                   std::int32_t (&resident)[N][E]) const {
    using namespace hisparse_lru_order;
    const std::int32_t first = team.team_rank() * N;
    const std::int32_t* in = a.logical + row * a.logical_stride;
    std::int32_t tok[N][E];
    for (int n = 0; n < N; ++n) {
      for (int u = 0; u < E; ++u) tok[n][u] = in[(first + n) * E + u];
    }
    for (int n = 0; n < N; ++n) {
      for (int u = 0; u < S; ++u) o.slot[n][u] = padding ? std::int16_t{0} : lru[(first + n) * S + u];
    }
    const std::int32_t* source_table = source_table_row(request);
    const std::int32_t* resident_table = resident_table_row(request);
    for (int n = 0; n < N; ++n) {
      for (int u = 0; u < E; ++u) {
        o.g[n][u] = source_table != nullptr ? source_block(source_table, tok[n][u]) : -1;
        resident[n][u] = resident_table != nullptr ? resident_block(resident_table, tok[n][u]) : -1;
      }
    }
    for (int n = 0; n < N; ++n) {
      for (int u = 0; u < S; ++u) o.holds[n][u] = padding ? -1 : slot_rows[o.slot[n][u]];
    }
    // While the loads are in flight: clear the set, copy the hot block table.
    const Int4 empty{-1, -1, -1, -1};
    const Int4 unselected{static_cast<std::int32_t>(no_entry), static_cast<std::int32_t>(no_entry),
                          static_cast<std::int32_t>(no_entry), static_cast<std::int32_t>(no_entry)};
    for (std::int32_t i = team.team_rank(); i < positions / 4; i += threads) {
      reinterpret_cast<Int4*>(s.keys)[i] = empty;
      reinterpret_cast<Int4*>(s.words)[i] = unselected;
    }
    const std::int32_t* hot_table = a.hot_block_table + hot_table_row * a.hot_table_stride;
    // Blocks of the H hot slots, rounded up (a block may be larger than H).
    const std::int32_t cached = padding ? 0 : (H + (std::int32_t{1} << hot_split.shift) - 1) >> hot_split.shift;
    for (std::int32_t b = team.team_rank(); b < cached; b += threads) s.hot_blocks[b] = hot_table[b];
    for (int n = 0; n < N; ++n) {
      for (int u = 0; u < E; ++u) {
        o.g[n][u] = host_row(o.g[n][u], tok[n][u]);
        resident[n][u] = resident_row(resident[n][u], tok[n][u]);
      }
    }
  }

  // Step B. Returns valid entries in the low half, distinct host rows entered
  // in the high.
  KOKKOS_INLINE_FUNCTION std::uint32_t enter_entries(const member_type& team, const hisparse_lru_order::Scratch& s,
                                                     std::int64_t row, Owned& o,
                                                     const std::int32_t (&resident)[N][E]) const {
    const std::int32_t first = team.team_rank() * N;
    std::uint32_t valid = 0, added = 0;
    for (int n = 0; n < N; ++n) {
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = (first + n) * E + u;
        const std::int32_t g = o.g[n][u];
        if (a.resolved_rows != nullptr) a.resolved_rows[row * a.out_stride + j] = g;
        valid += resident[n][u] >= 0 || g >= 0 ? 1u : 0u;
        const bool pending = resident[n][u] < 0 && g >= 0;
        o.at[n][u] = -1;
        if (pending) {
          o.at[n][u] = enter(s, static_cast<std::uint32_t>(g), static_cast<std::uint32_t>(j), added);
        } else {
          store(row, j, resident[n][u]);
          if (a.miss_mask != nullptr) a.miss_mask[row * a.out_stride + j] = 0;
        }
      }
    }
    return valid + added * hisparse::high_count;
  }

  // Step C. Returns hit slots in the low half, keys first found in the high;
  // `hit` gets bit u of group n (bit n * S + u) for a hit slot.
  KOKKOS_INLINE_FUNCTION std::uint32_t classify(const hisparse_lru_order::Scratch& s, const Owned& o,
                                                std::uint32_t (&hit)[N]) const {
    std::uint32_t counts = 0;
    for (int n = 0; n < N; ++n) {
      std::int32_t at[S];
      for (int u = 0; u < S; ++u) at[u] = find(s, o.holds[n][u]);
      hit[n] = 0;
      for (int u = 0; u < S; ++u) {
        if (at[u] < 0) continue;
        // A hit key's first entry is not needed again: the low half goes.
        const std::uint32_t slot_word = ((static_cast<std::uint32_t>(o.slot[n][u]) + 1u) << 16) | 0xFFFFu;
        const std::uint32_t old = device::atomic_max(s.words + at[u], slot_word);
        hit[n] |= 1u << u;
        counts += 1u + ((old >> 16) == 0 ? hisparse::high_count : 0u);
      }
    }
    return counts;
  }

  // Step D, the LRU half: the new place of each LRU position (SPEC section 5,
  // step 4) and the evictable slots the misses take.
  KOKKOS_INLINE_FUNCTION void order(const member_type& team, const hisparse_lru_order::Scratch& s, const Owned& o,
                                    const std::uint32_t (&hit)[N], std::int32_t hits_before, std::int32_t hits,
                                    std::int32_t misses, std::int16_t* lru) const {
    const std::int32_t untouched = H - hits - misses;
    std::int32_t p = team.team_rank() * N * S;
    for (int n = 0; n < N; ++n) {
      for (int u = 0; u < S; ++u, ++p) {
        std::int32_t to;
        if ((hit[n] >> u) & 1u) {
          to = H - hits + hits_before;
          ++hits_before;
        } else {
          const std::int32_t e = p - hits_before;  // evictable rank
          if (e < K) s.evicted[e] = o.slot[n][u];
          to = e >= misses ? e - misses : untouched + e;
        }
        lru[to < 0 ? 0 : to] = o.slot[n][u];  // to < 0 only if slot_rows held a row twice
      }
    }
  }

  // Step D, the entries' half: hit entries write their outputs. Returns the
  // first entries of missing keys in the low half, the entries that repeat a
  // missing key in the high; `missing` gets, for group n, bit u for the
  // former and bit E + u for the latter.
  KOKKOS_INLINE_FUNCTION std::uint32_t write_hits(const member_type& team, const hisparse_lru_order::Scratch& s,
                                                  std::int64_t row, const Owned& o, std::uint32_t (&missing)[N]) const {
    const std::int32_t first = team.team_rank() * N;
    std::uint32_t counts = 0;
    for (int n = 0; n < N; ++n) {
      missing[n] = 0;
      for (int u = 0; u < E; ++u) {
        if (o.at[n][u] < 0) continue;
        const std::int32_t j = (first + n) * E + u;
        const std::uint32_t w = s.words[o.at[n][u]];
        if ((w >> 16) != 0) {
          store(row, j, hot_row(s, static_cast<std::int32_t>(w >> 16) - 1));
          if (a.miss_mask != nullptr) a.miss_mask[row * a.out_stride + j] = 0;
        } else if ((w & 0xFFFFu) == static_cast<std::uint32_t>(j)) {
          missing[n] |= 1u << u;
          counts += 1u;
        } else {
          missing[n] |= 1u << (E + u);
          counts += hisparse::high_count;
        }
      }
    }
    return counts;
  }

  // Step E: the m-th missing host row takes the m-th evictable slot. With
  // `repeated`, the key's word then holds the slot + 1 (0: none) for the
  // entries that repeat it.
  KOKKOS_INLINE_FUNCTION void write_misses(const member_type& team, const hisparse_lru_order::Scratch& s,
                                           std::int64_t row, const Owned& o, const std::uint32_t (&missing)[N],
                                           std::int32_t m, std::int32_t evictable, std::int32_t* slot_rows,
                                           bool repeated) const {
    const std::int32_t first = team.team_rank() * N;
    for (int n = 0; n < N; ++n) {
      for (int u = 0; u < E; ++u) {
        if (((missing[n] >> u) & 1u) == 0) continue;
        const std::int32_t j = (first + n) * E + u;
        // m < evictable unless slot_rows held rows many times over.
        const std::int32_t slot = m < evictable ? s.evicted[m] : -1;
        const std::int32_t x = slot < 0 ? -1 : hot_row(s, slot);
        store(row, j, x);
        if (a.miss_mask != nullptr) a.miss_mask[row * a.out_stride + j] = 1;
        if (slot >= 0) slot_rows[slot] = o.g[n][u];
        a.swap_host_rows[row * a.out_stride + m] = o.g[n][u];
        a.swap_device_rows[row * a.out_stride + m] = x;
        if (repeated) s.words[o.at[n][u]] = static_cast<std::uint32_t>(slot + 1) << 16;
        ++m;
      }
    }
  }

  // Step E, after a barrier: the entries that repeat a missing key.
  KOKKOS_INLINE_FUNCTION void write_repeats(const member_type& team, const hisparse_lru_order::Scratch& s,
                                            std::int64_t row, const Owned& o, const std::uint32_t (&missing)[N]) const {
    const std::int32_t first = team.team_rank() * N;
    for (int n = 0; n < N; ++n) {
      for (int u = 0; u < E; ++u) {
        if (((missing[n] >> (E + u)) & 1u) == 0) continue;
        const std::int32_t j = (first + n) * E + u;
        const std::uint32_t w = s.words[o.at[n][u]];
        store(row, j, (w >> 16) == 0 ? -1 : hot_row(s, static_cast<std::int32_t>(w >> 16) - 1));
        if (a.miss_mask != nullptr) a.miss_mask[row * a.out_stride + j] = 0;
      }
    }
  }

  KOKKOS_INLINE_FUNCTION std::int32_t hot_row(const hisparse_lru_order::Scratch& s, std::int32_t slot) const {
    const std::int32_t b = hot_split.block(slot);
    return (s.hot_blocks[b] << hot_split.shift) + hot_split.offset(slot);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t row = team.league_rank();
    const std::int32_t state = a.request_state_indices != nullptr ? a.request_state_indices[row]
                                                                  : static_cast<std::int32_t>(row);
    const std::int32_t request = a.request_ids[row];
    // A padding row resolves as a row whose request is outside the tables:
    // every output -1, counts 0; its state is neither read nor written.
    const bool padding = state < 0 || state >= a.num_state_rows;
    const std::int64_t state_row = padding ? 0 : state;
    const std::int64_t hot_table_row = a.hot_table_by_state && !padding ? state : row;
    std::int32_t* slot_rows = a.slot_rows + state_row * a.slot_rows_stride;
    std::int16_t* lru = a.lru + state_row * a.lru_stride;
    void* base = team.team_scratch(Level).get_shmem_aligned(hisparse_lru_order::Scratch::bytes(), 16);
    const hisparse_lru_order::Scratch s = hisparse_lru_order::Scratch::carve(base);
    std::uint32_t* const totals[2] = {s.totals, s.totals + hisparse::team_total_words / 2};

    Owned o;
    {
      std::int32_t resident[N][E];
      load(team, s, row, padding ? -1 : request, hot_table_row, slot_rows, lru, padding, o, resident);
      team.team_barrier();
      std::uint32_t entered = 0;
      device::team_exclusive_sum(team, totals[0], enter_entries(team, s, row, o, resident), entered);
      if (a.valid_counts != nullptr && team.team_rank() == 0) {
        a.valid_counts[row] = static_cast<std::int32_t>(entered & 0xFFFFu);
      }
      if ((entered >> 16) == 0) {
        // Nothing consults the hot slots (or a padding row): the LRU stays as it is.
        if (team.team_rank() == 0) a.swap_counts[row] = 0;
        return;
      }
      const std::int32_t distinct = static_cast<std::int32_t>(entered >> 16);

      std::uint32_t hit[N];
      std::uint32_t found = 0;
      const std::uint32_t before = device::team_exclusive_sum(team, totals[1], classify(s, o, hit), found);
      const std::int32_t hits = static_cast<std::int32_t>(found & 0xFFFFu);
      const std::int32_t misses = distinct - static_cast<std::int32_t>(found >> 16);
      order(team, s, o, hit, static_cast<std::int32_t>(before & 0xFFFFu), hits, misses, lru);

      std::uint32_t missing[N];
      std::uint32_t missed = 0;
      const std::uint32_t m = device::team_exclusive_sum(team, totals[0], write_hits(team, s, row, o, missing), missed);
      const bool repeated = (missed >> 16) != 0;
      write_misses(team, s, row, o, missing, static_cast<std::int32_t>(m & 0xFFFFu), H - hits, slot_rows, repeated);
      if (repeated) {
        team.team_barrier();
        write_repeats(team, s, row, o, missing);
      }
      if (team.team_rank() == 0) {
        a.swap_counts[row] = misses;
        if (a.hit_miss_counters != nullptr) {
          Kokkos::atomic_add(&a.hit_miss_counters[0], static_cast<std::uint64_t>(hits));
          Kokkos::atomic_add(&a.hit_miss_counters[1], static_cast<std::uint64_t>(misses));
        }
      }
    }
  }
};

// Team scratch of one row; + 16: room to align the set.
constexpr std::size_t resolve_hisparse_in_lru_order_scratch_bytes = hisparse_lru_order::Scratch::bytes() + 16;

// A team's threads own whole groups (one each on a GPU, all of them on the
// host); Level: the team scratch level.
template <class Space, int Level>
void resolve_hisparse_in_lru_order(const Space& space, const HiSparseResolveArgs& a) {
  constexpr int team = row_team_size<Space>(hisparse::team_threads);
  constexpr int N = hisparse_lru_order::groups / team;
  static_assert(N * team == hisparse_lru_order::groups, "a team's threads own whole groups");
  using policy_type = Kokkos::TeamPolicy<Space, Kokkos::LaunchBounds<hisparse::team_threads, 1>>;
  policy_type policy(space, static_cast<int>(a.num_rows), team);
  policy.set_scratch_size(Level, Kokkos::PerTeam(resolve_hisparse_in_lru_order_scratch_bytes));
  Kokkos::parallel_for("sparse_mla::resolve_hisparse_in_lru_order", policy,
                       HiSparseResolveInLruOrder<Space, Level, N>{ResolveTables<SplitBy::shift>::of(a)});
}

}  // namespace sparse_mla::kernels
