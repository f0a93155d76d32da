// HiSparse swap-in (SPEC section 5): one team per batch row resolves the
// row's logical top-k against the hot slots of its state row.
//
// The row's distinct host rows go into a team-scratch hash set (open
// addressing in buckets of 4 positions, 3K/2 positions, so it is at most two
// thirds full). A position holds its key, the host row itself, so that a
// probe is one 16-byte scratch load and four compares, and beside it a word
// of what the passes learn about the key (hisparse::entry_unset and below):
// its first top-k entry, then the hot slot that holds it or, for a key no
// slot holds, its miss number. With each entry's set position, the new LRU
// order, one hit bit per LRU position, two class bits per entry and the
// per-warp team sums, a production row (K = 2048, H = 4096, hot blocks of
// 64) needs 39,424 bytes of scratch (and 16 to align the set): it fits the
// 40,936 bytes of level-0 (shared memory) scratch that a Kokkos 4.6 CUDA
// team can have, so every probe and atomic stays on the chip. Larger shapes
// run the same code from level-1 (global) scratch.
//
// On a GPU one team resolves a row alone, so the row's time is its chain of
// dependent loads and barriers, and the more warps hide each other's
// latency the shorter it is: a team is 1024 threads. A thread takes fixed
// groups of entries (2) or LRU positions (4), one group of each per thread
// at K = 2048, H = 4096, and issues a group's global loads before it uses
// any of them. Each team sum is one barrier (device::team_exclusive_sum: a
// warp shuffle scan, one word per warp through scratch), and that barrier
// is also the one between two passes. LaunchBounds<1024, 1> keeps the kernel
// within 64 registers (a 1024-thread team's share of an SM's register file).
// On the host a team is one thread and the same passes run as loops.
//
// Passes (the barrier that ends each is in brackets):
//   1. map_entries: map every entry to its host row g and its resident row;
//      write the resolved rows, the resident and invalid outputs and the
//      valid count; insert the host rows of the entries that need a slot
//      (each key keeps its first top-k entry: duplicates collapse to it).
//      The set is cleared and the hot block table cached while the first
//      entries' table loads are in flight [a barrier], and on CUDA the
//      state's slot_rows and lru are prefetched for pass 2 [team sum: valid
//      entries, distinct keys]. A row with no key returns here (its LRU
//      untouched), and so does a padding row, mapped as a row whose request
//      is outside the tables (all -1, counts 0).
//   2. classify_slots: walk the old LRU order; a slot whose host row is in
//      the set is a hit and records itself in the key's word [team sum:
//      hits, keys held]. Then each LRU position moves to its new place
//      (untouched evictable, newly loaded in miss order, hits, each in old
//      order), so the m-th oldest evictable slot lands where miss m finds it.
//   3. classify_entries: an entry whose key no slot holds is its key's first
//      entry (the key loads) or a duplicate of it [team sum: first entries,
//      duplicates, in entry order: the miss numbers].
//   4. write_results: the hot and attention rows of every entry of a hit
//      key and of every first entry of a missing key; the latter also
//      appends the swap pair and sets its slot's host row, and publishes its
//      miss number in the key's word; the new LRU order is stored. Only if
//      the row has duplicates of missing keys [a barrier] do they read their
//      miss numbers and write their rows.
#pragma once

#include <Kokkos_Core.hpp>

#include "primitives.hpp"
#include "space_traits.hpp"
#include "kernels.hpp"

namespace sparse_mla::kernels {

namespace hisparse {

// A key position that holds no host row (host rows are never negative).
constexpr std::uint32_t empty_key = 0xFFFFFFFFu;
// position[j] of an entry that needs no slot (resident, invalid).
constexpr std::uint16_t no_position = 0xFFFFu;

// The word beside a key. Pass 1: the first entry j that selected the key, in
// bits 0-15 (atomic min from entry_unset; the high half is 0). Pass 2: a hit
// slot s makes it (s + 1) << 16 (atomic max, so a state that held a row in
// two slots still resolves deterministically, to the larger slot). Pass 4:
// the first entry of a key no slot holds makes it
// (m << 16) | miss_flag | j, m its miss number.
// The packing needs K <= H <= hisparse_max_hot_slots (2^15): j, m < 2^15,
// slot + 1 <= 2^15, set positions < 3K/2 + 4 < no_position. check_resolve
// refuses other shapes with a message naming hot_slots.
constexpr std::uint32_t entry_unset = 0xFFFFu;
constexpr std::uint32_t entry_bits = 0x7FFFu;
constexpr std::uint32_t miss_flag = 0x8000u;
static_assert(hisparse_max_hot_slots <= 32768, "entries, slots and miss numbers must fit the packed set words");

// A GPU team's threads, and the groups of entries and LRU positions they
// take: one entry group and one position group per thread at K = 2048,
// H = 4096.
constexpr int team_threads = 1024;
constexpr int entries_per_group = 2;
constexpr int slots_per_group = 4;  // one byte of hit flags
// Up to this many hot blocks per row (H / hot_block_size) are cached in
// scratch by pass 1, so the last pass maps slots to hot rows without global loads.
constexpr std::int32_t max_cached_hot_blocks = 1024;
// Per-group partial counts of the team sums (device::team_exclusive_sum): two
// buffers, used in turn, so that a sum's buffer is written again only after a
// later barrier that every thread reaches after reading it.
constexpr std::int32_t team_total_words = 2 * device::team_exclusive_sum_words;

// An entry's class in pass 3 (two bits per entry, entries_per_group to a byte).
constexpr std::uint32_t first_miss = 1u, duplicate_miss = 2u;

KOKKOS_INLINE_FUNCTION std::int32_t groups(std::int32_t n, std::int32_t per_group) {
  return (n + per_group - 1) / per_group;
}

// The set is probed a bucket of 8 positions at a time (two 16-byte scratch
// loads of the keys): a key starts at the first position of its hash bucket
// and moves on a bucket at a time. A key sits at the first position that was
// empty in its probe order when it went in, and positions are never emptied,
// so a lookup ends at its key or at the first empty position. A warp probes
// until its longest chain ends: with 8 positions a bucket, nearly every key
// of a row ends in its first bucket.
constexpr std::int32_t bucket = 8;

// Positions of the set for top_k entries: 3K/2 (at most two thirds full), a
// whole number of buckets.
KOKKOS_INLINE_FUNCTION std::int32_t set_positions(std::int32_t top_k) {
  return (3 * top_k / 2 + bucket - 1) / bucket * bucket;
}

// Knuth's multiplicative hash, scaled to [0, size) by its high bits.
KOKKOS_INLINE_FUNCTION std::int32_t hash_position(std::int32_t key, std::int32_t size) {
  const std::uint32_t mixed = static_cast<std::uint32_t>(key) * 2654435761u;
  return static_cast<std::int32_t>((static_cast<std::uint64_t>(mixed) * static_cast<std::uint32_t>(size)) >> 32);
}

// The lowest set bit of a nonzero mask.
KOKKOS_INLINE_FUNCTION std::int32_t lowest_bit(std::uint32_t mask) { return device::first_lane(mask); }

// The team's scratch arrays, carved from one allocation. Each array's
// address is computed from the base where it is used, so that a thread
// keeps one pointer in its registers instead of eight.
struct ResolveScratch {
  char* base;  // 16-byte aligned
  std::int32_t top_k, hot_slots, cached;

  // Hot block table entries cached per row: all of the row's, or 0.
  KOKKOS_INLINE_FUNCTION static std::int32_t cached_hot_blocks(std::int32_t hot_slots, std::int32_t hot_block_size) {
    const std::int32_t blocks = groups(hot_slots, hot_block_size);
    return blocks <= max_cached_hot_blocks ? blocks : 0;
  }
  KOKKOS_INLINE_FUNCTION static std::size_t bytes(std::int32_t top_k, std::int32_t hot_slots, std::int32_t cached) {
    const std::size_t k = static_cast<std::size_t>(top_k), h = static_cast<std::size_t>(hot_slots);
    return 4 * (2 * static_cast<std::size_t>(set_positions(top_k)) + static_cast<std::size_t>(team_total_words + cached)) +
           2 * (k + h) + (h + slots_per_group - 1) / slots_per_group + (k + entries_per_group - 1) / entries_per_group;
  }
  // [set_positions(K)]: the set's host rows, empty_key where none.
  KOKKOS_INLINE_FUNCTION std::uint32_t* keys() const { return reinterpret_cast<std::uint32_t*>(base); }
  // [set_positions(K)]: the word of the key at the same position.
  KOKKOS_INLINE_FUNCTION std::uint32_t* words() const { return keys() + set_positions(top_k); }
  // [team_total_words]: per-group partial sums (device::team_exclusive_sum).
  KOKKOS_INLINE_FUNCTION std::uint32_t* totals() const { return words() + set_positions(top_k); }
  // [cached]: the row's hot block table, or unused (cached = 0).
  KOKKOS_INLINE_FUNCTION std::int32_t* hot_blocks() const {
    return reinterpret_cast<std::int32_t*>(totals() + team_total_words);
  }
  // [K]: set position of entry j's host row, or no_position.
  KOKKOS_INLINE_FUNCTION std::uint16_t* position() const {
    return reinterpret_cast<std::uint16_t*>(hot_blocks() + cached);
  }
  // [H]: the new LRU order (pass 2).
  KOKKOS_INLINE_FUNCTION std::int16_t* lru() const { return reinterpret_cast<std::int16_t*>(position() + top_k); }
  // [ceil(H / 4)]: bit u of byte i: the slot at old LRU position 4i + u is a hit.
  KOKKOS_INLINE_FUNCTION std::uint8_t* hit_flags() const { return reinterpret_cast<std::uint8_t*>(lru() + hot_slots); }
  // [ceil(K / 2)]: pass 3, bits 2u, 2u + 1 of byte i: class of entry 2i + u.
  KOKKOS_INLINE_FUNCTION std::uint8_t* classes() const { return hit_flags() + groups(hot_slots, slots_per_group); }
};

}  // namespace hisparse

// The row shape a launch is compiled for. AnyShape takes every size from
// the arguments; ProductionShape makes the production row's sizes
// (K = 2048, H = 4096, a team of 1024 threads, block sizes that are powers
// of two) constants, so that the compiler drops the group loops (one group
// of each kind per thread) and folds the sizes into the index arithmetic.
struct AnyShape {
  static constexpr std::int32_t top_k = 0, hot_slots = 0, threads = 0;
  static constexpr SplitBy split = SplitBy::either;
};
struct ProductionShape {
  static constexpr std::int32_t top_k = 2048, hot_slots = 4096, threads = hisparse::team_threads;
  static constexpr SplitBy split = SplitBy::shift;
};

// Level: the team scratch level, a template argument so that the compiler
// knows level-0 scratch is shared memory and reaches it with shared-memory
// instructions (32-bit addresses) rather than generic ones.
template <class Space, int Level, class Shape = AnyShape>
struct HiSparseResolve {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  static constexpr int E = hisparse::entries_per_group;
  static constexpr int S = hisparse::slots_per_group;
  HiSparseResolveArgs a;
  std::int32_t cached_blocks;  // hot block table entries cached in scratch per row
  BlockSplit<Shape::split> source_split, resident_split, hot_split;  // by a.source_block_size, ...

  // The row's sizes and the team's threads: the shape's constants, or the arguments'.
  KOKKOS_INLINE_FUNCTION std::int32_t top_k() const { return Shape::top_k > 0 ? Shape::top_k : a.top_k; }
  KOKKOS_INLINE_FUNCTION std::int32_t hot_slots() const { return Shape::hot_slots > 0 ? Shape::hot_slots : a.hot_slots; }
  KOKKOS_INLINE_FUNCTION static std::int32_t threads(const member_type& team) {
    return Shape::threads > 0 ? Shape::threads : team.team_size();
  }

  KOKKOS_INLINE_FUNCTION std::int32_t set_size() const { return hisparse::set_positions(top_k()); }
  KOKKOS_INLINE_FUNCTION std::int32_t first_position(std::int32_t key) const {
    return hisparse::hash_position(key, set_size() / hisparse::bucket) * hisparse::bucket;
  }
  KOKKOS_INLINE_FUNCTION std::int32_t next_bucket(std::int32_t b) const {
    return b + hisparse::bucket == set_size() ? 0 : b + hisparse::bucket;
  }
  KOKKOS_INLINE_FUNCTION std::int32_t entry_groups() const { return hisparse::groups(top_k(), E); }
  KOKKOS_INLINE_FUNCTION std::int32_t slot_groups() const { return hisparse::groups(hot_slots(), S); }

  // The bucket at b against `key` (two 16-byte loads): bit i is set when
  // position b + i holds the key, bit 8 + i when it is empty.
  KOKKOS_INLINE_FUNCTION std::uint32_t match_bucket(const hisparse::ResolveScratch& s, std::int32_t b,
                                                    std::uint32_t key) const {
    const Int4* v = reinterpret_cast<const Int4*>(s.keys() + b);
    const Int4 lo = v[0], hi = v[1];
    return match4(lo, key) | (match4(hi, key) << 4);
  }
  KOKKOS_INLINE_FUNCTION static std::uint32_t match4(const Int4& v, std::uint32_t key) {
    const auto x = static_cast<std::uint32_t>(v.x), y = static_cast<std::uint32_t>(v.y),
               z = static_cast<std::uint32_t>(v.z), w = static_cast<std::uint32_t>(v.w);
    const std::uint32_t found = (x == key ? 1u : 0u) | (y == key ? 2u : 0u) | (z == key ? 4u : 0u) | (w == key ? 8u : 0u);
    // Host rows are never negative: an empty position is the only one with its top bit set.
    const std::uint32_t empty = (x >> 31) | ((y >> 31) << 1) | ((z >> 31) << 2) | ((w >> 31) << 3);
    return found | (empty << 8);
  }

  // Looks up N host rows together (g[u] < 0: none), one bucket of each per
  // round, so that their scratch loads overlap. h[u]: the key's position, or
  // -1 when it is not in the set.
  template <int N>
  KOKKOS_INLINE_FUNCTION void find_keys(const hisparse::ResolveScratch& s, const std::int32_t (&g)[N],
                                        std::int32_t (&h)[N]) const {
    std::int32_t b[N];
    std::uint32_t open = 0;
    for (int u = 0; u < N; ++u) {
      h[u] = -1;
      b[u] = g[u] >= 0 ? first_position(g[u]) : 0;
      open |= g[u] >= 0 ? 1u << u : 0u;
    }
    while (open != 0) {
      std::uint32_t m[N];
      for (int u = 0; u < N; ++u) m[u] = match_bucket(s, b[u], static_cast<std::uint32_t>(g[u]));
      for (int u = 0; u < N; ++u) {
        if (((open >> u) & 1u) == 0) continue;
        if ((m[u] & 0xFFu) != 0) {
          h[u] = b[u] + hisparse::lowest_bit(m[u] & 0xFFu);
          open &= ~(1u << u);
        } else if ((m[u] >> 8) != 0) {
          open &= ~(1u << u);
        } else {
          b[u] = next_bucket(b[u]);
        }
      }
    }
  }

  // Inserts N host rows together (g[u] < 0: none; entry j[u] selected it),
  // gives each key's position in h[u], and lowers the key's first entry to
  // j[u]. Returns how many keys this call added to the set. An empty
  // position seen in a bucket may be taken by another key before the
  // compare-and-swap, which returns that key: the insert then tries the
  // next position it saw empty, and reads a bucket only when it moves to
  // it (a plain read after a failed atomic could see a stale line of
  // level-1 scratch, which is global memory).
  template <int N>
  KOKKOS_INLINE_FUNCTION std::int32_t insert_keys(const hisparse::ResolveScratch& s, const std::int32_t (&g)[N],
                                                  const std::int32_t (&j)[N], std::int32_t (&h)[N]) const {
    std::int32_t b[N];
    std::uint32_t m[N];
    std::uint32_t open = 0;
    std::int32_t added = 0;
    for (int u = 0; u < N; ++u) {
      h[u] = -1;
      b[u] = g[u] >= 0 ? first_position(g[u]) : 0;
      open |= g[u] >= 0 ? 1u << u : 0u;
    }
    std::uint32_t read = open;  // keys whose bucket at b[u] is to be read
    while (open != 0) {
      for (int u = 0; u < N; ++u) {
        if ((read >> u) & 1u) m[u] = match_bucket(s, b[u], static_cast<std::uint32_t>(g[u]));
      }
      read = 0;
      for (int u = 0; u < N; ++u) {
        if (((open >> u) & 1u) == 0) continue;
        if ((m[u] & 0xFFu) != 0) {
          h[u] = b[u] + hisparse::lowest_bit(m[u] & 0xFFu);
          open &= ~(1u << u);
        } else if ((m[u] >> 8) != 0) {
          const std::int32_t i = hisparse::lowest_bit(m[u] >> 8);
          const std::uint32_t key = static_cast<std::uint32_t>(g[u]);
          const std::uint32_t old = device::atomic_cas(&s.keys()[b[u] + i], hisparse::empty_key, key);
          if (old == hisparse::empty_key || old == key) {
            added += old == hisparse::empty_key ? 1 : 0;
            h[u] = b[u] + i;
            open &= ~(1u << u);
          } else {
            m[u] &= ~(0x100u << i);  // taken by another key
          }
        } else {
          b[u] = next_bucket(b[u]);
          read |= 1u << u;
        }
      }
    }
    for (int u = 0; u < N; ++u) {
      if (h[u] >= 0) device::atomic_min(&s.words()[h[u]], static_cast<std::uint32_t>(j[u]));
    }
    return added;
  }

  // The host row of request-relative position `tok` (SPEC section 5, step 1)
  // in two steps, so that a group issues all its table loads before it uses
  // one: the source block table entry (-1 when `tok` is outside the table),
  // then the host row (-1 for a negative block or a row outside the pool).
  // `table` is the request's row of the table, which has at least one block
  // (map_entries does not call this for a request outside the table). Masks,
  // not selects: nvcc turns `inside ? load : -1` back into a branch around
  // the load, so a thread's table loads would not issue together.
  KOKKOS_INLINE_FUNCTION std::int32_t source_block(const std::int32_t* table, std::int32_t tok) const {
    const std::int32_t block = source_split.block(tok);
    const std::int32_t inside = tok >= 0 && block < a.source_blocks_per_request;  // 1 or 0
    return table[block & -inside] | (inside - 1);
  }
  KOKKOS_INLINE_FUNCTION std::int32_t host_row(std::int32_t physical, std::int32_t tok) const {
    if (physical < 0) return -1;
    const std::int64_t g = static_cast<std::int64_t>(physical) * a.source_block_size + source_split.offset(tok);
    return g < a.host_rows ? static_cast<std::int32_t>(g) : -1;
  }

  // The same for the device row of `tok` when its page is resident (else -1).
  KOKKOS_INLINE_FUNCTION std::int32_t resident_block(const std::int32_t* table, std::int32_t tok) const {
    const std::int32_t block = resident_split.block(tok);
    const std::int32_t inside = tok >= 0 && block < a.resident_blocks_per_request;  // 1 or 0
    return table[block & -inside] | (inside - 1);
  }

  // The request's rows of the source and resident block tables, or nullptr
  // when the request is outside a table, the table has no blocks, or (the
  // resident one) there is none. request -1: both nullptr.
  KOKKOS_INLINE_FUNCTION const std::int32_t* source_table_row(std::int32_t request) const {
    const bool inside = request >= 0 && request < a.source_num_requests && a.source_blocks_per_request > 0;
    return inside ? a.source_block_table + static_cast<std::int64_t>(request) * a.source_table_stride : nullptr;
  }
  KOKKOS_INLINE_FUNCTION const std::int32_t* resident_table_row(std::int32_t request) const {
    const bool inside = a.resident_block_table != nullptr && request >= 0 && request < a.resident_num_requests &&
                        a.resident_blocks_per_request > 0;
    return inside ? a.resident_block_table + static_cast<std::int64_t>(request) * a.resident_table_stride : nullptr;
  }
  KOKKOS_INLINE_FUNCTION std::int32_t resident_row(std::int32_t physical, std::int32_t tok) const {
    if (physical < 0 || physical == a.resident_null_block) return -1;
    return static_cast<std::int32_t>(static_cast<std::int64_t>(physical) * a.resident_block_size +
                                     resident_split.offset(tok));
  }

  // Hot row of `slot`; `row` is the batch row, or the state row with
  // hot_table_by_state. Reads the scratch copy of the table when there is one.
  KOKKOS_INLINE_FUNCTION std::int32_t hot_row(const hisparse::ResolveScratch& s, std::int64_t row,
                                              std::int32_t slot) const {
    const std::int32_t b = hot_split.block(slot);
    const std::int32_t block = cached_blocks > 0 ? s.hot_blocks()[b] : a.hot_block_table[row * a.hot_table_stride + b];
    return static_cast<std::int32_t>(static_cast<std::int64_t>(block) * a.hot_block_size + hot_split.offset(slot));
  }

  // Writes the hot row of entry j and its attention index.
  KOKKOS_INLINE_FUNCTION void store(std::int64_t row, std::int32_t j, std::int32_t x) const {
    a.hot_indices[row * a.out_stride + j] = x;
    if (a.attention_indices != nullptr) {
      a.attention_indices[row * a.attention_stride + j] =
          x < 0 ? -1
                : static_cast<std::int32_t>(hot_split.block(x) * a.attention_block_stride + hot_split.offset(x));
    }
  }

  // Counts summed over the team pack two 16-bit counts into a word (low and
  // high half): every count here is at most hot_slots <= 2^15, so neither
  // half carries into the other.
  static constexpr std::uint32_t high_count = std::uint32_t{1} << 16;

  // Groups [begin, end) of n for this thread: consecutive, so that a team
  // sum over the threads is one in group order.
  KOKKOS_INLINE_FUNCTION static void thread_groups(const member_type& team, std::int32_t n, std::int32_t& begin,
                                                   std::int32_t& end) {
    const std::int32_t per_thread = hisparse::groups(n, threads(team));
    begin = team.team_rank() * per_thread;
    end = begin + per_thread < n ? begin + per_thread : n;
  }

  // Pass 1's entry group i: entries i, i + G, ... (coalesced loads), their
  // tokens, then their source and resident block table entries.
  struct EntryGroup {
    std::int32_t tok[E], source[E], resident[E];
  };
  KOKKOS_INLINE_FUNCTION void load_tokens(const std::int32_t* in, std::int32_t i, EntryGroup& e) const {
    for (int u = 0; u < E; ++u) {
      const std::int32_t j = i + u * entry_groups();
      e.tok[u] = j < top_k() ? in[j] : -1;
    }
  }
  // Branches only on the row (uniform), none per entry.
  KOKKOS_INLINE_FUNCTION void load_tables(const std::int32_t* source_table, const std::int32_t* resident_table,
                                          EntryGroup& e) const {
    for (int u = 0; u < E; ++u) e.source[u] = source_table != nullptr ? source_block(source_table, e.tok[u]) : -1;
    for (int u = 0; u < E; ++u) {
      e.resident[u] = resident_table != nullptr ? resident_block(resident_table, e.tok[u]) : -1;
    }
  }

  // Pass 1 for one entry group: the outputs of entries that need no slot,
  // the keys of the others. Returns valid entries (low half) and keys added
  // to the set (high half).
  KOKKOS_INLINE_FUNCTION std::uint32_t map_group(const hisparse::ResolveScratch& s, std::int64_t row, std::int32_t i,
                                                 const EntryGroup& e) const {
    const std::int32_t K = top_k();
    std::int32_t g[E], resident[E], j[E], key[E], h[E];
    std::uint32_t valid = 0;
    for (int u = 0; u < E; ++u) {
      g[u] = host_row(e.source[u], e.tok[u]);
      resident[u] = resident_row(e.resident[u], e.tok[u]);
    }
    for (int u = 0; u < E; ++u) {
      j[u] = i + u * entry_groups();
      key[u] = -1;
      if (j[u] >= K) continue;
      if (a.resolved_rows != nullptr) a.resolved_rows[row * a.out_stride + j[u]] = g[u];
      const bool pending = resident[u] < 0 && g[u] >= 0;
      if (!pending) {
        store(row, j[u], resident[u]);
        if (a.miss_mask != nullptr) a.miss_mask[row * a.out_stride + j[u]] = 0;
      }
      key[u] = pending ? g[u] : -1;
      valid += resident[u] >= 0 || g[u] >= 0 ? 1u : 0u;
    }
    const std::int32_t added = insert_keys(s, key, j, h);
    for (int u = 0; u < E; ++u) {
      if (j[u] < K) s.position()[j[u]] = key[u] >= 0 ? static_cast<std::uint16_t>(h[u]) : hisparse::no_position;
    }
    return valid + static_cast<std::uint32_t>(added) * high_count;
  }

  // Pass 1. `request` -1 maps every entry to -1; `cached` hot block table
  // entries are copied to scratch. On CUDA the state's slot_rows and lru are
  // prefetched for pass 2 (not for a padding row). The first entry group's
  // loads are issued before the set is cleared, and its table loads are in
  // flight across the barrier that ends the clearing.
  KOKKOS_INLINE_FUNCTION std::uint32_t map_entries(const member_type& team, const hisparse::ResolveScratch& s,
                                                   std::int64_t row, std::int32_t request, std::int64_t hot_table_row,
                                                   std::int32_t cached, const std::int32_t* slot_rows,
                                                   const std::int16_t* lru, bool prefetch) const {
    const std::int32_t* in = a.logical + row * a.logical_stride;
    const std::int32_t* hot_table = a.hot_block_table + hot_table_row * a.hot_table_stride;
    const std::int32_t* source_table = source_table_row(request);
    const std::int32_t* resident_table = resident_table_row(request);
    const std::int32_t G = entry_groups();
    const std::int32_t rank = team.team_rank(), step = threads(team);
    EntryGroup e{};
    if (rank < G) load_tokens(in, rank, e);
    const Int4 empty_keys{-1, -1, -1, -1};
    const Int4 unset_words{static_cast<std::int32_t>(hisparse::entry_unset), static_cast<std::int32_t>(hisparse::entry_unset),
                           static_cast<std::int32_t>(hisparse::entry_unset), static_cast<std::int32_t>(hisparse::entry_unset)};
    for (std::int32_t q = rank; q < set_size() / 4; q += step) {
      reinterpret_cast<Int4*>(s.keys())[q] = empty_keys;
      reinterpret_cast<Int4*>(s.words())[q] = unset_words;
    }
    // Pass 2 reads these two arrays: bring them to this SM's L1 while the
    // table loads are in flight, a line (32 slot rows, 64 LRU positions) at
    // a time. A hint where the device has one (device::prefetch_l1),
    // nothing elsewhere.
    if (prefetch) {
      const std::int32_t H = hot_slots();
      for (std::int32_t l = rank; l <= H / 32; l += step) {
        device::prefetch_l1(slot_rows + (l * 32 < H ? l * 32 : H - 1));
        if (l <= H / 64) device::prefetch_l1(lru + (l * 64 < H ? l * 64 : H - 1));
      }
    }
    for (std::int32_t b = rank; b < cached; b += step) s.hot_blocks()[b] = hot_table[b];
    if (rank < G) load_tables(source_table, resident_table, e);
    team.team_barrier();  // the set is clear
    std::uint32_t counts = 0;
    for (std::int32_t i = rank; i < G; i += step) {
      if (i != rank) {
        load_tokens(in, i, e);
        load_tables(source_table, resident_table, e);
      }
      counts += map_group(s, row, i, e);
    }
    return counts;
  }

  // Pass 2, first half, for LRU position groups [begin, end) (group i:
  // positions 4i .. 4i + 3). Returns this thread's hit slots (low half) and
  // the keys they are the first to hold (high).
  KOKKOS_INLINE_FUNCTION std::uint32_t classify_slots(const hisparse::ResolveScratch& s, const std::int32_t* slot_rows,
                                                      const std::int16_t* lru, std::int32_t begin,
                                                      std::int32_t end) const {
    const std::int32_t H = hot_slots();
    std::uint32_t counts = 0;
    for (std::int32_t i = begin; i < end; ++i) {
      const std::int32_t first = i * S;
      std::int32_t slot[S], g[S];
      for (int u = 0; u < S; ++u) slot[u] = first + u < H ? lru[first + u] : -1;
      for (int u = 0; u < S; ++u) g[u] = slot[u] >= 0 ? slot_rows[slot[u]] : -1;
      // All eight loads above are issued first; the lookups go one at a
      // time (a bucket is eight registers), which keeps the kernel within
      // its registers.
      std::uint32_t flags = 0;
      for (int u = 0; u < S; ++u) {
        const std::int32_t gu[1] = {g[u]};
        std::int32_t h[1];
        find_keys(s, gu, h);
        if (h[0] < 0) continue;
        const std::uint32_t old = device::atomic_max(&s.words()[h[0]], static_cast<std::uint32_t>(slot[u] + 1) << 16);
        flags |= 1u << u;
        counts += 1u + ((old >> 16) == 0 ? high_count : 0u);
      }
      s.hit_flags()[i] = static_cast<std::uint8_t>(flags);
    }
    return counts;
  }

  // Pass 2, second half: each of the thread's LRU positions moves to its
  // new place. `hits_before`: hit slots at earlier LRU positions.
  KOKKOS_INLINE_FUNCTION void order_slots(const hisparse::ResolveScratch& s, const std::int16_t* lru, std::int32_t begin,
                                          std::int32_t end, std::int32_t hits_before, std::int32_t hits,
                                          std::int32_t misses) const {
    const std::int32_t H = hot_slots();
    const std::int32_t untouched = H - hits - misses;
    for (std::int32_t i = begin; i < end; ++i) {
      const std::int32_t first = i * S;
      const std::uint32_t flags = s.hit_flags()[i];
      std::int16_t slot[S];
      for (int u = 0; u < S; ++u) slot[u] = first + u < H ? lru[first + u] : std::int16_t{0};
      for (int u = 0; u < S && first + u < H; ++u) {
        std::int32_t to;
        if ((flags >> u) & 1u) {
          to = H - hits + hits_before;  // hits, in old order
          ++hits_before;
        } else {
          const std::int32_t e = first + u - hits_before;  // evictable rank
          to = e >= misses ? e - misses : untouched + e;   // untouched, then newly loaded
        }
        s.lru()[to < 0 ? 0 : to] = slot[u];  // to < 0 only if slot_rows held a row twice
      }
    }
  }

  // Pass 3 for entry groups [begin, end) (group i: entries 2i, 2i + 1).
  // Returns the first entries of keys no slot holds (low half) and the
  // other entries of those keys (high).
  KOKKOS_INLINE_FUNCTION std::uint32_t classify_entries(const hisparse::ResolveScratch& s, std::int32_t begin,
                                                        std::int32_t end) const {
    const std::int32_t K = top_k();
    std::uint32_t counts = 0;
    for (std::int32_t i = begin; i < end; ++i) {
      std::uint32_t classes = 0;
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i * E + u;
        const std::uint16_t h = j < K ? s.position()[j] : hisparse::no_position;
        if (h == hisparse::no_position) continue;
        const std::uint32_t w = s.words()[h];
        if ((w >> 16) != 0) continue;  // a slot holds the key
        const bool first = (w & 0xFFFFu) == static_cast<std::uint32_t>(j);
        classes |= (first ? hisparse::first_miss : hisparse::duplicate_miss) << (2 * u);
        counts += first ? 1u : high_count;
      }
      s.classes()[i] = static_cast<std::uint8_t>(classes);
    }
    return counts;
  }

  // Pass 4 for entry groups [begin, end): every entry but the duplicates of
  // missing keys. `m`: first entries of missing keys in earlier groups.
  KOKKOS_INLINE_FUNCTION void write_results(const hisparse::ResolveScratch& s, std::int64_t row,
                                            std::int64_t hot_table_row, std::int32_t* slot_rows, std::int32_t begin,
                                            std::int32_t end, std::int32_t m, std::int32_t untouched) const {
    const std::int32_t K = top_k();
    for (std::int32_t i = begin; i < end; ++i) {
      const std::uint32_t classes = s.classes()[i];
      // Scratch loads of the whole group first, then the global stores.
      std::int32_t h[E], slot[E], miss[E], x[E];
      std::uint32_t g[E];
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i * E + u;
        const std::uint16_t p = j < K ? s.position()[j] : hisparse::no_position;
        const std::uint32_t c = (classes >> (2 * u)) & 3u;
        h[u] = p;
        g[u] = 0;
        slot[u] = -1;
        miss[u] = -1;  // miss number when entry j loads its key
        if (p == hisparse::no_position || c == hisparse::duplicate_miss) continue;
        if (c == hisparse::first_miss) {
          miss[u] = m++;
          const std::int32_t at = untouched + miss[u];
          slot[u] = s.lru()[at < 0 ? 0 : at];  // at < 0 only if slot_rows held a row twice
        } else {
          slot[u] = static_cast<std::int32_t>(s.words()[p] >> 16) - 1;
        }
        g[u] = s.keys()[p];
      }
      for (int u = 0; u < E; ++u) x[u] = slot[u] >= 0 ? hot_row(s, hot_table_row, slot[u]) : -1;
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i * E + u;
        if (slot[u] < 0) continue;
        store(row, j, x[u]);
        if (a.miss_mask != nullptr) a.miss_mask[row * a.out_stride + j] = miss[u] >= 0 ? 1 : 0;
        if (miss[u] >= 0) {
          s.words()[h[u]] = (static_cast<std::uint32_t>(miss[u]) << 16) | hisparse::miss_flag | static_cast<std::uint32_t>(j);
          slot_rows[slot[u]] = static_cast<std::int32_t>(g[u]);
          a.swap_host_rows[row * a.out_stride + miss[u]] = static_cast<std::int32_t>(g[u]);
          a.swap_device_rows[row * a.out_stride + miss[u]] = x[u];
        }
      }
    }
  }

  // Pass 4, after its barrier: the duplicates of missing keys, from the miss
  // number their key's first entry published.
  KOKKOS_INLINE_FUNCTION void write_duplicates(const hisparse::ResolveScratch& s, std::int64_t row,
                                               std::int64_t hot_table_row, std::int32_t begin, std::int32_t end,
                                               std::int32_t untouched) const {
    const std::int32_t K = top_k();
    for (std::int32_t i = begin; i < end; ++i) {
      const std::uint32_t classes = s.classes()[i];
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i * E + u;
        if (j >= K || ((classes >> (2 * u)) & 3u) != hisparse::duplicate_miss) continue;
        const std::int32_t at = untouched + static_cast<std::int32_t>(s.words()[s.position()[j]] >> 16);
        store(row, j, hot_row(s, hot_table_row, s.lru()[at < 0 ? 0 : at]));
        if (a.miss_mask != nullptr) a.miss_mask[row * a.out_stride + j] = 0;
      }
    }
  }

  // The new LRU order, four positions a thread at a time: the scratch loads
  // first (the compiler cannot tell the two apart), then the stores.
  KOKKOS_INLINE_FUNCTION void store_lru(const member_type& team, const hisparse::ResolveScratch& s,
                                        std::int16_t* lru) const {
    const std::int32_t H = hot_slots();
    constexpr int lru_per_round = 4;
    for (std::int32_t p0 = team.team_rank(); p0 < H; p0 += lru_per_round * threads(team)) {
      std::int16_t order[lru_per_round];
      for (int u = 0; u < lru_per_round; ++u) {
        const std::int32_t p = p0 + u * threads(team);
        order[u] = s.lru()[p < H ? p : 0];
      }
      for (int u = 0; u < lru_per_round; ++u) {
        const std::int32_t p = p0 + u * threads(team);
        if (p < H) lru[p] = order[u];
      }
    }
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t row = team.league_rank();
    const std::int32_t state = a.request_state_indices != nullptr ? a.request_state_indices[row]
                                                                  : static_cast<std::int32_t>(row);
    const std::int32_t request = a.request_ids[row];  // loaded with the state, not after it
    // A padding row goes through pass 1 as a row whose request is outside the
    // tables: every output -1, counts 0, and it returns before its state.
    const bool padding = state < 0 || state >= a.num_state_rows;
    const std::size_t bytes = hisparse::ResolveScratch::bytes(top_k(), hot_slots(), cached_blocks);
    char* base = static_cast<char*>(team.team_scratch(Level).get_shmem_aligned(bytes, 16));
    const hisparse::ResolveScratch s{base, top_k(), hot_slots(), cached_blocks};
    const std::int64_t hot_table_row = a.hot_table_by_state && !padding ? state : row;
    std::uint32_t* const totals[2] = {s.totals(), s.totals() + hisparse::team_total_words / 2};
    // State row 0 stands in for a padding row's (never read; not prefetched).
    const std::int64_t state_row = padding ? 0 : state;
    std::int32_t* slot_rows = a.slot_rows + state_row * a.slot_rows_stride;
    std::int16_t* lru = a.lru + state_row * a.lru_stride;

    std::uint32_t mapped = 0;
    device::team_exclusive_sum(team, totals[0],
                               map_entries(team, s, row, padding ? -1 : request, hot_table_row,
                                           padding ? 0 : cached_blocks, slot_rows, lru, !padding),
                               mapped);
    if (a.valid_counts != nullptr && team.team_rank() == 0) a.valid_counts[row] = static_cast<std::int32_t>(mapped & 0xFFFFu);
    const std::int32_t distinct = static_cast<std::int32_t>(mapped >> 16);
    if (distinct == 0) {
      // Nothing can consult the hot slots (or a padding row): leave the LRU as it is.
      if (team.team_rank() == 0) a.swap_counts[row] = 0;
      return;
    }

    std::int32_t begin = 0, end = 0;
    thread_groups(team, slot_groups(), begin, end);
    std::uint32_t found = 0;
    const std::uint32_t hits_before =
        device::team_exclusive_sum(team, totals[1], classify_slots(s, slot_rows, lru, begin, end), found);
    const std::int32_t hits = static_cast<std::int32_t>(found & 0xFFFFu);
    const std::int32_t misses = distinct - static_cast<std::int32_t>(found >> 16);
    const std::int32_t untouched = hot_slots() - hits - misses;
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      a.swap_counts[row] = misses;
      if (a.hit_miss_counters != nullptr) {
        // std::uint64_t: Kokkos 4.6 adds it with one red.add on CUDA, but
        // unsigned long long with a compare-and-swap loop, which rows that
        // finish together retry.
        Kokkos::atomic_add(&a.hit_miss_counters[0], static_cast<std::uint64_t>(hits));
        Kokkos::atomic_add(&a.hit_miss_counters[1], static_cast<std::uint64_t>(misses));
      }
    });
    order_slots(s, lru, begin, end, static_cast<std::int32_t>(hits_before & 0xFFFFu), hits, misses);

    thread_groups(team, entry_groups(), begin, end);
    std::uint32_t classified = 0;
    const std::uint32_t misses_before =
        device::team_exclusive_sum(team, totals[0], classify_entries(s, begin, end), classified);
    write_results(s, row, hot_table_row, slot_rows, begin, end, static_cast<std::int32_t>(misses_before & 0xFFFFu),
                  untouched);
    store_lru(team, s, lru);
    if ((classified >> 16) != 0) {  // duplicates of missing keys
      team.team_barrier();
      thread_groups(team, entry_groups(), begin, end);
      write_duplicates(s, row, hot_table_row, begin, end, untouched);
    }
  }
};

// Team scratch of one row's resolve; + 16: room to align the set for its
// 16-byte bucket loads.
inline std::size_t resolve_hisparse_scratch_bytes(std::int32_t top_k, std::int32_t hot_slots, std::int32_t hot_block_size) {
  const std::int32_t cached = hisparse::ResolveScratch::cached_hot_blocks(hot_slots, hot_block_size);
  return hisparse::ResolveScratch::bytes(top_k, hot_slots, cached) + 16;
}

// A team of `Threads` resolves each row with level `Level` scratch.
template <class Space, int Level, int Threads, class Shape>
void launch_resolve(const Space& space, const HiSparseResolveArgs& a, std::int32_t cached, std::size_t bytes) {
  using policy_type = Kokkos::TeamPolicy<Space, Kokkos::LaunchBounds<Threads, 1>>;
  policy_type policy(space, static_cast<int>(a.num_rows), row_team_size<Space>(Threads));
  policy.set_scratch_size(Level, Kokkos::PerTeam(bytes));
  const auto source = BlockSplit<Shape::split>::of(a.source_block_size);
  const auto resident = BlockSplit<Shape::split>::of(a.resident_block_size);
  const auto hot = BlockSplit<Shape::split>::of(a.hot_block_size);
  Kokkos::parallel_for("sparse_mla::resolve_hisparse", policy,
                       HiSparseResolve<Space, Level, Shape>{a, cached, source, resident, hot});
}

template <class Space>
void resolve_hisparse(const Space& space, const HiSparseResolveArgs& a) {
  if (a.num_rows == 0) return;
  const std::int32_t cached = hisparse::ResolveScratch::cached_hot_blocks(a.hot_slots, a.hot_block_size);
  const std::size_t bytes = resolve_hisparse_scratch_bytes(a.top_k, a.hot_slots, a.hot_block_size);
  // Production rows (K = 2048, H = 4096: 39,440 bytes) fit level-0 (shared
  // memory) scratch; larger shapes take level-1 (global) scratch, whose
  // 64-bit addresses do not fit the 64 registers of a 1024-thread team's
  // thread: those rows take teams of 512.
  constexpr int threads = hisparse::team_threads;
  const auto power_of_two = [](std::int32_t n) { return exact_log2(n) >= 0; };
  const bool resident_splits = a.resident_block_table == nullptr || power_of_two(a.resident_block_size);
  if (bytes > static_cast<std::size_t>(Kokkos::TeamPolicy<Space>::scratch_size_max(0))) {
    launch_resolve<Space, 1, threads / 2, AnyShape>(space, a, cached, bytes);
  } else if (a.top_k == ProductionShape::top_k && a.hot_slots == ProductionShape::hot_slots &&
             row_team_size<Space>(threads) == ProductionShape::threads && power_of_two(a.source_block_size) &&
             power_of_two(a.hot_block_size) && resident_splits) {
    launch_resolve<Space, 0, threads, ProductionShape>(space, a, cached, bytes);
  } else {
    launch_resolve<Space, 0, threads, AnyShape>(space, a, cached, bytes);
  }
}

}  // namespace sparse_mla::kernels
