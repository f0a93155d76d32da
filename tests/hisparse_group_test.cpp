// HiSparse index groups (SPEC sections 4 and 5) on every backend: the builder
// creates them from a HiSparse configuration and refuses configurations that
// cannot work; a multi-layer group resolves once per step and gathers every
// layer's own rows (checked against the scalar model under the host delay
// switch, so a missing wait shows); footprint and counters; prefill staging.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend_test.hpp"
#include "validation/reference/hisparse_reference.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/hisparse_group.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "sparse_mla/index_group_builder.hpp"
#include "sparse_mla/host_debug.hpp"
#include "sparse_mla/topk_convert.hpp"
#include "sparse_mla/fp8_upconvert.hpp"
#include "hisparse_engine.hpp"
#include "test_util.hpp"

namespace sparse_mla::testing {
namespace {

class HiSparseGroupTest : public BackendTest {};
SPARSE_MLA_INSTANTIATE_BACKENDS(HiSparseGroupTest);


// A device tensor of bf16 values (bit patterns).
DeviceTensor bf16_tensor(Device& device, Stream& stream, const std::vector<std::uint16_t>& bits, std::int64_t rows) {
  DeviceTensor t{upload(device, stream, bits), Tensor()};
  t.tensor = Tensor::of(t.buffer, DType::bf16, {rows, 576});
  return t;
}

constexpr std::int32_t K = 64, H = 128, requests = 4, blocks = 16, block_size = 16;

HiSparseConfig small_config() {
  HiSparseConfig c;
  c.hot_slots = H;
  c.max_requests = requests;
  c.max_tokens_per_request = blocks * block_size;
  c.host_pool_rows = (requests * blocks + 4) * block_size;
  c.block_size = block_size;
  c.attention_block_stride = 2 * block_size;
  return c;
}

// A model of `layers` layers (index-producing at the given ones), every
// group HiSparse, with the source tables and host pools of the test.
struct Engine : HiSparseEngine {
  Engine(std::shared_ptr<Device> d, const std::vector<bool>& producing, const std::vector<LayerConfig>& configs,
         std::mt19937_64& rng)
      : HiSparseEngine(std::move(d), HiSparseShape{K, H, requests, blocks, block_size, 8}, small_config(), producing,
                       configs, rng) {}
};

std::vector<std::int32_t> selection(std::mt19937_64& rng, const std::vector<std::int32_t>& previous) {
  std::set<std::int32_t> chosen;
  std::vector<std::int32_t> out;
  for (std::int32_t tok : previous) {
    if (tok >= 0 && rng() % 2 == 0 && chosen.insert(tok).second) out.push_back(tok);
  }
  while (out.size() < std::size_t(K)) {
    const std::int32_t tok = rng() % 40 == 0 ? -1 : static_cast<std::int32_t>(rng() % (blocks * block_size));
    if (tok < 0 || chosen.insert(tok).second) out.push_back(tok);
  }
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

LayerConfig hisparse_layer(const char* dtype, std::int64_t head_size) {
  LayerConfig c;
  c.kv_cache_dtype = dtype;
  c.head_size = head_size;
  c.hisparse = small_config();
  return c;
}

TEST_P(HiSparseGroupTest, BuilderRefusesConfigurationsThatCannotWork) {
  auto logical = device->allocate(16 * K * 4, MemoryKind::device);
  const Tensor buffer = Tensor::of(logical, DType::i32, {16, K});
  const auto refused = [&](HiSparseConfig c, const char* fragment, LayerConfig layer = {}) {
    layer.hisparse = c;
    SparseMLAIndexGroupBuilder builder(device, buffer, 8);
    const std::string message = error_of([&] { builder.register_layer(true, layer); });
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  };
  HiSparseConfig c = small_config();
  c.row_bytes = 656;
  c.hot_slots = K - 1;
  refused(c, "hot_slots H = 63 is smaller than top-k K = 64");
  c.hot_slots = 40000;
  refused(c, "exceeds 32768");
  c = small_config();
  c.row_bytes = 656;
  c.host_pool_rows = requests * blocks * block_size - 1;
  refused(c, "too small for 4 requests of 256 tokens");
  c = small_config();
  c.row_bytes = 650;
  refused(c, "650 bytes are not a positive multiple of 16");
  c.row_bytes = 0;
  refused(c, "10 bytes are not a positive multiple of 16", LayerConfig{5, "bfloat16", std::nullopt, std::nullopt});
  refused(c, "row size is unknown");
  c.top_k = 128;
  refused(c, "top_k is 128 but the group's logical top-k buffer has K = 64");
  c.top_k = 0;
  c.row_bytes = 656;

  SparseMLAIndexGroupBuilder builder(device, buffer, 8);
  const LayerRegistration plain = builder.register_layer(true);
  const LayerRegistration hisparse = builder.register_layer(true, hisparse_layer("fp8_ds_mla", 576));
  EXPECT_EQ(dynamic_cast<HiSparseMLAIndexGroup*>(plain.group.get()), nullptr);
  ASSERT_NE(dynamic_cast<HiSparseMLAIndexGroup*>(hisparse.group.get()), nullptr);
  const auto& g = dynamic_cast<HiSparseMLAIndexGroup&>(*hisparse.group);
  EXPECT_EQ(g.config().hot_slots, H);
  EXPECT_EQ(g.cache(0).row_bytes(), 656);
}

TEST_P(HiSparseGroupTest, FootprintCountsHostPoolsHotCachesAndState) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(31);
  Engine e(device, {true, false}, {hisparse_layer("fp8_ds_mla", 576), hisparse_layer("bfloat16", 576)}, rng);
  HiSparseMLAIndexGroup& g = e.group(0);
  const HiSparseConfig c = g.config();
  const std::uint64_t rows_bytes = 656 + 1152;
  const std::uint64_t hot_rows = std::uint64_t(c.max_requests) * (H / block_size) * c.attention_block_stride;
  const std::uint64_t state = std::uint64_t(c.max_requests) * H * (4 + 2) + std::uint64_t(c.max_requests) * (H / block_size) * 4;
  const std::uint64_t workspaces = 9 * K * 4 * 5 + 9 * 4 * 2 + 16;  // 4 resolve arrays + physical, 2 count rows, counters
  const HiSparseFootprint f = g.footprint();
  EXPECT_EQ(f.host_bytes, std::uint64_t(c.host_pool_rows) * rows_bytes);
  EXPECT_EQ(f.device_bytes, hot_rows * rows_bytes + state + workspaces);
}

// The main group test: several decode steps through two HiSparse groups.
TEST_P(HiSparseGroupTest, MultiLayerGroupsResolveOnceAndEveryLayerGetsItsOwnRows) {
  SCOPED_TRACE(seed_trace());
  DelayScope delay(200);
  auto rng = seeded_rng(32);
  std::vector<LayerConfig> configs = {hisparse_layer("fp8_ds_mla", 576), hisparse_layer("bfloat16", 64),
                                      hisparse_layer("float32", 8), hisparse_layer("fp8_ds_mla", 576),
                                      hisparse_layer("bfloat16", 576)};
  Engine e(device, {true, false, false, true, false}, configs, rng);
  ASSERT_EQ(e.builder->groups().size(), 2u);
  std::vector<reference::HiSparseState> states(2, reference::HiSparseState(requests, H));
  std::vector<std::vector<std::int32_t>> previous(requests);
  std::uint64_t hits = 0, misses = 0;
  const int steps = 5;
  for (int s = 0; s < steps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    std::vector<std::int32_t> order(requests);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::int32_t> state_rows = order;
    if (s == 3) state_rows[1] = -1;
    reference::HiSparseStep step;
    step.request_ids = order;
    step.state_indices = state_rows;
    for (std::int32_t b = 0; b < requests; ++b) {
      auto& sel = previous[std::size_t(order[std::size_t(b)])];
      sel = selection(rng, sel);
      step.logical.insert(step.logical.end(), sel.begin(), sel.end());
      for (std::int32_t i = 0; i < H / block_size; ++i) {
        step.hot_block_table.push_back(state_rows[std::size_t(b)] < 0 ? 0 : state_rows[std::size_t(b)] * (H / block_size) + i);
      }
    }
    // The "indexer" writes the logical top-k on the compute stream.
    const auto logical_src = device_tensor(*device, *e.compute, step.logical, {requests, K});
    e.compute->copy_bytes(e.logical_buffer.data(), logical_src.tensor.data(), step.logical.size() * 4);
    const auto req_ids = device_tensor(*device, *e.compute, order, {requests});
    const auto state_t = device_tensor(*device, *e.compute, state_rows, {requests});
    HiSparseBatch hb;
    hb.request_state_indices = state_t.tensor;
    BatchMetadata batch;
    batch.req_id_per_token = req_ids.tensor;
    batch.block_table = e.source.tensor;
    batch.block_size = block_size;
    batch.hisparse = &hb;
    const Tensor logical = e.logical_buffer.rows(0, requests);
    std::vector<reference::HiSparseResult> want;
    for (auto& st : states) want.push_back(reference::resolve_model(e.tables, step, st));
    for (std::size_t l = 0; l < e.layers.size(); ++l) {
      const int index = e.layers[l].index_in_group;
      const std::size_t gi = l < 3 ? 0 : 1;
      HiSparseMLAIndexGroup& g = e.group(l);
      g.set_logical_topk_ready(index, *e.compute);
      g.prepare_for_batch(index, batch, *e.compute);
      const TopkConversion conv = g.convert_logical_to_physical_topk(index, *e.compute, logical, batch, 0, true);
      EXPECT_EQ(download_rows<std::int32_t>(*device, *e.compute, conv.physical), want[gi].attention_indices) << "layer " << l;
      EXPECT_EQ(download_rows<std::int32_t>(*device, *e.compute, conv.valid_counts), want[gi].valid_counts) << "layer " << l;
      // This layer's hot cache: every occupied slot holds this layer's host row.
      const HiSparseCacheHandle& cache = g.cache(index);
      const auto hot = download_rows<std::uint8_t>(*device, *e.compute, cache.attention_cache());
      const std::size_t rb = std::size_t(cache.row_bytes());
      for (std::int32_t st = 0; st < requests; ++st) {
        for (std::int32_t slot = 0; slot < H; ++slot) {
          const std::int32_t row = states[gi].slot_rows[std::size_t(st * H + slot)];
          if (row < 0) continue;
          const std::size_t x = std::size_t((st * (H / block_size) + slot / block_size) * 2 * block_size + slot % block_size);
          ASSERT_TRUE(std::equal(hot.begin() + std::ptrdiff_t(x * rb), hot.begin() + std::ptrdiff_t((x + 1) * rb),
                                 e.pools[l].begin() + std::ptrdiff_t(std::size_t(row) * rb)))
              << "layer " << l << " state " << st << " slot " << slot;
        }
      }
    }
    for (std::size_t gi = 0; gi < 2; ++gi) {
      HiSparseMLAIndexGroup& g = e.group(gi == 0 ? 0 : 3);
      EXPECT_EQ(download_rows<std::int32_t>(*device, *e.compute, g.slot_rows()), states[gi].slot_rows);
      EXPECT_EQ(download_rows<std::int16_t>(*device, *e.compute, g.lru()), states[gi].lru);
    }
    hits += want[0].hits;
    misses += want[0].misses;
  }
  for (std::size_t l : {std::size_t(0), std::size_t(3)}) {
    HiSparseMLAIndexGroup& g = e.group(l);
    EXPECT_EQ(g.resolves(), std::uint64_t(steps)) << "one resolve per group per step";
    EXPECT_EQ(g.gathers(), std::uint64_t(steps) * std::uint64_t(g.num_layers()));
    // The first layer's gather alone, then one launch for each run of later
    // layers of one row size (these groups have fewer than eight layers).
    std::uint64_t launches = 1;
    for (int i = 1; i < g.num_layers(); ++i) launches += i == 1 || g.cache(i).row_bytes() != g.cache(i - 1).row_bytes();
    EXPECT_EQ(g.gather_launches(), std::uint64_t(steps) * launches);
    const HiSparseCounters counters = g.counters();
    EXPECT_EQ(counters.hits, hits);
    EXPECT_EQ(counters.misses, misses);
    std::uint64_t row_bytes = 0;
    for (int i = 0; i < g.num_layers(); ++i) row_bytes += std::uint64_t(g.cache(i).row_bytes());
    EXPECT_EQ(counters.bytes_moved, misses * row_bytes);
  }
  EXPECT_GT(hits, 0u);
  EXPECT_GT(misses, 0u);
}

TEST_P(HiSparseGroupTest, FollowersAndMissingTablesAreRefusedBeforeAnythingIsQueued) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(33);
  Engine e(device, {true, false}, {hisparse_layer("fp8_ds_mla", 576), hisparse_layer("fp8_ds_mla", 576)}, rng);
  HiSparseMLAIndexGroup& g = e.group(0);
  const auto req_ids = device_tensor(*device, *e.compute, std::vector<std::int32_t>{0, 1}, {2});
  BatchMetadata batch;
  batch.req_id_per_token = req_ids.tensor;
  batch.block_table = e.source.tensor;
  batch.block_size = block_size;
  const Tensor logical = e.logical_buffer.rows(0, 2);
  EXPECT_NE(error_of([&] { (void)g.convert_logical_to_physical_topk(1, *e.compute, logical, batch, 0, true); })
                .find("before the leader (layer 0) resolved"),
            std::string::npos);
  EXPECT_TRUE(g.prepare_reads_batch(0));  // the leader checks the step's HiSparse tables
  EXPECT_FALSE(g.prepare_reads_batch(1));
  EXPECT_NE(error_of([&] { g.prepare_for_batch(0, batch, *e.compute); }).find("batch.hisparse is null"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)g.convert_logical_to_physical_topk(0, *e.compute, logical, batch, 0, true); })
                .find("batch.hisparse is null"),
            std::string::npos);
  // Prefill-sized batches need the resident table.
  HiSparseBatch hb;
  hb.request_state_indices = req_ids.tensor;
  batch.hisparse = &hb;
  EXPECT_NE(error_of([&] { (void)g.convert_logical_to_physical_topk(0, *e.compute, e.logical_buffer.rows(0, 20), batch, 0, true); })
                .find("needs batch.hisparse->resident_block_table"),
            std::string::npos);
  EXPECT_EQ(g.resolves(), 0u);
  e.compute->synchronize();
}

TEST_P(HiSparseGroupTest, PrefillStagingPlanAndStagedRows) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(34);
  Engine e(device, {true, false}, {hisparse_layer("fp8_ds_mla", 576), hisparse_layer("bfloat16", 576)}, rng);
  HiSparseMLAIndexGroup& g = e.group(0);
  // Prefill requests 1 and 3 (plan rows 0 and 1) share two blocks; some
  // pages are resident.
  const std::int64_t P = 2;
  std::vector<std::int32_t> table;
  for (std::int32_t r : {1, 3}) table.insert(table.end(), e.tables.source_table.begin() + r * blocks, e.tables.source_table.begin() + (r + 1) * blocks);
  table[std::size_t(blocks + 2)] = table[0];
  table[std::size_t(blocks + 3)] = table[1];
  const std::vector<std::int64_t> lengths = {70, 100};  // 5 and 7 blocks
  std::vector<std::int32_t> resident(std::size_t(P * blocks), 0);
  resident[1] = 3;
  resident[std::size_t(blocks + 4)] = 5;
  const HiSparsePrefillStagingPlan plan = build_hisparse_prefill_staging_plan(*device, *e.compute, table, P, blocks, lengths,
                                                                             block_size, resident, blocks, 0);
  EXPECT_EQ(plan.num_blocks, 1 + 5 + 7 - 2);
  std::set<std::int32_t> compact_ids;
  for (std::int64_t p = 0; p < P; ++p) {
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int32_t c = plan.host_block_table[std::size_t(p * blocks + b)];
      if (b * block_size >= lengths[std::size_t(p)]) {
        EXPECT_EQ(c, 0) << "unused column";
        continue;
      }
      ASSERT_GT(c, 0);
      compact_ids.insert(c);
      for (std::int32_t off = 0; off < block_size; ++off) {
        EXPECT_EQ(plan.host_row_ids[std::size_t(c * block_size + off)], table[std::size_t(p * blocks + b)] * block_size + off);
      }
    }
  }
  EXPECT_EQ(compact_ids.size(), std::size_t(plan.num_blocks - 1));
  for (std::int32_t off = 0; off < block_size; ++off) EXPECT_EQ(plan.host_row_ids[std::size_t(off)], -1) << "null block";
  EXPECT_EQ(download_rows<std::int32_t>(*device, *e.compute, plan.block_table), plan.host_block_table);
  const std::int32_t c_res = plan.host_block_table[1];
  EXPECT_EQ(plan.host_gpu_row_ids[std::size_t(c_res * block_size + 7)], 3 * block_size + 7);

  const std::int64_t rb = g.cache(1).row_bytes();
  std::vector<std::uint8_t> resident_bytes(std::size_t(8 * block_size * rb));
  for (auto& b : resident_bytes) b = static_cast<std::uint8_t>(rng());
  const auto resident_cache = device_tensor(*device, *e.compute, resident_bytes, {8, block_size, rb});
  const auto staged = g.stage_prefill_rows(1, *e.compute, plan, resident_cache.tensor);
  const auto got = download_rows<std::uint8_t>(*device, *e.compute, staged);
  for (std::size_t row = 0; row < plan.host_row_ids.size(); ++row) {
    const std::int32_t x = plan.host_gpu_row_ids[row], h = plan.host_row_ids[row];
    std::vector<std::uint8_t> want(std::size_t(rb), 0);
    if (x >= 0) {
      std::copy(resident_bytes.begin() + x * rb, resident_bytes.begin() + (x + 1) * rb, want.begin());
    } else if (h >= 0) {
      std::copy(e.pools[1].begin() + h * rb, e.pools[1].begin() + (h + 1) * rb, want.begin());
    }
    ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin() + std::ptrdiff_t(row) * rb)) << "staged row " << row;
  }
}

// FP8 prefill through the plan: resident pages from the device, the rest
// straight from the host pool, gives what the plain gather-upconvert gives
// on a device cache holding the same rows. The host copies of the resident
// rows are cleared first, so reading them from the host would show.
TEST_P(HiSparseGroupTest, Fp8PrefillFromResidentAndHostRowsMatchesThePlainKernel) {
  SCOPED_TRACE(seed_trace());
  DelayScope delay(200);
  auto rng = seeded_rng(35);
  Engine e(device, {true, false}, {hisparse_layer("fp8_ds_mla", 576), hisparse_layer("fp8_ds_mla", 576)}, rng);
  HiSparseMLAIndexGroup& g = e.group(1);
  const int layer = e.layers[1].index_in_group;
  const std::int64_t rb = 656, pool_blocks = e.tables.host_rows / block_size;
  // The plain kernel's input: the layer's host pool as a paged device cache.
  const auto paged = device_tensor(*device, *e.compute, e.pools[1], {pool_blocks, block_size, rb});
  const std::int64_t P = 3;
  const std::vector<std::int32_t> prefill_requests = {2, 0, 3};
  const std::vector<std::int64_t> lengths = {40, 129, 7};
  std::vector<std::int32_t> table, starts;
  std::int32_t total = 0;
  for (std::size_t p = 0; p < prefill_requests.size(); ++p) {
    const auto row = e.tables.source_table.begin() + prefill_requests[p] * blocks;
    table.insert(table.end(), row, row + blocks);
    starts.push_back(total);
    total += static_cast<std::int32_t>(lengths[p]);
  }
  const auto table_t = device_tensor(*device, *e.compute, table, {P, blocks});
  const auto starts_t = device_tensor(*device, *e.compute, starts, {P});
  const std::vector<std::uint16_t> poison(std::size_t(total) * 576, 0xA5A5);
  const auto plain_dst = bf16_tensor(*device, *e.compute, poison, total);
  gather_upconvert_fp8(*e.compute, paged.tensor, plain_dst.tensor, table_t.tensor, starts_t.tensor, P);
  const auto want = download_rows<std::uint16_t>(*device, *e.compute, plain_dst.tensor);
  ASSERT_LT(std::count(want.begin(), want.end(), std::uint16_t{0xA5A5}), std::ptrdiff_t(want.size() / 100)) << "the plain kernel wrote the rows";

  // Some pages are resident: their rows move to a device cache and leave the host pool.
  std::vector<std::int32_t> resident(std::size_t(P * blocks), 0);
  resident[1] = 2;                   // request 2, block 1
  resident[std::size_t(blocks + 0)] = 5;  // request 0, block 0
  resident[std::size_t(blocks + 8)] = 7;  // request 0, block 8
  std::vector<std::uint8_t> resident_bytes(std::size_t(8 * block_size * rb), 0);
  std::vector<std::int32_t> cleared;
  for (std::int64_t i = 0; i < P * blocks; ++i) {
    if (resident[std::size_t(i)] == 0) continue;
    for (std::int32_t off = 0; off < block_size; ++off) {
      const std::int32_t h = table[std::size_t(i)] * block_size + off;
      std::copy(e.pools[1].begin() + h * rb, e.pools[1].begin() + (h + 1) * rb,
                resident_bytes.begin() + (resident[std::size_t(i)] * block_size + off) * rb);
      cleared.push_back(h);
    }
  }
  const auto resident_cache = device_tensor(*device, *e.compute, resident_bytes, {8, block_size, rb});
  const auto zeros = device_tensor(*device, *e.compute, std::vector<std::uint8_t>(cleared.size() * std::size_t(rb), 0),
                                   {std::int64_t(cleared.size()), rb});
  const auto cleared_t = device_tensor(*device, *e.compute, cleared, {std::int64_t(cleared.size())});
  g.write_rows(layer, *e.compute, zeros.tensor, cleared_t.tensor);
  HiSparsePrefillStagingPlan plan = build_hisparse_prefill_staging_plan(*device, *e.compute, table, P, blocks, lengths,
                                                                       block_size, resident, blocks, 0);
  BatchMetadata batch;
  batch.prefill_staging_plan = &plan;
  const auto dst = bf16_tensor(*device, *e.compute, poison, total);
  Event* ready = g.gather_fp8_prefill(layer, *e.compute, resident_cache.tensor, dst.tensor, Tensor(), starts_t.tensor, P,
                                      batch, 0);
  ASSERT_EQ(ready, &g.cache(layer).prefill_ready());
  e.compute->wait(*ready);
  EXPECT_EQ(download_rows<std::uint16_t>(*device, *e.compute, dst.tensor), want);

  // A slice of the plan's requests: request 1 of the plan alone.
  const auto one_start = device_tensor(*device, *e.compute, std::vector<std::int32_t>{0}, {1});
  const auto one_dst = bf16_tensor(*device, *e.compute, std::vector<std::uint16_t>(std::size_t(lengths[1]) * 576, 0xA5A5),
                                   lengths[1]);
  e.compute->wait(*g.gather_fp8_prefill(layer, *e.compute, resident_cache.tensor, one_dst.tensor, Tensor(), one_start.tensor,
                                        1, batch, 1));
  const auto one = download_rows<std::uint16_t>(*device, *e.compute, one_dst.tensor);
  EXPECT_TRUE(std::equal(one.begin(), one.end(), want.begin() + std::ptrdiff_t(starts[1]) * 576));
  EXPECT_NE(error_of([&] { g.gather_fp8_prefill(layer, *e.compute, Tensor(), dst.tensor, Tensor(), starts_t.tensor, P, batch, 0); })
                .find("the plan has resident rows"),
            std::string::npos);
  EXPECT_NE(error_of([&] { g.gather_fp8_prefill(layer, *e.compute, resident_cache.tensor, dst.tensor, Tensor(), starts_t.tensor, 3, batch, 1); })
                .find("outside the plan's 3 requests"),
            std::string::npos);
}

}  // namespace
}  // namespace sparse_mla::testing
