// A small engine on every backend (SPEC section 7), as vLLM or SGLang would
// drive the library: it owns its stream (a native one, wrapped, where the
// backend has them), one KV slab in which the HiSparse layers' hot blocks lie
// interleaved, its pinned host pools, the HiSparse slot state, the step's
// inputs and outputs, and on GPUs the graph of a whole decode step, captured
// on its own stream. It drives a plain group and a HiSparse group (two layers
// each) through decode and prefill steps. Every step is checked against the
// scalar references, and every step's calls are counted (the HiSparse prefill
// staging plan built on the device and the rows staged into the engine's
// tensor included): no allocation, no free and no host synchronisation, by
// the backend or by Kokkos.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backend_test.hpp"
#include "sparse_mla/hisparse_group.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "sparse_mla/index_group_builder.hpp"
#include "sparse_mla/kokkos_runtime.hpp"
#include "test_util.hpp"
#include "validation/reference/hisparse_reference.hpp"
#include "validation/reference/topk_reference.hpp"

namespace sparse_mla::testing {
namespace {

constexpr std::int32_t K = 64;            // top-k
constexpr std::int32_t H = 128;           // hot slots per request
constexpr std::int32_t S = 4;             // requests = state rows = decode rows
constexpr std::int32_t B = 16;            // blocks per request
constexpr std::int32_t bs = 16;           // block size (host pool, hot cache, KV cache)
constexpr std::int32_t context = B * bs;  // tokens of every request
constexpr std::int32_t head_size = 32;    // bfloat16 rows of 64 bytes
constexpr std::int64_t row_bytes = 2 * head_size;
constexpr std::int32_t hisparse_layers = 2;
constexpr std::int32_t hot_blocks_per_state = H / bs;
constexpr std::int32_t hot_blocks = S * hot_blocks_per_state;
constexpr std::int64_t host_rows = std::int64_t(S * B + 4) * bs;
constexpr std::int32_t prefill_tokens = 24;  // more than the workspace's S + 1 rows
constexpr std::int32_t max_tokens = 32;

// What the backend and Kokkos did between two points.
struct Activity {
  DeviceActivity device;
  KokkosActivity kokkos;
};

class EngineTest : public BackendTest {
 protected:
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped()) return;
    start_counting_kokkos_activity();
    count_kokkos_fences_on_this_thread(true);
  }
  void TearDown() override { count_kokkos_fences_on_this_thread(false); }
};
SPARSE_MLA_INSTANTIATE_BACKENDS(EngineTest);

// The engine: everything it owns, allocated once, before the first step.
struct TestEngine {
  std::shared_ptr<Device> device;
  std::unique_ptr<Stream> own_stream;  // stands for the engine's cudaStream_t / hipStream_t
  std::unique_ptr<Stream> wrapped;     // the library's view of it (GPU backends)
  Stream* compute = nullptr;

  // Step inputs: written by the host into pinned staging, copied in stream
  // order into the device tables (the copies are part of a captured step).
  OwnedTensor staged_logical;  // pinned int32 [2, max_tokens, K]: each group's indexer output
  OwnedTensor logical;         // device int32 [max_tokens, K]: the groups' logical top-k buffer
  OwnedTensor req_ids, block_table, resident_table, state_rows, counters;
  // Outputs: every layer's indices and counts, the prefill conversion's outputs.
  std::vector<OwnedTensor> layer_indices, layer_counts;
  OwnedTensor prefill_out, prefill_counts;
  // HiSparse memory: the KV slab, the host pools, the slot state.
  OwnedTensor slab;  // device uint8 [hot_blocks * layers, bs, row_bytes]
  std::vector<OwnedTensor> host_pools;
  std::vector<std::vector<std::uint8_t>> pool_bytes;
  OwnedTensor slot_rows, lru, hot_table;
  std::vector<std::int32_t> hot_table_values, block_table_values, resident_values;

  // HiSparse prefill staging: the plan's storage and the staged rows, sized once.
  std::unique_ptr<HiSparsePrefillPlanStorage> plan_storage;
  OwnedTensor context_lengths;  // int32 [S]: each prefill request's context
  OwnedTensor staged;           // uint8 [plan blocks, bs, row_bytes]

  std::unique_ptr<SparseMLAIndexGroupBuilder> builder;
  std::vector<LayerRegistration> layers;
  HiSparseBatch decode_hisparse, prefill_hisparse;  // prefill reads the resident pages
  BatchMetadata decode_batch, prefill_batch;

  TestEngine(std::shared_ptr<Device> d, std::mt19937_64& rng) : device(std::move(d)) {
    own_stream = device->create_stream();
    compute = own_stream.get();
    if (own_stream->native_handle() != nullptr) {
      wrapped = device->wrap_stream(own_stream->native_handle());
      compute = wrapped.get();
    }
    Stream& c = *compute;
    staged_logical = OwnedTensor(*device, DType::i32, {2, max_tokens, K}, MemoryKind::pinned_host);
    logical = OwnedTensor(*device, DType::i32, {max_tokens, K});

    // Request r's blocks are a random permutation of pool blocks; the
    // resident copies of prefill pages another permutation.
    std::vector<std::int32_t> blocks(S * B + 4);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    block_table_values.assign(blocks.begin(), blocks.begin() + S * B);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    resident_values.assign(blocks.begin(), blocks.begin() + S * B);
    block_table = upload(c, block_table_values, {S, B});
    resident_table = upload(c, resident_values, {S, B});
    std::vector<std::int32_t> ids(max_tokens);
    for (std::int32_t t = 0; t < max_tokens; ++t) ids[std::size_t(t)] = t < S ? t : (t * S) / prefill_tokens % S;
    req_ids = upload(c, ids);
    std::vector<std::int32_t> states(S);
    std::iota(states.begin(), states.end(), 0);
    std::shuffle(states.begin(), states.end(), rng);  // request r holds state row states[r]
    state_rows = upload(c, states);
    counters = OwnedTensor(*device, DType::i64, {2}, MemoryKind::pinned_host);

    for (int l = 0; l < 2 + hisparse_layers; ++l) {
      layer_indices.emplace_back(*device, DType::i32, std::vector<std::int64_t>{S, K});
      layer_counts.emplace_back(*device, DType::i32, std::vector<std::int64_t>{S});
    }
    prefill_out = OwnedTensor(*device, DType::i32, {prefill_tokens, K});
    prefill_counts = OwnedTensor(*device, DType::i32, {prefill_tokens});

    slab = OwnedTensor(*device, DType::u8, {hot_blocks * hisparse_layers, bs, row_bytes});
    c.fill(slab.buffer(), 0, 0, slab.bytes());
    for (int l = 0; l < hisparse_layers; ++l) {
      host_pools.emplace_back(*device, DType::u8, std::vector<std::int64_t>{host_rows, row_bytes}, MemoryKind::pinned_host);
      pool_bytes.emplace_back(std::size_t(host_rows * row_bytes));
      for (auto& b : pool_bytes.back()) b = static_cast<std::uint8_t>(rng());
      std::memcpy(host_pools.back().data(), pool_bytes.back().data(), pool_bytes.back().size());
    }
    slot_rows = OwnedTensor(*device, DType::i32, {S, H});
    lru = OwnedTensor(*device, DType::i16, {S, H});
    hot_table_values.resize(std::size_t(hot_blocks));
    std::iota(hot_table_values.begin(), hot_table_values.end(), 0);
    std::shuffle(hot_table_values.begin(), hot_table_values.end(), rng);  // the engine's placement
    hot_table = upload(c, hot_table_values, {S, hot_blocks_per_state});

    plan_storage = std::make_unique<HiSparsePrefillPlanStorage>(*device, S, B, S * B, host_rows / bs, bs);
    std::vector<std::int32_t> lengths(S);
    for (auto& length : lengths) length = std::int32_t(rng() % (context + 1));
    context_lengths = upload(c, lengths);
    staged = OwnedTensor(*device, DType::u8, {plan_storage->num_blocks(), bs, row_bytes});

    builder = std::make_unique<SparseMLAIndexGroupBuilder>(device, logical, S);
    layers.push_back(builder->register_layer(true));
    layers.push_back(builder->register_layer(false));
    HiSparseConfig config;
    config.hot_slots = H;
    config.max_requests = S;
    config.max_tokens_per_request = context;
    config.host_pool_rows = host_rows;
    config.block_size = bs;
    config.attention_block_stride = std::int64_t(hisparse_layers) * bs;
    config.state = HiSparseStateStorage{slot_rows, lru, hot_table};
    for (int l = 0; l < hisparse_layers; ++l) {
      LayerConfig layer{head_size, "bfloat16", config, hisparse_layer_storage(l)};
      layers.push_back(builder->register_layer(l == 0, layer));
    }

    decode_hisparse.request_state_indices = state_rows;
    prefill_hisparse = decode_hisparse;
    prefill_hisparse.resident_block_table = resident_table;
    decode_batch.req_id_per_token = req_ids;
    decode_batch.block_table = block_table;
    decode_batch.block_size = bs;
    decode_batch.num_decodes = S;
    decode_batch.num_decode_tokens = S;
    decode_batch.hisparse = &decode_hisparse;
    prefill_batch = decode_batch;
    prefill_batch.hisparse = &prefill_hisparse;
    prefill_batch.num_decodes = 0;
    prefill_batch.num_decode_tokens = 0;
    prefill_batch.num_prefills = S;
    c.synchronize();
  }

  // Layer l's hot cache: its blocks in the slab, the other layers' between them.
  HiSparseLayerStorage hisparse_layer_storage(int l) const {
    auto* base = static_cast<std::uint8_t*>(slab.data()) + std::int64_t(l) * bs * row_bytes;
    const Tensor hot(base, DType::u8, {hot_blocks, bs, row_bytes}, {hisparse_layers * bs * row_bytes, row_bytes, 1},
                     MemoryKind::device, device.get());
    return HiSparseLayerStorage{host_pools[std::size_t(l)], hot};
  }
  HiSparseMLAIndexGroup& hisparse() const { return dynamic_cast<HiSparseMLAIndexGroup&>(*layers[2].group); }

  // The indexer of group g: its output, staged by the host, lands in the
  // logical top-k buffer in stream order.
  void run_indexer(int g, std::int64_t rows) {
    const std::size_t bytes = std::size_t(rows) * K * 4;
    compute->copy_bytes(logical.data(), staged_logical.data_as<std::int32_t>() + std::int64_t(g) * max_tokens * K, bytes);
  }

  // One decode step of all four layers; each layer's "attention" copies the
  // indices it was given into that layer's outputs.
  void decode_step() {
    Stream& c = *compute;
    for (int l = 0; l < 4; ++l) {
      const LayerRegistration& r = layers[std::size_t(l)];
      if (r.index_in_group == 0) run_indexer(l / 2, S);
      r.group->set_logical_topk_ready(r.index_in_group, c);
      r.group->prepare_for_batch(r.index_in_group, decode_batch, c);
      const TopkConversion got =
          r.group->convert_logical_to_physical_topk(r.index_in_group, c, logical.tensor().rows(0, S), decode_batch, 0, true);
      c.copy_bytes(layer_indices[std::size_t(l)].data(), got.physical.data(), std::size_t(S) * K * 4);
      c.copy_bytes(layer_counts[std::size_t(l)].data(), got.valid_counts.data(), std::size_t(S) * 4);
    }
    hisparse().snapshot_counters(c, counters);
  }

  // One prefill step: every layer converts the prefill tokens into the
  // engine's outputs (HiSparse layers through the resident pages).
  void prefill_layer(int l) {
    Stream& c = *compute;
    const LayerRegistration& r = layers[std::size_t(l)];
    if (r.index_in_group == 0) run_indexer(l / 2, prefill_tokens);
    r.group->set_logical_topk_ready(r.index_in_group, c);
    r.group->prepare_for_batch(r.index_in_group, prefill_batch, c);
    const TopkConversion got = r.group->convert_logical_to_physical_topk(
        r.index_in_group, c, logical.tensor().rows(0, prefill_tokens), prefill_batch, 0, true, prefill_out, prefill_counts);
    EXPECT_EQ(got.physical.data(), prefill_out.data()) << "layer " << l << ": not written into the engine's output";
  }

  // HiSparse layer l's prefill rows that are not resident: the plan built on
  // the device, then the rows staged into the engine's tensor.
  HiSparsePrefillStagingPlan stage_prefill(int l) {
    HiSparsePrefillStagingPlan plan =
        plan_hisparse_prefill_staging(*compute, block_table, context_lengths, Tensor(), 0, *plan_storage);
    hisparse().stage_prefill_rows(l, *compute, plan, Tensor(), staged);
    return plan;
  }

  Activity activity() const { return Activity{device->activity(), kokkos_activity()}; }
};

void expect_nothing_between(const Activity& before, const Activity& after, const char* what) {
  const DeviceActivity d = after.device - before.device;
  EXPECT_EQ(d.allocations, 0u) << what;
  EXPECT_EQ(d.frees, 0u) << what;
  EXPECT_EQ(d.host_synchronizations, 0u) << what;
  EXPECT_EQ(after.kokkos.allocations - before.kokkos.allocations, 0u) << what << " (Kokkos allocations)";
  EXPECT_EQ(after.kokkos.fences - before.kokkos.fences, 0u) << what << " (Kokkos fences)";
}

// K distinct positions of a request's context, some -1; half of them kept
// from the row's previous selection so that steps hit as well as miss.
std::vector<std::int32_t> select(std::mt19937_64& rng, const std::vector<std::int32_t>& previous, std::int64_t rows) {
  std::vector<std::int32_t> out(std::size_t(rows) * K);
  for (std::int64_t t = 0; t < rows; ++t) {
    std::vector<std::int32_t> positions(context);
    std::iota(positions.begin(), positions.end(), 0);
    std::shuffle(positions.begin(), positions.end(), rng);
    if (!previous.empty()) {
      for (std::int32_t j = 0; j < K / 2; ++j) {
        const std::int32_t keep = previous[std::size_t(t * K + j)];
        if (keep >= 0) std::iter_swap(positions.begin() + j, std::find(positions.begin(), positions.end(), keep));
      }
    }
    for (std::int32_t j = 0; j < K; ++j) out[std::size_t(t * K + j)] = rng() % 16 == 0 ? -1 : positions[std::size_t(j)];
  }
  return out;
}

reference::TopkInputs topk_inputs(const TestEngine& e, const std::vector<std::int32_t>& logical, std::int64_t rows,
                                  const std::vector<std::int32_t>& table) {
  reference::TopkInputs in;
  in.num_tokens = rows;
  in.num_topk = K;
  in.blocks_per_request = B;
  in.block_size = bs;
  in.block_stride_rows = bs;
  in.req_id = download<std::int32_t>(*e.compute, e.req_ids);
  in.block_table = table;
  in.logical = logical;
  return in;
}

// The scalar model of the HiSparse group's slot state.
struct HiSparseModel {
  reference::HiSparseTables tables;
  reference::HiSparseState state{S, H};
  std::vector<std::int32_t> states;

  explicit HiSparseModel(const TestEngine& e) {
    tables.top_k = K;
    tables.hot_slots = H;
    tables.source_table = e.block_table_values;
    tables.source_rows = S;
    tables.source_blocks = B;
    tables.source_block_size = bs;
    tables.host_rows = host_rows;
    tables.hot_blocks_per_row = hot_blocks_per_state;
    tables.hot_block_size = bs;
    tables.attention_block_stride = std::int64_t(hisparse_layers) * bs;
    states = download<std::int32_t>(*e.compute, e.state_rows);
  }

  reference::HiSparseResult step(const TestEngine& e, const std::vector<std::int32_t>& logical) {
    reference::HiSparseStep step;
    step.logical = logical;
    for (std::int32_t r = 0; r < S; ++r) {
      step.request_ids.push_back(r);
      step.state_indices.push_back(states[std::size_t(r)]);
      const auto row = e.hot_table_values.begin() + states[std::size_t(r)] * hot_blocks_per_state;
      step.hot_block_table.insert(step.hot_block_table.end(), row, row + hot_blocks_per_state);
    }
    return reference::resolve_model(tables, step, state);
  }
};

// After a decode step: the plain layers' rows against the conversion model,
// the HiSparse layers' attention indices and counts against the resolve
// model, the rows attention would read from the engine's slab against the
// host pool, and the engine's counter snapshot against the model's counts.
void expect_decode_step(TestEngine& e, HiSparseModel& model, const std::vector<std::vector<std::int32_t>>& logical,
                        std::uint64_t& hits, std::uint64_t& misses, int step) {
  SCOPED_TRACE("decode step " + std::to_string(step));
  Stream& c = *e.compute;
  const reference::TopkOutputs plain = reference::convert_topk(topk_inputs(e, logical[0], S, e.block_table_values));
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(download<std::int32_t>(c, e.layer_indices[std::size_t(l)]), plain.physical) << "plain layer " << l;
    EXPECT_EQ(download<std::int32_t>(c, e.layer_counts[std::size_t(l)]), plain.valid_counts) << "plain layer " << l;
  }
  const reference::HiSparseResult want = model.step(e, logical[1]);
  hits += want.hits;
  misses += want.misses;
  const std::vector<std::uint8_t> slab = download<std::uint8_t>(c, e.slab);
  for (int l = 0; l < hisparse_layers; ++l) {
    const auto got = download<std::int32_t>(c, e.layer_indices[std::size_t(2 + l)]);
    EXPECT_EQ(got, want.attention_indices) << "HiSparse layer " << l;
    EXPECT_EQ(download<std::int32_t>(c, e.layer_counts[std::size_t(2 + l)]), want.valid_counts) << "HiSparse layer " << l;
    int wrong = 0;
    for (std::int32_t r = 0; r < S; ++r) {
      for (std::int32_t j = 0; j < K; ++j) {
        const std::int32_t a = got[std::size_t(r * K + j)];
        const std::int32_t g = reference::model_host_row(model.tables, r, logical[1][std::size_t(r * K + j)]);
        if (a < 0 || g < 0) continue;
        const std::size_t at = std::size_t(std::int64_t(l) * bs * row_bytes + std::int64_t(a) * row_bytes);
        wrong += std::memcmp(&slab[at], &e.pool_bytes[std::size_t(l)][std::size_t(g * row_bytes)], row_bytes) != 0;
      }
    }
    EXPECT_EQ(wrong, 0) << "HiSparse layer " << l << ": rows attention reads differ from the host pool";
  }
  const auto* snapshot = e.counters.data_as<std::int64_t>();
  EXPECT_EQ(std::uint64_t(snapshot[0]), hits);
  EXPECT_EQ(std::uint64_t(snapshot[1]), misses);
}

void expect_prefill_layer(TestEngine& e, const std::vector<std::int32_t>& logical, int l) {
  SCOPED_TRACE("prefill layer " + std::to_string(l));
  const auto& table = l < 2 ? e.block_table_values : e.resident_values;
  const reference::TopkOutputs want = reference::convert_topk(topk_inputs(e, logical, prefill_tokens, table));
  EXPECT_EQ(download<std::int32_t>(*e.compute, e.prefill_out), want.physical);
  EXPECT_EQ(download<std::int32_t>(*e.compute, e.prefill_counts), want.valid_counts);
}

// Every staged block of every request's context holds that block's rows of
// the layer's host pool.
void expect_staged_rows(TestEngine& e, const HiSparsePrefillStagingPlan& plan, int l) {
  SCOPED_TRACE("staged prefill rows of HiSparse layer " + std::to_string(l));
  Stream& c = *e.compute;
  check_hisparse_prefill_plan(c, plan);
  const auto table = download<std::int32_t>(c, plan.block_table);
  const auto lengths = download<std::int32_t>(c, e.context_lengths);
  const auto staged = download<std::uint8_t>(c, e.staged);
  const std::size_t block_bytes = std::size_t(bs * row_bytes);
  int wrong = 0, checked = 0;
  for (std::int32_t p = 0; p < S; ++p) {
    for (std::int32_t b = 0; b < (lengths[std::size_t(p)] + bs - 1) / bs; ++b) {
      const std::int32_t compact = table[std::size_t(p * B + b)];
      const std::int32_t host_block = e.block_table_values[std::size_t(p * B + b)];
      ++checked;
      wrong += compact < 1 || std::memcmp(&staged[std::size_t(compact) * block_bytes],
                                          &e.pool_bytes[std::size_t(l)][std::size_t(host_block) * block_bytes], block_bytes) != 0;
    }
  }
  EXPECT_EQ(wrong, 0) << "of " << checked << " staged blocks";
}

void stage_inputs(TestEngine& e, const std::vector<std::vector<std::int32_t>>& logical) {
  for (int g = 0; g < 2; ++g) {
    std::memcpy(e.staged_logical.data_as<std::int32_t>() + std::int64_t(g) * max_tokens * K, logical[std::size_t(g)].data(),
                logical[std::size_t(g)].size() * 4);
  }
}

void poison_outputs(TestEngine& e) {
  for (auto* list : {&e.layer_indices, &e.layer_counts}) {
    for (OwnedTensor& t : *list) e.compute->fill(t.buffer(), 0, poison_byte, t.bytes());
  }
  e.compute->fill(e.prefill_out.buffer(), 0, poison_byte, e.prefill_out.bytes());
  e.compute->fill(e.prefill_counts.buffer(), 0, poison_byte, e.prefill_counts.bytes());
  std::memset(e.counters.data(), 0xA5, e.counters.bytes());
}

// Decode steps, eager, then prefill layers, each checked, each counted.
TEST_P(EngineTest, DecodeAndPrefillStepsAllocateNothingAndNeverWait) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(71);
  TestEngine e(device, rng);
  HiSparseModel model(e);
  std::uint64_t hits = 0, misses = 0;
  std::vector<std::vector<std::int32_t>> logical(2);
  for (int step = 0; step < 4; ++step) {
    for (auto& l : logical) l = select(rng, l, S);
    stage_inputs(e, logical);
    poison_outputs(e);
    e.compute->synchronize();
    const Activity before = e.activity();
    e.decode_step();
    expect_nothing_between(before, e.activity(), "a decode step");
    e.compute->synchronize();
    expect_decode_step(e, model, logical, hits, misses, step);
  }
  for (auto& l : logical) l = select(rng, {}, prefill_tokens);
  stage_inputs(e, logical);
  for (int l = 0; l < 4; ++l) {
    poison_outputs(e);
    e.compute->synchronize();
    const Activity before = e.activity();
    e.prefill_layer(l);
    expect_nothing_between(before, e.activity(), "a prefill layer");
    e.compute->synchronize();
    expect_prefill_layer(e, logical[std::size_t(l / 2)], l);
  }
  for (int l = 0; l < hisparse_layers; ++l) {
    e.compute->fill(e.staged.buffer(), 0, poison_byte, e.staged.bytes());
    e.compute->synchronize();
    const Activity before = e.activity();
    const HiSparsePrefillStagingPlan plan = e.stage_prefill(l);
    expect_nothing_between(before, e.activity(), "staging a HiSparse layer's prefill rows");
    expect_staged_rows(e, plan, l);
  }
}

// The engine captures a whole decode step on its own stream and replays the
// graph with new inputs written in place; nothing allocates or waits during
// the capture or the replays.
TEST_P(EngineTest, TheEngineCapturesAWholeDecodeStepAndReplaysIt) {
  SCOPED_TRACE(seed_trace());
  if (device->backend() == Backend::host) GTEST_SKIP() << "the host backend has no graphs";
  auto rng = seeded_rng(72);
  TestEngine e(device, rng);
  HiSparseModel model(e);
  std::uint64_t hits = 0, misses = 0;
  std::vector<std::vector<std::int32_t>> logical(2);

  for (auto& l : logical) l = select(rng, l, S);
  stage_inputs(e, logical);
  e.compute->synchronize();
  e.decode_step();  // eager first: the capture records a warm path
  e.compute->synchronize();
  expect_decode_step(e, model, logical, hits, misses, 0);

  const Activity before_capture = e.activity();
  e.own_stream->begin_capture();  // cudaStreamBeginCapture on the engine's stream
  EXPECT_TRUE(e.compute->is_capturing());
  e.decode_step();
  std::unique_ptr<Graph> graph = e.own_stream->end_capture();
  expect_nothing_between(before_capture, e.activity(), "capturing a decode step");

  for (int step = 1; step < 5; ++step) {
    for (auto& l : logical) l = select(rng, l, S);
    stage_inputs(e, logical);
    poison_outputs(e);
    e.compute->synchronize();
    const Activity before = e.activity();
    graph->replay(*e.own_stream);
    expect_nothing_between(before, e.activity(), "replaying a decode step");
    e.own_stream->synchronize();
    expect_decode_step(e, model, logical, hits, misses, step);
  }
}

}  // namespace
}  // namespace sparse_mla::testing
