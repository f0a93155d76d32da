// Top-k conversion, logical token positions to physical KV-cache rows
// (SPEC section 2). One team per query token; on GPUs each thread converts
// four entries per 16-byte load and the team sums the valid count, so a row
// costs one read and one write of its indices and a single count store (no
// atomics, no zero-initialised counter).
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

template <class Space>
struct TopkConvert {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  TopkConvertArgs a;
  bool vector4;  // rows are 16-byte aligned and num_topk % 4 == 0

  // The row-constant part of the mapping: where the row's table row starts
  // and, for a prefill-workspace token, its workspace start.
  struct Row {
    const std::int32_t* table;
    std::int32_t workspace_start;
    bool prefill;
  };

  KOKKOS_INLINE_FUNCTION std::int32_t convert(const Row& row, std::int32_t tok) const {
    if (tok < 0) return -1;
    if (row.prefill) return wrap_mad(1, row.workspace_start, tok);
    const std::int32_t block = tok / a.block_size;
    if (block >= a.blocks_per_request) return -1;
    return wrap_mad(row.table[block], a.block_stride_rows, tok % a.block_size);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t t = team.league_rank();
    Row row{nullptr, 0, false};
    if (a.workspace_request != nullptr) {
      const std::int32_t p = a.workspace_request[t];
      if (p >= 0) row = Row{nullptr, a.workspace_starts[p], true};
    }
    if (!row.prefill) row.table = a.block_table + static_cast<std::int64_t>(a.req_id[t]) * a.block_table_stride;
    const std::int32_t* in = a.logical + t * a.logical_stride;
    std::int32_t* out = a.physical + t * a.physical_stride;

    std::int32_t valid = 0;
    if (vector4) {
      const Int4* in4 = reinterpret_cast<const Int4*>(in);
      Int4* out4 = reinterpret_cast<Int4*>(out);
      Kokkos::parallel_reduce(
          Kokkos::TeamThreadRange(team, a.num_topk / 4),
          [&](const std::int32_t q, std::int32_t& count) {
            const Int4 v = in4[q];
            const Int4 r{convert(row, v.x), convert(row, v.y), convert(row, v.z), convert(row, v.w)};
            out4[q] = r;
            count += (r.x != -1) + (r.y != -1) + (r.z != -1) + (r.w != -1);
          },
          valid);
    } else {
      Kokkos::parallel_reduce(
          Kokkos::TeamThreadRange(team, a.num_topk),
          [&](const std::int32_t j, std::int32_t& count) {
            const std::int32_t r = convert(row, in[j]);
            out[j] = r;
            count += (r != -1);
          },
          valid);
    }
    if (a.valid_counts != nullptr) {
      Kokkos::single(Kokkos::PerTeam(team), [&]() { a.valid_counts[t] = valid; });
    }
  }
};

template <class Space>
void convert_topk(const Space& space, const TopkConvertArgs& a) {
  if (a.num_tokens == 0) return;
  const bool vector4 = a.num_topk % 4 == 0 && aligned16(a.logical) && aligned16(a.physical) &&
                       a.logical_stride % 4 == 0 && a.physical_stride % 4 == 0;
  // Team size, measured on the H200 (K=2048, graph replays, rotated inputs):
  // 512 threads (one 16-byte unit each) were best for a handful of rows
  // (T=1: 4.6 us against 5.2 us), 256 threads (two units each) for many
  // (T=1024: 12.0 us against 17.3 us; T=32768: 2.10 TB/s against 1.24 TB/s).
  const std::int64_t units = vector4 ? a.num_topk / 4 : a.num_topk;
  const int wide = a.num_tokens < 64 && units >= 512 ? 512 : 256;
  const int team = row_team_size<Space>(static_cast<int>(units >= wide ? wide : (units + 31) / 32 * 32));
  Kokkos::parallel_for("sparse_mla::convert_topk",
                       Kokkos::TeamPolicy<Space>(space, static_cast<int>(a.num_tokens), team),
                       TopkConvert<Space>{a, vector4});
}

}  // namespace sparse_mla::kernels
