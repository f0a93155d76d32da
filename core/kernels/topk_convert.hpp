// Top-k conversion, logical token positions to physical KV-cache rows
// (SPEC section 2). One team per query token. On GPUs each thread converts
// units of four entries (one 16-byte load and store), one to four units in
// flight, and the team sums the valid count, so a row costs one read and one
// write of its indices and a single count store (no atomics on global
// memory, no zero-initialised counter).
//
// The row is a chain of memory latencies: its indices and its request id,
// then the request's block-table entries, then the stores and the count.
// Everything here keeps that chain short (docs/PERFORMANCE.md has the H200
// measurements behind each choice):
// - the first units' loads and the request id are issued before anything
//   waits on either (the compiler had made the index loads wait for req_id);
// - a unit's four table loads are issued before any is used (one round trip
//   for the four, not four);
// - a team thread is one GPU thread (vector length 1), so no Kokkos vector
//   loop or lane mask sits between the loads; the count is summed with warp
//   reductions where CUDA has them;
// - the kernel parameters that the first loads need come first, so that
//   they share the first lines of the constant cache.
//
// Two kernels: Convert takes any row; ConvertRounds takes rows that fill
// whole rounds of its team (production decode at K = 2048), with the team's
// shape fixed at compile time. convert_split() picks between them, and the
// team shape, by the token count (the table convert_shapes).
//
// Both also run the DCP filter-and-convert (SPEC section 2a), chosen at
// compile time (Dcp): positions become the rank's local positions (-1 for
// other ranks') before the table lookup, and with compaction a team scan of
// each round's counts places the valid entries in input order and the rest
// of the row is -1 (the scans: topk_dcp_scans.hpp). Convert scans each
// thread's counts (team_round_offsets) and stores its converted entries at
// their places; ConvertRounds' Compaction::gather gathers each lane group's
// owned positions first and converts them one a lane; its Compaction::stage
// places the row's local positions in team scratch first and then converts
// the compacted row (table loads for valid entries only, whole-unit stores).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

#include "components/compat.hpp"
#include "components/memory.hpp"
#include "components/team_reduction.hpp"
#include "components/warp.hpp"
#include "kernels.hpp"
#include "space_traits.hpp"
#include "topk_dcp_scans.hpp"

namespace sparse_mla::kernels {

// int32 arithmetic that wraps like the reference (Triton's int32), without
// the undefined behaviour of signed overflow.
KOKKOS_INLINE_FUNCTION std::int32_t wrap_mad(std::int32_t a, std::int32_t b, std::int32_t c) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(a) * static_cast<std::uint32_t>(b) +
                                   static_cast<std::uint32_t>(c));
}

namespace topk {

// A unit is what one load brings: four entries (Int4) when rows are 16-byte
// aligned and K % 4 == 0, else one.
KOKKOS_INLINE_FUNCTION constexpr int entries(const Int4*) { return 4; }
KOKKOS_INLINE_FUNCTION constexpr int entries(const std::int32_t*) { return 1; }

// The kernel's parameters, in the order the kernel reads them: a Kokkos
// kernel's parameters are its whole ParallelFor object (functor first), read
// through the constant cache, and a miss there stalls every warp. What the
// first loads need shares the first bytes.
template <class Split>
struct Params {
  // The row's indices and its request: the first loads.
  const std::int32_t* logical;
  const std::int32_t* req_id;
  const std::int32_t* block_table;  // never null: see params_of()
  std::int64_t logical_stride;
  std::int64_t block_table_stride;
  std::uint32_t limit;  // positions p with (uint32)p < limit have a block in the table
  Split split;
  std::int32_t num_topk;
  std::int32_t block_stride_rows;
  // Read once the loads are out.
  std::int32_t* physical;
  std::int64_t physical_stride;
  std::int32_t* valid_counts;               // or nullptr
  const std::int32_t* workspace_request;    // read only by the Workspace kernels
  const std::int32_t* workspace_starts;
};

// Position -> physical row through a request's block-table row, in two
// steps so that a unit issues all its table loads before it uses any.
// Branch-free on purpose: an invalid position loads entry 0 of the row (a
// valid address) and is masked to -1 after; with `valid ? load : -1` the
// compiler put each load in its own branch, one round trip per entry.
template <class Split>
struct TableMap {
  const std::int32_t* row;
  std::uint32_t limit;
  Split split;
  std::int32_t stride_rows;
  // Negative positions are huge as unsigned, so one compare checks both
  // ends: (uint32)p < limit <=> p >= 0 and p / block_size < blocks.
  KOKKOS_INLINE_FUNCTION std::int32_t inside(std::int32_t p) const { return static_cast<std::uint32_t>(p) < limit; }
  KOKKOS_INLINE_FUNCTION std::int32_t start(std::int32_t p) const { return row[split.block(p) & -inside(p)]; }
  // The same as start(), the load issued only for a position inside the
  // table (a predicated load; the compiler keeps fewer addresses live).
  KOKKOS_INLINE_FUNCTION std::int32_t start_inside(std::int32_t p) const {
    std::int32_t s = 0;
    if (inside(p)) s = row[split.block(p)];
    return s;
  }
  KOKKOS_INLINE_FUNCTION std::int32_t finish(std::int32_t p, std::int32_t start) const {
    return wrap_mad(start, stride_rows, split.offset(p)) | (inside(p) - 1);
  }
};

// A prefill-workspace token: its workspace start plus the position.
struct WorkspaceMap {
  std::int32_t first;
  KOKKOS_INLINE_FUNCTION std::int32_t start(std::int32_t) const { return 0; }
  KOKKOS_INLINE_FUNCTION std::int32_t finish(std::int32_t p, std::int32_t) const {
    return p < 0 ? -1 : wrap_mad(1, first, p);
  }
};

template <class Map>
KOKKOS_INLINE_FUNCTION std::int32_t map_unit(const Map& m, std::int32_t& v) {
  v = m.finish(v, m.start(v));
  return v != -1;
}
// A position's table entry, loaded branch-free (start()) or only for a
// position inside the table (Predicated: TableMap::start_inside()).
template <bool Predicated, class Map>
KOKKOS_INLINE_FUNCTION std::int32_t start_of(const Map& m, std::int32_t p) {
  if constexpr (Predicated) {
    return m.start_inside(p);
  } else {
    return m.start(p);
  }
}
// A unit's table entries (start_unit) and its rows from them (finish_unit,
// which returns the unit's valid entries), apart so that a thread can issue
// the loads of all its units before it uses any.
template <bool Predicated, class Map>
KOKKOS_INLINE_FUNCTION std::int32_t start_unit(const Map& m, std::int32_t v) {
  return start_of<Predicated>(m, v);
}
template <bool Predicated, class Map>
KOKKOS_INLINE_FUNCTION Int4 start_unit(const Map& m, const Int4& v) {
  return Int4{start_of<Predicated>(m, v.x), start_of<Predicated>(m, v.y), start_of<Predicated>(m, v.z),
              start_of<Predicated>(m, v.w)};
}
template <class Map>
KOKKOS_INLINE_FUNCTION std::int32_t finish_unit(const Map& m, std::int32_t& v, std::int32_t s) {
  v = m.finish(v, s);
  return v != -1;
}
// The entries of a unit that are not -1: their count, and which (bit e
// for entry e).
KOKKOS_INLINE_FUNCTION std::int32_t valid_entries(const Int4& v) {
  return (v.x != -1) + (v.y != -1) + (v.z != -1) + (v.w != -1);
}
KOKKOS_INLINE_FUNCTION std::uint32_t valid_mask(const Int4& v) {
  return static_cast<std::uint32_t>(v.x != -1) | static_cast<std::uint32_t>(v.y != -1) << 1 |
         static_cast<std::uint32_t>(v.z != -1) << 2 | static_cast<std::uint32_t>(v.w != -1) << 3;
}
template <class Map>
KOKKOS_INLINE_FUNCTION std::int32_t finish_unit(const Map& m, Int4& v, const Int4& s) {
  v = Int4{m.finish(v.x, s.x), m.finish(v.y, s.y), m.finish(v.z, s.z), m.finish(v.w, s.w)};
  return valid_entries(v);
}
template <bool Predicated = false, class Map>
KOKKOS_INLINE_FUNCTION std::int32_t map_unit(const Map& m, Int4& v) {
  return finish_unit(m, v, start_unit<Predicated>(m, v));
}

// A compacted round's units (Dcp::compact): localized, then every unit's
// table loads issued (predicated: a position outside the table, which is
// every other rank's, loads nothing), then the rows; count[u] is unit u's
// valid entries. `present` bounds the units of a partial round.
template <int N, class Unit, class Map, class Dcp, class Present>
KOKKOS_INLINE_FUNCTION void map_compact_units(const Map& m, const Dcp& dcp, Unit (&v)[N], std::int32_t (&count)[N],
                                              Present&& present) {
  Unit start[N] = {};
  for (int u = 0; u < N; ++u) {
    if (present(u)) dcp.localize(v[u]);
  }
  for (int u = 0; u < N; ++u) {
    if (present(u)) start[u] = start_unit<true>(m, v[u]);
  }
  for (int u = 0; u < N; ++u) count[u] = present(u) ? finish_unit(m, v[u], start[u]) : 0;
}

// The DCP policy of a launch. NoDcp: the plain conversion. Dcp<Compact>:
// rank `rank` of `size` owns position p when (p / interleave) % size ==
// rank; an owned position becomes its local position
// (p / (size * interleave)) * interleave + p % interleave, any other -1
// (which the table map turns into -1 like every negative position).
// Dcp<Compact, true> computes the same with masks and a shift, for splits
// whose size and interleave are powers of two (shifted()).
struct NoDcp {
  static constexpr bool filter = false;
  static constexpr bool compact = false;
  static constexpr bool shift_form = false;
  template <class Unit>
  KOKKOS_INLINE_FUNCTION void localize(Unit&) const {}
};
template <bool Compact, bool Shifts = false>
struct Dcp {
  static constexpr bool filter = true;
  static constexpr bool compact = Compact;
  static constexpr bool shift_form = Shifts;
  // Shifts = false, one division a position: with W = size * interleave,
  // p = cycle * W + r (r < W), and p is owned when r - rank * interleave is
  // in [0, interleave), its local position cycle * interleave + that.
  FastDivide by_width;  // of width
  std::uint32_t width;  // W, or 2^31 when larger (every position is then in cycle 0)
  std::uint32_t first;  // rank * interleave, the rank's first r
  std::uint32_t span;   // interleave, or 0 when first is past every position
  std::uint32_t interleave;
  // Shifts = true (only where shifts() holds; the fields are meaningless
  // otherwise): p's bits are those of cycle, rank and offset (log2 size and
  // log2 interleave bits), so p is owned when its rank bits (owner_mask) are
  // `rank` (owner_bits), and its local position is p without its rank bits.
  std::uint32_t owner_mask;  // (size - 1) << log2(interleave)
  std::uint32_t owner_bits;  // rank << log2(interleave)
  std::uint32_t low_mask;    // interleave - 1
  std::uint32_t size_shift;  // log2(size)
  static Dcp of(std::int32_t size, std::int32_t rank, std::int32_t interleave) {
    constexpr std::int64_t positions = std::int64_t{1} << 31;
    const std::int64_t w = std::int64_t{size} * interleave, f = std::int64_t{rank} * interleave;
    const std::int64_t width = w < positions ? w : positions;
    const std::uint32_t size_shift = static_cast<std::uint32_t>(exact_log2(size) >= 0 ? exact_log2(size) : 0);
    const std::uint32_t low_mask = static_cast<std::uint32_t>(interleave - 1);
    return Dcp{FastDivide::of(width),
               static_cast<std::uint32_t>(width),
               static_cast<std::uint32_t>(f < positions ? f : 0),
               f < positions ? static_cast<std::uint32_t>(interleave) : 0u,
               static_cast<std::uint32_t>(interleave),
               w < positions ? static_cast<std::uint32_t>(w - interleave) : 0u,
               f < positions ? static_cast<std::uint32_t>(f) : 0u,
               low_mask,
               size_shift};
  }
  // Whether the masks compute this split's ownership: size and interleave
  // powers of two, size x interleave below 2^31.
  bool shifts() const {
    const bool pow2 = (width & (width - 1)) == 0 && (interleave & (interleave - 1)) == 0;
    return pow2 && width < (std::uint32_t{1} << 31);
  }
  Dcp<Compact, true> shifted() const {
    return Dcp<Compact, true>{by_width, width, first, span, interleave, owner_mask, owner_bits, low_mask, size_shift};
  }
  // Whether the rank owns p, and p's local position or -1. A negative p
  // wraps to a huge unsigned value whose quotient is meaningless but
  // defined; p >= 0 masks it.
  KOKKOS_INLINE_FUNCTION bool owns(std::int32_t p) const {
    const auto u = static_cast<std::uint32_t>(p);
    if constexpr (Shifts) {
      return p >= 0 && ((u ^ owner_bits) & owner_mask) == 0;
    } else {
      return p >= 0 && u - by_width.div(u) * width - first < span;
    }
  }
  KOKKOS_INLINE_FUNCTION std::int32_t local(std::int32_t p) const {
    const auto u = static_cast<std::uint32_t>(p);
    if constexpr (Shifts) {
      return owns(p) ? static_cast<std::int32_t>(((u >> size_shift) & ~low_mask) | (u & low_mask)) : -1;
    } else {
      // owns() with the quotient kept for the local position.
      const std::uint32_t c = by_width.div(u);
      const std::uint32_t t = u - c * width - first;
      const bool owned = p >= 0 && t < span;
      return owned ? static_cast<std::int32_t>(c * interleave + t) : -1;
    }
  }
  // The unit's entries the rank owns: bit e for entry e.
  KOKKOS_INLINE_FUNCTION std::uint32_t owned_mask(const Int4& v) const {
    return static_cast<std::uint32_t>(owns(v.x)) | static_cast<std::uint32_t>(owns(v.y)) << 1 |
           static_cast<std::uint32_t>(owns(v.z)) << 2 | static_cast<std::uint32_t>(owns(v.w)) << 3;
  }
  KOKKOS_INLINE_FUNCTION void localize(std::int32_t& v) const { v = local(v); }
  KOKKOS_INLINE_FUNCTION void localize(Int4& v) const { v = Int4{local(v.x), local(v.y), local(v.z), local(v.w)}; }
};

// Stores the entries of a unit that are not -1 at out[at], out[at + 1], ...
// in order (a compacted row); store_valid_through() the same ending at
// out[end - 1].
KOKKOS_INLINE_FUNCTION void store_valid(std::int32_t* out, std::int32_t at, std::int32_t v) {
  if (v != -1) out[at] = v;
}
KOKKOS_INLINE_FUNCTION void store_valid(std::int32_t* out, std::int32_t at, const Int4& v) {
  if (v.x != -1) out[at++] = v.x;
  if (v.y != -1) out[at++] = v.y;
  if (v.z != -1) out[at++] = v.z;
  if (v.w != -1) out[at] = v.w;
}
KOKKOS_INLINE_FUNCTION void store_valid_through(std::int32_t* out, std::int32_t end, const Int4& v) {
  std::int32_t* at = out + end;
  if (v.w != -1) *--at = v.w;
  if (v.z != -1) *--at = v.z;
  if (v.y != -1) *--at = v.y;
  if (v.x != -1) *--at = v.x;
}

// A unit's positions outside the table become -1 (those left are the
// unit's valid entries: validity needs no table load).
template <class Split>
KOKKOS_INLINE_FUNCTION void keep_inside(const TableMap<Split>& m, Int4& v) {
  const std::int32_t x = m.inside(v.x), y = m.inside(v.y), z = m.inside(v.z), w = m.inside(v.w);
  v = Int4{x ? v.x : -1, y ? v.y : -1, z ? v.z : -1, w ? v.w : -1};
}

// Unit q of a staged row of `valid` entries, -1 from `valid` on (entries
// past `valid` are not read: nothing wrote them).
KOKKOS_INLINE_FUNCTION Int4 staged_unit(const std::int32_t* staged, std::int32_t q, std::int32_t valid) {
  const std::int32_t left = valid - 4 * q;
  if (left >= 4) return reinterpret_cast<const Int4*>(staged)[q];
  Int4 v{-1, -1, -1, -1};
  if (left > 0) v.x = staged[4 * q];
  if (left > 1) v.y = staged[4 * q + 1];
  if (left > 2) v.z = staged[4 * q + 2];
  return v;
}

// The largest K whose compacted rows ConvertRounds stages in team scratch
// (Compaction::stage: 32 KiB a team).
inline constexpr std::int64_t max_staged_topk = 8192;

// A compacted row's tail: entries [valid, count) of `out` become -1, as
// 16-byte stores from the first multiple of four on when the row's units are
// (Unit = Int4: the row is 16-byte aligned and count % 4 == 0).
template <class Unit, class Member>
KOKKOS_INLINE_FUNCTION void fill_tail(const Member& team, std::int32_t* out, std::int32_t valid, std::int32_t count) {
  const std::int32_t threads = team.team_size(), rank = team.team_rank();
  if constexpr (std::is_same<Unit, Int4>::value) {
    const std::int32_t aligned = (valid + 3) & ~3;
    for (std::int32_t i = valid + rank; i < aligned && i < count; i += threads) out[i] = -1;
    Int4* units = reinterpret_cast<Int4*>(out);
    for (std::int32_t q = aligned / 4 + rank; q < count / 4; q += threads) units[q] = Int4{-1, -1, -1, -1};
  } else {
    for (std::int32_t i = valid + rank; i < count; i += threads) out[i] = -1;
  }
}

template <class Space, class Split, class Unit, int UnitsInFlight, bool Workspace, class Dcp = NoDcp>
struct Convert {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  Params<Split> p;
  Dcp dcp;

  // Thread `rank` of `threads` converts units rank, rank + threads, ... of
  // the row, UnitsInFlight at a time; v holds the first round, loaded. The
  // first round is not in the loop: a loop from the start made the compiler
  // compute its trip count (a 32-bit division, forty instructions) before the
  // first loads.
  template <class Map>
  KOKKOS_INLINE_FUNCTION std::int32_t convert_row(const Map& m, const Unit* in, Unit* out, Unit (&v)[UnitsInFlight],
                                                  std::int32_t rank, std::int32_t threads, std::int32_t units) const {
    std::int32_t valid = convert_round(m, out, v, rank, threads, units);
    const std::int32_t step = UnitsInFlight * threads;
    SPARSE_MLA_NO_UNROLL
    for (std::int32_t q = rank + step; q < units; q += step) {  // rows longer than a round; the stores may alias the inputs
      load(in, v, q, threads, units);
      valid += convert_round(m, out, v, q, threads, units);
    }
    return valid;
  }

  template <class Map>
  KOKKOS_INLINE_FUNCTION std::int32_t convert_round(const Map& m, Unit* out, Unit (&v)[UnitsInFlight], std::int32_t q,
                                                    std::int32_t threads, std::int32_t units) const {
    std::int32_t valid = 0;
    for (int u = 0; u < UnitsInFlight; ++u) {
      if (q + u * threads < units) {
        dcp.localize(v[u]);
        valid += map_unit(m, v[u]);
      }
    }
    for (int u = 0; u < UnitsInFlight; ++u) {
      if (q + u * threads < units) out[q + u * threads] = v[u];
    }
    return valid;
  }

  // The compacted row (Dcp::compact): every round is taken by the whole team
  // (team_round_offsets has a barrier), and in it thread `rank` takes the
  // consecutive units first + rank * UnitsInFlight, ..., so that one offset
  // per thread places its units' valid entries, in input order, after those
  // of the threads before it (its stores are then contiguous too). Returns
  // the row's valid count, on every thread.
  template <class Map>
  KOKKOS_INLINE_FUNCTION std::int32_t compact_row(const member_type& team, const Map& m, const Unit* in, std::int32_t* out,
                                                  std::int32_t rank, std::int32_t threads, std::int32_t units,
                                                  std::int32_t* scratch) const {
    constexpr int unit_entries = entries(static_cast<const Unit*>(nullptr));
    std::int32_t base = 0;
    int parity = 0;
    const std::int32_t step = UnitsInFlight * threads;
    for (std::int32_t first = 0; first < units; first += step) {
      const std::int32_t q = first + rank * UnitsInFlight;
      Unit v[UnitsInFlight];
      for (int u = 0; u < UnitsInFlight; ++u) {
        if (q + u < units) v[u] = in[q + u];
      }
      std::int32_t count[UnitsInFlight];
      map_compact_units(m, dcp, v, count, [&](int u) { return q + u < units; });
      std::int32_t mine[1] = {0}, before[1];
      for (int u = 0; u < UnitsInFlight; ++u) mine[0] += count[u];
      std::int32_t total = 0;
      device::team_round_offsets<1, unit_entries * UnitsInFlight>(team, threads, mine, before, total, scratch, parity);
      std::int32_t at = base + before[0];
      for (int u = 0; u < UnitsInFlight; ++u) {
        if (q + u < units) store_valid(out, at, v[u]);
        at += count[u];
      }
      base += total;
    }
    return base;
  }

  KOKKOS_INLINE_FUNCTION static void load(const Unit* in, Unit (&v)[UnitsInFlight], std::int32_t q, std::int32_t threads,
                                          std::int32_t units) {
    for (int u = 0; u < UnitsInFlight; ++u) {
      if (q + u * threads < units) v[u] = in[q + u * threads];
    }
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t t = team.league_rank();
    const std::int32_t rank = team.team_rank();
    const std::int32_t threads = team.team_size();
    const std::int32_t units = p.num_topk / entries(static_cast<const Unit*>(nullptr));
    auto* partial = static_cast<std::int32_t*>(team.team_scratch(0).get_shmem(
        sizeof(std::int32_t) * (Dcp::compact ? device::team_round_ints(1) : device::team_sum_ints(threads))));

    // The first round's indices and the request id go out together.
    const Unit* in = reinterpret_cast<const Unit*>(p.logical + t * p.logical_stride);
    if constexpr (Dcp::compact) {
      const std::int32_t req = p.req_id[t];
      const TableMap<Split> m{p.block_table + req * p.block_table_stride, p.limit, p.split, p.block_stride_rows};
      std::int32_t* row = p.physical + t * p.physical_stride;
      const std::int32_t valid = compact_row(team, m, in, row, rank, threads, units, partial);
      fill_tail<Unit>(team, row, valid, p.num_topk);
      if (rank == 0) p.valid_counts[t] = valid;
      return;
    }
    Unit v[UnitsInFlight];
    load(in, v, rank, threads, units);
    const std::int32_t req = p.req_id[t];
    const std::int32_t workspace = Workspace ? p.workspace_request[t] : -1;
    if (p.valid_counts != nullptr) device::begin_team_sum(team, threads, partial);

    Unit* out = reinterpret_cast<Unit*>(p.physical + t * p.physical_stride);
    std::int32_t valid = 0;
    if (Workspace && workspace >= 0) {
      valid = convert_row(WorkspaceMap{p.workspace_starts[workspace]}, in, out, v, rank, threads, units);
    } else {
      const TableMap<Split> m{p.block_table + req * p.block_table_stride, p.limit, p.split, p.block_stride_rows};
      valid = convert_row(m, in, out, v, rank, threads, units);
    }
    if (p.valid_counts == nullptr) return;
    const std::int32_t sum = device::team_sum(team, threads, valid, partial);
    if (rank == 0) p.valid_counts[t] = sum;
  }
};

// Row offsets as one 32 x 32 -> 64-bit multiply (strides that fit in 32
// bits), not the four instructions of a 64 x 64 one.
KOKKOS_INLINE_FUNCTION std::uint64_t wide_mul(std::uint32_t a, std::uint32_t b) { return std::uint64_t{a} * b; }

// The whole-rounds kernel's parameters: Params with 32-bit strides, and the
// rounds a row takes in place of K.
template <class Split>
struct RoundParams {
  const std::int32_t* logical;
  const std::int32_t* req_id;
  const std::int32_t* block_table;
  std::uint32_t logical_stride;
  std::uint32_t block_table_stride;
  std::uint32_t limit;
  Split split;
  std::int32_t block_stride_rows;
  std::int32_t rounds;
  std::int32_t* physical;
  std::uint32_t physical_stride;
  std::int32_t* valid_counts;  // or nullptr
};

// The team sum's or scan's partials of a team of Threads: none for a team of
// one (host spaces), else device::team_ints (a constant address on GPUs),
// followed there by `Extra` ints for the kernel (device::team_ints is taken
// once a kernel).
template <int Threads, int ScanUnits, int Extra = 0, class Member>
KOKKOS_INLINE_FUNCTION std::int32_t* round_partials(const Member& team) {
  constexpr std::size_t ints = ScanUnits > 0 ? device::team_round_ints(ScanUnits) : device::team_sum_ints(Threads);
  if constexpr (Threads > 1) {
    return device::team_ints<static_cast<int>(ints) + Extra>(team);
  } else {
    (void)team;
    return nullptr;
  }
}

// How ConvertRounds compacts a row (Dcp::compact), chosen by the launch.
enum class Compaction {
  // Each lane group gathers a round's owned positions (ownership needs no
  // table load) in input order in team scratch first; then its lanes take
  // them in turn, so that a lane converts one position where it held four
  // (one table load a lane and turn, not four predicated ones a thread),
  // the group ballots which stayed valid, and after the round's barrier its
  // valid entries leave at consecutive places and the units past the row's
  // valid entries as -1 (in a row of one round, every element is stored
  // once; a later round's valid entries land over some of an earlier
  // round's -1). Rows of few tokens.
  gather,
  // The row's valid local positions (owned, inside the table: validity
  // needs no table load) are staged in team scratch first; then only the
  // threads whose units of the compacted row hold them load table entries,
  // and every store is a whole 16-byte unit: the fewest instructions, for
  // rows of many tokens. Rows of K <= max_staged_topk.
  stage,
};

// Rows of whole rounds: each thread of a team of Threads converts
// UnitsInFlight 16-byte units a round, every round full, strides below 2^32,
// no prefill workspace: production decode at a few tokens (K = 2048 is one
// round of 512 threads x 1 unit), and host spaces. It has the layout of the
// reference engine's Triton kernel, which is compiled for its K: what
// Convert decides at run time is a constant here (docs/PERFORMANCE.md has
// what each part was worth on the H200):
// - a thread's units sit at fixed offsets and need no bounds checks;
// - row offsets are single 32 x 32 -> 64-bit multiplies;
// - the team sum's partials are at a constant address (round_partials());
// - a table load is issued only for a position inside the table (but for
//   Compaction::gather's turns, whose lanes hold owned positions only).
template <class Space, class Split, int Threads, int UnitsInFlight, class Dcp = NoDcp,
          Compaction How = Compaction::gather>
struct ConvertRounds {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  RoundParams<Split> p;
  Dcp dcp;

  // Compaction::stage's team scratch for `rounds` rounds: the staged row (K
  // ints) and a flag after it.
  KOKKOS_INLINE_FUNCTION static constexpr std::int64_t staged_ints(std::int64_t rounds) {
    return rounds * UnitsInFlight * Threads * 4 + 4;
  }

  // A unit's four table loads are predicated (map_unit<true>): the compiler
  // keeps fewer addresses live than with Convert's branch-free loads of
  // entry 0. Convert keeps the branch-free loads for rows it does not
  // compact, with which it measured better (H200, docs/PERFORMANCE.md);
  // compacted rows take predicated loads in both kernels
  // (map_compact_units, convert_staged_round), which skip other ranks'
  // positions. Compaction::gather's turns load branch-free (a lane past its
  // group's owned positions loads entry 0): other ranks' positions never
  // reach them.
  KOKKOS_INLINE_FUNCTION std::int32_t convert_round(const TableMap<Split>& m, Int4 (&v)[UnitsInFlight], Int4* out) const {
    std::int32_t valid = 0;
    for (int u = 0; u < UnitsInFlight; ++u) {
      dcp.localize(v[u]);
      valid += map_unit<true>(m, v[u]);
    }
    for (int u = 0; u < UnitsInFlight; ++u) out[u * Threads] = v[u];
    return valid;
  }

  // After round r's barrier: the entries of the units thread `rank` loaded
  // in round r that are past the rounds' valid entries (from `end` on)
  // become -1. Later rounds' valid entries land over some of them after
  // their own barriers.
  KOKKOS_INLINE_FUNCTION static void minus_one_from(std::int32_t* row, std::int32_t end, std::int32_t rank,
                                                    std::int32_t r) {
    for (int u = 0; u < UnitsInFlight; ++u) {
      const std::int32_t q = (r * UnitsInFlight + u) * Threads + rank;
      if (4 * q >= end) {
        reinterpret_cast<Int4*>(row)[q] = Int4{-1, -1, -1, -1};
      } else {
        for (int e = 1; e < 4; ++e) {
          if (4 * q + e >= end) row[4 * q + e] = -1;
        }
      }
    }
  }

  // Compaction::gather, a round: its valid entries after the `base` of the
  // rounds before, in input order; returns the round's count. `gathered`
  // holds the lane group's owned positions, unit by unit (4 x group_lanes
  // ints a unit: team scratch, or a lane's own array where groups are one
  // lane). In turn i lane l takes the group's owned position i x lanes + l
  // (what it reads past the owned ones is not used: every slot is inside
  // the group's part). Turn 0 always runs, branch-free; the other three
  // only where the group owns more than one turn's positions.
  KOKKOS_INLINE_FUNCTION std::int32_t gather_round(const member_type& team, const TableMap<Split>& m,
                                                   const Int4 (&v)[UnitsInFlight], std::int32_t* row, std::int32_t base,
                                                   std::int32_t r, std::int32_t* gathered, std::int32_t* scratch,
                                                   int& parity) const {
    constexpr int lanes = device::group_lanes, turns = 4;
    const std::int32_t lane = team.team_rank() & (lanes - 1);
    const device::LaneMask below = device::lanes_below(lane), upto = below | device::LaneMask{1} << lane;
    std::int32_t owned[UnitsInFlight];
    for (int u = 0; u < UnitsInFlight; ++u) {
      const std::uint32_t mask = dcp.owned_mask(v[u]);
      const std::int32_t through = device::group_entries_through(mask, upto);
      std::int32_t* at = gathered + u * turns * lanes + through;
      if (mask & 8u) *--at = v[u].w;
      if (mask & 4u) *--at = v[u].z;
      if (mask & 2u) *--at = v[u].y;
      if (mask & 1u) *--at = v[u].x;
      owned[u] = device::shuffle(through, lanes - 1);
    }
    device::group_sync();
    std::int32_t entry[UnitsInFlight][turns], start[UnitsInFlight][turns];
    const auto take = [&](int u, int i) {
      const std::int32_t j = i * lanes + lane;
      const std::int32_t position = gathered[u * turns * lanes + j];
      entry[u][i] = dcp.local(j < owned[u] ? position : -1);
      start[u][i] = m.start(entry[u][i]);
    };
    for (int u = 0; u < UnitsInFlight; ++u) {
      for (int i = 1; i < turns; ++i) entry[u][i] = -1;
      take(u, 0);
      if (owned[u] > lanes) {
        for (int i = 1; i < turns; ++i) take(u, i);
      }
    }
    std::int32_t kept[UnitsInFlight] = {}, place[UnitsInFlight][turns] = {};
    const auto keep = [&](int u, int i) {
      entry[u][i] = m.finish(entry[u][i], start[u][i]);
      const device::LaneMask valid = device::ballot(entry[u][i] != -1);
      place[u][i] = kept[u] + device::popc(valid & below);
      kept[u] += device::popc(valid);
    };
    for (int u = 0; u < UnitsInFlight; ++u) {
      keep(u, 0);
      if (owned[u] > lanes) {
        for (int i = 1; i < turns; ++i) keep(u, i);
      }
    }
    std::int32_t before[UnitsInFlight];
    std::int32_t total = 0;
    device::team_group_offsets(team, Threads, kept, before, total, scratch, parity);
    for (int u = 0; u < UnitsInFlight; ++u) {
      for (int i = 0; i < turns; ++i) {
        if (entry[u][i] != -1) row[base + before[u] + place[u][i]] = entry[u][i];
      }
    }
    minus_one_from(row, base + total, team.team_rank(), r);
    return total;
  }

  // Compaction::stage takes two phases, so that a table load is
  // issued only for a valid entry, by the threads whose units hold it, and
  // every store is a whole 16-byte unit (the -1 tail included):
  // - stage_round(): a round's valid local positions (owned, inside the
  //   table) go, in input order, after those of the rounds before, into
  //   `staged` (team scratch, the row's K ints);
  // - after a barrier, convert_staged_round(): a thread converts its own
  //   units of the staged row, -1 from the row's valid count on, and stores
  //   them in the row and, those holding staged entries, back in `staged`.
  // Every round's loads precede every store (rows converted in place). A
  // table entry can still turn a staged position into -1 (its row plus the
  // offset wraps to -1, which SPEC section 2a does not count): the threads
  // that see one raise a flag, and after a barrier the team compacts the
  // converted row again (recompact()).
  KOKKOS_INLINE_FUNCTION std::int32_t stage_round(const member_type& team, const TableMap<Split>& m,
                                                  Int4 (&v)[UnitsInFlight], std::int32_t* staged, std::int32_t base,
                                                  std::int32_t* scratch, int& parity) const {
    std::int32_t through[UnitsInFlight];
    std::uint32_t valid[UnitsInFlight];
    for (int u = 0; u < UnitsInFlight; ++u) {
      dcp.localize(v[u]);
      keep_inside(m, v[u]);
      valid[u] = valid_mask(v[u]);
    }
    std::int32_t total = 0;
    device::team_entry_offsets(team, Threads, valid, through, total, scratch, parity);
    for (int u = 0; u < UnitsInFlight; ++u) store_valid_through(staged, base + through[u], v[u]);
    return total;
  }

  // Round r's units of thread `rank` in a staged row of `valid` entries:
  // staged positions to rows (predicated table loads; a unit past `valid`
  // loads nothing and becomes -1), stored at the same units of `out` and,
  // those holding staged entries, of `staged`. Returns whether a staged
  // position became -1.
  KOKKOS_INLINE_FUNCTION static bool convert_staged_round(const TableMap<Split>& m, std::int32_t* staged, Int4* out,
                                                          std::int32_t rank, std::int32_t r, std::int32_t valid) {
    Int4 v[UnitsInFlight], start[UnitsInFlight] = {};
    for (int u = 0; u < UnitsInFlight; ++u) {
      const std::int32_t q = (r * UnitsInFlight + u) * Threads + rank;
      if (4 * q < valid) {
        v[u] = staged_unit(staged, q, valid);
        start[u] = start_unit<true>(m, v[u]);
      }
    }
    bool lost = false;
    for (int u = 0; u < UnitsInFlight; ++u) {
      const std::int32_t q = (r * UnitsInFlight + u) * Threads + rank;
      const std::int32_t left = valid - 4 * q;
      if (left > 0) {
        const std::int32_t kept = finish_unit(m, v[u], start[u]);
        out[q] = v[u];
        reinterpret_cast<Int4*>(staged)[q] = v[u];
        lost |= kept < (left < 4 ? left : 4);
      } else {
        out[q] = Int4{-1, -1, -1, -1};
      }
    }
    return lost;
  }

  // The row again from its converted entries (`converted`, the first `valid`
  // in input order), the -1 among them left out, as the rounds compact
  // theirs; entries [kept, valid) of `row` become -1. Returns `kept`.
  KOKKOS_INLINE_FUNCTION std::int32_t recompact(const member_type& team, const std::int32_t* converted, std::int32_t* row,
                                                std::int32_t rank, std::int32_t valid, std::int32_t* scratch,
                                                int& parity) const {
    std::int32_t kept = 0;
    for (std::int32_t r = 0; r < p.rounds; ++r) {
      Int4 v[UnitsInFlight];
      std::int32_t through[UnitsInFlight];
      std::uint32_t mask[UnitsInFlight];
      for (int u = 0; u < UnitsInFlight; ++u) {
        v[u] = staged_unit(converted, (r * UnitsInFlight + u) * Threads + rank, valid);
        mask[u] = valid_mask(v[u]);
      }
      std::int32_t total = 0;
      device::team_entry_offsets(team, Threads, mask, through, total, scratch, parity);
      for (int u = 0; u < UnitsInFlight; ++u) store_valid_through(row, kept + through[u], v[u]);
      kept += total;
    }
    for (std::int32_t i = kept + rank; i < valid; i += Threads) row[i] = -1;
    return kept;
  }

  KOKKOS_INLINE_FUNCTION static void load(const Int4* in, Int4 (&v)[UnitsInFlight]) {
    for (int u = 0; u < UnitsInFlight; ++u) v[u] = in[u * Threads];
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const auto t = static_cast<std::uint32_t>(team.league_rank());
    const std::int32_t rank = team.team_rank();
    // The first round's indices and the request id go out together.
    const Int4* in = reinterpret_cast<const Int4*>(p.logical + wide_mul(t, p.logical_stride)) + rank;
    Int4 v[UnitsInFlight];
    load(in, v);
    const std::int32_t req = p.req_id[t];
    // Compaction::gather's positions follow the scan's partials in team
    // scratch on GPUs (gather_round()).
    constexpr int gathered_ints = Dcp::compact && How == Compaction::gather && device::form != device::Form::portable
                                      ? Threads * UnitsInFlight * 4
                                      : 0;
    std::int32_t* partial = round_partials<Threads, Dcp::compact ? UnitsInFlight : 0, gathered_ints>(team);
    if (!Dcp::compact && p.valid_counts != nullptr) device::begin_team_sum(team, Threads, partial);

    // req_id names a row of the table (SPEC), so it is not negative.
    const TableMap<Split> m{p.block_table + wide_mul(static_cast<std::uint32_t>(req), p.block_table_stride), p.limit,
                            p.split, p.block_stride_rows};
    if constexpr (Dcp::compact && How == Compaction::gather) {
      std::int32_t* row = p.physical + wide_mul(t, p.physical_stride);
      std::int32_t lane_gathered[gathered_ints == 0 ? 4 * UnitsInFlight : 1] = {};
      constexpr int group_ints = UnitsInFlight * 4 * device::group_lanes;
      std::int32_t* gathered = gathered_ints == 0 ? lane_gathered
                                                  : partial + device::team_round_ints(UnitsInFlight) +
                                                        rank / device::group_lanes * group_ints;
      int parity = 0;
      std::int32_t valid = gather_round(team, m, v, row, 0, 0, gathered, partial, parity);
      for (std::int32_t r = 1; r < p.rounds; ++r) {
        in += UnitsInFlight * Threads;
        load(in, v);
        valid += gather_round(team, m, v, row, valid, r, gathered, partial, parity);
      }
      if (rank == 0) p.valid_counts[t] = valid;
      return;
    } else if constexpr (Dcp::compact) {
      auto* staged = static_cast<std::int32_t*>(
          team.team_scratch(0).get_shmem_aligned(sizeof(std::int32_t) * staged_ints(p.rounds), 16));
      std::int32_t* lost = staged + staged_ints(p.rounds) - 4;
      if (rank == 0) *lost = 0;  // ordered before the flag's stores by the rounds' barriers
      int parity = 0;
      std::int32_t valid = stage_round(team, m, v, staged, 0, partial, parity);
      for (std::int32_t r = 1; r < p.rounds; ++r) {
        in += UnitsInFlight * Threads;
        load(in, v);
        valid += stage_round(team, m, v, staged, valid, partial, parity);
      }
      team.team_barrier();
      std::int32_t* row = p.physical + wide_mul(t, p.physical_stride);
      bool lost_here = false;
      for (std::int32_t r = 0; r < p.rounds; ++r) {
        lost_here |= convert_staged_round(m, staged, reinterpret_cast<Int4*>(row), rank, r, valid);
      }
      if (lost_here) *lost = 1;
      team.team_barrier();
      if (*lost != 0) valid = recompact(team, staged, row, rank, valid, partial, parity);
      if (rank == 0) p.valid_counts[t] = valid;
      return;
    }
    Int4* out = reinterpret_cast<Int4*>(p.physical + wide_mul(t, p.physical_stride)) + rank;
    std::int32_t valid = convert_round(m, v, out);
    SPARSE_MLA_NO_UNROLL
    for (std::int32_t r = 1; r < p.rounds; ++r) {  // the stores may alias the inputs: the next loads follow them
      in += UnitsInFlight * Threads;
      out += UnitsInFlight * Threads;
      load(in, v);
      valid += convert_round(m, v, out);
    }
    if (p.valid_counts == nullptr) return;
    const std::int32_t sum = device::team_sum(team, Threads, valid, partial);
    if (rank == 0) p.valid_counts[t] = sum;
  }
};

template <class Space, class Unit, int UnitsInFlight, class Split, class Dcp>
void launch(const Space& space, const Params<Split>& p, const Dcp& dcp, std::int64_t rows, int threads) {
  Kokkos::TeamPolicy<Space> policy(space, static_cast<int>(rows), threads);
  policy.set_scratch_size(0, Kokkos::PerTeam(sizeof(std::int32_t) * (Dcp::compact ? device::team_round_ints(1) : device::team_sum_ints(threads))));
  if constexpr (Dcp::filter) {  // no prefill workspace with DCP (checked by the operation)
    Kokkos::parallel_for("sparse_mla::convert_topk_dcp", policy, Convert<Space, Split, Unit, UnitsInFlight, false, Dcp>{p, dcp});
  } else if (p.workspace_request != nullptr) {
    Kokkos::parallel_for("sparse_mla::convert_topk", policy, Convert<Space, Split, Unit, UnitsInFlight, true>{p, dcp});
  } else {
    Kokkos::parallel_for("sparse_mla::convert_topk", policy, Convert<Space, Split, Unit, UnitsInFlight, false>{p, dcp});
  }
}

// Launches the whole-rounds kernel and returns true when `p`'s rows are
// whole rounds of Threads x UnitsInFlight units (`units` a row), its strides
// fit in 32 bits and, for Compaction::stage, K is at most max_staged_topk;
// else launches nothing and returns false.
template <class Space, int Threads, int UnitsInFlight, Compaction How = Compaction::gather, class Split, class Dcp>
bool launch_rounds(const Space& space, const Params<Split>& p, const Dcp& dcp, std::int64_t rows, std::int64_t units) {
  constexpr std::int64_t per_round = std::int64_t{Threads} * UnitsInFlight;
  const auto fits = [](std::int64_t stride) { return stride >= 0 && stride <= std::int64_t{0xFFFFFFFF}; };
  if (p.workspace_request != nullptr || units % per_round != 0 || !fits(p.logical_stride) ||
      !fits(p.physical_stride) || !fits(p.block_table_stride) ||
      (Dcp::compact && How == Compaction::stage && 4 * units > max_staged_topk)) {
    return false;
  }
  const RoundParams<Split> r{p.logical,
                             p.req_id,
                             p.block_table,
                             static_cast<std::uint32_t>(p.logical_stride),
                             static_cast<std::uint32_t>(p.block_table_stride),
                             p.limit,
                             p.split,
                             p.block_stride_rows,
                             static_cast<std::int32_t>(units / per_round),
                             p.physical,
                             static_cast<std::uint32_t>(p.physical_stride),
                             p.valid_counts};
  static_assert(Threads == 1 || !is_host_space<Space>, "host spaces run teams of one (round_partials)");
  using Kernel = ConvertRounds<Space, Split, Threads, UnitsInFlight, Dcp, How>;
  // Compaction::stage serves rows of many tokens: on sm_90 (2048 threads an
  // SM) the bound keeps 32 registers a thread at 256, so that register use
  // does not keep an SM below 8 teams (docs/PERFORMANCE.md); shared memory
  // still does for K above about 6,900 (8 staged rows of 4K bytes then
  // exceed an SM's 227 KiB). Compaction::gather takes the same bound (four
  // teams of 512 an SM, every row below 512 tokens in one wave), except
  // with the division form of ownership, which spills at 32 registers: it
  // keeps three quarters of the teams.
  constexpr unsigned teams = 2048 / Threads;
  constexpr unsigned min_teams = How == Compaction::gather && !Dcp::shift_form ? teams * 3 / 4 : teams;
  using Policy = std::conditional_t<Dcp::compact,
                                    Kokkos::TeamPolicy<Space, MeasuredLaunchBounds<Space, Threads, min_teams>>,
                                    Kokkos::TeamPolicy<Space>>;
  Policy policy(space, static_cast<int>(rows), Threads);
  std::size_t scratch = 0;
  if (!device::static_team_ints && Threads > 1) {  // round_partials() takes team scratch
    constexpr std::size_t ints = Dcp::compact ? device::team_round_ints(UnitsInFlight) : device::team_sum_ints(Threads);
    scratch += sizeof(std::int32_t) * ints;
  }
  if (Dcp::compact && How == Compaction::stage) {  // the staged row and its flag, 16-byte aligned
    scratch += sizeof(std::int32_t) * static_cast<std::size_t>(Kernel::staged_ints(r.rounds)) + 16;
  }
  if (scratch > 0) policy.set_scratch_size(0, Kokkos::PerTeam(scratch));
  Kokkos::parallel_for(Dcp::filter ? "sparse_mla::convert_topk_dcp_rounds" : "sparse_mla::convert_topk_rounds", policy,
                       Kernel{r, dcp});
  return true;
}

// launch_rounds with the shift form of a compacted split's ownership where
// it computes it (Dcp::shifts()), which saves instructions on every entry.
template <class Space, int Threads, int UnitsInFlight, Compaction How = Compaction::gather, class Split, class Dcp>
bool launch_shifted_rounds(const Space& space, const Params<Split>& p, const Dcp& dcp, std::int64_t rows,
                           std::int64_t units) {
  if constexpr (Dcp::compact) {
    if (dcp.shifts()) return launch_rounds<Space, Threads, UnitsInFlight, How>(space, p, dcp.shifted(), rows, units);
  }
  return launch_rounds<Space, Threads, UnitsInFlight, How>(space, p, dcp, rows, units);
}

// The kernel's parameters for `a`. A table without blocks has nothing valid
// (limit 0); its masked loads read entry 0 of a row, so every row points at
// a readable int32 (the first index) rather than at a zero-width table.
template <class Split>
Params<Split> params_of(const TopkConvertArgs& a, Split split) {
  const bool no_blocks = a.blocks_per_request <= 0;
  const std::int64_t positions = static_cast<std::int64_t>(a.blocks_per_request) * a.block_size;
  return Params<Split>{a.logical,
                       a.req_id,
                       no_blocks ? a.logical : a.block_table,
                       a.logical_stride,
                       no_blocks ? 0 : a.block_table_stride,
                       no_blocks ? 0u : static_cast<std::uint32_t>(positions < (std::int64_t{1} << 31) ? positions : (std::int64_t{1} << 31)),
                       split,
                       a.num_topk,
                       a.block_stride_rows,
                       a.physical,
                       a.physical_stride,
                       a.valid_counts,
                       a.workspace_request,
                       a.workspace_starts};
}

// The conversion's launch shapes: which kernel, and which team shape
// (threads x 16-byte units in flight a thread), a call takes by its token
// count. Chosen by measurement (K = 2048, graph replays, rotated inputs;
// docs/PERFORMANCE.md has the figures and the shapes tried): a few tokens
// want many threads with few loads each, a full device fewer threads with
// more loads each. Convert's small rows shrink the team to the warps their
// units fill (at least one: K >= 1).
struct TeamShape {
  int threads;
  int units_in_flight;
};
struct ConvertLaunchShapes {
  // Token counts where the choice changes.
  std::int64_t few_tokens;          // below: few tokens
  std::int64_t rounds_from;         // rows not compacted take ConvertRounds again from here ...
  std::int64_t full_device;         // ... up to here; from here a full device
  std::int64_t host_staged_from;    // host spaces: compacted rows take Compaction::stage from here
  // GPU spaces. Rows of whole rounds take ConvertRounds where it beat
  // Convert; from few_tokens to rounds_from and from full_device Convert
  // stays (at 128 x 4 the compiler put ConvertRounds' third and fourth index
  // loads behind its first table loads). Compacted DCP rows take
  // ConvertRounds' Compaction::gather below few_tokens and its
  // Compaction::stage from there (K up to max_staged_topk; longer rows take
  // Convert).
  TeamShape few_rounds;       // ConvertRounds below few_tokens (compacted: Compaction::gather)
  TeamShape few;              // Convert below few_tokens
  TeamShape rounds;           // ConvertRounds from rounds_from to full_device (compacted: the stage from few_tokens)
  TeamShape middle;           // Convert from few_tokens to full_device, and rows not of 16-byte units
  TeamShape full_stage;       // compacted rows from full_device: Compaction::stage
  TeamShape full;             // Convert from full_device
  // Host spaces: a team of one thread, four units in flight; rows of whole
  // rounds take ConvertRounds, and compacted rows compact by the token count
  // as on GPUs, so that host CI runs both ways.
  TeamShape host;
};
inline constexpr ConvertLaunchShapes convert_shapes{
    512, 2048, 8192, 512, {512, 1}, {256, 2}, {256, 1}, {128, 4}, {256, 2}, {128, 2}, {1, 4},
};

template <class Space, class Split, class Dcp>
void convert_split(const Space& space, const TopkConvertArgs& a, Split split, const Dcp& dcp) {
  const Params<Split> p = params_of(a, split);
  const bool vector4 = a.num_topk % 4 == 0 && aligned16(a.logical) && aligned16(a.physical) &&
                       a.logical_stride % 4 == 0 && a.physical_stride % 4 == 0;
  const std::int64_t units = vector4 ? a.num_topk / 4 : a.num_topk;
  constexpr ConvertLaunchShapes s = convert_shapes;
  if constexpr (is_host_space<Space>) {
    constexpr TeamShape host = s.host;
    if (vector4) {
      bool launched = false;
      if constexpr (Dcp::compact) {
        if (a.num_tokens >= s.host_staged_from) {
          launched = launch_shifted_rounds<Space, host.threads, host.units_in_flight, Compaction::stage>(
              space, p, dcp, a.num_tokens, units);
        }
      }
      if (launched ||
          launch_shifted_rounds<Space, host.threads, host.units_in_flight>(space, p, dcp, a.num_tokens, units)) {
        return;
      }
      launch<Space, Int4, host.units_in_flight>(space, p, dcp, a.num_tokens, host.threads);
    } else {
      launch<Space, std::int32_t, host.units_in_flight>(space, p, dcp, a.num_tokens, host.threads);
    }
  } else {
    constexpr TeamShape few_rounds = s.few_rounds, few = s.few, rounds = s.rounds, middle = s.middle,
                        full_stage = s.full_stage, full = s.full;
    auto threads_for = [&](TeamShape shape) {
      const std::int64_t needed = (units + shape.units_in_flight - 1) / shape.units_in_flight;
      return static_cast<int>(needed >= shape.threads ? shape.threads : (needed + 31) / 32 * 32);
    };
    if (!vector4) {
      launch<Space, std::int32_t, middle.units_in_flight>(space, p, dcp, a.num_tokens, threads_for(middle));
    } else if (a.num_tokens < s.few_tokens) {
      if (launch_shifted_rounds<Space, few_rounds.threads, few_rounds.units_in_flight>(space, p, dcp, a.num_tokens,
                                                                                       units)) {
        return;
      }
      launch<Space, Int4, few.units_in_flight>(space, p, dcp, a.num_tokens, threads_for(few));
    } else if (a.num_tokens < s.full_device) {
      if constexpr (Dcp::compact) {
        if (launch_shifted_rounds<Space, rounds.threads, rounds.units_in_flight, Compaction::stage>(
                space, p, dcp, a.num_tokens, units)) {
          return;
        }
      } else {
        if (a.num_tokens >= s.rounds_from &&
            launch_rounds<Space, rounds.threads, rounds.units_in_flight>(space, p, dcp, a.num_tokens, units)) {
          return;
        }
      }
      launch<Space, Int4, middle.units_in_flight>(space, p, dcp, a.num_tokens, threads_for(middle));
    } else {
      if constexpr (Dcp::compact) {
        if (launch_shifted_rounds<Space, full_stage.threads, full_stage.units_in_flight, Compaction::stage>(
                space, p, dcp, a.num_tokens, units)) {
          return;
        }
      }
      launch<Space, Int4, full.units_in_flight>(space, p, dcp, a.num_tokens, threads_for(full));
    }
  }
}

}  // namespace topk

template <class Space>
void convert_topk(const Space& space, const TopkConvertArgs& a) {
  if (a.num_tokens == 0) return;
  with_block_split(a.block_size, [&](auto split) {
    if (a.dcp_size <= 1) {
      topk::convert_split(space, a, split, topk::NoDcp{});
    } else if (a.dcp_compact) {
      topk::convert_split(space, a, split, topk::Dcp<true>::of(a.dcp_size, a.dcp_rank, a.dcp_interleave));
    } else {
      topk::convert_split(space, a, split, topk::Dcp<false>::of(a.dcp_size, a.dcp_rank, a.dcp_interleave));
    }
  });
}

}  // namespace sparse_mla::kernels
