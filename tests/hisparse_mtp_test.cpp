// HiSparse groups under speculative decoding (HiSparseConfig::
// max_rows_per_request > 1, docs/hisparse.md "Speculative decoding") on every
// backend: the consecutive batch rows of one request resolve once, as the
// union of their selections, and every row's outputs and share of the swap
// list come from that union. Checked against the scalar model
// (reference::resolve_mtp_model) over several steps of fresh random data,
// under the host delay switch, with every output poisoned first; the hot
// caches against the host pools; bad requests on the device; the refused
// configurations; a step that allocates nothing and never waits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend_test.hpp"
#include "validation/reference/hisparse_reference.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/fill.hpp"
#include "sparse_mla/hisparse_group.hpp"
#include "sparse_mla/index_group_builder.hpp"
#include "sparse_mla/kokkos_runtime.hpp"
#include "hisparse_engine.hpp"
#include "test_util.hpp"

namespace sparse_mla::testing {
namespace {

class HiSparseMtpTest : public BackendTest {};
SPARSE_MLA_INSTANTIATE_BACKENDS(HiSparseMtpTest);

// K entries a row, up to R rows a request: unions of up to 96 positions in
// 128 hot slots (the default (R + 1) * K), out of 256 positions a request.
constexpr std::int32_t K = 32, R = 3, H = (R + 1) * K, requests = 6, blocks = 16, block_size = 16;
constexpr std::int32_t max_decode_rows = 17;  // workspace rows: 18
constexpr std::int32_t context = blocks * block_size;

HiSparseConfig mtp_config(std::int32_t rows_per_request = R) {
  HiSparseConfig c;
  c.max_rows_per_request = rows_per_request;
  c.hot_slots = rows_per_request == R ? 0 : H;  // 0: the default, (R + 1) * K
  c.max_requests = requests;
  c.max_tokens_per_request = context;
  c.host_pool_rows = (requests * blocks + 4) * block_size;
  c.block_size = block_size;
  c.attention_block_stride = 2 * block_size;
  return c;
}

LayerConfig mtp_layer(const char* dtype, std::int64_t head_size, std::int32_t rows_per_request = R) {
  LayerConfig c;
  c.kv_cache_dtype = dtype;
  c.head_size = head_size;
  c.hisparse = mtp_config(rows_per_request);
  return c;
}

// Layers of HiSparse groups over one source table, their host pools filled
// with random rows through the host mirror.
struct Engine : HiSparseEngine {
  Engine(std::shared_ptr<Device> d, const std::vector<bool>& producing, const std::vector<LayerConfig>& configs,
         std::mt19937_64& rng)
      : HiSparseEngine(std::move(d), HiSparseShape{K, H, requests, blocks, block_size, max_decode_rows}, mtp_config(),
                       producing, configs, rng) {}
};

// One step's batch: rows by request, padding rows between them.
struct Batch {
  reference::HiSparseStep step;
  bool hot_table_by_batch_row = false;  // else the groups' own blocks, by state row
};

// K positions of a request's context, a few -1 and a few repeated; kept
// partly from `keep` (earlier rows of the request, or its last step), so
// that a request's rows overlap and steps hit as well as miss.
std::vector<std::int32_t> select_row(std::mt19937_64& rng, const std::vector<std::int32_t>& keep) {
  std::vector<std::int32_t> row;
  for (std::int32_t tok : keep) {
    if (tok >= 0 && row.size() < std::size_t(K) && rng() % 3 == 0) row.push_back(tok);
  }
  while (row.size() < std::size_t(K)) {
    const std::uint64_t kind = rng() % 32;
    if (kind == 0) {
      row.push_back(-1);
    } else if (kind == 1 && !row.empty()) {
      row.push_back(row[std::size_t(rng() % row.size())]);  // a position selected twice in one row
    } else {
      row.push_back(static_cast<std::int32_t>(rng() % context));
    }
  }
  std::shuffle(row.begin(), row.end(), rng);
  return row;
}

// Five of the six requests, in random order, with 1..R rows each, and up to
// two padding rows between them. `last` holds each request's last selections.
Batch random_batch(std::mt19937_64& rng, std::vector<std::vector<std::int32_t>>& last, bool hot_table_by_batch_row) {
  Batch batch;
  batch.hot_table_by_batch_row = hot_table_by_batch_row;
  std::vector<std::int32_t> order(requests);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  order.pop_back();
  reference::HiSparseStep& step = batch.step;
  std::int32_t padding = 2;
  const auto add_row = [&](std::int32_t request, std::int32_t state, const std::vector<std::int32_t>& selection) {
    step.request_ids.push_back(request);
    step.state_indices.push_back(state);
    step.logical.insert(step.logical.end(), selection.begin(), selection.end());
    for (std::int32_t i = 0; i < H / block_size; ++i) step.hot_block_table.push_back(state < 0 ? 0 : state * (H / block_size) + i);
  };
  for (std::int32_t q : order) {
    if (padding > 0 && rng() % 3 == 0) {
      --padding;
      add_row(static_cast<std::int32_t>(rng() % requests), -1, select_row(rng, {}));
    }
    const std::int32_t rows = 1 + static_cast<std::int32_t>(rng() % R);
    std::vector<std::int32_t> keep = last[std::size_t(q)], all;
    for (std::int32_t r = 0; r < rows; ++r) {
      const std::vector<std::int32_t> row = select_row(rng, keep);
      add_row(q, q, row);
      all.insert(all.end(), row.begin(), row.end());
      keep = row;
    }
    last[std::size_t(q)] = all;
  }
  return batch;
}

// Runs `batch` through layers [first, first + count) of `e` (one group) and
// compares every output of the group with `want` and its state with `model`.
void run_and_compare(Engine& e, std::size_t first, std::size_t count, const Batch& batch,
                     const reference::HiSparseResult& want, const reference::HiSparseState& model) {
  Device& device = *e.device;
  Stream& compute = *e.compute;
  const reference::HiSparseStep& step = batch.step;
  const std::int32_t T = step.rows();
  const auto logical_src = device_tensor(device, compute, step.logical, {T, K});
  compute.copy_bytes(e.logical_buffer.data(), logical_src.tensor.data(), step.logical.size() * 4);
  const auto req_ids = device_tensor(device, compute, step.request_ids, {T});
  const auto states = device_tensor(device, compute, step.state_indices, {T});
  const auto hot_table = device_tensor(device, compute, step.hot_block_table, {T, H / block_size});
  HiSparseBatch hb;
  hb.request_state_indices = states.tensor;
  if (batch.hot_table_by_batch_row) hb.hot_block_table = hot_table.tensor;
  BatchMetadata meta;
  meta.req_id_per_token = req_ids.tensor;
  meta.block_table = e.source.tensor;
  meta.block_size = block_size;
  meta.hisparse = &hb;
  const Tensor logical = e.logical_buffer.rows(0, T);
  HiSparseMLAIndexGroup& g = e.group(first);
  // Every output of the step poisoned first (on the compute stream, which the side stream joins).
  for (const Tensor& t : {g.physical_workspace(), g.valid_counts_workspace(), g.hot_indices(), g.miss_mask(),
                          g.swap_host_rows(), g.swap_device_rows(), g.swap_counts()}) {
    fill_i32(compute, t, poison_i32);
  }
  for (std::size_t l = first; l < first + count; ++l) {
    const int index = e.layers[l].index_in_group;
    g.set_logical_topk_ready(index, compute);
    g.prepare_for_batch(index, meta, compute);
    const TopkConversion conv = g.convert_logical_to_physical_topk(index, compute, logical, meta, 0, true);
    EXPECT_EQ(download_rows<std::int32_t>(device, compute, conv.physical), want.attention_indices) << "layer " << l;
    EXPECT_EQ(download_rows<std::int32_t>(device, compute, conv.valid_counts), want.valid_counts) << "layer " << l;
    // Every occupied slot of this layer's hot cache holds this layer's host row.
    const HiSparseCacheHandle& cache = g.cache(index);
    const auto hot = download_rows<std::uint8_t>(device, compute, cache.attention_cache());
    const std::size_t rb = std::size_t(cache.row_bytes());
    for (std::int32_t st = 0; st < requests; ++st) {
      for (std::int32_t slot = 0; slot < H; ++slot) {
        const std::int32_t row = model.slot_rows[std::size_t(st * H + slot)];
        if (row < 0) continue;
        const std::size_t x = std::size_t((st * (H / block_size) + slot / block_size) * 2 * block_size + slot % block_size);
        ASSERT_TRUE(std::equal(hot.begin() + std::ptrdiff_t(x * rb), hot.begin() + std::ptrdiff_t((x + 1) * rb),
                               e.pools[l].begin() + std::ptrdiff_t(std::size_t(row) * rb)))
            << "layer " << l << " state " << st << " slot " << slot;
      }
    }
  }
  EXPECT_EQ(download_rows<std::int32_t>(device, compute, g.hot_indices().rows(0, T)), want.hot_indices);
  EXPECT_EQ(download_rows<std::int32_t>(device, compute, g.miss_mask().rows(0, T)), want.miss_mask);
  const auto swap_counts = download_rows<std::int32_t>(device, compute, g.swap_counts().rows(0, T));
  EXPECT_EQ(swap_counts, want.swap_counts);
  const auto swap_host = download_rows<std::int32_t>(device, compute, g.swap_host_rows().rows(0, T));
  const auto swap_device = download_rows<std::int32_t>(device, compute, g.swap_device_rows().rows(0, T));
  for (std::int32_t b = 0; b < T; ++b) {
    for (std::int32_t c = 0; c < want.swap_counts[std::size_t(b)] && c < swap_counts[std::size_t(b)]; ++c) {
      const std::size_t i = std::size_t(b) * K + std::size_t(c);
      EXPECT_EQ(swap_host[i], want.swap_host_rows[i]) << "row " << b << " swap " << c;
      EXPECT_EQ(swap_device[i], want.swap_device_rows[i]) << "row " << b << " swap " << c;
    }
  }
  EXPECT_EQ(download_rows<std::int32_t>(device, compute, g.slot_rows()), model.slot_rows);
  EXPECT_EQ(download_rows<std::int16_t>(device, compute, g.lru()), model.lru);
}

// The main test: steps of mixed requests through a two-layer MTP group.
TEST_P(HiSparseMtpTest, RowsOfOneRequestResolveAsTheUnionOfTheirSelections) {
  SCOPED_TRACE(seed_trace());
  DelayScope delay(200);
  auto rng = seeded_rng(81);
  Engine e(device, {true, false}, {mtp_layer("fp8_ds_mla", 576), mtp_layer("bfloat16", 64)}, rng);
  ASSERT_EQ(e.group(0).config().hot_slots, H) << "the default hot slots: (R + 1) * K";
  reference::HiSparseState model(requests, H);
  std::vector<std::vector<std::int32_t>> last(requests);
  std::uint64_t hits = 0, misses = 0, multi_row_requests = 0, shared_positions = 0, evictions = 0;
  const int steps = 8;
  for (int s = 0; s < steps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    const Batch batch = random_batch(rng, last, s % 2 == 1);
    const reference::HiSparseState before = model;
    const reference::HiSparseResult want = reference::resolve_mtp_model(e.tables, batch.step, model, R);
    run_and_compare(e, 0, 2, batch, want, model);
    hits += want.hits;
    misses += want.misses;
    // What the data exercised: requests of several rows sharing positions, evicted slots.
    const auto& st = batch.step.state_indices;
    for (std::size_t b = 1; b < st.size(); ++b) {
      if (st[b] < 0 || st[b] != st[b - 1]) continue;
      multi_row_requests += (b < 2 || st[b - 2] != st[b]) ? 1 : 0;
      for (std::int32_t j = 0; j < K; ++j) {
        const std::int32_t tok = batch.step.logical[b * K + std::size_t(j)];
        const auto prev = batch.step.logical.begin() + std::ptrdiff_t((b - 1) * K);
        shared_positions += tok >= 0 && std::find(prev, prev + K, tok) != prev + K ? 1 : 0;
      }
    }
    for (std::size_t i = 0; i < model.slot_rows.size(); ++i) {
      evictions += before.slot_rows[i] >= 0 && model.slot_rows[i] != before.slot_rows[i] ? 1 : 0;
    }
  }
  HiSparseMLAIndexGroup& g = e.group(0);
  EXPECT_EQ(g.resolves(), std::uint64_t(steps)) << "one resolve per group per step";
  const HiSparseCounters counters = g.counters();
  EXPECT_EQ(counters.hits, hits);
  EXPECT_EQ(counters.misses, misses);
  EXPECT_EQ(counters.bytes_moved, misses * (656 + 128));
  EXPECT_GT(hits, 0u);
  EXPECT_GT(multi_row_requests, 0u);
  EXPECT_GT(shared_positions, 0u);
  EXPECT_GT(evictions, 0u);
}

// Requests of one row each: an MTP group gives what a group of one row per
// request gives (and what the single-row model gives), step after step.
TEST_P(HiSparseMtpTest, SingleRowRequestsResolveAsWithoutSpeculativeDecoding) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(82);
  Engine e(device, {true, true}, {mtp_layer("bfloat16", 64), mtp_layer("bfloat16", 64, 1)}, rng);
  ASSERT_EQ(e.group(1).config().max_rows_per_request, 1);
  std::vector<reference::HiSparseState> models(2, reference::HiSparseState(requests, H));
  std::vector<std::vector<std::int32_t>> last(requests);
  for (int s = 0; s < 5; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    Batch batch;
    std::vector<std::int32_t> order(requests);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (std::int32_t q : order) {
      const bool padding = rng() % 5 == 0;
      const std::vector<std::int32_t> row = select_row(rng, last[std::size_t(q)]);
      last[std::size_t(q)] = row;
      batch.step.request_ids.push_back(q);
      batch.step.state_indices.push_back(padding ? -1 : q);
      batch.step.logical.insert(batch.step.logical.end(), row.begin(), row.end());
      for (std::int32_t i = 0; i < H / block_size; ++i) batch.step.hot_block_table.push_back(q * (H / block_size) + i);
    }
    const reference::HiSparseResult mtp = reference::resolve_mtp_model(e.tables, batch.step, models[0], R);
    const reference::HiSparseResult plain = reference::resolve_model(e.tables, batch.step, models[1]);
    EXPECT_EQ(mtp.attention_indices, plain.attention_indices);
    EXPECT_EQ(mtp.swap_counts, plain.swap_counts);
    EXPECT_EQ(models[0].lru, models[1].lru);
    run_and_compare(e, 0, 1, batch, mtp, models[0]);
    run_and_compare(e, 1, 1, batch, plain, models[1]);
  }
  EXPECT_EQ(e.group(0).counters().hits, e.group(1).counters().hits);
  EXPECT_EQ(e.group(0).counters().misses, e.group(1).counters().misses);
}

// Bad input that lives on the device: a request of more than R rows, a state
// row whose rows are apart in the batch, two request ids on one state row.
// The too long request and the later request on a shared state row come out
// as padding (the first request on the state resolves); a refused first
// request leaves its state as it was; the other requests resolve as usual.
TEST_P(HiSparseMtpTest, RequestsThatBreakTheRowRulesComeOutAsPadding) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(83);
  Engine e(device, {true}, {mtp_layer("bfloat16", 64)}, rng);
  reference::HiSparseState model(requests, H);
  std::vector<std::vector<std::int32_t>> last(requests);
  // A warm-up step over every request, so that refused states have slots to keep.
  Batch warm;
  for (std::int32_t q = 0; q < requests; ++q) {
    const std::vector<std::int32_t> row = select_row(rng, {});
    warm.step.request_ids.push_back(q);
    warm.step.state_indices.push_back(q);
    warm.step.logical.insert(warm.step.logical.end(), row.begin(), row.end());
    for (std::int32_t i = 0; i < H / block_size; ++i) warm.step.hot_block_table.push_back(q * (H / block_size) + i);
  }
  run_and_compare(e, 0, 1, warm, reference::resolve_mtp_model(e.tables, warm.step, model, R), model);

  // (request, state) of each row: 0 has R + 1 rows (refused); 1's rows are
  // apart (row 8 refused); 2 and 5 share state row 2 (5's row refused); 3 has
  // R rows and 4 one row, both fine.
  const std::vector<std::pair<std::int32_t, std::int32_t>> rows = {{0, 0}, {0, 0}, {0, 0}, {0, 0}, {1, 1}, {3, 3}, {3, 3},
                                                                   {3, 3}, {1, 1}, {2, 2}, {5, 2}, {4, 4}};
  Batch batch;
  batch.hot_table_by_batch_row = true;
  for (const auto& [q, s] : rows) {
    const std::vector<std::int32_t> row = select_row(rng, {});
    batch.step.request_ids.push_back(q);
    batch.step.state_indices.push_back(s);
    batch.step.logical.insert(batch.step.logical.end(), row.begin(), row.end());
    for (std::int32_t i = 0; i < H / block_size; ++i) batch.step.hot_block_table.push_back(s * (H / block_size) + i);
  }
  const reference::HiSparseState before = model;
  const reference::HiSparseResult want = reference::resolve_mtp_model(e.tables, batch.step, model, R);
  for (std::size_t b = 0; b < rows.size(); ++b) {
    const bool refused = rows[b].second == 0 || b == 8 || b == 10;
    if (!refused) continue;
    EXPECT_EQ(want.valid_counts[b], 0) << "row " << b;
    EXPECT_EQ(want.swap_counts[b], 0) << "row " << b;
    EXPECT_TRUE(std::all_of(want.attention_indices.begin() + std::ptrdiff_t(b * K),
                            want.attention_indices.begin() + std::ptrdiff_t((b + 1) * K), [](std::int32_t x) { return x == -1; }))
        << "row " << b;
  }
  EXPECT_TRUE(std::equal(model.lru.begin(), model.lru.begin() + H, before.lru.begin())) << "state 0";
  EXPECT_TRUE(std::equal(model.slot_rows.begin(), model.slot_rows.begin() + H, before.slot_rows.begin())) << "state 0";
  for (std::size_t b : {4, 5, 6, 7, 9, 11}) EXPECT_GT(want.valid_counts[b], 0) << "row " << b << " resolves";
  run_and_compare(e, 0, 1, batch, want, model);
}

TEST_P(HiSparseMtpTest, ConfigurationsThatCannotHoldTheUnionAreRefused) {
  auto logical = device->allocate(16 * K * 4, MemoryKind::device);
  const Tensor buffer = Tensor::of(logical, DType::i32, {16, K});
  const auto refused = [&](HiSparseConfig c, const char* fragment) {
    LayerConfig layer;
    layer.kv_cache_dtype = "bfloat16";
    layer.head_size = 64;
    layer.hisparse = c;
    SparseMLAIndexGroupBuilder builder(device, buffer, 8);
    const std::string message = error_of([&] { builder.register_layer(true, layer); });
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  };
  HiSparseConfig c = mtp_config();
  c.max_rows_per_request = 0;
  refused(c, "max_rows_per_request must be at least 1");
  c = mtp_config();
  c.hot_slots = R * K - 1;
  refused(c, "hot_slots H = 95 is smaller than max_union_rows = max_rows_per_request 3 x top-k K 32 = 96");
  c = mtp_config();
  c.max_rows_per_request = 1025;
  refused(c, "max_rows_per_request 1025 x top-k K 32 = 32800 selected rows per request exceeds 32768");

  // The defaults and the workspace a union needs: union rows, the resolve's
  // outputs for them and the rows' maps, on top of a group of one row per request.
  SparseMLAIndexGroupBuilder builder(device, buffer, 8);
  LayerConfig layer = mtp_layer("bfloat16", 64);
  const LayerRegistration mtp = builder.register_layer(true, layer);
  layer.hisparse->max_rows_per_request = 1;
  layer.hisparse->hot_slots = H;
  const LayerRegistration plain = builder.register_layer(true, layer);
  const auto& gm = dynamic_cast<HiSparseMLAIndexGroup&>(*mtp.group);
  const auto& gp = dynamic_cast<HiSparseMLAIndexGroup&>(*plain.group);
  EXPECT_EQ(gm.config().hot_slots, (R + 1) * K);
  EXPECT_EQ(max_union_rows(gm.config()), R * K);
  const std::uint64_t W = 9;
  EXPECT_EQ(gm.footprint().device_bytes - gp.footprint().device_bytes, (5 * W * R * K + 3 * W + W * K) * 4);
  HiSparseConfig one = mtp_config(1);
  one.hot_slots = 0;
  EXPECT_EQ(resolve_hisparse_config(one, K).hot_slots, 2 * K) << "one row per request keeps the default 2K";
}

// The step path with speculative decoding, from the first step on: nothing
// allocated (by the backend or by Kokkos), nothing the driving thread waits for.
TEST_P(HiSparseMtpTest, AStepAllocatesNothingAndNeverWaits) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(84);
  start_counting_kokkos_activity();
  count_kokkos_fences_on_this_thread(true);
  Engine e(device, {true, false}, {mtp_layer("fp8_ds_mla", 576), mtp_layer("bfloat16", 64)}, rng);
  reference::HiSparseState model(requests, H);
  std::vector<std::vector<std::int32_t>> last(requests);
  for (int s = 0; s < 3; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    const Batch batch = random_batch(rng, last, false);
    const std::int32_t T = batch.step.rows();
    const auto logical_src = device_tensor(*device, *e.compute, batch.step.logical, {T, K});
    const auto req_ids = device_tensor(*device, *e.compute, batch.step.request_ids, {T});
    const auto states = device_tensor(*device, *e.compute, batch.step.state_indices, {T});
    HiSparseBatch hb;
    hb.request_state_indices = states.tensor;
    BatchMetadata meta;
    meta.req_id_per_token = req_ids.tensor;
    meta.block_table = e.source.tensor;
    meta.block_size = block_size;
    meta.hisparse = &hb;
    const Tensor logical = e.logical_buffer.rows(0, T);
    HiSparseMLAIndexGroup& g = e.group(0);
    e.compute->copy_bytes(e.logical_buffer.data(), logical_src.tensor.data(), batch.step.logical.size() * 4);
    e.compute->synchronize();
    std::vector<TopkConversion> conversions;
    conversions.reserve(2);
    const DeviceActivity device_before = device->activity();
    const KokkosActivity kokkos_before = kokkos_activity();
    for (int index = 0; index < 2; ++index) {
      g.set_logical_topk_ready(index, *e.compute);
      g.prepare_for_batch(index, meta, *e.compute);
      conversions.push_back(g.convert_logical_to_physical_topk(index, *e.compute, logical, meta, 0, true));
    }
    const DeviceActivity d = device->activity() - device_before;
    const KokkosActivity kokkos_after = kokkos_activity();
    EXPECT_EQ(d.allocations, 0u);
    EXPECT_EQ(d.frees, 0u);
    EXPECT_EQ(d.host_synchronizations, 0u);
    EXPECT_EQ(kokkos_after.allocations - kokkos_before.allocations, 0u) << "Kokkos allocations";
    EXPECT_EQ(kokkos_after.fences - kokkos_before.fences, 0u) << "Kokkos fences";
    const reference::HiSparseResult want = reference::resolve_mtp_model(e.tables, batch.step, model, R);
    EXPECT_EQ(download_rows<std::int32_t>(*device, *e.compute, conversions[1].physical), want.attention_indices);
  }
  count_kokkos_fences_on_this_thread(false);
}

}  // namespace
}  // namespace sparse_mla::testing
