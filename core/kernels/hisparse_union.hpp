// HiSparse speculative decoding (SPEC section 5, docs/hisparse.md
// "Speculative decoding"): the rows of one request share its state row, so
// the group resolves one union of their selections per request instead of
// each row on its own.
//
// Two kernels around the unchanged resolve (hisparse_resolve.hpp):
//   union_hisparse_requests, before it: one team per batch row. The team of
//     a request's first row f builds union row f (the request's distinct
//     positions, max_rows_per_request * K wide) and, for every entry of the
//     request's rows, its position in the union; every other union row is
//     padding, so that the resolve over the union rows resolves each request
//     once, against its state row, with the first row's request id and hot
//     blocks.
//   scatter_hisparse_union, after it: one team per batch row maps the row's
//     entries back from its request's union row (hot rows and their
//     attention indices, miss mask, valid count) and takes its share of the
//     union's swap list, so that the row gather runs over batch rows
//     unchanged.
//
// The union is built with a team-scratch hash set keyed by position (2 x the
// union width, at most half full), each key keeping its first entry in
// row-major order (an atomic minimum), then one team prefix sum numbering the
// first entries in that order. Union widths of production shapes (K = 2048,
// four rows) need level-1 (global) team scratch; smaller ones fit level 0.
// On the host a team is one thread and the same passes run as loops.
#pragma once

#include <Kokkos_Core.hpp>

#include "space_traits.hpp"
#include "kernels.hpp"

namespace sparse_mla::kernels {

namespace hisparse_union {

constexpr std::uint32_t empty_word = 0xFFFFFFFFu;
constexpr int team_threads = 256;

// Positions of the union's hash set: 2 x the union width, so at most half full.
KOKKOS_INLINE_FUNCTION std::int32_t set_positions(std::int32_t union_width) { return 2 * union_width; }

// Knuth's multiplicative hash, scaled to [0, size) by its high bits.
KOKKOS_INLINE_FUNCTION std::int32_t hash_position(std::int32_t key, std::int32_t size) {
  const std::uint32_t mixed = static_cast<std::uint32_t>(key) * 2654435761u;
  return static_cast<std::int32_t>((static_cast<std::uint64_t>(mixed) * static_cast<std::uint32_t>(size)) >> 32);
}

// The team's scratch: the set's words (the first entry of each key), the
// position of every entry of the request's rows, and the union position of
// each first entry.
struct UnionScratch {
  std::uint32_t* words;       // [set_positions(U)]
  std::int32_t* positions;    // [U]: logical position of flat entry i (row-major over the request's rows)
  std::int32_t* union_index;  // [U]: union position of flat entry i when it is its key's first entry

  KOKKOS_INLINE_FUNCTION static std::size_t bytes(std::int32_t union_width) {
    return 4 * (static_cast<std::size_t>(set_positions(union_width)) + 2 * static_cast<std::size_t>(union_width));
  }
  KOKKOS_INLINE_FUNCTION static UnionScratch carve(void* base, std::int32_t union_width) {
    UnionScratch s;
    s.words = static_cast<std::uint32_t*>(base);
    s.positions = reinterpret_cast<std::int32_t*>(s.words + set_positions(union_width));
    s.union_index = s.positions + union_width;
    return s;
  }
};

}  // namespace hisparse_union

template <class Space, int Level>
struct HiSparseUnion {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  HiSparseUnionArgs a;

  KOKKOS_INLINE_FUNCTION bool same_request(std::int64_t x, std::int32_t state, std::int32_t request) const {
    return a.request_state_indices[x] == state && a.request_ids[x] == request;
  }

  // The set's position of `key` (inserted before), or -1.
  KOKKOS_INLINE_FUNCTION std::int32_t find(const hisparse_union::UnionScratch& s, std::int32_t key) const {
    const std::int32_t size = hisparse_union::set_positions(a.union_width);
    std::int32_t h = hisparse_union::hash_position(key, size);
    for (;;) {
      const std::uint32_t w = s.words[h];
      if (w == hisparse_union::empty_word) return -1;
      if (s.positions[w] == key) return h;
      h = h + 1 == size ? 0 : h + 1;
    }
  }

  // Inserts flat entry i (position key >= 0); the key's word ends up holding
  // its smallest entry. A word seen empty may be taken by another thread
  // before the compare-and-swap, which then reports that thread's entry.
  KOKKOS_INLINE_FUNCTION void insert(const hisparse_union::UnionScratch& s, std::int32_t key, std::uint32_t i) const {
    const std::int32_t size = hisparse_union::set_positions(a.union_width);
    std::int32_t h = hisparse_union::hash_position(key, size);
    for (;;) {
      std::uint32_t w = s.words[h];
      if (w == hisparse_union::empty_word) {
        w = Kokkos::atomic_compare_exchange(&s.words[h], hisparse_union::empty_word, i);
        if (w == hisparse_union::empty_word) return;
      }
      if (s.positions[w] == key) {
        if (i < w) Kokkos::atomic_fetch_min(&s.words[h], i);
        return;
      }
      h = h + 1 == size ? 0 : h + 1;
    }
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t b = team.league_rank();
    const std::int32_t state = a.request_state_indices[b];
    const std::int32_t request = a.request_ids[b];
    const bool valid = state >= 0 && state < a.num_state_rows;
    const bool first = valid && (b == 0 || !same_request(b - 1, state, request));
    if (!first) {
      // Union row b is padding; a valid row's run_first is its first row's to write.
      Kokkos::single(Kokkos::PerTeam(team), [&]() {
        a.union_state[b] = -1;
        if (!valid) a.run_first[b] = -1;
      });
      return;
    }
    // The request's rows [b, end); every thread finds the same end.
    std::int64_t end = b + 1;
    while (end < a.num_rows && same_request(end, state, request)) ++end;
    // Rows of an earlier request on this state row: this request's rows are
    // not contiguous (or a second request id shares the state), bad input.
    std::int32_t earlier = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, static_cast<std::int32_t>(b)),
        [&](const std::int32_t x, std::int32_t& count) { count += a.request_state_indices[x] == state ? 1 : 0; },
        earlier);
    const bool refused = end - b > a.max_rows_per_request || earlier > 0;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, static_cast<std::int32_t>(end - b)), [&](const std::int32_t r) {
      a.run_first[b + r] = refused ? -1 : static_cast<std::int32_t>(b);
    });
    if (refused) {
      Kokkos::single(Kokkos::PerTeam(team), [&]() { a.union_state[b] = -1; });
      return;
    }

    const std::int32_t K = a.top_k, U = a.union_width;
    const std::int32_t n = static_cast<std::int32_t>(end - b) * K;  // flat entries of the request, <= U
    void* base = team.team_scratch(Level).get_shmem(hisparse_union::UnionScratch::bytes(U));
    const hisparse_union::UnionScratch s = hisparse_union::UnionScratch::carve(base, U);
    // Read the entries, clear the set.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](const std::int32_t i) {
      s.positions[i] = a.logical[(b + i / K) * a.logical_stride + i % K];
    });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, hisparse_union::set_positions(U)),
                         [&](const std::int32_t h) { s.words[h] = hisparse_union::empty_word; });
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](const std::int32_t i) {
      if (s.positions[i] >= 0) insert(s, s.positions[i], static_cast<std::uint32_t>(i));
    });
    team.team_barrier();
    // Number the first entries in row-major order: each thread takes a
    // consecutive range of entries, and one team prefix sum orders the ranges.
    const std::int32_t per_thread = (n + team.team_size() - 1) / team.team_size();
    const std::int32_t lo = team.team_rank() * per_thread < n ? team.team_rank() * per_thread : n;
    const std::int32_t hi = lo + per_thread < n ? lo + per_thread : n;
    const auto is_first = [&](std::int32_t i) {
      return s.positions[i] >= 0 && s.words[find(s, s.positions[i])] == static_cast<std::uint32_t>(i);
    };
    std::int32_t mine = 0;
    for (std::int32_t i = lo; i < hi; ++i) mine += is_first(i) ? 1 : 0;
    std::int32_t next = team.team_scan(mine);
    std::int32_t size = mine;
    team.team_reduce(Kokkos::Sum<std::int32_t>(size));
    for (std::int32_t i = lo; i < hi; ++i) {
      if (!is_first(i)) continue;
      s.union_index[i] = next;
      a.union_logical[b * a.union_stride + next] = s.positions[i];
      ++next;
    }
    team.team_barrier();
    // Every entry's union position; the rest of the union row is -1.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](const std::int32_t i) {
      const std::int32_t key = s.positions[i];
      std::int32_t p = -1;
      if (key >= 0) {
        const std::uint32_t w = s.words[find(s, key)];
        p = w == static_cast<std::uint32_t>(i) ? s.union_index[i] : -(s.union_index[w] + 2);
      }
      a.entry_position[(b + i / K) * a.entry_stride + i % K] = p;
    });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, size, U),
                         [&](const std::int32_t p) { a.union_logical[b * a.union_stride + p] = -1; });
    Kokkos::single(Kokkos::PerTeam(team), [&]() { a.union_state[b] = state; });
  }
};

// Team scratch of one union row (the group reserves it ahead of the step path).
inline std::size_t union_hisparse_scratch_bytes(std::int32_t union_width) {
  return hisparse_union::UnionScratch::bytes(union_width);
}

template <class Space>
void union_hisparse_requests(const Space& space, const HiSparseUnionArgs& a) {
  if (a.num_rows == 0) return;
  using policy_type = Kokkos::TeamPolicy<Space>;
  const std::size_t bytes = union_hisparse_scratch_bytes(a.union_width);
  const int level = bytes <= static_cast<std::size_t>(policy_type::scratch_size_max(0)) ? 0 : 1;
  policy_type policy(space, static_cast<int>(a.num_rows), row_team_size<Space>(hisparse_union::team_threads));
  policy.set_scratch_size(level, Kokkos::PerTeam(bytes));
  if (level == 0) {
    Kokkos::parallel_for("sparse_mla::union_hisparse_requests", policy, HiSparseUnion<Space, 0>{a});
  } else {
    Kokkos::parallel_for("sparse_mla::union_hisparse_requests", policy, HiSparseUnion<Space, 1>{a});
  }
}

template <class Space>
struct HiSparseUnionScatter {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  HiSparseUnionScatterArgs a;

  // The attention index of hot (or resident) row x, as the resolve writes it.
  KOKKOS_INLINE_FUNCTION std::int32_t attention_index(std::int32_t x) const {
    if (x < 0) return -1;
    return static_cast<std::int32_t>(static_cast<std::int64_t>(x / a.hot_block_size) * a.attention_block_stride +
                                     x % a.hot_block_size);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t b = team.league_rank();
    const std::int32_t K = a.top_k;
    const std::int32_t f = a.run_first[b];
    std::int32_t* hot = a.hot_indices + b * a.out_stride;
    std::int32_t* attention = a.attention_indices != nullptr ? a.attention_indices + b * a.attention_stride : nullptr;
    std::int32_t* miss = a.miss_mask != nullptr ? a.miss_mask + b * a.out_stride : nullptr;
    if (f < 0) {
      // Padding, or a row of a refused request: as the resolve's padding rows.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, K), [&](const std::int32_t j) {
        hot[j] = -1;
        if (attention != nullptr) attention[j] = -1;
        if (miss != nullptr) miss[j] = 0;
      });
      Kokkos::single(Kokkos::PerTeam(team), [&]() {
        if (a.valid_counts != nullptr) a.valid_counts[b] = 0;
        a.swap_counts[b] = 0;
      });
      return;
    }
    const std::int64_t u = f;
    const std::int32_t* position = a.entry_position + b * a.entry_stride;
    std::int32_t valid = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, K),
        [&](const std::int32_t j, std::int32_t& count) {
          const std::int32_t e = position[j];
          const std::int32_t p = e >= 0 ? e : -(e + 2);  // -1 stays -1
          const std::int32_t x = p >= 0 ? a.union_hot[u * a.union_stride + p] : -1;
          hot[j] = x;
          if (attention != nullptr) attention[j] = attention_index(x);
          if (miss != nullptr) miss[j] = e >= 0 ? a.union_miss[u * a.union_stride + p] : 0;
          count += x >= 0 ? 1 : 0;
        },
        valid);
    // Row r of the request holds the union's swap pairs r * K .. r * K + K - 1.
    const std::int32_t r = static_cast<std::int32_t>(b - u);
    std::int32_t count = a.union_swap_counts[u] - r * K;
    count = count < 0 ? 0 : (count > K ? K : count);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count), [&](const std::int32_t c) {
      a.swap_host_rows[b * a.out_stride + c] = a.union_swap_host_rows[u * a.union_stride + r * K + c];
      a.swap_device_rows[b * a.out_stride + c] = a.union_swap_device_rows[u * a.union_stride + r * K + c];
    });
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      if (a.valid_counts != nullptr) a.valid_counts[b] = valid;
      a.swap_counts[b] = count;
    });
  }
};

template <class Space>
void scatter_hisparse_union(const Space& space, const HiSparseUnionScatterArgs& a) {
  if (a.num_rows == 0) return;
  Kokkos::parallel_for("sparse_mla::scatter_hisparse_union",
                       Kokkos::TeamPolicy<Space>(space, static_cast<int>(a.num_rows),
                                                 row_team_size<Space>(hisparse_union::team_threads)),
                       HiSparseUnionScatter<Space>{a});
}

}  // namespace sparse_mla::kernels
