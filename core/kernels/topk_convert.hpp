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

template <class Space, class Split, int UnitsInFlight>
struct TopkConvert {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  TopkConvertArgs a;
  Split split;          // tok >= 0 only
  bool vector4;         // rows are 16-byte aligned and num_topk % 4 == 0
  int lanes_per_thread;  // the policy's vector length: 32 on GPUs (a warp), 1 on CPUs

  // The row-constant part of the mapping: where the row's table row starts
  // and, for a prefill-workspace token, its workspace start.
  struct Row {
    const std::int32_t* table;
    std::int32_t workspace_start;
    bool prefill;
  };

  KOKKOS_INLINE_FUNCTION Row row_of(std::int64_t t) const {
    Row row{nullptr, 0, false};
    if (a.workspace_request != nullptr) {
      const std::int32_t p = a.workspace_request[t];
      if (p >= 0) row = Row{nullptr, a.workspace_starts[p], true};
    }
    if (!row.prefill) row.table = a.block_table + static_cast<std::int64_t>(a.req_id[t]) * a.block_table_stride;
    return row;
  }

  KOKKOS_INLINE_FUNCTION std::int32_t convert(const Row& row, std::int32_t tok) const {
    if (tok < 0) return -1;
    if (row.prefill) return wrap_mad(1, row.workspace_start, tok);
    const std::int32_t block = split.block(tok);
    if (block >= a.blocks_per_request) return -1;
    return wrap_mad(row.table[block], a.block_stride_rows, split.offset(tok));
  }

  KOKKOS_INLINE_FUNCTION Int4 convert(const Row& row, const Int4& v) const {
    return Int4{convert(row, v.x), convert(row, v.y), convert(row, v.z), convert(row, v.w)};
  }

  KOKKOS_INLINE_FUNCTION static std::int32_t valid(std::int32_t r) { return r != -1; }
  KOKKOS_INLINE_FUNCTION static std::int32_t valid(const Int4& r) {
    return (r.x != -1) + (r.y != -1) + (r.z != -1) + (r.w != -1);
  }

  // Lane `lane` of `lanes` converts units lane, lane + lanes, ... of a row
  // (a unit is an Int4 of four entries, or one entry), `UnitsInFlight` at a
  // time: the stores may alias the inputs, so only loads issued ahead of the
  // first store overlap their latency. Returns the entries that stay valid.
  template <class Unit>
  KOKKOS_INLINE_FUNCTION std::int32_t convert_units(const Row& row, const Unit* in, Unit* out, std::int32_t units,
                                                    std::int32_t lane, std::int32_t lanes) const {
    std::int32_t count = 0;
    for (std::int32_t q = lane; q < units; q += UnitsInFlight * lanes) {
      Unit v[UnitsInFlight];
      for (int u = 0; u < UnitsInFlight; ++u) {
        if (q + u * lanes < units) v[u] = in[q + u * lanes];
      }
      for (int u = 0; u < UnitsInFlight; ++u) {
        if (q + u * lanes < units) v[u] = convert(row, v[u]);
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

  // The count is summed within each thread's vector lanes (warp shuffles on
  // GPUs), then across the team's threads through scratch with one barrier:
  // Kokkos' general team reduction costs a dozen barriers, which for a
  // single token was more than half of the kernel.
  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t t = team.league_rank();
    const Row row = row_of(t);
    const std::int32_t lanes = team.team_size() * lanes_per_thread;
    const std::int32_t first_lane = team.team_rank() * lanes_per_thread;
    std::int32_t thread_valid = 0;
    Kokkos::parallel_reduce(
        Kokkos::ThreadVectorRange(team, lanes_per_thread),
        [&](const std::int32_t lane, std::int32_t& count) {
          if (vector4) {
            count += convert_units(row, reinterpret_cast<const Int4*>(a.logical + t * a.logical_stride),
                                   reinterpret_cast<Int4*>(a.physical + t * a.physical_stride), a.num_topk / 4,
                                   first_lane + lane, lanes);
          } else {
            count += convert_units(row, a.logical + t * a.logical_stride, a.physical + t * a.physical_stride,
                                   a.num_topk, first_lane + lane, lanes);
          }
        },
        thread_valid);
    if (a.valid_counts == nullptr) return;
    auto* partial = static_cast<std::int32_t*>(team.team_scratch(0).get_shmem(sizeof(std::int32_t) * team.team_size()));
    Kokkos::single(Kokkos::PerThread(team), [&]() { partial[team.team_rank()] = thread_valid; });
    team.team_barrier();
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      std::int32_t sum = 0;
      for (int i = 0; i < team.team_size(); ++i) sum += partial[i];
      a.valid_counts[t] = sum;
    });
  }
};

template <class Space, int UnitsInFlight, class Split>
void launch_convert_topk(const Space& space, const TopkConvertArgs& a, Split split, bool vector4, int threads) {
  const int lanes = is_host_space<Space> ? 1 : 32;
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
