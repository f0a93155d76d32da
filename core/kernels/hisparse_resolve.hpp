// HiSparse swap-in (SPEC section 5): one team per batch row resolves the
// row's logical top-k against the hot slots of its state row.
//
// The row's distinct host rows go into a team-scratch hash set (open
// addressing, 2K positions, so it is at most half full). One 32-bit word per
// position packs what the passes know about a key (hisparse::empty_word and
// below): its first top-k entry, then the hot slot that holds it or, for a
// key that misses, its miss number. With the host row of each entry, each
// entry's hash position, the new LRU order, one hit bit per slot, one miss
// bit per entry and the per-warp team sums, a production row (K = 2048,
// H = 4096, hot blocks of 64) needs 39,424 bytes of scratch (and 16 to align
// the set): it fits the 40,936 bytes of level-0 (shared memory) scratch that
// a Kokkos 4.6 CUDA team can have, so every probe and atomic stays on the
// chip. Larger shapes run the same code from level-1 (global) scratch.
//
// On a GPU one team resolves a row alone, so the row's time is its chain of
// dependent loads and barriers, and the more warps hide each other's
// latency the shorter it is: a team is 1024 threads (rows resolved sooner
// than with 512 on the H200; docs/PERFORMANCE.md). Each pass gives a thread
// fixed groups of entries (2) or slots (4), one group per thread at
// K = 2048, H = 4096, and issues a group's global loads before it uses any
// of them; the prefix sums run over groups, and the LRU walk and the miss
// numbering share one. Each team sum is one barrier
// (device::team_exclusive_sum: a warp shuffle scan, one word per warp through
// scratch), and that barrier is also the one between two passes. LaunchBounds<1024, 1> keeps the kernel within
// 64 registers (a 1024-thread team's share of an SM's register file). On the
// host a team is one thread and the same passes run as loops.
//
// With a slot map (a.slot_map; sparse_mla/hisparse_ops.hpp gives its layout),
// a host row -> slot hash map kept in global memory beside slot_rows across
// steps, pass 1 also looks every entry up there, and passes 2 and 3 become
// one (note_hits_and_misses): a hit sets its slot's hit flag, only a miss
// goes into the set. Pass 6 keeps the map in step with slot_rows
// (enter_loaded_rows).
// The map is rebuilt from slot_rows before pass 1 when it asks for it; a
// state that holds a host row in two slots cannot be mapped and takes the
// passes below as they are. On a GPU only ProductionShape rows use it (the
// map's code does not fit the registers of the others).
//
// Passes (one barrier between two, in the team sum that ends each):
//   1. map_entries: map every entry to its host row g and its resident row;
//      write the resolved rows, the resident and invalid outputs and the
//      valid count; clear the set; cache the row's hot block table. A row
//      with nothing left to look up returns here (its LRU untouched), and so
//      does a padding row, mapped as a row whose request is outside the
//      tables (all -1, counts 0).
//   2. build_set: insert the pending host rows; each key keeps the first top-k
//      entry that selected it (duplicates collapse to it).
//      On CUDA it also prefetches the state's slot_rows and lru for pass 3.
//   3. classify_slots: by slot index (coalesced slot_rows reads), a slot whose
//      host row is in the set is a hit and its key records the slot. The
//      same loads read the row's old LRU order, so that pass 4 finds it in
//      the cache.
//   4. order_slots: one prefix sum over LRU groups (hits before each) and
//      entry groups (misses before each). Each LRU position moves to its new
//      place (untouched evictable, newly loaded in miss order, hits), and the
//      first entry of each missing key gives the key its miss number m.
//   5. write_results: the hot and attention rows of every pending entry
//      (miss m takes the m-th oldest evictable slot, which is where step 4
//      put it in the new order); the first entry of each miss appends the
//      swap pair and sets the slot's host row; the new LRU order is stored.
//   6. enter_loaded_rows (with a slot map, after one more barrier): the
//      evicted slots' entries are removed and the loaded rows entered.
#pragma once

#include <Kokkos_Core.hpp>

#include "primitives.hpp"
#include "space_traits.hpp"
#include "kernels.hpp"

namespace sparse_mla::kernels {

namespace hisparse {

constexpr std::int32_t done = -1;  // entry needs no slot (resident, invalid)

// The set's words. A position is empty_word, or holds a key: bits 0-14 are
// the first entry j that selected it (pass 2: atomic min); bits 16-31 are
// 0, then slot + 1 once a hit slot holds the key (pass 3: atomic max, so a
// state that held a row in two slots still resolves deterministically).
// Pass 4 sets miss_flag on a key that no slot holds and puts its miss number
// m in bits 16-31. The key itself is host_rows[j].
// The packing needs K <= H <= hisparse_max_hot_slots (2^15): j, m < 2^15,
// slot + 1 <= 2^15, hash positions < 2K <= 2^16. check_resolve refuses other
// shapes with a message naming hot_slots.
constexpr std::uint32_t empty_word = 0xFFFFFFFFu;
constexpr std::uint32_t entry_bits = 0x7FFFu;
constexpr std::uint32_t miss_flag = 0x8000u;
static_assert(hisparse_max_hot_slots <= 32768, "entries, slots and miss numbers must fit the packed set words");

// A GPU team's threads, and the groups of entries and slots they take: one
// entry group and one slot group per thread at K = 2048, H = 4096.
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

KOKKOS_INLINE_FUNCTION std::int32_t groups(std::int32_t n, std::int32_t per_group) {
  return (n + per_group - 1) / per_group;
}

// The set is probed a bucket of 4 positions at a time (one 16-byte scratch
// load): a key starts at the first position of its hash bucket and moves on
// a bucket at a time, so a lookup at half load nearly always ends in its
// first bucket. Probing one position at a time, a warp ran as many rounds as
// its longest chain, and probing dominated the resolve's instructions.
constexpr std::int32_t bucket = 4;

// Positions of the set for top_k entries: 2K (at most half full), a whole
// number of buckets.
KOKKOS_INLINE_FUNCTION std::int32_t set_positions(std::int32_t top_k) { return (2 * top_k + bucket - 1) / bucket * bucket; }

// Knuth's multiplicative hash, scaled to [0, size) by its high bits.
KOKKOS_INLINE_FUNCTION std::int32_t hash_position(std::int32_t key, std::int32_t size) {
  const std::uint32_t mixed = static_cast<std::uint32_t>(key) * 2654435761u;
  return static_cast<std::int32_t>((static_cast<std::uint64_t>(mixed) * static_cast<std::uint32_t>(size)) >> 32);
}

// Bytes of hit flags for H slots (one bit a slot, S = slots_per_group bits a
// byte), a whole number of 32-bit words so that the slot-map path can set
// them with word atomics.
KOKKOS_INLINE_FUNCTION std::int32_t hit_flag_bytes(std::int32_t hot_slots) {
  return groups(groups(hot_slots, slots_per_group), 4) * 4;
}

// The team's scratch arrays, carved from one allocation.
struct ResolveScratch {
  std::uint32_t* words;      // [set_positions(K)]: the hash set, 16-byte aligned
  std::uint32_t* totals;     // [team_total_words]: per-group partial sums (device::team_exclusive_sum)
  std::int32_t* host_rows;   // [K]: host row of entry j when it needs a slot, else done (or hit_of(slot))
  std::int32_t* hot_blocks;  // [cached]: the row's hot block table, or unused (cached = 0)
  std::uint8_t* hit_flags;   // [hit_flag_bytes(H)]: bit s % S of byte s / S is set when slot s is a hit (S slots a group)
  std::uint16_t* position;   // [K]: hash position of entry j (entries that need a slot)
  std::int16_t* lru;         // [H]: the new LRU order (pass 4); pass 3 copies the old one here
  std::uint8_t* miss_flags;  // [ceil(K / 2)]: pass 4, bit u of byte i: entry E * i + u gives its key a miss number

  // Hot block table entries cached per row: all of the row's, or 0.
  KOKKOS_INLINE_FUNCTION static std::int32_t cached_hot_blocks(std::int32_t hot_slots, std::int32_t hot_block_size) {
    const std::int32_t blocks = groups(hot_slots, hot_block_size);
    return blocks <= max_cached_hot_blocks ? blocks : 0;
  }
  KOKKOS_INLINE_FUNCTION static std::size_t bytes(std::int32_t top_k, std::int32_t hot_slots, std::int32_t cached) {
    const std::size_t k = static_cast<std::size_t>(top_k), h = static_cast<std::size_t>(hot_slots);
    return 4 * (static_cast<std::size_t>(set_positions(top_k)) + k + static_cast<std::size_t>(team_total_words + cached)) +
           static_cast<std::size_t>(hit_flag_bytes(hot_slots)) + 2 * (k + h) + (k + entries_per_group - 1) / entries_per_group;
  }
  KOKKOS_INLINE_FUNCTION static ResolveScratch carve(void* base, std::int32_t top_k, std::int32_t hot_slots,
                                                     std::int32_t cached) {
    ResolveScratch s;
    s.words = static_cast<std::uint32_t*>(base);
    s.totals = s.words + set_positions(top_k);
    s.host_rows = reinterpret_cast<std::int32_t*>(s.totals + team_total_words);
    s.hot_blocks = s.host_rows + top_k;
    s.hit_flags = reinterpret_cast<std::uint8_t*>(s.hot_blocks + cached);
    s.position = reinterpret_cast<std::uint16_t*>(s.hit_flags + hit_flag_bytes(hot_slots));
    s.lru = reinterpret_cast<std::int16_t*>(s.position + top_k);
    s.miss_flags = reinterpret_cast<std::uint8_t*>(s.lru + hot_slots);
    return s;
  }
};

// With a slot map, pass 1 finds each entry's slot there, and an entry whose
// host row a slot holds (a hit) keeps that slot in host_rows as hit_of(slot)
// (<= -2): only the misses go into the set.
KOKKOS_INLINE_FUNCTION std::int32_t hit_of(std::int32_t slot) { return -2 - slot; }
KOKKOS_INLINE_FUNCTION std::int32_t slot_of_hit(std::int32_t host_row) { return -2 - host_row; }

// Slot map entries (sparse_mla/hisparse_ops.hpp gives the layout): the host
// row in the low word, the slot in the high. A lookup walks buckets of four
// entries (32 bytes, two 16-byte loads) from the key's hash bucket and ends at
// the key or at a never-used entry; removed entries keep the walk going and
// are reused by inserts.
constexpr std::uint64_t map_never_used = ~std::uint64_t{0};                       // host row -1
constexpr std::uint64_t map_removed = (map_never_used << 32) | 0xFFFFFFFEu;      // host row -2
constexpr std::int32_t map_bucket = 4;
// A header count past any map's limit: an insert that found no room (rows
// sharing a state row, against hisparse_ops.hpp's rule) asks for a rebuild
// with it, whether or not the step's own count lands before or after.
constexpr std::int32_t map_full = 1 << 30;
KOKKOS_INLINE_FUNCTION std::uint64_t map_entry(std::int32_t host_row, std::int32_t slot) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(slot)) << 32) | static_cast<std::uint32_t>(host_row);
}
KOKKOS_INLINE_FUNCTION std::int32_t map_key(std::uint64_t e) { return static_cast<std::int32_t>(static_cast<std::uint32_t>(e)); }
KOKKOS_INLINE_FUNCTION std::int32_t map_slot(std::uint64_t e) { return static_cast<std::int32_t>(e >> 32); }

// The slot map's layout (sparse_mla/hisparse_ops.hpp) in functions device
// code can call (the public ones are host constexpr functions), checked
// against the public ones.
KOKKOS_INLINE_FUNCTION constexpr std::int32_t map_positions(std::int32_t hot_slots) { return 4 * hot_slots; }
KOKKOS_INLINE_FUNCTION constexpr std::int64_t map_entries_at(std::int32_t hot_slots) {
  return hisparse_slot_map_slot_positions + (static_cast<std::int64_t>(hot_slots) + 3) / 4 * 4;
}
static_assert(map_positions(4096) == hisparse_slot_map_positions(4096) && map_positions(5) == hisparse_slot_map_positions(5),
              "the kernel's slot map layout is hisparse_ops.hpp's");
static_assert(map_entries_at(4096) == hisparse_slot_map_entries(4096) && map_entries_at(5) == hisparse_slot_map_entries(5),
              "the kernel's slot map layout is hisparse_ops.hpp's");

// The slot map of one state row.
struct SlotMap {
  std::int32_t* header;         // [0]: entries written since the last rebuild (from above), -1: rebuild; [1]: tag ^ H
  std::int32_t* slot_position;  // [H]: the position of each slot's entry, -1 none
  std::uint64_t* entries;       // [4H], 16-byte aligned
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

  KOKKOS_INLINE_FUNCTION std::int32_t hash_size() const { return hisparse::set_positions(top_k()); }
  KOKKOS_INLINE_FUNCTION std::int32_t first_position(std::int32_t key) const {
    return hisparse::hash_position(key, hash_size() / hisparse::bucket) * hisparse::bucket;
  }
  KOKKOS_INLINE_FUNCTION std::int32_t next_bucket(std::int32_t b) const {
    return b + hisparse::bucket == hash_size() ? 0 : b + hisparse::bucket;
  }

  // The words of the bucket at b (one 16-byte load), and the key of each
  // (host_rows[0] for an empty word: a load in any case, so that the four
  // issue together).
  struct Bucket {
    std::uint32_t word[hisparse::bucket];
    std::int32_t key[hisparse::bucket];
  };
  KOKKOS_INLINE_FUNCTION void load_bucket(const hisparse::ResolveScratch& s, std::int32_t b, Bucket& k) const {
    const Int4 v = *reinterpret_cast<const Int4*>(s.words + b);
    k.word[0] = static_cast<std::uint32_t>(v.x);
    k.word[1] = static_cast<std::uint32_t>(v.y);
    k.word[2] = static_cast<std::uint32_t>(v.z);
    k.word[3] = static_cast<std::uint32_t>(v.w);
  }
  KOKKOS_INLINE_FUNCTION void load_keys(const hisparse::ResolveScratch& s, Bucket& k) const {
    for (int i = 0; i < hisparse::bucket; ++i) {
      k.key[i] = s.host_rows[k.word[i] == hisparse::empty_word ? 0 : k.word[i] & hisparse::entry_bits];
    }
  }
  KOKKOS_INLINE_FUNCTION std::int32_t entry_groups() const { return hisparse::groups(top_k(), E); }
  KOKKOS_INLINE_FUNCTION std::int32_t slot_groups() const { return hisparse::groups(hot_slots(), S); }

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
    const std::int32_t block = cached_blocks > 0 ? s.hot_blocks[b] : a.hot_block_table[row * a.hot_table_stride + b];
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

  // ---- The slot map (a.slot_map): host row -> hot slot, kept across steps ----

  KOKKOS_INLINE_FUNCTION hisparse::SlotMap slot_map(std::int64_t state_row) const {
    std::int32_t* base = a.slot_map + state_row * a.slot_map_stride;
    return {base, base + hisparse_slot_map_slot_positions,
            reinterpret_cast<std::uint64_t*>(base + hisparse::map_entries_at(hot_slots()))};
  }
  // 4H positions in H buckets; a map is rebuilt before a step once more than
  // 2H positions have been used, so a step (at most K <= H inserts) always
  // leaves never-used entries, which end every lookup.
  KOKKOS_INLINE_FUNCTION std::int32_t map_positions() const { return hisparse::map_positions(hot_slots()); }
  KOKKOS_INLINE_FUNCTION std::int32_t map_used_limit() const { return 2 * hot_slots(); }
  KOKKOS_INLINE_FUNCTION std::int32_t map_first(std::int32_t key) const {
    return hisparse::hash_position(key, map_positions() / hisparse::map_bucket) * hisparse::map_bucket;
  }
  KOKKOS_INLINE_FUNCTION std::int32_t map_next(std::int32_t b) const {
    return b + hisparse::map_bucket == map_positions() ? 0 : b + hisparse::map_bucket;
  }
  KOKKOS_INLINE_FUNCTION static void load_map_bucket(const std::uint64_t* at, std::uint64_t (&e)[hisparse::map_bucket]) {
    const Int4 lo = reinterpret_cast<const Int4*>(at)[0], hi = reinterpret_cast<const Int4*>(at)[1];
    const auto pair = [](std::int32_t low, std::int32_t high) {
      return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(high)) << 32) | static_cast<std::uint32_t>(low);
    };
    e[0] = pair(lo.x, lo.y);
    e[1] = pair(lo.z, lo.w);
    e[2] = pair(hi.x, hi.y);
    e[3] = pair(hi.z, hi.w);
  }

  // The slots holding N host rows (g[u] < 0: none), looked up together, one
  // bucket of each per round; slot[u] -1 when no slot holds g[u]. A walk ends
  // at a never-used entry, which a map used as documented always has; one
  // that has met none after every bucket (a map filled by rows that share a
  // state row, against hisparse_ops.hpp) ends there too, not found.
  template <int N>
  KOKKOS_INLINE_FUNCTION void find_in_map(const hisparse::SlotMap& m, const std::int32_t (&g)[N],
                                          std::int32_t (&slot)[N]) const {
    bool open[N];
    std::int32_t b[N];
    bool any = false;
    for (int u = 0; u < N; ++u) {
      slot[u] = -1;
      open[u] = g[u] >= 0;
      b[u] = open[u] ? map_first(g[u]) : 0;
      any = any || open[u];
    }
    for (std::int32_t round = 0; any && round < map_positions() / hisparse::map_bucket; ++round) {
      any = false;
      std::uint64_t e[N][hisparse::map_bucket];
      for (int u = 0; u < N; ++u) {
        if (open[u]) load_map_bucket(m.entries + b[u], e[u]);
      }
      for (int u = 0; u < N; ++u) {
        if (!open[u]) continue;
        bool done = false;
        for (int i = 0; i < hisparse::map_bucket; ++i) {
          const std::int32_t key = hisparse::map_key(e[u][i]);
          if (key == g[u]) {
            slot[u] = hisparse::map_slot(e[u][i]);
            done = true;
          } else if (key == -1) {
            done = true;
          }
          if (done) break;
        }
        if (done) {
          open[u] = false;
        } else {
          b[u] = map_next(b[u]);
          any = true;
        }
      }
    }
  }

  // Enters host row g >= 0 as held by `slot` at the first never-used or
  // removed entry of its walk, and returns that position; when the walk meets
  // g first (a state that holds g in two slots) it sets `duplicate` and
  // returns g's position. A compare-and-swap that fails returns what the entry
  // holds now, which decides: g (a duplicate, in a rebuild), or anything else
  // (another thread's row, or an entry removed meanwhile: walk on). A bucket is
  // read once, never again from a cache that may be stale; walking past a
  // removed entry only forgoes reusing it. Returns -1 when no bucket had room
  // (only a map filled against hisparse_ops.hpp's rule can be full).
  KOKKOS_INLINE_FUNCTION std::int32_t insert_in_map(const hisparse::SlotMap& m, std::int32_t g, std::int32_t slot,
                                                    bool& duplicate) const {
    const std::uint64_t mine = hisparse::map_entry(g, slot);
    std::int32_t b = map_first(g);
    for (std::int32_t round = 0; round < map_positions() / hisparse::map_bucket; ++round, b = map_next(b)) {
      std::uint64_t e[hisparse::map_bucket];
      load_map_bucket(m.entries + b, e);
      // The bucket loop leaves by `break` (clang unrolls it whole and keeps
      // the bucket in registers).
      std::int32_t at = -1;
      for (int i = 0; i < hisparse::map_bucket; ++i) {
        std::uint64_t seen = e[i];
        if (hisparse::map_key(seen) < 0) {
          const std::uint64_t was = device::atomic_cas(m.entries + b + i, seen, mine);
          if (was == seen) {
            at = b + i;
            break;
          }
          seen = was;
        }
        if (hisparse::map_key(seen) == g) {
          duplicate = true;
          at = b + i;
          break;
        }
      }
      if (at >= 0) return at;
    }
    return -1;
  }

  // Rebuilds the map from slot_rows (the first step of a state, or once the
  // map has used more than map_used_limit() positions). Returns this thread's
  // counts: slots entered in the low half, slots whose host row another slot
  // already holds in the high (then the row takes the path without the map).
  KOKKOS_INLINE_FUNCTION std::uint32_t rebuild_map(const member_type& team, const hisparse::SlotMap& m,
                                                   const std::int32_t* slot_rows) const {
    const std::int32_t H = hot_slots();
    const Int4 never_used{-1, -1, -1, -1};  // two entries
    Int4* units = reinterpret_cast<Int4*>(m.entries);
    for (std::int32_t i = team.team_rank(); i < map_positions() / 2; i += threads(team)) units[i] = never_used;
    team.team_barrier();
    std::uint32_t counts = 0;
    for (std::int32_t slot = team.team_rank(); slot < H; slot += threads(team)) {
      const std::int32_t g = slot_rows[slot];
      std::int32_t position = -1;
      if (g >= 0) {
        bool duplicate = false;
        position = insert_in_map(m, g, slot, duplicate);
        if (duplicate) position = -1;
        counts += position < 0 ? high_count : 1u;
      }
      m.slot_position[slot] = position;
    }
    return counts;
  }

  // Probes N host rows together, one bucket of each per round, so that their
  // scratch loads overlap. at_bucket(u, b, k) looks at the bucket at b (its
  // words and keys k) of key u and returns true when key u is done there;
  // a key not done moves on to the next bucket. g[u] < 0: no key.
  template <int N, class AtBucket>
  KOKKOS_INLINE_FUNCTION void probe_keys(const hisparse::ResolveScratch& s, const std::int32_t (&g)[N],
                                         AtBucket&& at_bucket) const {
    bool open[N];
    std::int32_t b[N];
    bool any = false;
    for (int u = 0; u < N; ++u) {
      open[u] = g[u] >= 0;
      b[u] = open[u] ? first_position(g[u]) : 0;
      any = any || open[u];
    }
    while (any) {
      any = false;
      Bucket k[N];
      for (int u = 0; u < N; ++u) load_bucket(s, b[u], k[u]);
      for (int u = 0; u < N; ++u) load_keys(s, k[u]);
      for (int u = 0; u < N; ++u) {
        if (!open[u]) continue;
        if (at_bucket(u, b[u], k[u])) {
          open[u] = false;
        } else {
          b[u] = next_bucket(b[u]);
          any = true;
        }
      }
    }
  }

  // Looks up N host rows together. h[u]: the key's position, or -1 (g[u] < 0,
  // or not in the set); w[u]: its word. A lookup ends at the key or at the
  // first empty position in probe order.
  template <int N>
  KOKKOS_INLINE_FUNCTION void find_keys(const hisparse::ResolveScratch& s, const std::int32_t (&g)[N],
                                        std::int32_t (&h)[N], std::uint32_t (&w)[N]) const {
    for (int u = 0; u < N; ++u) {
      h[u] = -1;
      w[u] = hisparse::empty_word;
    }
    // The bucket loops leave by `break`, not by their condition: clang then
    // unrolls them whole and keeps the bucket in registers (with `&& !done`
    // in the condition it kept it in scratch memory on gfx90a).
    probe_keys(s, g, [&](int u, std::int32_t b, const Bucket& k) {
      bool done = false;
      for (int i = 0; i < hisparse::bucket; ++i) {
        if (k.word[i] == hisparse::empty_word) {
          done = true;
        } else if (k.key[i] == g[u]) {
          h[u] = b + i;
          w[u] = k.word[i];
          done = true;
        }
        if (done) break;
      }
      return done;
    });
  }

  // Inserts N host rows (entries j[u]; g[u] < 0: none) together. h[u]: the
  // key's position. Returns how many keys this call added to the set. A word
  // seen holding a key keeps that key (only its entry can fall, to a smaller
  // one of the same key); a word seen empty may be taken by another thread
  // before the compare-and-swap, which then reports the word that thread
  // stored.
  template <int N>
  KOKKOS_INLINE_FUNCTION std::int32_t insert_keys(const hisparse::ResolveScratch& s, const std::int32_t (&g)[N],
                                                  const std::int32_t (&j)[N], std::int32_t (&h)[N]) const {
    const std::uint32_t empty = hisparse::empty_word;
    std::int32_t added = 0;
    for (int u = 0; u < N; ++u) h[u] = -1;
    probe_keys(s, g, [&](int u, std::int32_t b, const Bucket& k) {
      const auto entry = static_cast<std::uint32_t>(j[u]);
      bool done = false;
      for (int i = 0; i < hisparse::bucket; ++i) {  // leaves by break, as in find_keys
        std::uint32_t word = k.word[i];
        std::int32_t key = k.key[i];
        if (word == empty) {
          word = device::atomic_cas(&s.words[b + i], empty, entry);
          if (word == empty) {
            ++added;
            h[u] = b + i;
            done = true;
            break;
          }
          key = s.host_rows[word];  // in this pass a word is empty or an entry index
        }
        if (key == g[u]) {
          if (entry < word) device::atomic_min(&s.words[b + i], entry);
          h[u] = b + i;
          done = true;
          break;
        }
      }
      return done;
    });
    return added;
  }

  // Counts summed over the team pack two 16-bit counts into a word (low and
  // high half): every count here is at most hot_slots <= 2^15, so neither
  // half carries into the other.
  static constexpr std::uint32_t high_count = std::uint32_t{1} << 16;

  // Pass 1. Returns this thread's counts: valid entries in the low half,
  // entries that need a hot slot in the high. Group i holds entries i, i + G,
  // ... (coalesced loads). `request` -1 maps every entry to -1; `cached` hot
  // block table entries are copied to scratch. On CUDA the state's
  // slot_rows and lru are prefetched for pass 3 (not for a padding row).
  KOKKOS_INLINE_FUNCTION std::uint32_t map_entries(const member_type& team, const hisparse::ResolveScratch& s,
                                                   std::int64_t row, std::int32_t request, std::int64_t hot_table_row,
                                                   std::int32_t cached, const std::int32_t* slot_rows,
                                                   const std::int16_t* lru, bool prefetch, bool mapped,
                                                   std::int64_t state_row) const {
    const std::int32_t* in = a.logical + row * a.logical_stride;
    const std::int32_t* hot_table = a.hot_block_table + hot_table_row * a.hot_table_stride;
    const std::int32_t* source_table = source_table_row(request);
    const std::int32_t* resident_table = resident_table_row(request);
    const std::int32_t K = top_k();
    const std::int32_t G = entry_groups();
    std::uint32_t counts = 0;
    for (std::int32_t i = team.team_rank(); i < G; i += threads(team)) {
      std::int32_t tok[E], g[E], resident[E];
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i + u * G;
        tok[u] = j < K ? in[j] : -1;
      }
      // While the loads are in flight: clear the set and the hit flags, copy
      // the hot block table.
      for (std::int32_t h = i; h < hash_size(); h += G) s.words[h] = hisparse::empty_word;
      std::uint32_t* hit_words = reinterpret_cast<std::uint32_t*>(s.hit_flags);
      for (std::int32_t w = i; w < hisparse::hit_flag_bytes(hot_slots()) / 4; w += G) hit_words[w] = 0;
      // Pass 3 reads these two barriers from now: bring them to this SM's L1
      // while the table loads are in flight (after the entry loads, which
      // must not wait for the state). A hint where the device has one
      // (device::prefetch_l1), nothing elsewhere.
      if (prefetch) {
        for (std::int32_t k = i; k < slot_groups(); k += G) {
          if (!mapped) device::prefetch_l1(slot_rows + k * S);
          device::prefetch_l1(lru + k * S);
        }
      }
      for (std::int32_t b = i; b < cached; b += G) s.hot_blocks[b] = hot_table[b];
      // Branches only on the row (uniform), none per entry.
      if (source_table != nullptr) {
        for (int u = 0; u < E; ++u) g[u] = source_block(source_table, tok[u]);
      } else {
        for (int u = 0; u < E; ++u) g[u] = -1;
      }
      if (resident_table != nullptr) {
        for (int u = 0; u < E; ++u) resident[u] = resident_block(resident_table, tok[u]);
      } else {
        for (int u = 0; u < E; ++u) resident[u] = -1;
      }
      for (int u = 0; u < E; ++u) {
        g[u] = host_row(g[u], tok[u]);
        resident[u] = resident_row(resident[u], tok[u]);
      }
      // With a slot map: the slot that holds each entry's row, if one does,
      // one entry at a time (a bucket each is what the 64 registers allow).
      std::int32_t hit_slot[E];
      for (int u = 0; u < E; ++u) {
        hit_slot[u] = -1;
        if (mapped) {
          const std::int32_t wanted[1] = {resident[u] < 0 ? g[u] : -1};
          std::int32_t found[1];
          find_in_map(slot_map(state_row), wanted, found);
          hit_slot[u] = found[0];
        }
      }
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i + u * G;
        if (j >= K) break;
        if (a.resolved_rows != nullptr) a.resolved_rows[row * a.out_stride + j] = g[u];
        const bool pending = resident[u] < 0 && g[u] >= 0;
        if (!pending) {
          store(row, j, resident[u]);
          if (a.miss_mask != nullptr) a.miss_mask[row * a.out_stride + j] = 0;
        }
        s.host_rows[j] = !pending ? hisparse::done : hit_slot[u] >= 0 ? hisparse::hit_of(hit_slot[u]) : g[u];
        s.position[j] = 0;  // pass 2 sets it for pending entries
        counts += (resident[u] >= 0 || g[u] >= 0 ? 1u : 0u) + (pending ? high_count : 0u);
      }
    }
    return counts;
  }

  // Pass 2. Returns how many distinct host rows this thread added to the set.
  KOKKOS_INLINE_FUNCTION std::uint32_t build_set(const member_type& team, const hisparse::ResolveScratch& s) const {
    const std::int32_t K = top_k();
    const std::int32_t G = entry_groups();
    std::uint32_t distinct = 0;
    for (std::int32_t i = team.team_rank(); i < G; i += threads(team)) {
      std::int32_t j[E], g[E], h[E];
      for (int u = 0; u < E; ++u) {
        j[u] = i + u * G;
        g[u] = j[u] < K ? s.host_rows[j[u]] : hisparse::done;
      }
      distinct += static_cast<std::uint32_t>(insert_keys(s, g, j, h));
      for (int u = 0; u < E; ++u) {
        if (g[u] >= 0) s.position[j[u]] = static_cast<std::uint16_t>(h[u]);
      }
    }
    return distinct;
  }

  // Pass 2 with a slot map, in place of passes 2 and 3: every hit sets its
  // slot's hit flag, then build_set() enters the misses (the only entries
  // host_rows still holds as host rows). Returns this thread's counts: hit
  // slots flagged first here in the low half, missing host rows added to the
  // set in the high.
  KOKKOS_INLINE_FUNCTION std::uint32_t note_hits_and_misses(const member_type& team,
                                                            const hisparse::ResolveScratch& s) const {
    const std::int32_t K = top_k();
    const std::int32_t G = entry_groups();
    std::uint32_t* hit_words = reinterpret_cast<std::uint32_t*>(s.hit_flags);
    std::uint32_t hits = 0;
    for (std::int32_t i = team.team_rank(); i < G; i += threads(team)) {
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i + u * G;
        const std::int32_t g = j < K ? s.host_rows[j] : hisparse::done;
        if (g >= hisparse::done) continue;  // a miss, or no slot needed
        // Byte slot / S, bit slot % S of the hit flags, in 32-bit words
        // (little-endian, as every supported device is).
        const std::int32_t slot = hisparse::slot_of_hit(g);
        const std::int32_t byte = slot / S;
        const std::uint32_t bit = 1u << ((byte % 4) * 8 + slot % S);
        hits += (device::atomic_or(&hit_words[byte / 4], bit) & bit) == 0 ? 1u : 0u;
      }
    }
    return hits + build_set(team, s) * high_count;
  }

  // Pass 3. Group i holds slots 8i .. 8i + 7 and LRU positions 8i .. 8i + 7.
  // Returns this thread's hit slots in the low half, the keys they hold
  // (first holder only) in the high.
  KOKKOS_INLINE_FUNCTION std::uint32_t classify_slots(const member_type& team, const hisparse::ResolveScratch& s,
                                                      const std::int32_t* slot_rows, const std::int16_t* lru) const {
    const std::int32_t H = hot_slots();
    std::uint32_t counts = 0;
    for (std::int32_t i = team.team_rank(); i < slot_groups(); i += threads(team)) {
      const std::int32_t first = i * S;
      std::int32_t g[S];
      std::int16_t old_order[S];
      for (int u = 0; u < S; ++u) {
        g[u] = first + u < H ? slot_rows[first + u] : -1;
        old_order[u] = first + u < H ? lru[first + u] : std::int16_t{0};
      }
      // Copied into the scratch that pass 4 overwrites: the copy is never
      // read, but its loads, issued with slot_rows', bring the row's lru
      // into the cache, where pass 4 reads it again.
      for (int u = 0; u < S; ++u) {
        if (first + u < H) s.lru[first + u] = old_order[u];
      }
      // The lookups go in two halves of four: all eight loads above are
      // issued first, and four probes at a time keep the registers down.
      std::uint32_t flags = 0;
      for (int half = 0; half < S; half += S / 2) {
        std::int32_t gh[S / 2], h[S / 2];
        std::uint32_t w[S / 2];
        for (int u = 0; u < S / 2; ++u) gh[u] = g[half + u];
        find_keys(s, gh, h, w);
        for (int u = 0; u < S / 2; ++u) {
          if (h[u] < 0) continue;
          const std::uint32_t slot_word = (static_cast<std::uint32_t>(first + half + u + 1) << 16) | (w[u] & 0xFFFFu);
          const std::uint32_t old = device::atomic_max(&s.words[h[u]], slot_word);
          flags |= 1u << (half + u);
          counts += 1u + ((old >> 16) == 0 ? high_count : 0u);
        }
      }
      s.hit_flags[i] = static_cast<std::uint8_t>(flags);
    }
    return counts;
  }

  // Pass 4, scan element i: LRU positions 8i .. 8i + 7 and entries
  // 4i .. 4i + 3. What the scan's first half reads, kept for its second.
  struct OrderGroup {
    std::int16_t slot[S];  // the old LRU order at positions 8i ..
    std::uint32_t hit;     // bit u: slot[u] is a hit
    std::int32_t h[E];     // hash positions of entries 4i ..
    std::uint32_t miss;    // bit u: entry 4i + u is the first entry of a missing key
    std::uint32_t count;   // hits in the low half, misses in the high
  };

  // Before the prefix sum (`placed` false) a group's misses come from the
  // set's words and are kept in miss_flags; after it they are read back
  // from there, because place_order_group() then writes the words of missing
  // keys, which other threads' groups point at too (a duplicate entry, or
  // position 0 for an entry that needs no slot). The answers would not
  // change, but reading a word while another thread writes it is a data
  // race (compute-sanitizer's racecheck reported it on the H200).
  KOKKOS_INLINE_FUNCTION OrderGroup load_order_group(const hisparse::ResolveScratch& s, const std::int16_t* lru,
                                                     std::int32_t i, bool placed) const {
    const std::int32_t H = hot_slots(), K = top_k();
    OrderGroup o{};
    if (i < slot_groups()) {
      const std::int32_t first = i * S;
      for (int u = 0; u < S; ++u) o.slot[u] = first + u < H ? lru[first + u] : std::int16_t{0};
      for (int u = 0; u < S; ++u) {
        const bool hit = first + u < H && ((s.hit_flags[o.slot[u] / S] >> (o.slot[u] % S)) & 1) != 0;
        o.hit |= hit ? 1u << u : 0u;
        o.count += hit ? 1u : 0u;
      }
    }
    if (i < entry_groups()) {
      const std::int32_t first = i * E;
      for (int u = 0; u < E; ++u) o.h[u] = first + u < K ? s.position[first + u] : 0;
      if (placed) {
        o.miss = s.miss_flags[i];
      } else {
        for (int u = 0; u < E; ++u) {
          // The key's first entry, no slot and no miss number yet (a word is
          // never an entry index that does not need a slot).
          const bool miss = first + u < K && s.words[o.h[u]] == static_cast<std::uint32_t>(first + u);
          o.miss |= miss ? 1u << u : 0u;
        }
        s.miss_flags[i] = static_cast<std::uint8_t>(o.miss);
      }
      for (int u = 0; u < E; ++u) o.count += ((o.miss >> u) & 1u) != 0 ? high_count : 0u;
    }
    return o;
  }

  // `before`: hits before group i in the low half, misses before in the high.
  KOKKOS_INLINE_FUNCTION void place_order_group(const hisparse::ResolveScratch& s, const OrderGroup& o, std::int32_t i,
                                                std::uint32_t before, std::int32_t hits, std::int32_t misses) const {
    const std::int32_t H = hot_slots();
    const std::int32_t untouched = H - hits - misses;
    if (i < slot_groups()) {
      const std::int32_t first = i * S;
      std::int32_t hits_before = static_cast<std::int32_t>(before & 0xFFFFu);
      for (int u = 0; u < S && first + u < H; ++u) {
        std::int32_t to;
        if ((o.hit >> u) & 1u) {
          to = H - hits + hits_before;  // hits, in old order
          ++hits_before;
        } else {
          const std::int32_t e = first + u - hits_before;  // evictable rank
          to = e >= misses ? e - misses : untouched + e;   // untouched, then newly loaded
        }
        s.lru[to < 0 ? 0 : to] = o.slot[u];  // to < 0 only if slot_rows held a row twice
      }
    }
    if (i < entry_groups()) {
      const std::int32_t first = i * E;
      std::uint32_t m = before >> 16;
      for (int u = 0; u < E; ++u) {
        if (((o.miss >> u) & 1u) == 0) continue;
        s.words[o.h[u]] = (m << 16) | hisparse::miss_flag | static_cast<std::uint32_t>(first + u);
        ++m;
      }
    }
  }

  // Pass 4: one prefix sum over scan elements (hits and misses before each).
  // Each LRU position moves to its new place, and the first entry of each
  // missing key gives the key its miss number. A thread takes consecutive
  // elements (one at K = 2048, H = 4096 with 1024 threads), so one team
  // prefix sum orders them all.
  KOKKOS_INLINE_FUNCTION void order_slots(const member_type& team, const hisparse::ResolveScratch& s,
                                          std::uint32_t* totals, const std::int16_t* lru, std::int32_t hits,
                                          std::int32_t misses) const {
    const std::int32_t position_groups = slot_groups(), entry_group_count = entry_groups();
    const std::int32_t n = position_groups > entry_group_count ? position_groups : entry_group_count;
    const std::int32_t per_thread = hisparse::groups(n, threads(team));
    const std::int32_t begin = team.team_rank() * per_thread;
    const std::int32_t end = begin + per_thread < n ? begin + per_thread : n;
    // The elements are read again after the prefix sum (the lru from L1,
    // the rest from scratch) rather than kept in registers across it: that
    // keeps the kernel within 64 registers.
    std::uint32_t count = 0;
    for (std::int32_t i = begin; i < end; ++i) count += load_order_group(s, lru, i, false).count;
    std::uint32_t total = 0;
    std::uint32_t before = device::team_exclusive_sum(team, totals, count, total);
    for (std::int32_t i = begin; i < end; ++i) {
      const OrderGroup o = load_order_group(s, lru, i, true);
      place_order_group(s, o, i, before, hits, misses);
      before += o.count;
    }
  }

  // The map's part of loading host row g into `slot`: the entry of the row the
  // slot held is removed, g's is entered.
  KOKKOS_INLINE_FUNCTION void move_in_map(const hisparse::SlotMap& m, std::int32_t g, std::int32_t slot) const {
    const std::int32_t old = m.slot_position[slot];
    if (old >= 0) m.entries[old] = hisparse::map_removed;
    bool duplicate = false;  // g missed, so no entry holds it
    const std::int32_t position = insert_in_map(m, g, slot, duplicate);
    m.slot_position[slot] = position;
    if (position < 0) m.header[0] = hisparse::map_full;  // a map filled against the rule: rebuild it
  }

  // Pass 5.
  KOKKOS_INLINE_FUNCTION void write_results(const member_type& team, const hisparse::ResolveScratch& s,
                                            std::int64_t row, std::int64_t hot_table_row, std::int32_t* slot_rows,
                                            std::int16_t* lru, std::int32_t hits, std::int32_t misses) const {
    const std::int32_t H = hot_slots(), K = top_k();
    const std::int32_t G = entry_groups();
    const std::int32_t untouched = H - hits - misses;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, G), [&](const std::int32_t i) {
      // Scratch loads of the whole group first, then the global stores.
      std::int32_t g[E], slot[E], m[E], x[E];
      std::uint32_t w[E];
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i + u * G;
        g[u] = j < K ? s.host_rows[j] : hisparse::done;
        w[u] = s.words[j < K ? s.position[j] : 0];
      }
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i + u * G;
        m[u] = -1;  // miss number when entry j loads its key
        slot[u] = -1;
        if (g[u] == hisparse::done) continue;
        if (g[u] < hisparse::done) {
          slot[u] = hisparse::slot_of_hit(g[u]);  // found in the slot map
        } else if (w[u] & hisparse::miss_flag) {
          const std::int32_t at = untouched + static_cast<std::int32_t>(w[u] >> 16);
          slot[u] = s.lru[at < 0 ? 0 : at];  // at < 0 only if slot_rows held a row twice
          if ((w[u] & hisparse::entry_bits) == static_cast<std::uint32_t>(j)) m[u] = static_cast<std::int32_t>(w[u] >> 16);
        } else {
          slot[u] = static_cast<std::int32_t>(w[u] >> 16) - 1;
        }
      }
      for (int u = 0; u < E; ++u) x[u] = g[u] == hisparse::done ? -1 : hot_row(s, hot_table_row, slot[u]);
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i + u * G;
        if (g[u] == hisparse::done) continue;
        store(row, j, x[u]);
        if (a.miss_mask != nullptr) a.miss_mask[row * a.out_stride + j] = m[u] >= 0 ? 1 : 0;
        if (m[u] >= 0) {
          slot_rows[slot[u]] = g[u];
          a.swap_host_rows[row * a.out_stride + m[u]] = g[u];
          a.swap_device_rows[row * a.out_stride + m[u]] = x[u];
        }
      }
    });
    // The new LRU order, four positions a thread at a time: the scratch loads
    // first (the compiler cannot tell the two apart), then the stores.
    constexpr int lru_per_round = 4;
    for (std::int32_t p0 = team.team_rank(); p0 < H; p0 += lru_per_round * threads(team)) {
      std::int16_t order[lru_per_round];
      for (int u = 0; u < lru_per_round; ++u) {
        const std::int32_t p = p0 + u * threads(team);
        order[u] = s.lru[p < H ? p : 0];
      }
      for (int u = 0; u < lru_per_round; ++u) {
        const std::int32_t p = p0 + u * threads(team);
        if (p < H) lru[p] = order[u];
      }
    }
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
  }

  // Pass 6, with a slot map: the m-th missed host row (pass 5 wrote it to the
  // swap list) goes into the map as held by the slot it took.
  // Its positions used since the rebuild go up by the misses (rank 0, which
  // alone writes the header).
  KOKKOS_INLINE_FUNCTION void enter_loaded_rows(const member_type& team, const hisparse::ResolveScratch& s,
                                                std::int64_t state_row, std::int64_t row, std::int32_t hits,
                                                std::int32_t misses) const {
    const hisparse::SlotMap map = slot_map(state_row);
    const std::int32_t untouched = hot_slots() - hits - misses;
    for (std::int32_t m = team.team_rank(); m < misses; m += threads(team)) {
      move_in_map(map, a.swap_host_rows[row * a.out_stride + m], s.lru[untouched + m]);
    }
    // An atomic add: an insert that found no room (rows sharing a state row,
    // against the rule) may be storing map_full meanwhile, and must not be lost.
    if (team.team_rank() == 0) Kokkos::atomic_add(&map.header[0], misses);
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
    void* base = team.team_scratch(Level).get_shmem_aligned(bytes, 16);
    const hisparse::ResolveScratch s = hisparse::ResolveScratch::carve(base, top_k(), hot_slots(), cached_blocks);
    const std::int64_t hot_table_row = a.hot_table_by_state && !padding ? state : row;
    std::uint32_t* const totals[2] = {s.totals, s.totals + hisparse::team_total_words / 2};
    std::uint32_t counts = 0;
    // State row 0 stands in for a padding row's (never read; not prefetched).
    const std::int64_t state_row = padding ? 0 : state;
    std::int32_t* slot_rows = a.slot_rows + state_row * a.slot_rows_stride;
    std::int16_t* lru = a.lru + state_row * a.lru_stride;
    // The slot map, rebuilt first when it asks for it; a state that holds a
    // host row in two slots resolves without it (and rebuilds it next time).
    // On a GPU the map serves production rows (ProductionShape); rows of other
    // shapes search the slots, because the map's code does not fit their 64
    // registers (their sizes are run-time values). Their map is marked for a
    // rebuild, since such a row changes slot_rows without it.
    constexpr bool can_map = is_host_space<Space> || (Level == 0 && std::is_same<Shape, ProductionShape>::value);
    bool mapped = can_map && a.slot_map != nullptr && !padding;
    if (!can_map && a.slot_map != nullptr && !padding && team.team_rank() == 0) slot_map(state_row).header[0] = -1;
    if (mapped) {
      const hisparse::SlotMap map = slot_map(state_row);
      // One thread reads the header and the team follows it, so that a header
      // that changes meanwhile (rows sharing a state row, against the rule)
      // cannot split the team's barriers. A row the library did not build (no
      // tag: zeros, say) is rebuilt like one marked -1. totals[1][0] is next
      // written after the rebuild's first barrier or pass 1's.
      if (team.team_rank() == 0) {
        const Int4 header = *reinterpret_cast<const Int4*>(map.header);
        const std::int32_t used = header.y == (hisparse_slot_map_tag ^ hot_slots()) ? header.x : -1;
        totals[1][0] = used < 0 || used > map_used_limit() ? 1u : 0u;
      }
      team.team_barrier();
      if (totals[1][0] != 0) {
        std::uint32_t entered = 0;
        device::team_exclusive_sum(team, totals[1], rebuild_map(team, map, slot_rows), entered);
        mapped = (entered >> 16) == 0;
        if (team.team_rank() == 0) {
          const std::int32_t now = mapped ? static_cast<std::int32_t>(entered & 0xFFFFu) : -1;
          *reinterpret_cast<Int4*>(map.header) = Int4{now, hisparse_slot_map_tag ^ hot_slots(), 0, 0};
        }
      }
    }
    device::team_exclusive_sum(team, totals[0],
                map_entries(team, s, row, padding ? -1 : request, hot_table_row, padding ? 0 : cached_blocks,
                            slot_rows, lru, !padding, mapped, state_row),
                counts);
    if (a.valid_counts != nullptr && team.team_rank() == 0) a.valid_counts[row] = static_cast<std::int32_t>(counts & 0xFFFFu);
    if ((counts >> 16) == 0) {
      // Nothing can consult the hot slots (or a padding row): leave the LRU as it is.
      if (team.team_rank() == 0) a.swap_counts[row] = 0;
      return;
    }
    std::int32_t hits = 0, misses = 0;
    if (mapped) {
      std::uint32_t noted = 0;
      device::team_exclusive_sum(team, totals[1], note_hits_and_misses(team, s), noted);
      hits = static_cast<std::int32_t>(noted & 0xFFFFu);
      misses = static_cast<std::int32_t>(noted >> 16);
      order_slots(team, s, totals[0], lru, hits, misses);
    } else {
      std::uint32_t distinct = 0;
      device::team_exclusive_sum(team, totals[1], build_set(team, s), distinct);
      std::uint32_t found = 0;
      device::team_exclusive_sum(team, totals[0], classify_slots(team, s, slot_rows, lru), found);
      hits = static_cast<std::int32_t>(found & 0xFFFFu);
      misses = static_cast<std::int32_t>(distinct) - static_cast<std::int32_t>(found >> 16);
      order_slots(team, s, totals[1], lru, hits, misses);
    }
    team.team_barrier();
    write_results(team, s, row, hot_table_row, slot_rows, lru, hits, misses);
    if (mapped) {
      team.team_barrier();  // the swap list is written
      enter_loaded_rows(team, s, state_row, row, hits, misses);
    }
  }
};

// Team scratch of one row's resolve; + 16: room to align the set for its
// 16-byte bucket loads.
inline std::size_t resolve_hisparse_scratch_bytes(std::int32_t top_k, std::int32_t hot_slots, std::int32_t hot_block_size) {
  const std::int32_t cached = hisparse::ResolveScratch::cached_hot_blocks(hot_slots, hot_block_size);
  return hisparse::ResolveScratch::bytes(top_k, hot_slots, cached) + 16;
}

// A team of hisparse::team_threads resolves each row with level `Level`
// scratch, compiled for `Shape`.
template <class Space, int Level, class Shape>
void launch_resolve(const Space& space, const HiSparseResolveArgs& a, std::int32_t cached, std::size_t bytes) {
  using policy_type = Kokkos::TeamPolicy<Space, Kokkos::LaunchBounds<hisparse::team_threads, 1>>;
  policy_type policy(space, static_cast<int>(a.num_rows), row_team_size<Space>(hisparse::team_threads));
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
  // memory) scratch, and run the production shape when their block sizes
  // are powers of two; larger shapes take level-1 (global) scratch.
  const auto power_of_two = [](std::int32_t n) { return exact_log2(n) >= 0; };
  const bool resident_splits = a.resident_block_table == nullptr || power_of_two(a.resident_block_size);
  if (bytes > static_cast<std::size_t>(Kokkos::TeamPolicy<Space>::scratch_size_max(0))) {
    launch_resolve<Space, 1, AnyShape>(space, a, cached, bytes);
  } else if (a.top_k == ProductionShape::top_k && a.hot_slots == ProductionShape::hot_slots &&
             row_team_size<Space>(hisparse::team_threads) == ProductionShape::threads &&
             power_of_two(a.source_block_size) && power_of_two(a.hot_block_size) && resident_splits) {
    launch_resolve<Space, 0, ProductionShape>(space, a, cached, bytes);
  } else {
    launch_resolve<Space, 0, AnyShape>(space, a, cached, bytes);
  }
}

}  // namespace sparse_mla::kernels
