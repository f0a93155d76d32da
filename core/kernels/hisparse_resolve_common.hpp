// What the two HiSparse resolve kernels share (hisparse_resolve.hpp chooses
// between them): the production row's sizes, the team and its groups, the
// team-scratch hash set's hash and buckets, and the tables a row is resolved
// through and its outputs written to.
#pragma once

#include <Kokkos_Core.hpp>

#include "components/atomic.hpp"
#include "components/memory.hpp"
#include "components/prefix_sum.hpp"
#include "kernels.hpp"
#include "space_traits.hpp"

namespace sparse_mla::kernels {

namespace hisparse {

// The production row: DeepSeek-V3.2's top-k and the default 2K hot slots.
constexpr std::int32_t production_top_k = 2048;
constexpr std::int32_t production_hot_slots = 4096;

// On a GPU one team of team_threads resolves a row alone, so the row's time
// is its chain of dependent loads and barriers, and the more warps hide each
// other's latency the shorter it is (docs/PERFORMANCE.md). A thread takes
// groups of entries (2) and of slots or LRU positions (4): one group of each
// per thread in a production row.
constexpr int team_threads = 1024;
constexpr int entries_per_group = 2;
constexpr int slots_per_group = 4;

KOKKOS_INLINE_FUNCTION constexpr std::int32_t groups(std::int32_t n, std::int32_t per_group) {
  return (n + per_group - 1) / per_group;
}

// Hot block table entries a row copies to team scratch, so that its slots
// map to hot rows without global loads: up to 256 (hot blocks of 16 rows or
// more at H = 4096), which keeps the resolve in LRU order within the 40,936
// bytes of level-0 scratch a CUDA team can have.
constexpr std::int32_t max_cached_hot_blocks = 256;

// Per-group partial counts of the team sums (device::team_exclusive_sum): two
// buffers, used in turn, so that a sum's buffer is written again only after a
// later barrier that every thread reaches after reading it.
constexpr std::int32_t team_total_words = 2 * device::team_exclusive_sum_words;

// Counts summed over the team pack two 16-bit counts into a word (low and
// high half): every count is at most hot_slots <= 2^15, so neither half
// carries into the other.
constexpr std::uint32_t high_count = std::uint32_t{1} << 16;

// The set of a row's distinct host rows: 2K positions (at most half full),
// probed a bucket of 4 positions at a time (one 16-byte scratch load). A key
// starts at the first position of its hash bucket and moves on a bucket at a
// time, so a lookup at half load nearly always ends in its first bucket;
// probing one position at a time, a warp ran as many rounds as its longest
// chain, and probing dominated the resolve's instructions.
constexpr std::int32_t bucket = 4;
constexpr std::uint32_t empty_word = 0xFFFFFFFFu;  // an empty position
KOKKOS_INLINE_FUNCTION constexpr std::int32_t set_positions(std::int32_t top_k) {
  return (2 * top_k + bucket - 1) / bucket * bucket;
}

// Knuth's multiplicative hash, scaled to [0, size) by its high bits.
KOKKOS_INLINE_FUNCTION std::int32_t hash_position(std::int32_t key, std::int32_t size) {
  const std::uint32_t mixed = static_cast<std::uint32_t>(key) * 2654435761u;
  return static_cast<std::int32_t>((static_cast<std::uint64_t>(mixed) * static_cast<std::uint32_t>(size)) >> 32);
}

}  // namespace hisparse

// A launch's tables and outputs as both resolve kernels read and write them,
// with block splits of the kind `Split` (SplitBy::shift where every block
// size is a power of two).
template <SplitBy Split>
struct ResolveTables {
  HiSparseResolveArgs a;
  BlockSplit<Split> source_split, resident_split, hot_split;  // by a.source_block_size, ...

  static ResolveTables of(const HiSparseResolveArgs& a) {
    return {a, BlockSplit<Split>::of(a.source_block_size), BlockSplit<Split>::of(a.resident_block_size),
            BlockSplit<Split>::of(a.hot_block_size)};
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

  // The host row of request-relative position `tok` (SPEC section 5, step 1)
  // in two steps, so that a group issues all its table loads before it uses
  // one: the source block table entry (-1 when `tok` is outside the table),
  // then the host row (-1 for a negative block or a row outside the pool).
  // `table` is the request's row of the table, which has at least one block.
  // Masks, not selects: nvcc turns `inside ? load : -1` back into a branch
  // around the load, so a thread's table loads would not issue together.
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
  KOKKOS_INLINE_FUNCTION std::int32_t resident_row(std::int32_t physical, std::int32_t tok) const {
    if (physical < 0 || physical == a.resident_null_block) return -1;
    return static_cast<std::int32_t>(static_cast<std::int64_t>(physical) * a.resident_block_size +
                                     resident_split.offset(tok));
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
};

}  // namespace sparse_mla::kernels
