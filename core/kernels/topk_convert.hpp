// Top-k conversion, logical token positions to physical KV-cache rows
// (SPEC section 2). One team per query token; on GPUs each lane converts
// four entries per 16-byte load, with one to four loads in flight, and the
// team sums the valid count, so a row costs one read and one write of its
// indices and a single count store (no atomics, no zero-initialised
// counter).
#pragma once

#include <Kokkos_Core.hpp>

#include "space_traits.hpp"
#include "sparse_mla/kernels.hpp"

namespace sparse_mla::kernels {

// int32 arithmetic that wraps like the reference (Triton's int32), without
// the undefined behaviour of signed overflow.
KOKKOS_INLINE_FUNCTION std::int32_t wrap_mad(std::int32_t a, std::int32_t b, std::int32_t c) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(a) * static_cast<std::uint32_t>(b) +
                                   static_cast<std::uint32_t>(c));
}

// The three ways a row maps its positions, chosen once per row (team), so
// the per-entry code has no branch on them.
//
// Through the block table: branch-free on purpose. Every entry loads a table
// entry (block 0 when the position is invalid: a valid address), so the
// compiler issues all the table loads of a thread's units together. With an
// early return per entry, each load sat in its own branch with its use right
// after it: one cache round trip per entry, one after another (the first
// Kokkos version took 4.5 us for one token where a branch-free raw CUDA
// kernel took 1.8).
template <class Split>
struct TableMap {
  const std::int32_t* table;  // the row's block-table row, >= 1 entry
  Split split;
  std::int32_t blocks;
  std::int32_t stride_rows;
  KOKKOS_INLINE_FUNCTION std::int32_t operator()(std::int32_t tok) const {
    const std::int32_t block = split.block(tok);
    const std::int32_t inside = tok >= 0 && block < blocks;  // 1 or 0
    // Masks, not selects: the compiler turns `inside ? load : -1` back into
    // a branch around the load (seen in the PTX), which is what we avoid.
    const std::int32_t start = table[block & -inside];
    return wrap_mad(start, stride_rows, split.offset(tok)) | (inside - 1);
  }
};
// A prefill-workspace token: its workspace start plus the position.
struct WorkspaceMap {
  std::int32_t start;
  KOKKOS_INLINE_FUNCTION std::int32_t operator()(std::int32_t tok) const { return tok < 0 ? -1 : wrap_mad(1, start, tok); }
};
// A table with no blocks: nothing is valid.
struct NothingMap {
  KOKKOS_INLINE_FUNCTION std::int32_t operator()(std::int32_t) const { return -1; }
};

template <class Space, class Split, int UnitsInFlight>
struct TopkConvert {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  TopkConvertArgs a;
  Split split;           // of a.block_size
  bool vector4;          // rows are 16-byte aligned and num_topk % 4 == 0
  int lanes_per_thread;  // the policy's vector length: 32 on GPUs (a warp), 1 on CPUs

  template <class Map>
  KOKKOS_INLINE_FUNCTION static std::int32_t map(const Map& m, std::int32_t tok) {
    return m(tok);
  }
  template <class Map>
  KOKKOS_INLINE_FUNCTION static Int4 map(const Map& m, const Int4& v) {
    return Int4{m(v.x), m(v.y), m(v.z), m(v.w)};
  }

  KOKKOS_INLINE_FUNCTION static std::int32_t valid(std::int32_t r) { return r != -1; }
  KOKKOS_INLINE_FUNCTION static std::int32_t valid(const Int4& r) {
    return (r.x != -1) + (r.y != -1) + (r.z != -1) + (r.w != -1);
  }

  // Lane `lane` of `lanes` converts units lane, lane + lanes, ... of a row
  // (a unit is an Int4 of four entries, or one entry), `UnitsInFlight` at a
  // time: the stores may alias the inputs, so only loads issued ahead of the
  // first store overlap their latency. Returns the entries that stay valid.
  template <class Map, class Unit>
  KOKKOS_INLINE_FUNCTION std::int32_t convert_units(const Map& m, const Unit* in, Unit* out, std::int32_t units,
                                                    std::int32_t lane, std::int32_t lanes) const {
    std::int32_t count = 0;
    for (std::int32_t q = lane; q < units; q += UnitsInFlight * lanes) {
      Unit v[UnitsInFlight];
      for (int u = 0; u < UnitsInFlight; ++u) {
        if (q + u * lanes < units) v[u] = in[q + u * lanes];
      }
      for (int u = 0; u < UnitsInFlight; ++u) {
        if (q + u * lanes < units) v[u] = map(m, v[u]);
      }
      for (int u = 0; u < UnitsInFlight; ++u) {
        if (q + u * lanes < units) {
          out[q + u * lanes] = v[u];
          count += valid(v[u]);
        }
      }
    }
    return count;
  }

  // The sum of each vector lane's `value` over a team thread's lanes, which
  // every lane gets. On CUDA (sm_80 and later) the lanes are one warp and
  // one warp reduction adds them; Kokkos' vector reduction is a loop of five
  // shuffle steps with divergence checks (about 70 instructions on the
  // critical path: Nsight Compute, T=1024). Elsewhere Kokkos' reduction.
  KOKKOS_INLINE_FUNCTION std::int32_t lane_sum(const member_type& team, std::int32_t value) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    (void)team;
    return __reduce_add_sync(0xffffffffu, value);
#else
    std::int32_t sum = 0;
    Kokkos::parallel_reduce(
        Kokkos::ThreadVectorRange(team, lanes_per_thread), [&](std::int32_t, std::int32_t& s) { s += value; }, sum);
    return sum;
#endif
  }

  // Converts row t with `m`; returns this team thread's valid entries. Each
  // vector lane runs the body once, with its own lane_valid.
  template <class Map>
  KOKKOS_INLINE_FUNCTION std::int32_t convert_row(const member_type& team, const Map& m, std::int64_t t) const {
    const std::int32_t lanes = team.team_size() * lanes_per_thread;
    const std::int32_t first_lane = team.team_rank() * lanes_per_thread;
    const std::int32_t* in = a.logical + t * a.logical_stride;
    std::int32_t* out = a.physical + t * a.physical_stride;
    std::int32_t lane_valid = 0;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, lanes_per_thread), [&](const std::int32_t lane) {
      if (vector4) {
        lane_valid = convert_units(m, reinterpret_cast<const Int4*>(in), reinterpret_cast<Int4*>(out), a.num_topk / 4,
                                   first_lane + lane, lanes);
      } else {
        lane_valid = convert_units(m, in, out, a.num_topk, first_lane + lane, lanes);
      }
    });
    return lane_sum(team, lane_valid);
  }

  // The count is summed within each thread's vector lanes (warp shuffles on
  // GPUs), then across the team's threads through scratch with one barrier,
  // by the first thread's lanes: Kokkos' general team reduction costs a
  // dozen barriers.
  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t t = team.league_rank();
    const std::int32_t workspace = a.workspace_request != nullptr ? a.workspace_request[t] : -1;
    std::int32_t thread_valid = 0;
    if (workspace >= 0) {
      thread_valid = convert_row(team, WorkspaceMap{a.workspace_starts[workspace]}, t);
    } else if (a.blocks_per_request > 0) {
      const std::int32_t* table = a.block_table + static_cast<std::int64_t>(a.req_id[t]) * a.block_table_stride;
      thread_valid = convert_row(team, TableMap<Split>{table, split, a.blocks_per_request, a.block_stride_rows}, t);
    } else {
      thread_valid = convert_row(team, NothingMap{}, t);
    }
    if (a.valid_counts == nullptr) return;
    auto* partial = static_cast<std::int32_t*>(team.team_scratch(0).get_shmem(sizeof(std::int32_t) * team.team_size()));
    Kokkos::single(Kokkos::PerThread(team), [&]() { partial[team.team_rank()] = thread_valid; });
    team.team_barrier();
    if (team.team_rank() != 0) return;
    // The first thread's lanes sum the partials (a load or so each, then
    // one lane_sum).
    std::int32_t lane_partials = 0;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, lanes_per_thread), [&](const std::int32_t lane) {
      for (std::int32_t i = lane; i < team.team_size(); i += lanes_per_thread) lane_partials += partial[i];
    });
    const std::int32_t sum = lane_sum(team, lane_partials);
    Kokkos::single(Kokkos::PerThread(team), [&]() { a.valid_counts[t] = sum; });
  }
};

template <class Space, int UnitsInFlight, class Split>
void launch_convert_topk(const Space& space, const TopkConvertArgs& a, Split split, bool vector4, int threads) {
  constexpr int lanes = warp_lanes<Space>();
  Kokkos::TeamPolicy<Space> policy(space, static_cast<int>(a.num_tokens), threads / lanes, lanes);
  policy.set_scratch_size(0, Kokkos::PerTeam(sizeof(std::int32_t) * static_cast<std::size_t>(threads / lanes)));
  Kokkos::parallel_for("sparse_mla::convert_topk", policy, TopkConvert<Space, Split, UnitsInFlight>{a, split, vector4, lanes});
}

template <class Space, class Split>
void convert_topk_split(const Space& space, const TopkConvertArgs& a, Split split) {
  const bool vector4 = a.num_topk % 4 == 0 && aligned16(a.logical) && aligned16(a.physical) &&
                       a.logical_stride % 4 == 0 && a.physical_stride % 4 == 0;
  const std::int64_t units = vector4 ? a.num_topk / 4 : a.num_topk;
  if constexpr (is_host_space<Space>) {
    launch_convert_topk<Space, 4>(space, a, split, vector4, 1);
  } else {
    // Shapes measured on the H200 (K=2048, graph replays, rotated inputs), a
    // raw CUDA kernel of the same structure beside it: a few tokens want
    // every unit's load in its own thread (512 threads x 1 unit: T=1 in
    // 1.8 us), a full device wants fewer threads with more loads each in
    // flight (T=1024: 256 x 2; T=32768: 128 x 4 at 79% of DRAM peak).
    // Small rows shrink the team to the warps their units fill.
    auto threads_for = [&](int base, int in_flight) {
      const std::int64_t needed = (units + in_flight - 1) / in_flight;
      return static_cast<int>(needed >= base ? base : (needed + 31) / 32 * 32);
    };
    if (a.num_tokens < 512) {
      launch_convert_topk<Space, 1>(space, a, split, vector4, threads_for(512, 1));
    } else if (a.num_tokens < 8192) {
      launch_convert_topk<Space, 2>(space, a, split, vector4, threads_for(256, 2));
    } else {
      launch_convert_topk<Space, 4>(space, a, split, vector4, threads_for(128, 4));
    }
  }
}

template <class Space>
void convert_topk(const Space& space, const TopkConvertArgs& a) {
  if (a.num_tokens == 0) return;
  with_block_split(a.block_size, [&](auto split) { convert_topk_split(space, a, split); });
}

}  // namespace sparse_mla::kernels
