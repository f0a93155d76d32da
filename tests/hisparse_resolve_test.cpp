// The HiSparse resolve and row gather on every backend, against the scalar
// model of tools/validation/reference/hisparse_reference.hpp: cold loads, replays, random
// multi-step runs with evictions (after every step each hot slot holds its
// host row's bytes), resident pages, padding rows, rows outside the pool,
// duplicates, the early return, the hit and miss counters, and rejected calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "backend_test.hpp"
#include "sparse_mla/error.hpp"
#include "test_util.hpp"
#include "validation/hisparse_rig.hpp"

namespace sparse_mla::testing {
namespace {

using reference::HiSparseResult;
using reference::HiSparseState;
using reference::HiSparseStep;
using reference::HiSparseTables;
using validation::HiSparseRig;

// Production rows (K = 2048, H = 4096, power-of-two blocks) take the resolve
// in LRU order, every other shape the general resolve
// (core/kernels/hisparse_resolve.hpp): the tests run both.
class HiSparseResolveTest : public BackendTest {};
SPARSE_MLA_INSTANTIATE_BACKENDS(HiSparseResolveTest);

struct Shape {
  std::int32_t top_k = 64, hot_slots = 128, requests = 4, blocks = 16, block_size = 16;
  std::int32_t states = 4;
  bool resident = false;
};

// Production rows, two requests: K = 2048, H = 4096, blocks of 64 (powers of
// two), 256 blocks of context each.
Shape production_shape() {
  Shape shape;
  shape.top_k = 2048;
  shape.hot_slots = 4096;
  shape.requests = shape.states = 2;
  shape.blocks = 256;
  shape.block_size = 64;
  return shape;
}

// Source blocks are a shuffle of the pool (block 0 included); a few entries
// are -1 or point past the pool. Hot blocks: state s owns blocks
// 1 + s * per_row .. (block 0 is never used, as in the golden file).
HiSparseTables make_tables(const Shape& shape, std::mt19937_64& rng) {
  HiSparseTables t;
  t.top_k = shape.top_k;
  t.hot_slots = shape.hot_slots;
  t.source_rows = shape.requests;
  t.source_blocks = shape.blocks;
  t.source_block_size = shape.block_size;
  const std::int32_t pool_blocks = shape.requests * shape.blocks + 3;
  t.host_rows = std::int64_t(pool_blocks) * shape.block_size;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(pool_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  t.source_table.assign(ids.begin(), ids.begin() + std::ptrdiff_t(shape.requests) * shape.blocks);
  t.source_table[std::size_t(shape.blocks - 1)] = -1;            // request 0's last block: none
  if (shape.requests > 1) t.source_table[std::size_t(2 * shape.blocks - 1)] = pool_blocks + 5;  // past the pool
  if (shape.resident) {
    t.resident_rows = shape.requests;
    t.resident_blocks = shape.blocks;
    t.resident_block_size = shape.block_size;
    t.resident_null_block = 0;
    t.resident_table.assign(std::size_t(shape.requests) * shape.blocks, 0);
    for (std::int32_t r = 0; r < shape.requests; ++r) {
      for (std::int32_t b = 0; b < shape.blocks; ++b) {
        // About a fifth of the pages, block 1 of every request always.
        if (b == 1 || rng() % 5 == 0) t.resident_table[std::size_t(r) * shape.blocks + b] = 500 + r * shape.blocks + b;
      }
    }
  }
  t.hot_block_size = 32;
  t.hot_blocks_per_row = (shape.hot_slots + t.hot_block_size - 1) / t.hot_block_size;
  t.attention_block_stride = 2 * t.hot_block_size;
  return t;
}

std::int32_t hot_cache_blocks(const HiSparseTables& t, std::int32_t states) { return 1 + states * t.hot_blocks_per_row; }

std::vector<std::int32_t> hot_blocks_of_state(const HiSparseTables& t, std::int32_t state) {
  std::vector<std::int32_t> blocks(static_cast<std::size_t>(t.hot_blocks_per_row));
  for (std::int32_t i = 0; i < t.hot_blocks_per_row; ++i) blocks[std::size_t(i)] = state < 0 ? 0 : 1 + state * t.hot_blocks_per_row + i;
  return blocks;
}

// A step where batch row b is request requests[b] on state states[b].
HiSparseStep make_step(const HiSparseTables& t, const std::vector<std::int32_t>& requests,
                       const std::vector<std::int32_t>& states, const std::vector<std::vector<std::int32_t>>& selections) {
  HiSparseStep step;
  step.request_ids = requests;
  step.state_indices = states;
  for (std::size_t b = 0; b < requests.size(); ++b) {
    step.logical.insert(step.logical.end(), selections[b].begin(), selections[b].end());
    const auto blocks = hot_blocks_of_state(t, states[b]);
    step.hot_block_table.insert(step.hot_block_table.end(), blocks.begin(), blocks.end());
  }
  return step;
}

// K distinct positions: about `keep` of them from `previous`, the rest new,
// with a few -1 and a few past the table.
std::vector<std::int32_t> next_selection(const HiSparseTables& t, const std::vector<std::int32_t>& previous, double keep,
                                         std::mt19937_64& rng) {
  const std::int32_t context = t.source_blocks * t.source_block_size;
  std::set<std::int32_t> chosen;
  std::vector<std::int32_t> out;
  for (std::int32_t tok : previous) {
    if (tok >= 0 && std::uniform_real_distribution<double>(0, 1)(rng) < keep && chosen.insert(tok).second) out.push_back(tok);
  }
  while (out.size() < std::size_t(t.top_k)) {
    const std::uint64_t kind = rng() % 32;
    if (kind == 0) {
      out.push_back(-1);
      continue;
    }
    const std::int32_t tok = kind == 1 ? context + static_cast<std::int32_t>(rng() % 64)
                                       : static_cast<std::int32_t>(rng() % std::uint64_t(context));
    if (chosen.insert(tok).second) out.push_back(tok);
  }
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

// Every output of the kernel equals the model's; swap entries past the
// count are never written (they keep the poison).
void expect_same(const HiSparseResult& got, const HiSparseResult& want, std::int32_t K) {
  EXPECT_EQ(got.hot_indices, want.hot_indices);
  EXPECT_EQ(got.attention_indices, want.attention_indices);
  EXPECT_EQ(got.resolved_rows, want.resolved_rows);
  EXPECT_EQ(got.miss_mask, want.miss_mask);
  EXPECT_EQ(got.valid_counts, want.valid_counts);
  ASSERT_EQ(got.swap_counts, want.swap_counts);
  for (std::size_t b = 0; b < want.swap_counts.size(); ++b) {
    for (std::int32_t m = 0; m < K; ++m) {
      const std::size_t i = b * std::size_t(K) + std::size_t(m);
      if (m < want.swap_counts[b]) {
        EXPECT_EQ(got.swap_host_rows[i], want.swap_host_rows[i]) << "row " << b << " swap " << m;
        EXPECT_EQ(got.swap_device_rows[i], want.swap_device_rows[i]) << "row " << b << " swap " << m;
      } else {
        EXPECT_EQ(got.swap_host_rows[i], HiSparseRig::poison) << "row " << b << " swap " << m << " past the count was written";
        EXPECT_EQ(got.swap_device_rows[i], HiSparseRig::poison) << "row " << b << " swap " << m << " past the count was written";
      }
    }
  }
}

void expect_same_state(const HiSparseState& got, const HiSparseState& want) {
  EXPECT_EQ(got.slot_rows, want.slot_rows);
  EXPECT_EQ(got.lru, want.lru);
}

// The rig's state equals the model's.
void expect_state(HiSparseRig& rig, const HiSparseState& want) { expect_same_state(rig.state(), want); }

// Nothing lost: every occupied slot of every state row holds its host row's bytes.
void expect_slots_hold_host_rows(HiSparseRig& rig, const HiSparseState& state) {
  const auto cache = rig.hot_cache_bytes();
  const HiSparseTables& t = rig.tables();
  const std::size_t row_bytes = std::size_t(rig.row_bytes());
  std::int32_t occupied = 0;
  for (std::int32_t s = 0; s < state.states(); ++s) {
    const auto blocks = hot_blocks_of_state(t, s);
    for (std::int32_t slot = 0; slot < t.hot_slots; ++slot) {
      const std::int32_t g = state.slot_rows[std::size_t(s) * t.hot_slots + slot];
      if (g < 0) continue;
      ++occupied;
      const std::size_t x = std::size_t(blocks[std::size_t(slot / t.hot_block_size)]) * t.hot_block_size + slot % t.hot_block_size;
      const bool same = std::equal(cache.begin() + std::ptrdiff_t(x * row_bytes), cache.begin() + std::ptrdiff_t((x + 1) * row_bytes),
                                   rig.pool_row(g).begin());
      EXPECT_TRUE(same) << "state " << s << " slot " << slot << " should hold host row " << g;
    }
  }
  EXPECT_GT(occupied, 0);
}

// Runs `step` on the rig and through the model (which updates `state`): the
// outputs, the slot state and the hot slots' bytes agree; where the rig gives
// no optional outputs, their buffers keep the poison. Returns the model's
// result.
HiSparseResult run_step_as_model(HiSparseRig& rig, const HiSparseTables& t, const HiSparseStep& step, HiSparseState& state) {
  const HiSparseResult got = rig.run(step);
  const HiSparseResult want = reference::resolve_model(t, step, state);
  HiSparseResult expected = want;
  if (!rig.optional_outputs) {
    const std::vector<std::int32_t> untouched(want.hot_indices.size(), HiSparseRig::poison);
    expected.attention_indices = expected.resolved_rows = expected.miss_mask = untouched;
    expected.valid_counts.assign(want.valid_counts.size(), HiSparseRig::poison);
  }
  expect_same(got, expected, t.top_k);
  expect_same_state(rig.state(), state);
  expect_slots_hold_host_rows(rig, state);
  return want;
}

std::vector<std::int32_t> iota_vec(std::int32_t n, std::int32_t start = 0) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST_P(HiSparseResolveTest, ColdResolveLoadsKRowsAndPutsThemLast) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(1);
  auto stream = device->create_stream();
  Shape shape;
  shape.states = 1;
  shape.requests = 1;
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(1, t.hot_slots);
  HiSparseRig rig(*stream, t, state, 1, 656, hot_cache_blocks(t, 1), rng());
  // K distinct valid positions (the first blocks of the request hold real pool rows).
  std::vector<std::int32_t> selection = iota_vec(t.top_k, 3);
  std::shuffle(selection.begin(), selection.end(), rng);
  const HiSparseStep step = make_step(t, {0}, {0}, {selection});
  const HiSparseResult got = rig.run(step);
  const HiSparseResult want = reference::resolve_model(t, step, state);
  expect_same(got, want, t.top_k);
  expect_state(rig, state);

  ASSERT_EQ(got.swap_counts[0], t.top_k);
  EXPECT_EQ(got.valid_counts[0], t.top_k);
  const HiSparseState after = rig.state();
  // Slot m (the m-th oldest of a cold LRU) holds the m-th selected row, and
  // the loaded slots are the last K of the LRU, in miss order.
  for (std::int32_t m = 0; m < t.top_k; ++m) {
    EXPECT_EQ(after.slot_rows[std::size_t(m)], got.resolved_rows[std::size_t(m)]);
    EXPECT_EQ(after.lru[std::size_t(t.hot_slots - t.top_k + m)], m);
  }
  for (std::int32_t p = 0; p < t.hot_slots - t.top_k; ++p) EXPECT_EQ(after.lru[std::size_t(p)], t.top_k + p);
  expect_slots_hold_host_rows(rig, after);
  EXPECT_EQ(rig.hit_miss_counters(), (std::vector<std::int64_t>{0, t.top_k}));
}

TEST_P(HiSparseResolveTest, ReplayingTheSameSelectionIsAllHitsAndChangesNothing) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(2);
  auto stream = device->create_stream();
  Shape shape;
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(shape.states, t.hot_slots);
  HiSparseRig rig(*stream, t, state, shape.requests, 64, hot_cache_blocks(t, shape.states), rng());
  std::vector<std::vector<std::int32_t>> selections;
  for (std::int32_t b = 0; b < shape.requests; ++b) selections.push_back(next_selection(t, {}, 0, rng));
  const HiSparseStep step = make_step(t, iota_vec(shape.requests), iota_vec(shape.requests), selections);
  const HiSparseResult first = rig.run(step);
  reference::resolve_model(t, step, state);
  const HiSparseState loaded = rig.state();
  expect_same_state(loaded, state);
  const auto cache = rig.hot_cache_bytes();
  const auto counters = rig.hit_miss_counters();

  const HiSparseResult again = rig.run(step);
  const HiSparseResult want = reference::resolve_model(t, step, state);
  expect_same(again, want, t.top_k);
  EXPECT_EQ(again.hot_indices, first.hot_indices);
  for (std::int32_t b = 0; b < shape.requests; ++b) EXPECT_EQ(again.swap_counts[std::size_t(b)], 0);
  EXPECT_EQ(again.miss_mask, std::vector<std::int32_t>(again.miss_mask.size(), 0));
  expect_state(rig, loaded);  // the hits were already the most recent, in order
  EXPECT_EQ(rig.hot_cache_bytes(), cache);
  const auto counters_after = rig.hit_miss_counters();
  EXPECT_EQ(counters_after[1], counters[1]);
  std::int64_t distinct = 0;
  for (std::int32_t c : first.swap_counts) distinct += c;
  EXPECT_EQ(counters_after[0] - counters[0], distinct);
}

// The main property test: random steps with evictions, batch rows permuted
// over state rows, resident pages and a padding row now and then.
void run_random_steps(HiSparseRig& rig, const Shape& shape, HiSparseState& state, std::int32_t steps, std::mt19937_64& rng,
                      bool duplicates) {
  const HiSparseTables& t = rig.tables();
  std::vector<std::vector<std::int32_t>> previous(static_cast<std::size_t>(shape.requests));
  const std::vector<std::int64_t> counters_before = rig.hit_miss_counters();
  std::uint64_t hits = 0, misses = 0;
  for (std::int32_t s = 0; s < steps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    std::vector<std::int32_t> order = iota_vec(shape.requests);
    std::shuffle(order.begin(), order.end(), rng);  // batch row b serves request order[b] on state order[b]
    std::vector<std::int32_t> states = order;
    if (s % 3 == 2) states[rng() % states.size()] = -1;  // a padding row
    std::vector<std::vector<std::int32_t>> selections;
    for (std::int32_t r : order) {
      auto& sel = previous[std::size_t(r)];
      sel = next_selection(t, sel, 0.5, rng);
      if (duplicates) {
        for (int d = 0; d < 6; ++d) sel[rng() % sel.size()] = sel[rng() % sel.size()];
      }
      selections.push_back(sel);
    }
    const HiSparseResult want = run_step_as_model(rig, t, make_step(t, order, states, selections), state);
    hits += want.hits;
    misses += want.misses;
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(hits, 0u);
  EXPECT_GT(misses, 0u);
  EXPECT_EQ(rig.hit_miss_counters(), (std::vector<std::int64_t>{counters_before[0] + std::int64_t(hits),
                                                                 counters_before[1] + std::int64_t(misses)}));
}

TEST_P(HiSparseResolveTest, RandomStepsWithEvictionsLoseNothing) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(3);
  auto stream = device->create_stream();
  Shape shape;
  shape.hot_slots = 80;  // little slack: most steps evict
  shape.requests = shape.states = 5;
  shape.blocks = 24;
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(shape.states, t.hot_slots);
  HiSparseRig rig(*stream, t, state, shape.requests, 656, hot_cache_blocks(t, shape.states), rng());
  run_random_steps(rig, shape, state, 12, rng, false);
}

// Many steps at little slack (H barely above K) with repeated entries: nearly
// every step evicts, and the state still agrees with the model after each.
TEST_P(HiSparseResolveTest, ALongRunAtLittleSlackStaysExact) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(12);
  auto stream = device->create_stream();
  Shape shape;
  shape.top_k = 48;
  shape.hot_slots = 52;
  shape.requests = shape.states = 3;
  shape.blocks = 12;
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(shape.states, t.hot_slots);
  HiSparseRig rig(*stream, t, state, shape.requests, 32, hot_cache_blocks(t, shape.states), rng());
  run_random_steps(rig, shape, state, 30, rng, true);
}

// Production rows (the resolve in LRU order, a team of 1024 threads on a GPU)
// over many steps of about a thousand misses each: every slot is evicted and
// reloaded several times, and a row sits out about one step in six as padding.
TEST_P(HiSparseResolveTest, ProductionRowsStayExactOverManySteps) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(14);
  auto stream = device->create_stream();
  Shape shape = production_shape();
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(shape.states, t.hot_slots);
  HiSparseRig rig(*stream, t, state, shape.requests, 16, hot_cache_blocks(t, shape.states), rng());
  run_random_steps(rig, shape, state, 24, rng, false);
}

// Calls of another shape between production calls, on the same state rows:
// the general resolve and the resolve in LRU order take turns on one state.
TEST_P(HiSparseResolveTest, CallsOfAnotherShapeBetweenProductionCallsStayExact) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(15);
  auto stream = device->create_stream();
  const Shape shape = production_shape();
  const HiSparseTables wide = make_tables(shape, rng);
  HiSparseTables narrow = wide;
  narrow.top_k = 1000;  // neither 2048 nor a power of two
  HiSparseState state(shape.states, wide.hot_slots);
  HiSparseRig rig(*stream, wide, state, shape.requests, 16, hot_cache_blocks(wide, shape.states), rng());
  std::vector<std::vector<std::int32_t>> previous(2);
  for (int s = 0; s < 8; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    const bool production = s % 2 == 0;
    const HiSparseTables& t = production ? wide : narrow;
    // Steps 3 and 7 leave state row 1 out (a padding row).
    const std::vector<std::int32_t> states = {0, s % 4 == 3 ? -1 : 1};
    for (auto& sel : previous) sel = next_selection(t, sel, production ? 0.5 : 0.4, rng);  // at most K kept
    run_step_as_model(rig, t, make_step(t, {0, 1}, states, previous), state);
    if (::testing::Test::HasFailure()) return;
  }
}

// Gives the rig a hot block table indexed by state row (each state's own
// blocks, as hot_blocks_of_state places them) in place of the one by batch row.
void index_hot_table_by_state(HiSparseRig& rig, const HiSparseTables& t, std::int32_t states) {
  std::vector<std::int32_t> by_state;
  for (std::int32_t s = 0; s < states; ++s) {
    const auto blocks = hot_blocks_of_state(t, s);
    by_state.insert(by_state.end(), blocks.begin(), blocks.end());
  }
  rig.hot_table_by_state = sparse_mla::upload(rig.stream(), by_state, {states, t.hot_blocks_per_row});
}

TEST_P(HiSparseResolveTest, HotTableByStateRowMatchesTheTableByBatchRow) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(11);
  auto stream = device->create_stream();
  Shape shape;
  shape.hot_slots = 100;  // not a multiple of the hot block size
  shape.requests = shape.states = 6;
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(shape.states, t.hot_slots);
  HiSparseRig rig(*stream, t, state, shape.requests, 32, hot_cache_blocks(t, shape.states), rng());
  index_hot_table_by_state(rig, t, shape.states);
  run_random_steps(rig, shape, state, 8, rng, false);
}

TEST_P(HiSparseResolveTest, ResidentPagesBypassTheLru) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(4);
  auto stream = device->create_stream();
  Shape shape;
  shape.resident = true;
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(shape.states, t.hot_slots);
  HiSparseRig rig(*stream, t, state, shape.requests, 32, hot_cache_blocks(t, shape.states), rng());
  run_random_steps(rig, shape, state, 6, rng, false);

  // A row that selects only resident positions (and -1): outputs the
  // resident rows, swaps nothing, and leaves its LRU exactly as it was.
  std::vector<std::int32_t> selection(std::size_t(t.top_k), -1);
  std::size_t n = 0;
  for (std::int32_t tok = 0; tok < t.source_blocks * t.source_block_size && n < selection.size(); tok += 3) {
    if (reference::model_resident_row(t, 1, tok) >= 0) selection[n++] = tok;
  }
  ASSERT_GT(n, 0u);
  const HiSparseState before = rig.state();
  const HiSparseStep step = make_step(t, {1}, {2}, {selection});
  const HiSparseResult got = rig.run(step);
  const HiSparseResult want = reference::resolve_model(t, step, state);
  expect_same(got, want, t.top_k);
  EXPECT_EQ(got.swap_counts[0], 0);
  EXPECT_EQ(got.valid_counts[0], std::int32_t(n));
  for (std::size_t j = 0; j < n; ++j) EXPECT_EQ(got.hot_indices[j], reference::model_resident_row(t, 1, selection[j]));
  expect_state(rig, before);
}

TEST_P(HiSparseResolveTest, PaddingRowsOutputMinusOneAndLeaveStateAlone) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(5);
  auto stream = device->create_stream();
  Shape shape;
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(shape.states, t.hot_slots);
  HiSparseRig rig(*stream, t, state, shape.requests, 48, hot_cache_blocks(t, shape.states), rng());
  run_random_steps(rig, shape, state, 2, rng, false);
  const HiSparseState before = rig.state();
  std::vector<std::vector<std::int32_t>> selections;
  for (int b = 0; b < 3; ++b) selections.push_back(next_selection(t, {}, 0, rng));
  // State -1, and a state index past the state rows: both are padding.
  const HiSparseStep step = make_step(t, {0, 1, 2}, {-1, shape.states, -1}, selections);
  const HiSparseResult got = rig.run(step);
  const HiSparseResult want = reference::resolve_model(t, step, state);
  expect_same(got, want, t.top_k);
  EXPECT_EQ(got.hot_indices, std::vector<std::int32_t>(got.hot_indices.size(), -1));
  EXPECT_EQ(got.attention_indices, std::vector<std::int32_t>(got.hot_indices.size(), -1));
  EXPECT_EQ(got.resolved_rows, std::vector<std::int32_t>(got.hot_indices.size(), -1));
  EXPECT_EQ(got.valid_counts, (std::vector<std::int32_t>{0, 0, 0}));
  EXPECT_EQ(got.swap_counts, (std::vector<std::int32_t>{0, 0, 0}));
  expect_state(rig, before);
}

TEST_P(HiSparseResolveTest, DuplicatesInOneSelectionCollapse) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(6);
  auto stream = device->create_stream();
  Shape shape;
  shape.hot_slots = 96;
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(shape.states, t.hot_slots);
  HiSparseRig rig(*stream, t, state, shape.requests, 16, hot_cache_blocks(t, shape.states), rng());

  // Every position twice: K / 2 distinct rows, one slot each, one swap each.
  std::vector<std::int32_t> half = iota_vec(t.top_k / 2, 1);
  std::vector<std::int32_t> selection = half;
  selection.insert(selection.end(), half.begin(), half.end());
  std::shuffle(selection.begin(), selection.end(), rng);
  const HiSparseStep step = make_step(t, {2}, {1}, {selection});
  const HiSparseResult got = rig.run(step);
  const HiSparseResult want = reference::resolve_model(t, step, state);
  expect_same(got, want, t.top_k);
  expect_state(rig, state);
  EXPECT_EQ(got.swap_counts[0], t.top_k / 2);
  EXPECT_EQ(got.valid_counts[0], t.top_k);
  for (std::int32_t i = 0; i < t.top_k; ++i) {
    for (std::int32_t j = 0; j < t.top_k; ++j) {
      if (selection[std::size_t(i)] == selection[std::size_t(j)]) {
        EXPECT_EQ(got.hot_indices[std::size_t(i)], got.hot_indices[std::size_t(j)]);
      }
    }
  }
  EXPECT_EQ(std::accumulate(got.miss_mask.begin(), got.miss_mask.end(), 0), t.top_k / 2);
  expect_slots_hold_host_rows(rig, state);

  run_random_steps(rig, shape, state, 6, rng, true);
}

TEST_P(HiSparseResolveTest, RowsOutsideThePoolResolveToMinusOne) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(7);
  auto stream = device->create_stream();
  Shape shape;
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(shape.states, t.hot_slots);
  HiSparseRig rig(*stream, t, state, shape.requests, 16, hot_cache_blocks(t, shape.states), rng());
  // Request 0's last block is -1, request 1's last block is past the pool,
  // and positions past the table, negative ones and a request id outside the
  // table give no host row either.
  const std::int32_t last = (t.source_blocks - 1) * t.source_block_size;
  std::vector<std::int32_t> selection(std::size_t(t.top_k), -7);
  for (std::int32_t j = 0; j < 8; ++j) selection[std::size_t(j)] = last + j;
  selection[8] = t.source_blocks * t.source_block_size;
  selection[9] = 2;  // the one valid entry
  const HiSparseStep step = make_step(t, {0, 1, 9}, {0, 1, 2}, {selection, selection, selection});
  const HiSparseResult got = rig.run(step);
  const HiSparseResult want = reference::resolve_model(t, step, state);
  expect_same(got, want, t.top_k);
  expect_state(rig, state);
  EXPECT_EQ(got.valid_counts, (std::vector<std::int32_t>{1, 1, 0}));
  EXPECT_EQ(got.swap_counts, (std::vector<std::int32_t>{1, 1, 0}));
  for (std::size_t j = 0; j < std::size_t(t.top_k); ++j) {
    if (j != 9) {
      EXPECT_EQ(got.resolved_rows[j], -1) << j;
    }
  }
}

TEST_P(HiSparseResolveTest, GatherZeroFillsHostRowsOutsideThePool) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(8);
  auto stream = device->create_stream();
  const std::int64_t row_bytes = 48, host_rows = 10;
  std::vector<std::uint8_t> pool(static_cast<std::size_t>(host_rows * row_bytes));
  for (auto& b : pool) b = static_cast<std::uint8_t>(rng() | 1);
  const auto host = device_tensor(*device, *stream, pool, {host_rows, row_bytes}, MemoryKind::pinned_host);
  const std::int32_t blocks = 3, block_size = 4;
  std::vector<std::uint8_t> cache(std::size_t(blocks * block_size * row_bytes), 0xEE);
  const auto hot = device_tensor(*device, *stream, cache, {blocks, block_size, row_bytes});
  // Row 0: host row 3 -> hot 5, host row 10 (past the pool) -> hot 6, host
  // row -1 -> hot 7 (skipped), host row 2 -> hot 12 (past the cache, skipped),
  // then an entry past the count. Row 1: negative count (nothing).
  const auto swap_host = device_tensor(*device, *stream, std::vector<std::int32_t>{3, 10, -1, 2, 4, 1, 1, 1, 1, 1}, {2, 5});
  const auto swap_device = device_tensor(*device, *stream, std::vector<std::int32_t>{5, 6, 7, 12, 8, 0, 0, 0, 0, 0}, {2, 5});
  const auto counts = device_tensor(*device, *stream, std::vector<std::int32_t>{4, -3}, {2});
  gather_hisparse(*stream, HiSparseGatherTensors{host.tensor, hot.tensor, swap_host.tensor, swap_device.tensor, counts.tensor}, 2);
  std::vector<std::uint8_t> want = cache;
  std::copy(pool.begin() + 3 * row_bytes, pool.begin() + 4 * row_bytes, want.begin() + 5 * row_bytes);
  std::fill(want.begin() + 6 * row_bytes, want.begin() + 7 * row_bytes, 0);
  EXPECT_EQ(download<std::uint8_t>(*device, *stream, hot.buffer, want.size()), want);
}

TEST_P(HiSparseResolveTest, KernelMatchesModelAtProductionWidth) {
  // K = 2048 and H = 4096: the scratch no longer fits small shared memories
  // (level-1 scratch on the host), and the prefix sums span many chunks.
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(9);
  auto stream = device->create_stream();
  Shape shape = production_shape();
  shape.resident = true;
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(shape.states, t.hot_slots);
  HiSparseRig rig(*stream, t, state, shape.requests, 16, hot_cache_blocks(t, shape.states), rng());
  run_random_steps(rig, shape, state, 3, rng, true);
}

// Production rows (K = 2048, H = 4096) step by step through every kind of
// row: cold (all misses), replayed (all hits), every position selected twice
// (repeats of hits and of misses in one row), resident and invalid entries
// only (no slot consulted), padding, then random steps with duplicates; the
// hot block table by state row. Each step against the model.
TEST_P(HiSparseResolveTest, ProductionRowsMatchTheModelInEveryKindOfRow) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(16);
  auto stream = device->create_stream();
  Shape shape = production_shape();
  shape.resident = true;
  shape.requests = shape.states = 3;
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(shape.states, t.hot_slots);
  HiSparseRig rig(*stream, t, state, shape.requests, 16, hot_cache_blocks(t, shape.states), rng());
  index_hot_table_by_state(rig, t, shape.states);
  const std::vector<std::int32_t> rows = iota_vec(shape.requests);
  std::vector<std::vector<std::int32_t>> selections;
  for (std::size_t r = 0; r < rows.size(); ++r) selections.push_back(next_selection(t, {}, 0, rng));
  const std::vector<std::int64_t> counters_before = rig.hit_miss_counters();
  std::int64_t hits = 0, misses = 0;
  const auto count = [&](const HiSparseResult& want) {
    hits += std::int64_t(want.hits);
    misses += std::int64_t(want.misses);
  };
  {
    SCOPED_TRACE("cold");
    const HiSparseResult want = run_step_as_model(rig, t, make_step(t, rows, rows, selections), state);
    count(want);
    EXPECT_GT(want.misses, 3u * 1000u);  // a fifth of the pages are resident
  }
  {
    SCOPED_TRACE("replayed");
    const HiSparseResult want = run_step_as_model(rig, t, make_step(t, rows, rows, selections), state);
    count(want);
    EXPECT_EQ(want.misses, 0u);
  }
  {
    SCOPED_TRACE("every position twice");
    for (auto& sel : selections) {
      std::vector<std::int32_t> half = next_selection(t, sel, 0.5, rng);
      half.resize(std::size_t(t.top_k / 2));
      sel = half;
      sel.insert(sel.end(), half.begin(), half.end());
      std::shuffle(sel.begin(), sel.end(), rng);
    }
    const HiSparseResult want = run_step_as_model(rig, t, make_step(t, rows, rows, selections), state);
    count(want);
    EXPECT_GT(want.misses, 0u);
    EXPECT_GT(want.hits, 0u);
  }
  {
    SCOPED_TRACE("resident and invalid only, padding");
    std::vector<std::int32_t> resident_only(std::size_t(t.top_k), -1);
    std::size_t n = 0;
    for (std::int32_t tok = 0; tok < t.source_blocks * t.source_block_size && n < resident_only.size(); tok += 5) {
      if (reference::model_resident_row(t, 1, tok) >= 0) resident_only[n++] = tok;
    }
    ASSERT_GT(n, 0u);
    std::shuffle(resident_only.begin(), resident_only.end(), rng);
    selections[1] = resident_only;
    selections[2] = next_selection(t, selections[2], 0.9, rng);
    count(run_step_as_model(rig, t, make_step(t, {0, 1, 2}, {-1, 1, 2}, selections), state));
  }
  // The counters add each step's hits and misses (none for padding, resident
  // or invalid entries).
  EXPECT_EQ(rig.hit_miss_counters(), (std::vector<std::int64_t>{counters_before[0] + hits, counters_before[1] + misses}));
  run_random_steps(rig, shape, state, 4, rng, true);
}

// Production rows with hot blocks at both ends of what the hot block table
// holds: 8 rows (512 blocks, more than the resolve in LRU order caches: the
// general resolve takes them and reads the hot block table from global
// memory), 16 rows (256 blocks, the most the resolve in LRU order caches) and
// one block larger than all H slots; padding by a state index past the
// state rows.
TEST_P(HiSparseResolveTest, ProductionRowsWithTheSmallestAndLargestHotBlocks) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(17);
  auto stream = device->create_stream();
  for (const std::int32_t hot_block : {8, 16, 8192}) {
    SCOPED_TRACE("hot blocks of " + std::to_string(hot_block));
    Shape shape = production_shape();
    HiSparseTables t = make_tables(shape, rng);
    t.hot_block_size = hot_block;
    t.hot_blocks_per_row = (t.hot_slots + hot_block - 1) / hot_block;
    t.attention_block_stride = 2 * hot_block;
    HiSparseState state(shape.states, t.hot_slots);
    HiSparseRig rig(*stream, t, state, shape.requests, 16, hot_cache_blocks(t, shape.states), rng());
    std::vector<std::vector<std::int32_t>> selections;
    for (std::int32_t r = 0; r < shape.requests; ++r) selections.push_back(next_selection(t, {}, 0, rng));
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      for (auto& sel : selections) sel = next_selection(t, sel, 0.5, rng);
      const std::vector<std::int32_t> states = step == 2 ? std::vector<std::int32_t>{0, shape.states}
                                                         : std::vector<std::int32_t>{0, 1};
      run_step_as_model(rig, t, make_step(t, {0, 1}, states, selections), state);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Production rows without any optional output (attention indices, resolved
// rows, miss mask, valid counts, counters): the hot indices, the swap lists
// and the state match the model step after step, with hits, misses and
// repeated entries, and the optional outputs' buffers and the counters are
// never written.
TEST_P(HiSparseResolveTest, ProductionRowsWithoutTheOptionalOutputs) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(18);
  auto stream = device->create_stream();
  Shape shape = production_shape();
  shape.resident = true;
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(shape.states, t.hot_slots);
  HiSparseRig rig(*stream, t, state, shape.requests, 16, hot_cache_blocks(t, shape.states), rng());
  rig.optional_outputs = false;
  const std::vector<std::int64_t> counters_before = rig.hit_miss_counters();
  const std::vector<std::int32_t> rows = iota_vec(shape.requests);
  std::vector<std::vector<std::int32_t>> selections(rows.size());
  std::uint64_t hits = 0, misses = 0;
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    for (auto& sel : selections) {
      sel = next_selection(t, sel, 0.5, rng);
      for (int d = 0; d < 6; ++d) sel[rng() % sel.size()] = sel[rng() % sel.size()];
    }
    const HiSparseResult want = run_step_as_model(rig, t, make_step(t, rows, rows, selections), state);
    hits += want.hits;
    misses += want.misses;
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(hits, 0u);
  EXPECT_GT(misses, 0u);
  EXPECT_EQ(rig.hit_miss_counters(), counters_before);
}

TEST_P(HiSparseResolveTest, BlockSizesThatAreNotPowersOfTwo) {
  // The kernel shifts and masks by power-of-two block sizes and divides by
  // the others: source, resident and hot blocks of 12, 12 and 24 rows.
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(14);
  auto stream = device->create_stream();
  Shape shape;
  shape.block_size = 12;
  shape.hot_slots = 100;
  shape.resident = true;
  HiSparseTables t = make_tables(shape, rng);
  t.hot_block_size = 24;
  t.hot_blocks_per_row = (t.hot_slots + t.hot_block_size - 1) / t.hot_block_size;
  t.attention_block_stride = 40;
  HiSparseState state(shape.states, t.hot_slots);
  HiSparseRig rig(*stream, t, state, shape.requests, 16, hot_cache_blocks(t, shape.states), rng());
  run_random_steps(rig, shape, state, 6, rng, true);
}

// The kernel packs entry indices, miss numbers and slot + 1 into 15 and 16
// bits of its set words (core/kernels/hisparse_resolve_general.hpp): these two tests
// run the largest values the op accepts (H = 32768, K = H).

TEST_P(HiSparseResolveTest, KernelMatchesModelWithTheLargestSlotIds) {
  // H = 32768 with a reversed LRU: the first loads take slots 32767, 32766,
  // ..., so later steps hit slots whose id + 1 is 2^15.
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(12);
  auto stream = device->create_stream();
  Shape shape;
  shape.top_k = 512;
  shape.hot_slots = hisparse_max_hot_slots;
  shape.requests = shape.states = 2;
  shape.blocks = 32;
  shape.block_size = 64;
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(shape.states, t.hot_slots);
  for (std::int32_t s = 0; s < shape.states; ++s) {
    for (std::int32_t p = 0; p < t.hot_slots; ++p) {
      state.lru[std::size_t(s) * t.hot_slots + p] = static_cast<std::int16_t>(t.hot_slots - 1 - p);
    }
  }
  HiSparseRig rig(*stream, t, state, shape.requests, 16, hot_cache_blocks(t, shape.states), rng());
  // A cold step, then the same selections again: every slot it loaded,
  // 32767 first, is a hit.
  const std::vector<std::vector<std::int32_t>> selections{next_selection(t, {}, 0, rng), next_selection(t, {}, 0, rng)};
  const HiSparseStep step = make_step(t, {0, 1}, {0, 1}, selections);
  for (int pass = 0; pass < 2; ++pass) {
    const HiSparseResult got = rig.run(step);
    const HiSparseResult want = reference::resolve_model(t, step, state);
    expect_same(got, want, t.top_k);
    expect_state(rig, state);
    if (pass == 1) {
      EXPECT_EQ(want.misses, 0u);
    }
  }
  EXPECT_GE(state.slot_rows[std::size_t(t.hot_slots - 1)], 0);
  run_random_steps(rig, shape, state, 4, rng, true);
}

TEST_P(HiSparseResolveTest, KernelMatchesModelAtTheLargestTopK) {
  // K = H = 32768. A cold step loads 32768 distinct rows (entries and miss
  // numbers up to 32767, set positions up to 65535); it is checked in closed
  // form, as the scalar model is quadratic in K. Then a step of 1024 rows of
  // the first (hits) and 1024 new ones (misses), each selected many times
  // across all K entries, against the model.
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(13);
  auto stream = device->create_stream();
  Shape shape;
  shape.top_k = shape.hot_slots = hisparse_max_hot_slots;
  shape.requests = shape.states = 1;
  shape.blocks = 1024;
  shape.block_size = 64;
  const HiSparseTables t = make_tables(shape, rng);
  const std::int32_t K = t.top_k;
  HiSparseState state(1, t.hot_slots);
  HiSparseRig rig(*stream, t, state, 1, 16, hot_cache_blocks(t, 1), rng());

  // Positions [0, K) are all in the pool: entry m is the m-th miss and takes
  // slot m (a cold LRU is 0 .. H - 1), and with K = H the LRU stays as it is.
  std::vector<std::int32_t> cold = iota_vec(K);
  std::shuffle(cold.begin(), cold.end(), rng);
  const HiSparseStep first = make_step(t, {0}, {0}, {cold});
  const HiSparseResult got = rig.run(first);
  ASSERT_EQ(got.swap_counts, std::vector<std::int32_t>{K});
  ASSERT_EQ(got.valid_counts, std::vector<std::int32_t>{K});
  for (std::int32_t m = 0; m < K; ++m) {
    const std::int32_t g = reference::model_host_row(t, 0, cold[std::size_t(m)]);
    const std::int32_t x = reference::model_hot_row(t, first, 0, m);
    ASSERT_GE(g, 0);
    ASSERT_EQ(got.resolved_rows[std::size_t(m)], g) << m;
    ASSERT_EQ(got.hot_indices[std::size_t(m)], x) << m;
    ASSERT_EQ(got.attention_indices[std::size_t(m)], reference::model_attention_index(t, x)) << m;
    ASSERT_EQ(got.miss_mask[std::size_t(m)], 1) << m;
    ASSERT_EQ(got.swap_host_rows[std::size_t(m)], g) << m;
    ASSERT_EQ(got.swap_device_rows[std::size_t(m)], x) << m;
    state.slot_rows[std::size_t(m)] = g;
  }
  expect_state(rig, state);

  std::vector<std::int32_t> rows(cold.begin(), cold.begin() + 1024);
  for (std::int32_t i = 0; i < 1024; ++i) rows.push_back(K + static_cast<std::int32_t>(rng() % std::uint64_t(K)));
  std::vector<std::int32_t> mixed(static_cast<std::size_t>(K));
  for (auto& tok : mixed) tok = rng() % 16 == 0 ? -1 : rows[rng() % rows.size()];
  const HiSparseStep second = make_step(t, {0}, {0}, {mixed});
  const HiSparseResult got2 = rig.run(second);
  const HiSparseResult want2 = reference::resolve_model(t, second, state);
  expect_same(got2, want2, K);
  expect_state(rig, state);
  EXPECT_GT(want2.hits, 0u);
  EXPECT_GT(want2.misses, 0u);
  expect_slots_hold_host_rows(rig, state);
}

TEST_P(HiSparseResolveTest, RejectedCallsNameTheArgumentAndWriteNothing) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(10);
  auto stream = device->create_stream();
  Shape shape;
  const HiSparseTables t = make_tables(shape, rng);
  HiSparseState state(shape.states, t.hot_slots);
  HiSparseRig rig(*stream, t, state, shape.requests, 16, hot_cache_blocks(t, shape.states), rng());
  std::vector<std::vector<std::int32_t>> selections(4, next_selection(t, {}, 0, rng));
  const HiSparseStep step = make_step(t, iota_vec(4), iota_vec(4), selections);
  const auto logical = device_tensor(*device, *stream, step.logical, {4, t.top_k});
  const auto ids = device_tensor(*device, *stream, step.request_ids, {4});
  const auto states = device_tensor(*device, *stream, step.state_indices, {4});
  const auto hot_table = device_tensor(*device, *stream, step.hot_block_table, {4, t.hot_blocks_per_row});
  const auto short_table = device_tensor(*device, *stream, std::vector<std::int32_t>(4, 1), {4, 1});
  const auto lru16 = device_tensor(*device, *stream, std::vector<std::int32_t>(std::size_t(4 * t.hot_slots), 0), {4, t.hot_slots});
  rig.poison_outputs();
  const HiSparseSlotState slots = rig.slot_state();
  const auto expect_error = [&](const char* fragment, auto call) {
    try {
      call();
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error("hot_slots must be in [K", [&] { resolve_hisparse(*stream, rig.inputs(logical.tensor, ids.tensor, states.tensor, hot_table.tensor), slots, t.top_k - 1, rig.outputs()); });
  expect_error("hot_block_table has shape [4, 1]", [&] { resolve_hisparse(*stream, rig.inputs(logical.tensor, ids.tensor, states.tensor, short_table.tensor), slots, t.hot_slots, rig.outputs()); });
  expect_error("lru has dtype I32", [&] {
    resolve_hisparse(*stream, rig.inputs(logical.tensor, ids.tensor, states.tensor, hot_table.tensor), HiSparseSlotState{rig.slot_state().slot_rows, lru16.tensor}, t.hot_slots, rig.outputs());
  });
  HiSparseResolveOutputs narrow = rig.outputs();
  narrow.swap_counts = narrow.swap_counts.rows(0, 2);
  expect_error("swap_counts has shape [2]", [&] { resolve_hisparse(*stream, rig.inputs(logical.tensor, ids.tensor, states.tensor, hot_table.tensor), slots, t.hot_slots, narrow); });
  const auto odd_pool = device_tensor(*device, *stream, std::vector<std::uint8_t>(40 * 10), {10, 40}, MemoryKind::pinned_host);
  expect_error("multiple of 16 bytes", [&] {
    const HiSparseResolveOutputs out = rig.outputs();
    gather_hisparse(*stream, HiSparseGatherTensors{odd_pool.tensor, rig.hot_cache(), out.swap_host_rows, out.swap_device_rows, out.swap_counts}, 4);
  });
  // Nothing was written: every output still holds the poison, the state is as set up.
  stream->synchronize();
  EXPECT_EQ(sparse_mla::download<std::int32_t>(*stream, rig.outputs().hot_indices),
            std::vector<std::int32_t>(std::size_t(4 * t.top_k), HiSparseRig::poison));
  EXPECT_EQ(sparse_mla::download<std::int32_t>(*stream, rig.outputs().swap_counts), std::vector<std::int32_t>(4, HiSparseRig::poison));
  expect_state(rig, state);
}

}  // namespace
}  // namespace sparse_mla::testing
