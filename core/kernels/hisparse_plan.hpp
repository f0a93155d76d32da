// HiSparse prefill staging plan built on the device (SPEC section 5;
// HiSparsePlanArgs in kernels.hpp): the plan that
// build_hisparse_prefill_staging_plan builds on the host, computed in stream
// order into storage sized once, so that the step path neither allocates nor
// waits for the host.
//
// Every entry (p, b) of the prefill block table, and the context length of
// each request as the entry (p, -1) before its blocks, has a key
// p * (B + 1) + b + 1: keys order entries as the host builder visits them.
// Six launches on the stream's execution-space instance, in order:
//   1. clear: every host block's first-use key and the error key become
//      no_key, the distinct count 0.
//   2. mark (one thread per key): a request's length entry checks the length;
//      a block entry inside a good context either records its key as a use of
//      its host block (atomic min: the first user wins, whatever the order
//      the threads run in) or, for a block id outside the pool, as a bad entry.
//   3. number (one team): compact id of each used host block = 1 + the used
//      blocks before it, an exclusive scan over the pool in ascending block
//      order; the inverse map (compact id to host block) for the rows. Each
//      thread of the team scans a contiguous chunk of the pool and one team
//      scan gives each chunk its offset, so the result needs no host and does
//      not depend on the team size.
//   4. table (one thread per entry): the compact id of each entry, 0 beyond
//      the context, for a bad entry, and for a block whose compact id does
//      not fit the storage (recorded as a bad entry).
//   5. rows (one thread per staged row): host row and resident row of each
//      row of the compact blocks in use, -1 for the null block and the tail.
//   6. report (one thread): the first bad entry's code, request, block and
//      value into the error record, found again from its key.
// Ids are int32 and keys fit int32 (the storage's construction checks the
// sizes), so every product is computed in 64 bits and fits back.
#pragma once

#include <Kokkos_Core.hpp>

#include "space_traits.hpp"
#include "kernels.hpp"

namespace sparse_mla::kernels {

namespace hisparse_plan {

// No entry: larger than every key.
constexpr std::int32_t no_key = 2147483647;

KOKKOS_INLINE_FUNCTION std::int64_t smaller(std::int64_t x, std::int64_t y) { return x < y ? x : y; }

// What the launches share: the entries' keys and contexts.
struct Entries {
  HiSparsePlanArgs a;

  KOKKOS_INLINE_FUNCTION std::int64_t key_stride() const { return std::int64_t{a.blocks_per_request} + 1; }
  KOKKOS_INLINE_FUNCTION std::int32_t key(std::int64_t p, std::int64_t b) const {
    return static_cast<std::int32_t>(p * key_stride() + b + 1);
  }
  KOKKOS_INLINE_FUNCTION std::int64_t request_of(std::int32_t key) const { return key / key_stride(); }
  KOKKOS_INLINE_FUNCTION std::int64_t block_of(std::int32_t key) const { return key % key_stride() - 1; }  // -1: the length
  // Blocks of request p's context, or -1 when its length is bad (negative,
  // or more blocks than the table has): such a request uses no block.
  KOKKOS_INLINE_FUNCTION std::int64_t context_blocks(std::int64_t p) const {
    const std::int64_t length = a.context_lengths[p];
    if (length < 0) return -1;
    const std::int64_t blocks = (length + a.block_size - 1) / a.block_size;
    return blocks <= a.blocks_per_request ? blocks : -1;
  }
  KOKKOS_INLINE_FUNCTION std::int32_t block_id(std::int64_t p, std::int64_t b) const {
    return a.block_table[p * a.block_table_stride + b];
  }
  KOKKOS_INLINE_FUNCTION bool inside_pool(std::int32_t id) const { return id >= 0 && id < a.pool_blocks; }
  KOKKOS_INLINE_FUNCTION void record_bad_entry(std::int32_t key) const { Kokkos::atomic_fetch_min(&a.totals[0], key); }
};

// Launch 1, i in [0, pool_blocks]: i < pool_blocks clears a first-use key,
// i == pool_blocks the totals.
struct Clear {
  Entries e;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    if (i < e.a.pool_blocks) {
      e.a.first_use[i] = no_key;
    } else {
      e.a.totals[0] = no_key;
      e.a.totals[1] = 0;
    }
  }
};

// Launch 2, one key in [0, num_requests * (B + 1)) each.
struct Mark {
  Entries e;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    const auto key = static_cast<std::int32_t>(i);
    const std::int64_t p = e.request_of(key), b = e.block_of(key);
    const std::int64_t blocks = e.context_blocks(p);
    if (b < 0) {
      if (blocks < 0) e.record_bad_entry(key);
      return;
    }
    if (b >= blocks) return;
    const std::int32_t id = e.block_id(p, b);
    if (e.inside_pool(id)) {
      Kokkos::atomic_fetch_min(&e.a.first_use[id], key);
    } else {
      e.record_bad_entry(key);
    }
  }
};

// Launch 3, one team: thread r numbers the used blocks of pool chunk r.
template <class Space>
struct Number {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  Entries e;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t n = e.a.pool_blocks, threads = team.team_size();
    const std::int64_t chunk = (n + threads - 1) / threads;
    const std::int64_t begin = smaller(n, team.team_rank() * chunk), end = smaller(n, begin + chunk);
    std::int32_t used = 0;
    for (std::int64_t id = begin; id < end; ++id) used += e.a.first_use[id] != no_key ? 1 : 0;
    const std::int32_t before = team.team_scan(used);
    if (team.team_rank() == team.team_size() - 1) e.a.totals[1] = before + used;
    std::int32_t compact = before;
    for (std::int64_t id = begin; id < end; ++id) {
      if (e.a.first_use[id] == no_key) {
        e.a.compact_block[id] = 0;
        continue;
      }
      ++compact;
      e.a.compact_block[id] = compact;
      if (compact <= e.a.max_staged_blocks) e.a.staged_host_block[compact - 1] = static_cast<std::int32_t>(id);
    }
  }
};

// Launch 4, i in [0, num_requests * B): entry (i / B, i % B).
struct Table {
  Entries e;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    const std::int64_t p = i / e.a.blocks_per_request, b = i % e.a.blocks_per_request;
    std::int32_t compact = 0;
    if (b < e.context_blocks(p)) {
      const std::int32_t id = e.block_id(p, b);
      if (e.inside_pool(id)) {
        compact = e.a.compact_block[id];
        if (compact > e.a.max_staged_blocks) {
          e.record_bad_entry(e.key(p, b));
          compact = 0;
        }
      }
    }
    e.a.plan_block_table[i] = compact;
  }
};

// Launch 5, n in [0, (1 + max_staged_blocks) * block_size): staged row n.
struct Rows {
  Entries e;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t n) const {
    const std::int64_t compact = n / e.a.block_size, off = n % e.a.block_size;
    const std::int64_t used = smaller(e.a.totals[1], e.a.max_staged_blocks);
    std::int32_t host_row = -1, gpu_row = -1;
    if (compact >= 1 && compact <= used) {
      const std::int32_t id = e.a.staged_host_block[compact - 1];
      host_row = static_cast<std::int32_t>(std::int64_t{id} * e.a.block_size + off);
      // The first entry that uses the block decides its resident page.
      const std::int32_t key = e.a.first_use[id];
      const std::int64_t p = e.request_of(key), b = e.block_of(key);
      if (e.a.resident_block_table != nullptr && b < e.a.resident_blocks_per_request) {
        const std::int32_t page = e.a.resident_block_table[p * e.a.resident_table_stride + b];
        if (page >= 0 && page != e.a.resident_null_block) {
          gpu_row = static_cast<std::int32_t>(std::int64_t{page} * e.a.block_size + off);
        }
      }
    }
    e.a.row_ids[n] = host_row;
    e.a.gpu_row_ids[n] = gpu_row;
  }
};

// Launch 6, one thread.
struct Report {
  Entries e;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t) const {
    const std::int32_t key = e.a.totals[0];
    std::int32_t* record = e.a.error_record;
    if (key == no_key) {
      record[0] = static_cast<std::int32_t>(HiSparsePlanError::none);
      record[1] = record[2] = -1;
      record[3] = 0;
      return;
    }
    const std::int64_t p = e.request_of(key), b = e.block_of(key);
    HiSparsePlanError code = HiSparsePlanError::too_many_blocks;
    std::int32_t value = e.a.totals[1];
    if (b < 0) {
      code = HiSparsePlanError::bad_context_length;
      value = e.a.context_lengths[p];
    } else if (!e.inside_pool(e.block_id(p, b))) {
      value = e.block_id(p, b);
      code = value < 0 ? HiSparsePlanError::negative_block : HiSparsePlanError::block_outside_pool;
    }
    record[0] = static_cast<std::int32_t>(code);
    record[1] = static_cast<std::int32_t>(p);
    record[2] = static_cast<std::int32_t>(b);
    record[3] = value;
  }
};

// Threads of the numbering team on a GPU; one on the host.
constexpr int number_team_threads = 256;

}  // namespace hisparse_plan

template <class Space>
void plan_hisparse_prefill(const Space& space, const HiSparsePlanArgs& a) {
  using Range = Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>;
  const hisparse_plan::Entries e{a};
  const std::int64_t keys = std::int64_t{a.num_requests} * (std::int64_t{a.blocks_per_request} + 1);
  const std::int64_t entries = std::int64_t{a.num_requests} * a.blocks_per_request;
  const std::int64_t rows = (std::int64_t{a.max_staged_blocks} + 1) * a.block_size;
  Kokkos::parallel_for("sparse_mla::plan_hisparse_prefill::clear", Range(space, 0, std::int64_t{a.pool_blocks} + 1),
                       hisparse_plan::Clear{e});
  if (keys > 0) Kokkos::parallel_for("sparse_mla::plan_hisparse_prefill::mark", Range(space, 0, keys), hisparse_plan::Mark{e});
  Kokkos::parallel_for("sparse_mla::plan_hisparse_prefill::number",
                       Kokkos::TeamPolicy<Space>(space, 1, row_team_size<Space>(hisparse_plan::number_team_threads)),
                       hisparse_plan::Number<Space>{e});
  if (entries > 0) {
    Kokkos::parallel_for("sparse_mla::plan_hisparse_prefill::table", Range(space, 0, entries), hisparse_plan::Table{e});
  }
  Kokkos::parallel_for("sparse_mla::plan_hisparse_prefill::rows", Range(space, 0, rows), hisparse_plan::Rows{e});
  Kokkos::parallel_for("sparse_mla::plan_hisparse_prefill::report", Range(space, 0, 1), hisparse_plan::Report{e});
}

}  // namespace sparse_mla::kernels
