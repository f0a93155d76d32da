// HiSparse swap-in (SPEC section 5), the general resolve: any top-k K and
// hot slots H (K <= H <= hisparse_max_hot_slots), any block sizes. Production
// rows take the resolve in LRU order instead (hisparse_resolve.hpp chooses).
// One team per batch row resolves the row's logical top-k against the hot
// slots of its state row.
//
// The row's distinct host rows go into a team-scratch hash set (2K
// positions, hisparse_resolve_common.hpp). One 32-bit word per position packs
// what the passes know about a key (below): its first top-k entry, then the
// hot slot that holds it or, for a key that misses, its miss number. With the
// host row of each entry, each entry's hash position, the new LRU order, one
// hit bit per slot, one miss bit per entry and the per-warp team sums, a row
// of K = 2048, H = 4096 with hot blocks of 64 needs 39,424 bytes of scratch
// (and 16 to align the set): it fits the 40,936 bytes of level-0 (shared
// memory) scratch that a Kokkos 4.6 CUDA team can have, so every probe and
// atomic stays on the chip. Larger shapes run the same code from level-1
// (global) scratch.
//
// A GPU team is hisparse::team_threads. Each pass gives a thread fixed groups
// of entries or slots and issues a group's global loads before it uses any
// of them; the prefix sums run over groups, and the LRU walk and the miss
// numbering share one. Each team sum is one barrier (device::team_exclusive_sum:
// a warp shuffle scan, one word per warp through scratch), and that barrier
// is also the one between two passes. LaunchBounds<1024, 1> keeps the kernel
// within 64 registers (a 1024-thread team's share of an SM's register file).
// On the host a team is one thread and the same passes run as loops.
//
// Passes (one barrier between two, in the team sum that ends each):
//   1. map_entries: map every entry to its host row g and its resident row;
//      write the resolved rows, the resident and invalid outputs and the
//      valid count; clear the set; cache the row's hot block table. A row
//      with nothing left to look up returns here (its LRU untouched), and so
//      does a padding row, mapped as a row whose request is outside the
//      tables (all -1, counts 0).
//      On CUDA it also prefetches the state's slot_rows and lru for pass 3.
//   2. build_set: insert the pending host rows; each key keeps the first top-k
//      entry that selected it (duplicates collapse to it).
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
#pragma once

#include <Kokkos_Core.hpp>

#include "hisparse_resolve_common.hpp"

namespace sparse_mla::kernels {

namespace hisparse_general {

constexpr std::int32_t done = -1;  // entry needs no slot (resident, invalid)

// The set's words. A position is hisparse::empty_word, or holds a key: bits
// 0-14 are the first entry j that selected it (pass 2: atomic min); bits
// 16-31 are 0, then slot + 1 once a hit slot holds the key (pass 3: atomic
// max, so a state that held a row in two slots still resolves
// deterministically). Pass 4 sets miss_flag on a key that no slot holds and
// puts its miss number m in bits 16-31. The key itself is host_rows[j].
// The packing needs K <= H <= hisparse_max_hot_slots (2^15): j, m < 2^15,
// slot + 1 <= 2^15, hash positions < 2K <= 2^16. check_resolve refuses other
// shapes with a message naming hot_slots.
constexpr std::uint32_t entry_bits = 0x7FFFu;
constexpr std::uint32_t miss_flag = 0x8000u;
static_assert(hisparse_max_hot_slots <= 32768, "entries, slots and miss numbers must fit the packed set words");

// The team's scratch arrays, carved from one allocation.
struct Scratch {
  std::uint32_t* words;      // [set_positions(K)]: the hash set, 16-byte aligned
  std::uint32_t* totals;     // [team_total_words]: per-group partial sums (device::team_exclusive_sum)
  std::int32_t* host_rows;   // [K]: host row of entry j when it needs a slot, else done
  std::int32_t* hot_blocks;  // [cached]: the row's hot block table, or unused (cached = 0)
  std::uint16_t* position;   // [K]: hash position of entry j (entries that need a slot)
  std::int16_t* lru;         // [H]: the new LRU order (pass 4); pass 3 copies the old one here
  std::uint8_t* hit_flags;   // [ceil(H / S)]: bit s % S of byte s / S is set when slot s is a hit (S slots a group)
  std::uint8_t* miss_flags;  // [ceil(K / E)]: pass 4, bit u of byte i: entry E * i + u gives its key a miss number

  // Hot block table entries cached per row: all of the row's, or 0.
  KOKKOS_INLINE_FUNCTION static std::int32_t cached_hot_blocks(std::int32_t hot_slots, std::int32_t hot_block_size) {
    const std::int32_t blocks = hisparse::groups(hot_slots, hot_block_size);
    return blocks <= hisparse::max_cached_hot_blocks ? blocks : 0;
  }
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t bytes(std::int32_t top_k, std::int32_t hot_slots,
                                                            std::int32_t cached) {
    const std::size_t k = static_cast<std::size_t>(top_k), h = static_cast<std::size_t>(hot_slots);
    return 4 * (static_cast<std::size_t>(hisparse::set_positions(top_k)) + k +
                static_cast<std::size_t>(hisparse::team_total_words + cached)) +
           2 * (k + h) + static_cast<std::size_t>(hisparse::groups(hot_slots, hisparse::slots_per_group)) +
           static_cast<std::size_t>(hisparse::groups(top_k, hisparse::entries_per_group));
  }
  KOKKOS_INLINE_FUNCTION static Scratch carve(void* base, std::int32_t top_k, std::int32_t hot_slots,
                                              std::int32_t cached) {
    Scratch s;
    s.words = static_cast<std::uint32_t*>(base);
    s.totals = s.words + hisparse::set_positions(top_k);
    s.host_rows = reinterpret_cast<std::int32_t*>(s.totals + hisparse::team_total_words);
    s.hot_blocks = s.host_rows + top_k;
    s.position = reinterpret_cast<std::uint16_t*>(s.hot_blocks + cached);
    s.lru = reinterpret_cast<std::int16_t*>(s.position + top_k);
    s.hit_flags = reinterpret_cast<std::uint8_t*>(s.lru + hot_slots);
    s.miss_flags = s.hit_flags + hisparse::groups(hot_slots, hisparse::slots_per_group);
    return s;
  }
};

}  // namespace hisparse_general

// Level: the team scratch level, a template argument so that the compiler
// knows level-0 scratch is shared memory and reaches it with shared-memory
// instructions (32-bit addresses) rather than generic ones.
template <class Space, int Level>
struct HiSparseResolveGeneral : ResolveTables<SplitBy::either> {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  using Scratch = hisparse_general::Scratch;
  static constexpr int E = hisparse::entries_per_group;
  static constexpr int S = hisparse::slots_per_group;
  std::int32_t cached_blocks;  // hot block table entries cached in scratch per row

  KOKKOS_INLINE_FUNCTION std::int32_t hash_size() const { return hisparse::set_positions(a.top_k); }
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
  KOKKOS_INLINE_FUNCTION void load_bucket(const Scratch& s, std::int32_t b, Bucket& k) const {
    const Int4 v = *reinterpret_cast<const Int4*>(s.words + b);
    k.word[0] = static_cast<std::uint32_t>(v.x);
    k.word[1] = static_cast<std::uint32_t>(v.y);
    k.word[2] = static_cast<std::uint32_t>(v.z);
    k.word[3] = static_cast<std::uint32_t>(v.w);
  }
  KOKKOS_INLINE_FUNCTION void load_keys(const Scratch& s, Bucket& k) const {
    for (int i = 0; i < hisparse::bucket; ++i) {
      k.key[i] = s.host_rows[k.word[i] == hisparse::empty_word ? 0 : k.word[i] & hisparse_general::entry_bits];
    }
  }
  KOKKOS_INLINE_FUNCTION std::int32_t entry_groups() const { return hisparse::groups(a.top_k, E); }
  KOKKOS_INLINE_FUNCTION std::int32_t slot_groups() const { return hisparse::groups(a.hot_slots, S); }

  // Hot row of `slot`; `row` is the batch row, or the state row with
  // hot_table_by_state. Reads the scratch copy of the table when there is one.
  KOKKOS_INLINE_FUNCTION std::int32_t hot_row(const Scratch& s, std::int64_t row, std::int32_t slot) const {
    const std::int32_t b = hot_split.block(slot);
    const std::int32_t block = cached_blocks > 0 ? s.hot_blocks[b] : a.hot_block_table[row * a.hot_table_stride + b];
    return static_cast<std::int32_t>(static_cast<std::int64_t>(block) * a.hot_block_size + hot_split.offset(slot));
  }

  // Probes N host rows together, one bucket of each per round, so that their
  // scratch loads overlap. at_bucket(u, b, k) looks at the bucket at b (its
  // words and keys k) of key u and returns true when key u is done there;
  // a key not done moves on to the next bucket. g[u] < 0: no key.
  template <int N, class AtBucket>
  KOKKOS_INLINE_FUNCTION void probe_keys(const Scratch& s, const std::int32_t (&g)[N], AtBucket&& at_bucket) const {
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
  KOKKOS_INLINE_FUNCTION void find_keys(const Scratch& s, const std::int32_t (&g)[N], std::int32_t (&h)[N],
                                        std::uint32_t (&w)[N]) const {
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
  KOKKOS_INLINE_FUNCTION std::int32_t insert_keys(const Scratch& s, const std::int32_t (&g)[N],
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

  // Pass 1. Returns this thread's counts: valid entries in the low half,
  // entries that need a hot slot in the high. Group i holds entries i, i + G,
  // ... (coalesced loads). `request` -1 maps every entry to -1; `cached` hot
  // block table entries are copied to scratch. On CUDA the state's
  // slot_rows and lru are prefetched for pass 3 (not for a padding row).
  KOKKOS_INLINE_FUNCTION std::uint32_t map_entries(const member_type& team, const Scratch& s, std::int64_t row,
                                                   std::int32_t request, std::int64_t hot_table_row, std::int32_t cached,
                                                   const std::int32_t* slot_rows, const std::int16_t* lru,
                                                   bool prefetch) const {
    const std::int32_t* in = a.logical + row * a.logical_stride;
    const std::int32_t* hot_table = a.hot_block_table + hot_table_row * a.hot_table_stride;
    const std::int32_t* source_table = source_table_row(request);
    const std::int32_t* resident_table = resident_table_row(request);
    const std::int32_t K = a.top_k;
    const std::int32_t G = entry_groups();
    std::uint32_t counts = 0;
    for (std::int32_t i = team.team_rank(); i < G; i += team.team_size()) {
      std::int32_t tok[E], g[E], resident[E];
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i + u * G;
        tok[u] = j < K ? in[j] : -1;
      }
      // While the loads are in flight: clear the set, copy the hot block table.
      for (std::int32_t h = i; h < hash_size(); h += G) s.words[h] = hisparse::empty_word;
      // Pass 3 reads these two barriers from now: bring them to this SM's L1
      // while the table loads are in flight (after the entry loads, which
      // must not wait for the state). A hint where the device has one
      // (device::prefetch_l1), nothing elsewhere.
      if (prefetch) {
        for (std::int32_t k = i; k < slot_groups(); k += G) {
          device::prefetch_l1(slot_rows + k * S);
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
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i + u * G;
        if (j >= K) break;
        if (a.resolved_rows != nullptr) a.resolved_rows[row * a.out_stride + j] = g[u];
        const bool pending = resident[u] < 0 && g[u] >= 0;
        if (!pending) {
          store(row, j, resident[u]);
          if (a.miss_mask != nullptr) a.miss_mask[row * a.out_stride + j] = 0;
        }
        s.host_rows[j] = pending ? g[u] : hisparse_general::done;
        s.position[j] = 0;  // pass 2 sets it for pending entries
        counts += (resident[u] >= 0 || g[u] >= 0 ? 1u : 0u) + (pending ? hisparse::high_count : 0u);
      }
    }
    return counts;
  }

  // Pass 2. Returns how many distinct host rows this thread added to the set.
  KOKKOS_INLINE_FUNCTION std::uint32_t build_set(const member_type& team, const Scratch& s) const {
    const std::int32_t K = a.top_k;
    const std::int32_t G = entry_groups();
    std::uint32_t distinct = 0;
    for (std::int32_t i = team.team_rank(); i < G; i += team.team_size()) {
      std::int32_t j[E], g[E], h[E];
      for (int u = 0; u < E; ++u) {
        j[u] = i + u * G;
        g[u] = j[u] < K ? s.host_rows[j[u]] : hisparse_general::done;
      }
      distinct += static_cast<std::uint32_t>(insert_keys(s, g, j, h));
      for (int u = 0; u < E; ++u) {
        if (g[u] >= 0) s.position[j[u]] = static_cast<std::uint16_t>(h[u]);
      }
    }
    return distinct;
  }

  // Pass 3. Group i holds slots S * i .. S * i + S - 1. Returns this thread's
  // hit slots in the low half, the keys they hold (first holder only) in the
  // high.
  KOKKOS_INLINE_FUNCTION std::uint32_t classify_slots(const member_type& team, const Scratch& s,
                                                      const std::int32_t* slot_rows, const std::int16_t* lru) const {
    const std::int32_t H = a.hot_slots;
    std::uint32_t counts = 0;
    for (std::int32_t i = team.team_rank(); i < slot_groups(); i += team.team_size()) {
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
      // The lookups go in two halves: all the loads above are issued first,
      // and half a group's probes at a time keep the registers down.
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
          counts += 1u + ((old >> 16) == 0 ? hisparse::high_count : 0u);
        }
      }
      s.hit_flags[i] = static_cast<std::uint8_t>(flags);
    }
    return counts;
  }

  // Pass 4, scan element i: LRU positions S * i .. and entries E * i ...
  // What the scan's first half reads, kept for its second.
  struct OrderGroup {
    std::int16_t slot[S];  // the old LRU order at positions S * i ..
    std::uint32_t hit;     // bit u: slot[u] is a hit
    std::int32_t h[E];     // hash positions of entries E * i ..
    std::uint32_t miss;    // bit u: entry E * i + u is the first entry of a missing key
    std::uint32_t count;   // hits in the low half, misses in the high
  };

  // Before the prefix sum (`placed` false) a group's misses come from the
  // set's words and are kept in miss_flags; after it they are read back
  // from there, because place_order_group() then writes the words of missing
  // keys, which other threads' groups point at too (a duplicate entry, or
  // position 0 for an entry that needs no slot). The answers would not
  // change, but reading a word while another thread writes it is a data
  // race (compute-sanitizer's racecheck reported it on the H200).
  KOKKOS_INLINE_FUNCTION OrderGroup load_order_group(const Scratch& s, const std::int16_t* lru, std::int32_t i,
                                                     bool placed) const {
    const std::int32_t H = a.hot_slots, K = a.top_k;
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
      for (int u = 0; u < E; ++u) o.count += ((o.miss >> u) & 1u) != 0 ? hisparse::high_count : 0u;
    }
    return o;
  }

  // `before`: hits before group i in the low half, misses before in the high.
  KOKKOS_INLINE_FUNCTION void place_order_group(const Scratch& s, const OrderGroup& o, std::int32_t i,
                                                std::uint32_t before, std::int32_t hits, std::int32_t misses) const {
    const std::int32_t H = a.hot_slots;
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
        s.words[o.h[u]] = (m << 16) | hisparse_general::miss_flag | static_cast<std::uint32_t>(first + u);
        ++m;
      }
    }
  }

  // Pass 4: one prefix sum over scan elements (hits and misses before each).
  // Each LRU position moves to its new place, and the first entry of each
  // missing key gives the key its miss number. A thread takes consecutive
  // elements (one at K = 2048, H = 4096 with 1024 threads), so one team
  // prefix sum orders them all.
  KOKKOS_INLINE_FUNCTION void order_slots(const member_type& team, const Scratch& s, std::uint32_t* totals,
                                          const std::int16_t* lru, std::int32_t hits, std::int32_t misses) const {
    const std::int32_t position_groups = slot_groups(), entry_group_count = entry_groups();
    const std::int32_t n = position_groups > entry_group_count ? position_groups : entry_group_count;
    const std::int32_t per_thread = hisparse::groups(n, team.team_size());
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

  // Pass 5.
  KOKKOS_INLINE_FUNCTION void write_results(const member_type& team, const Scratch& s, std::int64_t row,
                                            std::int64_t hot_table_row, std::int32_t* slot_rows, std::int16_t* lru,
                                            std::int32_t hits, std::int32_t misses) const {
    const std::int32_t H = a.hot_slots, K = a.top_k;
    const std::int32_t G = entry_groups();
    const std::int32_t untouched = H - hits - misses;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, G), [&](const std::int32_t i) {
      // Scratch loads of the whole group first, then the global stores.
      std::int32_t g[E], slot[E], m[E], x[E];
      std::uint32_t w[E];
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i + u * G;
        g[u] = j < K ? s.host_rows[j] : hisparse_general::done;
        w[u] = s.words[j < K ? s.position[j] : 0];
      }
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i + u * G;
        m[u] = -1;  // miss number when entry j loads its key
        slot[u] = -1;
        if (g[u] == hisparse_general::done) continue;
        if (w[u] & hisparse_general::miss_flag) {
          const std::int32_t at = untouched + static_cast<std::int32_t>(w[u] >> 16);
          slot[u] = s.lru[at < 0 ? 0 : at];  // at < 0 only if slot_rows held a row twice
          if ((w[u] & hisparse_general::entry_bits) == static_cast<std::uint32_t>(j)) {
            m[u] = static_cast<std::int32_t>(w[u] >> 16);
          }
        } else {
          slot[u] = static_cast<std::int32_t>(w[u] >> 16) - 1;
        }
      }
      for (int u = 0; u < E; ++u) x[u] = g[u] == hisparse_general::done ? -1 : hot_row(s, hot_table_row, slot[u]);
      for (int u = 0; u < E; ++u) {
        const std::int32_t j = i + u * G;
        if (g[u] == hisparse_general::done) continue;
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
    const std::int32_t threads = team.team_size();
    for (std::int32_t p0 = team.team_rank(); p0 < H; p0 += lru_per_round * threads) {
      std::int16_t order[lru_per_round];
      for (int u = 0; u < lru_per_round; ++u) {
        const std::int32_t p = p0 + u * threads;
        order[u] = s.lru[p < H ? p : 0];
      }
      for (int u = 0; u < lru_per_round; ++u) {
        const std::int32_t p = p0 + u * threads;
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

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t row = team.league_rank();
    const std::int32_t state = a.request_state_indices != nullptr ? a.request_state_indices[row]
                                                                  : static_cast<std::int32_t>(row);
    const std::int32_t request = a.request_ids[row];  // loaded with the state, not after it
    // A padding row goes through pass 1 as a row whose request is outside the
    // tables: every output -1, counts 0, and it returns before its state.
    const bool padding = state < 0 || state >= a.num_state_rows;
    const std::size_t bytes = Scratch::bytes(a.top_k, a.hot_slots, cached_blocks);
    void* base = team.team_scratch(Level).get_shmem_aligned(bytes, 16);
    const Scratch s = Scratch::carve(base, a.top_k, a.hot_slots, cached_blocks);
    const std::int64_t hot_table_row = a.hot_table_by_state && !padding ? state : row;
    std::uint32_t* const totals[2] = {s.totals, s.totals + hisparse::team_total_words / 2};
    // State row 0 stands in for a padding row's (never read; not prefetched).
    const std::int64_t state_row = padding ? 0 : state;
    std::int32_t* slot_rows = a.slot_rows + state_row * a.slot_rows_stride;
    std::int16_t* lru = a.lru + state_row * a.lru_stride;
    std::uint32_t counts = 0;
    device::team_exclusive_sum(team, totals[0],
                               map_entries(team, s, row, padding ? -1 : request, hot_table_row,
                                           padding ? 0 : cached_blocks, slot_rows, lru, !padding),
                               counts);
    if (a.valid_counts != nullptr && team.team_rank() == 0) a.valid_counts[row] = static_cast<std::int32_t>(counts & 0xFFFFu);
    if ((counts >> 16) == 0) {
      // Nothing can consult the hot slots (or a padding row): leave the LRU as it is.
      if (team.team_rank() == 0) a.swap_counts[row] = 0;
      return;
    }
    std::uint32_t distinct = 0;
    device::team_exclusive_sum(team, totals[1], build_set(team, s), distinct);
    std::uint32_t found = 0;
    device::team_exclusive_sum(team, totals[0], classify_slots(team, s, slot_rows, lru), found);
    const std::int32_t hits = static_cast<std::int32_t>(found & 0xFFFFu);
    const std::int32_t misses = static_cast<std::int32_t>(distinct) - static_cast<std::int32_t>(found >> 16);
    order_slots(team, s, totals[1], lru, hits, misses);
    team.team_barrier();
    write_results(team, s, row, hot_table_row, slot_rows, lru, hits, misses);
  }
};

// Team scratch of one row of the general resolve; + 16: room to align the
// set for its 16-byte bucket loads.
inline std::size_t resolve_hisparse_general_scratch_bytes(std::int32_t top_k, std::int32_t hot_slots,
                                                          std::int32_t hot_block_size) {
  const std::int32_t cached = hisparse_general::Scratch::cached_hot_blocks(hot_slots, hot_block_size);
  return hisparse_general::Scratch::bytes(top_k, hot_slots, cached) + 16;
}

// A team of hisparse::team_threads resolves each row with level-`Level`
// scratch of `bytes`.
template <class Space, int Level>
void launch_resolve_hisparse_general(const Space& space, const HiSparseResolveArgs& a, std::size_t bytes) {
  using policy_type = Kokkos::TeamPolicy<Space, Kokkos::LaunchBounds<hisparse::team_threads, 1>>;
  policy_type policy(space, static_cast<int>(a.num_rows), row_team_size<Space>(hisparse::team_threads));
  policy.set_scratch_size(Level, Kokkos::PerTeam(bytes));
  const std::int32_t cached = hisparse_general::Scratch::cached_hot_blocks(a.hot_slots, a.hot_block_size);
  Kokkos::parallel_for("sparse_mla::resolve_hisparse_general", policy,
                       HiSparseResolveGeneral<Space, Level>{ResolveTables<SplitBy::either>::of(a), cached});
}

// From level-0 (shared memory) scratch where a row's fits it (K = 2048,
// H = 4096: 39,440 bytes), else from level 1.
template <class Space>
void resolve_hisparse_general(const Space& space, const HiSparseResolveArgs& a) {
  const std::size_t bytes = resolve_hisparse_general_scratch_bytes(a.top_k, a.hot_slots, a.hot_block_size);
  if (bytes <= static_cast<std::size_t>(Kokkos::TeamPolicy<Space>::scratch_size_max(0))) {
    launch_resolve_hisparse_general<Space, 0>(space, a, bytes);
  } else {
    launch_resolve_hisparse_general<Space, 1>(space, a, bytes);
  }
}

}  // namespace sparse_mla::kernels
