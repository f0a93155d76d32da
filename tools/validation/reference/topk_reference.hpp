// Scalar reference for the top-k conversion (SPEC sections 2 and 2a), written from
// the SPEC's text as one plain loop, independent of core/kernels.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace sparse_mla::reference {

// The low 32 bits of an int64, as the reference engine's int32 arithmetic
// keeps them.
inline std::int32_t low32(std::int64_t v) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(static_cast<std::uint64_t>(v)));
}

struct TopkInputs {
  std::int64_t num_tokens = 0;  // T
  std::int64_t num_topk = 0;    // K
  std::int64_t blocks_per_request = 0;  // B (block_table is [R, B], packed)
  std::int32_t block_size = 1;
  std::int32_t block_stride_rows = 1;
  std::vector<std::int32_t> req_id;       // [>= T]
  std::vector<std::int32_t> block_table;  // [R * B]
  std::vector<std::int32_t> logical;      // [T * K]
  // Prefill workspace variant: both empty, or [>= T] and [P].
  std::vector<std::int32_t> workspace_request;
  std::vector<std::int32_t> workspace_starts;
  // DCP (SPEC section 2a): dcp_size > 1 filters to rank dcp_rank's tokens
  // (no workspace then); block_table is the rank-local table.
  std::int32_t dcp_size = 1;
  std::int32_t dcp_rank = 0;
  std::int32_t dcp_interleave = 1;
  bool dcp_compact = true;

  // The DCP fields from a split with the members of sparse_mla::DcpConfig
  // (size, rank, interleave, compact).
  template <class Split>
  void set_dcp(const Split& split) {
    dcp_size = split.size;
    dcp_rank = split.rank;
    dcp_interleave = split.interleave;
    dcp_compact = split.compact;
  }
};

struct TopkOutputs {
  std::vector<std::int32_t> physical;      // [T * K]
  std::vector<std::int32_t> valid_counts;  // [T]
};

inline TopkOutputs convert_topk(const TopkInputs& in) {
  TopkOutputs out;
  out.physical.assign(static_cast<std::size_t>(in.num_tokens * in.num_topk), -1);
  out.valid_counts.assign(static_cast<std::size_t>(in.num_tokens), 0);
  const bool has_workspace = !in.workspace_request.empty();
  for (std::int64_t t = 0; t < in.num_tokens; ++t) {
    const auto ut = static_cast<std::size_t>(t);
    const std::int64_t p = has_workspace ? in.workspace_request[ut] : -1;
    for (std::int64_t j = 0; j < in.num_topk; ++j) {
      const auto at = static_cast<std::size_t>(t * in.num_topk + j);
      const std::int64_t tok = in.logical[at];
      std::int64_t value = -1;
      if (tok >= 0 && p >= 0) {
        value = std::int64_t{in.workspace_starts[static_cast<std::size_t>(p)]} + tok;
      } else if (tok >= 0 && tok / in.block_size < in.blocks_per_request) {
        const std::int64_t r = in.req_id[ut];
        const std::int64_t block = in.block_table[static_cast<std::size_t>(r * in.blocks_per_request + tok / in.block_size)];
        value = block * in.block_stride_rows + tok % in.block_size;
      }
      out.physical[at] = low32(value);
      if (out.physical[at] != -1) ++out.valid_counts[ut];
    }
  }
  return out;
}

// SPEC section 2a, from its words: a position this rank does not own is
// -1; an owned one is converted at its local position; compaction keeps the
// valid outputs in input order and fills the rest of the row with -1.
inline TopkOutputs convert_topk_dcp(const TopkInputs& in) {
  if (in.dcp_size <= 1) return convert_topk(in);
  TopkInputs local = in;
  const std::int64_t S = in.dcp_size, I = in.dcp_interleave;
  for (std::int32_t& tok : local.logical) {
    if (tok < 0) continue;
    const std::int64_t owner = (tok / I) % S;
    tok = owner == in.dcp_rank ? static_cast<std::int32_t>((tok / (S * I)) * I + tok % I) : -1;
  }
  TopkOutputs out = convert_topk(local);
  if (!in.dcp_compact) return out;
  for (std::int64_t t = 0; t < in.num_tokens; ++t) {
    const auto row = out.physical.begin() + t * in.num_topk;
    std::vector<std::int32_t> kept;
    for (std::int64_t j = 0; j < in.num_topk; ++j) {
      if (row[j] != -1) kept.push_back(row[j]);
    }
    std::fill(row, row + in.num_topk, -1);
    std::copy(kept.begin(), kept.end(), row);
  }
  return out;
}

}  // namespace sparse_mla::reference
