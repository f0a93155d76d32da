// Index groups (SPEC section 4) on every backend: grouping and leaders, one
// conversion per group per decode step, prefill-sized batches per call, the
// workspace boundary, the side stream's wait for logical_topk_ready under the
// host delay switch (with the control that shows the test can fail),
// piecewise capture mode, groups without an indexer, and rejected calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend_test.hpp"
#include "host/host_device.hpp"
#include "validation/reference/fp8_reference.hpp"
#include "validation/reference/topk_reference.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/host_debug.hpp"
#include "sparse_mla/index_group_builder.hpp"
#include "sparse_mla/fill.hpp"
#include "test_util.hpp"

namespace sparse_mla::testing {
namespace {

class IndexGroupTest : public BackendTest {};
SPARSE_MLA_INSTANTIATE_BACKENDS(IndexGroupTest);


// The engine's side of a model: the logical top-k buffer the indexers write,
// the builder, and where each layer landed.
struct Model {
  Buffer logical_storage;
  Tensor logical_buffer;
  std::unique_ptr<SparseMLAIndexGroupBuilder> builder;
  std::vector<LayerRegistration> layers;
};

Model make_model(const std::shared_ptr<Device>& device, const std::vector<bool>& index_producing,
                 std::int64_t max_tokens, std::int64_t top_k, std::optional<std::int64_t> max_decode_rows) {
  Model m;
  m.logical_storage = device->allocate(static_cast<std::size_t>(max_tokens * top_k) * 4, MemoryKind::device);
  m.logical_buffer = Tensor::of(m.logical_storage, DType::i32, {max_tokens, top_k});
  m.builder = std::make_unique<SparseMLAIndexGroupBuilder>(device, m.logical_buffer, max_decode_rows);
  for (bool producing : index_producing) m.layers.push_back(m.builder->register_layer(producing));
  return m;
}

std::vector<bool> index_every(int layers, int every) {
  std::vector<bool> producing(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) producing[static_cast<std::size_t>(l)] = l % every == 0;
  return producing;
}

// One step's tables: host values and their device copies.
struct Tables {
  std::int64_t num_requests = 0;
  std::int64_t blocks_per_request = 0;
  std::int32_t block_size = 0;
  std::vector<std::int32_t> req_id;
  std::vector<std::int32_t> block_table;
  DeviceTensor req_id_device;
  DeviceTensor block_table_device;
  BatchMetadata batch;
};

Tables random_tables(Device& device, Stream& stream, std::mt19937_64& rng, std::int64_t num_tokens,
                     std::int64_t num_requests, std::int64_t blocks_per_request, std::int32_t block_size) {
  Tables t;
  t.num_requests = num_requests;
  t.blocks_per_request = blocks_per_request;
  t.block_size = block_size;
  std::uniform_int_distribution<std::int32_t> request(0, static_cast<std::int32_t>(num_requests - 1));
  std::uniform_int_distribution<std::int32_t> block(0, static_cast<std::int32_t>(4 * num_requests * blocks_per_request));
  for (std::int64_t i = 0; i < num_tokens; ++i) t.req_id.push_back(request(rng));
  std::sort(t.req_id.begin(), t.req_id.end());
  for (std::int64_t i = 0; i < num_requests * blocks_per_request; ++i) t.block_table.push_back(block(rng));
  t.req_id_device = device_tensor(device, stream, t.req_id, {num_tokens});
  t.block_table_device = device_tensor(device, stream, t.block_table, {num_requests, blocks_per_request});
  t.batch.req_id_per_token = t.req_id_device.tensor;
  t.batch.block_table = t.block_table_device.tensor;
  t.batch.block_size = block_size;
  t.batch.num_decodes = num_requests;
  t.batch.num_decode_tokens = num_tokens;
  return t;
}

// Logical positions with -1 entries and positions beyond the block table.
std::vector<std::int32_t> random_logical(std::mt19937_64& rng, const Tables& t, std::int64_t num_tokens,
                                         std::int64_t top_k) {
  const std::int32_t context = static_cast<std::int32_t>(t.blocks_per_request * t.block_size);
  std::uniform_int_distribution<std::int32_t> position(-context / 8, context + context / 8);
  std::vector<std::int32_t> logical(static_cast<std::size_t>(num_tokens * top_k));
  for (auto& v : logical) v = std::max(position(rng), -1);
  return logical;
}

reference::TopkOutputs expected(const Tables& t, const std::vector<std::int32_t>& logical, std::int64_t num_tokens,
                                std::int64_t top_k, std::int32_t block_stride_rows = 0, const DcpConfig& dcp = {}) {
  reference::TopkInputs in;
  in.num_tokens = num_tokens;
  in.num_topk = top_k;
  in.blocks_per_request = t.blocks_per_request;
  in.block_size = t.block_size;
  in.block_stride_rows = block_stride_rows == 0 ? t.block_size : block_stride_rows;
  in.req_id = t.req_id;
  in.block_table = t.block_table;
  in.logical = logical;
  in.set_dcp(dcp);
  return reference::convert_topk_dcp(in);
}

// The engine's indexer: writes `logical` into the buffer on the compute
// stream, after poisoning it, in several queued tasks so that under the delay
// switch it finishes late. `staging` must live until the stream has run.
[[nodiscard]] Buffer produce_logical(Device& device, Stream& compute, Model& m, const std::vector<std::int32_t>& logical) {
  const std::size_t bytes = logical.size() * 4;
  Buffer staging = device.allocate(bytes, MemoryKind::host);
  std::memcpy(staging.data(), logical.data(), bytes);
  const std::size_t total = m.logical_storage.bytes();
  const std::uint8_t poison_bytes = 0xF7;  // int32 -134744073: a negative position, converts to -1
  compute.fill(m.logical_storage, 0, poison_bytes, total);
  compute.fill(m.logical_storage, 0, poison_bytes, total);
  compute.copy(m.logical_storage, 0, staging, 0, bytes);
  return staging;
}

// What one layer's call returned, copied on the compute stream (as attention
// would read it), and downloaded after the step.
struct LayerCapture {
  Buffer physical;
  Buffer counts;
  void take(Device& device, Stream& compute, const TopkConversion& r) {
    const std::size_t bytes = static_cast<std::size_t>(r.physical.numel()) * 4;
    physical = device.allocate(bytes, MemoryKind::device);
    compute.copy_bytes(physical.data(), r.physical.data(), bytes);
    if (r.valid_counts.defined()) {
      counts = device.allocate(static_cast<std::size_t>(r.valid_counts.numel()) * 4, MemoryKind::device);
      compute.copy_bytes(counts.data(), r.valid_counts.data(), counts.bytes());
    }
  }
};

void expect_matches(Device& device, Stream& compute, const LayerCapture& c, const reference::TopkOutputs& want,
                    const std::string& what) {
  EXPECT_EQ(download<std::int32_t>(device, compute, c.physical, want.physical.size()), want.physical) << what;
  EXPECT_EQ(download<std::int32_t>(device, compute, c.counts, want.valid_counts.size()), want.valid_counts) << what;
}

// The contents of an int32 tensor (contiguous), read on `stream`.
std::vector<std::int32_t> read(Device& device, Stream& stream, const Tensor& tensor) {
  const std::size_t count = static_cast<std::size_t>(tensor.numel());
  Buffer staging = device.allocate(count * 4, MemoryKind::host);
  stream.copy_bytes(staging.data(), tensor.data(), count * 4);
  stream.synchronize();
  std::vector<std::int32_t> values(count);
  if (count) std::memcpy(values.data(), staging.data(), count * 4);
  return values;
}

void poison_workspaces(Stream& compute, const Model& m) {
  for (const auto& group : m.builder->groups()) {
    fill_i32(compute, group->physical_workspace(), poison_i32);
    fill_i32(compute, group->valid_counts_workspace(), poison_i32);
  }
  compute.synchronize();
}

// One step through every layer, the correct sequence: the leader's indexer
// writes the logical top-k, then every layer runs steps 1 to 3. Returns what
// each layer saw; `logical_per_group` gets each group's selection.
std::vector<LayerCapture> run_step(Device& device, Stream& compute, Model& m, const Tables& t, std::int64_t num_tokens,
                                   std::mt19937_64& rng, std::vector<std::vector<std::int32_t>>& logical_per_group,
                                   bool record_ready = true) {
  const std::int64_t top_k = m.logical_buffer.dim(1);
  std::vector<LayerCapture> captures(m.layers.size());
  std::vector<Buffer> staging;
  std::vector<TopkConversion> results;  // prefill-sized results own buffers the stream still reads
  logical_per_group.clear();
  for (std::size_t l = 0; l < m.layers.size(); ++l) {
    SparseMLAIndexGroup& group = *m.layers[l].group;
    const int index = m.layers[l].index_in_group;
    if (index == 0) {
      logical_per_group.push_back(random_logical(rng, t, num_tokens, top_k));
      staging.push_back(produce_logical(device, compute, m, logical_per_group.back()));
    }
    if (record_ready) group.set_logical_topk_ready(index, compute);
    group.prepare_for_batch(index, t.batch, compute);
    results.push_back(
        group.convert_logical_to_physical_topk(index, compute, m.logical_buffer.rows(0, num_tokens), t.batch, 0, true));
    EXPECT_EQ(results.back().physical.dim(0), num_tokens);
    EXPECT_EQ(results.back().physical.dim(1), top_k);
    captures[l].take(device, compute, results.back());
  }
  compute.synchronize();
  return captures;
}

std::size_t group_of_layer(const Model& m, std::size_t layer) {
  std::size_t g = 0;
  for (std::size_t l = 1; l <= layer; ++l) g += m.layers[l].index_in_group == 0;
  return g;
}

std::uint64_t total(const Model& m, std::uint64_t ConversionCounts::*field) {
  std::uint64_t n = 0;
  for (const auto& group : m.builder->groups()) n += group->conversion_counts().*field;
  return n;
}

// ---- grouping ----

TEST_P(IndexGroupTest, GroupsAndLeadersFollowTheIndexProducingLayers) {
  struct Shape {
    int layers, every;
  };
  for (const Shape s : {Shape{61, 4}, Shape{8, 1}, Shape{5, 10}, Shape{7, 3}, Shape{1, 1}}) {
    SCOPED_TRACE("layers " + std::to_string(s.layers) + ", index every " + std::to_string(s.every));
    Model m = make_model(device, index_every(s.layers, s.every), 8, 64, std::nullopt);
    const std::size_t groups = static_cast<std::size_t>((s.layers + s.every - 1) / s.every);
    ASSERT_EQ(m.builder->groups().size(), groups);
    for (int l = 0; l < s.layers; ++l) {
      const LayerRegistration& r = m.layers[static_cast<std::size_t>(l)];
      EXPECT_EQ(r.index_in_group, l % s.every) << "layer " << l;
      EXPECT_EQ(r.group, m.builder->groups()[static_cast<std::size_t>(l / s.every)]) << "layer " << l;
    }
    for (std::size_t g = 0; g < groups; ++g) {
      const auto& group = *m.builder->groups()[g];
      EXPECT_TRUE(group.has_indexer());
      EXPECT_EQ(group.num_layers(), std::min<int>(s.every, s.layers - static_cast<int>(g) * s.every));
      EXPECT_EQ(group.workspace_rows(), 9);  // max_tokens + the spare row
      EXPECT_EQ(group.physical_workspace().dim(0), 9);
      EXPECT_EQ(group.physical_workspace().dim(1), 64);
    }
  }
}

TEST_P(IndexGroupTest, LayersBeforeTheFirstIndexerFormAGroupWithoutIndexer) {
  Model m = make_model(device, {false, false, true, false, true}, 8, 64, 4);
  ASSERT_EQ(m.builder->groups().size(), 3u);
  EXPECT_FALSE(m.builder->groups()[0]->has_indexer());
  EXPECT_TRUE(m.builder->groups()[1]->has_indexer());
  EXPECT_TRUE(m.builder->groups()[2]->has_indexer());
  const int expected_index[] = {0, 1, 0, 1, 0};
  for (std::size_t l = 0; l < 5; ++l) EXPECT_EQ(m.layers[l].index_in_group, expected_index[l]) << "layer " << l;
  EXPECT_EQ(m.builder->groups()[0]->workspace_rows(), 5);
}

// ---- decode-sized and prefill-sized batches ----

TEST_P(IndexGroupTest, DecodeStepsConvertOncePerGroupAndEveryLayerMatchesTheReference) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(1);
  auto compute = device->create_stream();
  const std::int64_t max_decode_rows = 12, top_k = 128;
  Model m = make_model(device, index_every(10, 4), 64, top_k, max_decode_rows);  // groups of 4, 4, 2
  poison_workspaces(*compute, m);
  for (int step = 1; step <= 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::int64_t num_tokens = std::uniform_int_distribution<std::int64_t>(1, max_decode_rows + 1)(rng);
    const Tables t = random_tables(*device, *compute, rng, num_tokens, 6, 5, 16);
    std::vector<std::vector<std::int32_t>> logical;
    const auto captures = run_step(*device, *compute, m, t, num_tokens, rng, logical);
    for (std::size_t l = 0; l < m.layers.size(); ++l) {
      expect_matches(*device, *compute, captures[l], expected(t, logical[group_of_layer(m, l)], num_tokens, top_k),
                     "layer " + std::to_string(l));
    }
    for (const auto& group : m.builder->groups()) {
      EXPECT_EQ(group->conversion_counts().decode, static_cast<std::uint64_t>(step));
      EXPECT_EQ(group->conversion_counts().prefill, 0u);
    }
  }
}

// DCP (SPEC section 2a): groups set to one rank of a split convert once per
// decode step with the filter (compacted or not), every layer sees the
// rank's rows, and prefill-sized calls are filtered too.
TEST_P(IndexGroupTest, DcpGroupsConvertOncePerStepFilteredToTheirRank) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(21);
  auto compute = device->create_stream();
  const std::int64_t max_decode_rows = 12, top_k = 256;
  for (const DcpConfig dcp : {DcpConfig{4, 2, 8, true}, DcpConfig{2, 1, 1, false}}) {
    SCOPED_TRACE("dcp rank " + std::to_string(dcp.rank) + " of " + std::to_string(dcp.size));
    Model m = make_model(device, index_every(6, 3), 64, top_k, max_decode_rows);  // groups of 3, 3
    m.builder->set_dcp(dcp);
    poison_workspaces(*compute, m);
    for (int step = 1; step <= 4; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const std::int64_t num_tokens = step == 4 ? 40 : std::uniform_int_distribution<std::int64_t>(1, max_decode_rows + 1)(rng);
      const Tables t = random_tables(*device, *compute, rng, num_tokens, 6, 5, 16);
      std::vector<std::vector<std::int32_t>> logical;
      const auto captures = run_step(*device, *compute, m, t, num_tokens, rng, logical);
      for (std::size_t l = 0; l < m.layers.size(); ++l) {
        expect_matches(*device, *compute, captures[l],
                       expected(t, logical[group_of_layer(m, l)], num_tokens, top_k, 0, dcp), "layer " + std::to_string(l));
      }
    }
    for (const auto& group : m.builder->groups()) {
      EXPECT_EQ(group->dcp().rank, dcp.rank);
      EXPECT_EQ(group->conversion_counts().decode, 3u);
      EXPECT_EQ(group->conversion_counts().prefill, 3u);  // the prefill-sized step: one per layer
    }
  }
  Model m = make_model(device, index_every(2, 2), 8, 64, 4);
  for (const auto& [bad, message] : {std::pair{DcpConfig{4, 4, 1, true}, "dcp.rank must be in [0, dcp.size) = [0, 4), got 4"},
                                     std::pair{DcpConfig{0, 0, 1, true}, "dcp.size must be at least 1, got 0"},
                                     std::pair{DcpConfig{2, 0, 0, true}, "dcp.interleave must be positive, got 0"}}) {
    const DcpConfig refused = bad;  // C++17 lambdas cannot capture structured bindings
    const std::string got = error_of([&] { m.builder->set_dcp(refused); });
    EXPECT_NE(got.find(message), std::string::npos) << got;
    EXPECT_NE(got.find("SparseMLAIndexGroup::set_dcp"), std::string::npos) << got;
    EXPECT_EQ(m.builder->groups()[0]->dcp().size, 1);
  }
}

TEST_P(IndexGroupTest, DecodeResultsAreViewsOfTheGroupWorkspace) {
  auto compute = device->create_stream();
  auto rng = seeded_rng(2);
  Model m = make_model(device, index_every(3, 3), 16, 64, 4);
  SparseMLAIndexGroup& group = *m.builder->groups()[0];
  const Tables t = random_tables(*device, *compute, rng, 3, 2, 2, 8);
  for (int layer = 0; layer < 3; ++layer) {
    group.set_logical_topk_ready(layer, *compute);
    const TopkConversion r = group.convert_logical_to_physical_topk(layer, *compute, m.logical_buffer.rows(0, 3),
                                                                    t.batch, 0, layer != 2);
    EXPECT_EQ(r.physical.data(), group.physical_workspace().data());
    EXPECT_EQ(r.physical.dim(0), 3);
    EXPECT_FALSE(r.physical_storage);
    EXPECT_EQ(r.valid_counts.defined(), layer != 2);
    if (r.valid_counts.defined()) {
      EXPECT_EQ(r.valid_counts.data(), group.valid_counts_workspace().data());
    }
  }
  compute->synchronize();
  EXPECT_EQ(group.conversion_counts().decode, 1u);
}

// Which calls read their batch (what a binding must build): the leader's
// conversion and every prefill-sized one; a follower of a decode-sized step
// reads none, so an empty batch gives it the leader's rows; a plain group's
// prepare_for_batch reads none.
TEST_P(IndexGroupTest, OnlyTheLeaderAndPrefillSizedCallsReadTheBatch) {
  auto compute = device->create_stream();
  auto rng = seeded_rng(12);
  Model m = make_model(device, index_every(3, 3), 16, 64, 4);
  SparseMLAIndexGroup& group = *m.builder->groups()[0];
  EXPECT_FALSE(group.prepare_reads_batch(0));
  EXPECT_FALSE(group.prepare_reads_batch(1));
  EXPECT_TRUE(group.convert_reads_batch(0, 5));
  EXPECT_FALSE(group.convert_reads_batch(1, 5));  // 5 rows: max_decode_rows + 1, decode-sized
  EXPECT_TRUE(group.convert_reads_batch(1, 6));   // prefill-sized
  const Tables t = random_tables(*device, *compute, rng, 3, 2, 2, 8);
  group.set_logical_topk_ready(0, *compute);
  group.prepare_for_batch(0, BatchMetadata{}, *compute);
  const TopkConversion leader = group.convert_logical_to_physical_topk(0, *compute, m.logical_buffer.rows(0, 3),
                                                                       t.batch, 0, true);
  for (int layer = 1; layer < 3; ++layer) {
    group.prepare_for_batch(layer, BatchMetadata{}, *compute);
    const TopkConversion follower = group.convert_logical_to_physical_topk(layer, *compute, m.logical_buffer.rows(0, 3),
                                                                           BatchMetadata{}, 0, true);
    EXPECT_EQ(follower.physical.data(), leader.physical.data());
    EXPECT_EQ(follower.valid_counts.data(), leader.valid_counts.data());
  }
  // The leader still checks the batch it reads.
  EXPECT_NE(error_of([&] {
              (void)group.convert_logical_to_physical_topk(0, *compute, m.logical_buffer.rows(0, 3), BatchMetadata{}, 0,
                                                           true);
            }).find("req_id"),
            std::string::npos);
  compute->synchronize();
  EXPECT_EQ(group.conversion_counts().decode, 1u);
}

TEST_P(IndexGroupTest, PrefillSizedBatchesConvertOnEveryCall) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(3);
  auto compute = device->create_stream();
  const std::int64_t max_decode_rows = 4, top_k = 64, num_tokens = 40;
  Model m = make_model(device, index_every(6, 3), 64, top_k, max_decode_rows);
  poison_workspaces(*compute, m);
  const Tables t = random_tables(*device, *compute, rng, num_tokens, 3, 4, 32);
  std::vector<std::vector<std::int32_t>> logical;
  const auto captures = run_step(*device, *compute, m, t, num_tokens, rng, logical);
  for (std::size_t l = 0; l < m.layers.size(); ++l) {
    expect_matches(*device, *compute, captures[l], expected(t, logical[group_of_layer(m, l)], num_tokens, top_k),
                   "layer " + std::to_string(l));
  }
  for (const auto& group : m.builder->groups()) {
    EXPECT_EQ(group->conversion_counts().prefill, 3u);  // one per layer
    EXPECT_EQ(group->conversion_counts().decode, 0u);
  }
}

TEST_P(IndexGroupTest, PrefillSizedResultsOwnFreshBuffersAndLeaveTheWorkspaceAlone) {
  auto compute = device->create_stream();
  auto rng = seeded_rng(4);
  Model m = make_model(device, index_every(2, 2), 32, 64, 2);
  poison_workspaces(*compute, m);
  SparseMLAIndexGroup& group = *m.builder->groups()[0];
  const Tables t = random_tables(*device, *compute, rng, 20, 2, 2, 16);
  const auto logical = random_logical(rng, t, 20, 64);
  Buffer staging = produce_logical(*device, *compute, m, logical);
  const Tensor rows = m.logical_buffer.rows(0, 20);
  const TopkConversion first = group.convert_logical_to_physical_topk(0, *compute, rows, t.batch, 0, true);
  const TopkConversion second = group.convert_logical_to_physical_topk(1, *compute, rows, t.batch, 0, false);
  EXPECT_TRUE(first.physical_storage);
  EXPECT_TRUE(first.valid_counts_storage);
  EXPECT_FALSE(second.valid_counts.defined());
  EXPECT_NE(first.physical.data(), second.physical.data());
  const auto want = expected(t, logical, 20, 64);
  EXPECT_EQ(read(*device, *compute, first.physical), want.physical);
  EXPECT_EQ(read(*device, *compute, first.valid_counts), want.valid_counts);
  EXPECT_EQ(read(*device, *compute, second.physical), want.physical);
  const auto untouched = read(*device, *compute, group.physical_workspace());
  EXPECT_EQ(std::count(untouched.begin(), untouched.end(), poison_i32), group.physical_workspace().numel());
}

// max_decode_rows + 1 rows (the spare row) is decode-sized; one more is not.
TEST_P(IndexGroupTest, WorkspaceBoundaryIsMaxDecodeRowsPlusOne) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(5);
  auto compute = device->create_stream();
  const std::int64_t max_decode_rows = 7, top_k = 64;
  Model m = make_model(device, index_every(4, 2), 32, top_k, max_decode_rows);
  const SparseMLAIndexGroup& first = *m.builder->groups()[0];
  EXPECT_TRUE(first.is_decode_sized(max_decode_rows + 1));
  EXPECT_FALSE(first.is_decode_sized(max_decode_rows + 2));
  for (const std::int64_t num_tokens : {max_decode_rows + 1, max_decode_rows + 2}) {
    SCOPED_TRACE("T = " + std::to_string(num_tokens));
    poison_workspaces(*compute, m);
    const auto before = first.conversion_counts();
    const Tables t = random_tables(*device, *compute, rng, num_tokens, 4, 3, 8);
    std::vector<std::vector<std::int32_t>> logical;
    const auto captures = run_step(*device, *compute, m, t, num_tokens, rng, logical);
    for (std::size_t l = 0; l < m.layers.size(); ++l) {
      expect_matches(*device, *compute, captures[l], expected(t, logical[l / 2], num_tokens, top_k),
                     "layer " + std::to_string(l));
    }
    const auto after = first.conversion_counts();
    const bool decode = num_tokens == max_decode_rows + 1;
    EXPECT_EQ(after.decode - before.decode, decode ? 1u : 0u);
    EXPECT_EQ(after.prefill - before.prefill, decode ? 0u : 2u);
  }
}

// ---- ordering: the side stream waits for logical_topk_ready ----

// `trials` decode steps of a 3-layer group under the host delay switch; the
// indexer writes slowly on the compute stream. Returns how many steps gave
// any layer a wrong result.
int wrong_steps_under_delay(const std::shared_ptr<Device>& device, const std::vector<bool>& producing,
                            bool record_ready, bool piecewise, int trials) {
  auto rng = seeded_rng(6);
  auto compute = device->create_stream();
  const std::int64_t top_k = 256, num_tokens = 8;
  Model m = make_model(device, producing, 16, top_k, 8);
  m.builder->set_piecewise_capture(piecewise);
  int wrong = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const Tables t = random_tables(*device, *compute, rng, num_tokens, 4, 8, 16);
    std::vector<std::vector<std::int32_t>> logical;
    const auto captures = run_step(*device, *compute, m, t, num_tokens, rng, logical, record_ready);
    bool ok = true;
    for (std::size_t l = 0; l < m.layers.size(); ++l) {
      const auto want = expected(t, logical[group_of_layer(m, l)], num_tokens, top_k);
      ok = ok && download<std::int32_t>(*device, *compute, captures[l].physical, want.physical.size()) == want.physical;
      ok = ok && download<std::int32_t>(*device, *compute, captures[l].counts, num_tokens) == want.valid_counts;
    }
    wrong += !ok;
  }
  return wrong;
}

TEST_P(IndexGroupTest, SideStreamWaitsForLogicalTopkReadyUnderDelay) {
  SCOPED_TRACE(seed_trace());
  DelayScope delay(3000);
  EXPECT_EQ(wrong_steps_under_delay(device, index_every(3, 3), true, false, 20), 0);
}

// The control for the test above: an engine that skips set_logical_topk_ready
// lets the side stream convert before the indexer's writes land, and reads
// wrong or stale top-k at least once in 20 delayed steps. If this fails, the
// ordering test proves nothing.
TEST_P(IndexGroupTest, SkippingSetLogicalTopkReadyReadsStaleTopk) {
  if (GetParam() != "host") GTEST_SKIP() << "relies on the host backend's delay switch";
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the unjoined conversion is a deliberate data race, which ThreadSanitizer rightly reports";
#endif
  SCOPED_TRACE(seed_trace());
  DelayScope delay(3000);
  EXPECT_GT(wrong_steps_under_delay(device, index_every(3, 3), false, false, 20), 0)
      << "20 steps without logical_topk_ready all converted fresh top-k";
}

// Piecewise capture mode: set_logical_topk_ready records nothing, and the
// leader joins through the compute stream, so the steps are still right.
TEST_P(IndexGroupTest, PiecewiseCaptureModeJoinsThroughTheComputeStream) {
  SCOPED_TRACE(seed_trace());
  DelayScope delay(3000);
  EXPECT_EQ(wrong_steps_under_delay(device, index_every(3, 3), true, true, 20), 0);
}

TEST_P(IndexGroupTest, PiecewiseCaptureModeRecordsNoLogicalTopkReady) {
  if (GetParam() != "host") GTEST_SKIP() << "inspects the host backend's event records";
  auto compute = device->create_stream();
  Model m = make_model(device, index_every(2, 2), 8, 64, 4);
  SparseMLAIndexGroup& group = *m.builder->groups()[0];
  auto& ready = dynamic_cast<host::HostEvent&>(group.logical_topk_ready());
  m.builder->set_piecewise_capture(true);
  EXPECT_TRUE(group.piecewise_capture());
  group.set_logical_topk_ready(0, *compute);
  EXPECT_EQ(ready.last_record(), nullptr);
  m.builder->set_piecewise_capture(false);
  group.set_logical_topk_ready(1, *compute);  // a follower records nothing either
  EXPECT_EQ(ready.last_record(), nullptr);
  group.set_logical_topk_ready(0, *compute);
  EXPECT_NE(ready.last_record(), nullptr);
  compute->synchronize();
}

// A group with no indexer (layers before the first index-producing layer):
// nothing records logical_topk_ready; the leader joins the compute stream.
TEST_P(IndexGroupTest, GroupWithoutIndexerJoinsThroughTheComputeStream) {
  SCOPED_TRACE(seed_trace());
  DelayScope delay(3000);
  EXPECT_EQ(wrong_steps_under_delay(device, {false, false, false}, true, false, 20), 0);
  if (GetParam() == "host") {
    auto compute = device->create_stream();
    Model m = make_model(device, {false, false}, 8, 64, 4);
    m.layers[0].group->set_logical_topk_ready(0, *compute);
    EXPECT_EQ(dynamic_cast<host::HostEvent&>(m.layers[0].group->logical_topk_ready()).last_record(), nullptr);
  }
}

TEST_P(IndexGroupTest, ConversionCountersAreKeptPerGroup) {
  auto rng = seeded_rng(7);
  auto compute = device->create_stream();
  Model m = make_model(device, index_every(5, 2), 32, 64, 4);  // groups of 2, 2, 1
  std::vector<std::vector<std::int32_t>> logical;
  for (int step = 0; step < 3; ++step) {
    const Tables t = random_tables(*device, *compute, rng, 3, 3, 2, 8);
    run_step(*device, *compute, m, t, 3, rng, logical);
  }
  const Tables prefill = random_tables(*device, *compute, rng, 20, 3, 2, 8);
  run_step(*device, *compute, m, prefill, 20, rng, logical);
  const std::uint64_t layers_in_group[] = {2, 2, 1};
  for (std::size_t g = 0; g < 3; ++g) {
    EXPECT_EQ(m.builder->groups()[g]->conversion_counts().decode, 3u) << "group " << g;
    EXPECT_EQ(m.builder->groups()[g]->conversion_counts().prefill, layers_in_group[g]) << "group " << g;
  }
  EXPECT_EQ(total(m, &ConversionCounts::decode), 9u);
  EXPECT_EQ(total(m, &ConversionCounts::prefill), 5u);
}

TEST_P(IndexGroupTest, BlockStrideRowsLargerThanBlockSize) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(8);
  auto compute = device->create_stream();
  Model m = make_model(device, index_every(2, 2), 32, 64, 4);
  SparseMLAIndexGroup& group = *m.builder->groups()[0];
  const Tables t = random_tables(*device, *compute, rng, 5, 2, 4, 16);
  const auto logical = random_logical(rng, t, 5, 64);
  Buffer staging = produce_logical(*device, *compute, m, logical);
  group.set_logical_topk_ready(0, *compute);
  const Tensor rows = m.logical_buffer.rows(0, 5);
  const TopkConversion leader = group.convert_logical_to_physical_topk(0, *compute, rows, t.batch, 48, true);
  const auto want = expected(t, logical, 5, 64, 48);
  EXPECT_EQ(read(*device, *compute, leader.physical), want.physical);
  const TopkConversion follower = group.convert_logical_to_physical_topk(1, *compute, rows, t.batch, 48, true);
  EXPECT_EQ(read(*device, *compute, follower.valid_counts), want.valid_counts);
}

// ---- FP8 prefill ----

// A small fp8_ds_mla cache (random bytes: every encoding, NaN scales too) and
// a two-request gather over it, on the device and as reference inputs.
struct Fp8Prefill {
  reference::Fp8GatherInputs in;
  Buffer cache, block_table, workspace_starts, dst;
  Tensor cache_view, block_table_view, workspace_starts_view, dst_view;
  std::vector<std::uint16_t> poison;
};

Fp8Prefill fp8_prefill(Device& device, Stream& compute, std::mt19937_64& rng) {
  Fp8Prefill p;
  p.in.num_blocks = 6;
  p.in.cache_block_size = p.in.block_size = 4;
  p.in.blocks_per_request = 3;
  p.in.batch = 2;
  p.in.total_rows = 12;
  p.in.workspace_starts = {0, 7};
  std::uniform_int_distribution<int> byte(0, 255), block(0, 5);
  p.in.cache.resize(static_cast<std::size_t>(p.in.num_blocks * p.in.cache_block_size) * reference::row_bytes);
  for (auto& b : p.in.cache) b = static_cast<std::uint8_t>(byte(rng));
  for (int i = 0; i < 6; ++i) p.in.block_table.push_back(block(rng));
  // The engine writes the cache on the compute stream, late under the delay
  // switch: a plain group's gather must queue behind it.
  Buffer staging = device.allocate(p.in.cache.size(), MemoryKind::host);
  std::memcpy(staging.data(), p.in.cache.data(), p.in.cache.size());
  p.cache = device.allocate(p.in.cache.size(), MemoryKind::device);
  compute.fill(p.cache, 0, 0xFF, p.cache.bytes());
  compute.copy(p.cache, 0, staging, 0, staging.bytes());
  p.block_table = upload(device, compute, p.in.block_table);  // synchronises: staging may go
  p.workspace_starts = upload(device, compute, p.in.workspace_starts);
  p.poison.assign(static_cast<std::size_t>(p.in.total_rows) * reference::out_width, 0xA5A5);
  p.dst = upload(device, compute, p.poison);
  p.cache_view = Tensor::of(p.cache, DType::u8, {6, 4, 656});
  p.block_table_view = Tensor::of(p.block_table, DType::i32, {2, 3});
  p.workspace_starts_view = Tensor::of(p.workspace_starts, DType::i32, {2});
  p.dst_view = Tensor::of(p.dst, DType::bf16, {12, 576});
  return p;
}

TEST_P(IndexGroupTest, PlainGroupsGatherFp8PrefillOnTheComputeStreamWithoutAnEvent) {
  SCOPED_TRACE(seed_trace());
  DelayScope delay(1000);
  auto rng = seeded_rng(10);
  auto compute = device->create_stream();
  Model m = make_model(device, index_every(2, 2), 8, 64, 4);
  SparseMLAIndexGroup& group = *m.builder->groups()[0];
  for (int layer = 0; layer < 2; ++layer) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    Fp8Prefill p = fp8_prefill(*device, *compute, rng);
    BatchMetadata batch;
    Event* ready = group.gather_fp8_prefill(layer, *compute, p.cache_view, p.dst_view, p.block_table_view,
                                            p.workspace_starts_view, 2, batch, 0);
    EXPECT_EQ(ready, nullptr);
    std::vector<std::uint16_t> want = p.poison;
    reference::gather_upconvert(p.in, want);
    EXPECT_EQ(download<std::uint16_t>(*device, *compute, p.dst, want.size()), want);
  }
}

// ---- rejected calls ----

void expect_error(const std::function<void()>& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected one containing \"" << fragment << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

struct RejectionFixture {
  std::shared_ptr<Device> device;
  std::unique_ptr<Stream> compute;
  Model model;
  Tables tables;
  SparseMLAIndexGroup* group;
  Tensor rows(std::int64_t n) const { return model.logical_buffer.rows(0, n); }
  // Everything either stream queued has run, and the workspace still holds
  // `want` (poison when nothing converted yet).
  void expect_workspace(const std::vector<std::int32_t>& want) {
    group->side_stream().synchronize();
    EXPECT_EQ(read(*device, *compute, group->physical_workspace()), want);
  }
};

RejectionFixture rejection_fixture(const std::shared_ptr<Device>& device) {
  RejectionFixture f{device, device->create_stream(), make_model(device, index_every(2, 2), 32, 64, 4), {}, nullptr};
  auto rng = seeded_rng(9);
  f.tables = random_tables(*device, *f.compute, rng, 20, 2, 2, 16);  // req_id for up to 20 tokens
  f.group = f.model.builder->groups()[0].get();
  poison_workspaces(*f.compute, f.model);
  const Buffer staging = produce_logical(*device, *f.compute, f.model, random_logical(rng, f.tables, 3, 64));
  f.compute->synchronize();
  return f;
}

TEST_P(IndexGroupTest, UnregisteredLayersAreRejected) {
  RejectionFixture f = rejection_fixture(device);
  SparseMLAIndexGroup& g = *f.group;
  const std::vector<std::int32_t> poison(static_cast<std::size_t>(g.physical_workspace().numel()), poison_i32);
  const std::string message = "layer_index 2 is not a registered layer of this group (2 layers)";
  expect_error([&] { (void)g.convert_logical_to_physical_topk(2, *f.compute, f.rows(3), f.tables.batch, 0, true); }, message);
  expect_error([&] { (void)g.convert_logical_to_physical_topk(-1, *f.compute, f.rows(3), f.tables.batch, 0, true); },
               "layer_index -1 is not a registered layer");
  expect_error([&] { g.set_logical_topk_ready(2, *f.compute); }, message);
  expect_error([&] { g.prepare_for_batch(2, f.tables.batch, *f.compute); }, message);
  f.expect_workspace(poison);
  EXPECT_EQ(g.conversion_counts().decode + g.conversion_counts().prefill, 0u);
}

TEST_P(IndexGroupTest, BadLogicalTopkIsRejectedAndWritesNothing) {
  RejectionFixture f = rejection_fixture(device);
  SparseMLAIndexGroup& g = *f.group;
  const std::vector<std::int32_t> poison(static_cast<std::size_t>(g.physical_workspace().numel()), poison_i32);
  const auto convert = [&](const Tensor& logical) {
    return [&, logical] { (void)g.convert_logical_to_physical_topk(0, *f.compute, logical, f.tables.batch, 0, true); };
  };
  Buffer wide_storage = device->allocate(3 * 128 * 4, MemoryKind::device);
  Buffer long_storage = device->allocate(40 * 64 * 4, MemoryKind::device);
  expect_error(convert(Tensor::of(wide_storage, DType::i32, {3, 128})),
               "logical top-k has shape [3, 128] but dimension 1 must be 64 (K of the group's logical top-k buffer)");
  expect_error(convert(Tensor::of(long_storage, DType::i32, {40, 64})),
               "logical top-k has shape [40, 64] but dimension 0 must be <= 32 (rows of the group's logical top-k buffer)");
  expect_error(convert(Tensor::of(wide_storage, DType::i16, {3, 64})), "logical top-k has dtype I16, expected I32");
  expect_error(convert(Tensor::of(wide_storage, DType::i32, {192})), "logical top-k has shape [192] (1 dims), expected 2 dims");
  expect_error(convert(Tensor()), "logical top-k is missing");
  f.expect_workspace(poison);
  EXPECT_EQ(g.conversion_counts().decode + g.conversion_counts().prefill, 0u);
}

TEST_P(IndexGroupTest, BadBatchMetadataIsRejectedAndWritesNothing) {
  RejectionFixture f = rejection_fixture(device);
  SparseMLAIndexGroup& g = *f.group;
  const std::vector<std::int32_t> poison(static_cast<std::size_t>(g.physical_workspace().numel()), poison_i32);
  const auto convert = [&](const BatchMetadata& batch, std::int64_t stride, std::int64_t tokens) {
    return [&, batch, stride, tokens] {
      (void)g.convert_logical_to_physical_topk(0, *f.compute, f.rows(tokens), batch, stride, true);
    };
  };
  for (const std::int64_t tokens : {std::int64_t{3}, std::int64_t{20}}) {  // decode-sized, then prefill-sized
    SCOPED_TRACE("T = " + std::to_string(tokens));
    BatchMetadata short_req_id = f.tables.batch;
    short_req_id.req_id_per_token = f.tables.batch.req_id_per_token.rows(0, 2);
    expect_error(convert(short_req_id, 0, tokens), "req_id has shape [2] but dimension 0 must be >= " + std::to_string(tokens));
    BatchMetadata bad_table = f.tables.batch;
    bad_table.block_table = Tensor::of(f.tables.block_table_device.buffer, DType::u8, {2, 2});
    expect_error(convert(bad_table, 0, tokens), "block_table has dtype U8, expected I32");
    BatchMetadata no_block_size = f.tables.batch;
    no_block_size.block_size = 0;
    expect_error(convert(no_block_size, 0, tokens), "block_size must be positive, got 0");
    expect_error(convert(f.tables.batch, 8, tokens), "block_stride_rows must be in [block_size, 2^31) = [16, 2^31), got 8");
  }
  f.expect_workspace(poison);
  EXPECT_EQ(g.conversion_counts().decode + g.conversion_counts().prefill, 0u);
}

TEST_P(IndexGroupTest, AComputeStreamOfAnotherDeviceIsRejected) {
  RejectionFixture f = rejection_fixture(device);
  auto other = open_device(GetParam());
  auto foreign = other->create_stream();
  const std::string message = "the compute stream belongs to another device";
  expect_error([&] { f.group->set_logical_topk_ready(0, *foreign); }, message);
  expect_error([&] { f.group->prepare_for_batch(0, f.tables.batch, *foreign); }, message);
  expect_error([&] { (void)f.group->convert_logical_to_physical_topk(0, *foreign, f.rows(3), f.tables.batch, 0, true); },
               message);
  f.expect_workspace(std::vector<std::int32_t>(static_cast<std::size_t>(f.group->physical_workspace().numel()), poison_i32));
}

// A follower reads what its leader converted: it may not come first, ask for
// other rows, or ask for counts the leader did not write.
TEST_P(IndexGroupTest, FollowersThatDoNotMatchTheLeaderAreRejected) {
  RejectionFixture f = rejection_fixture(device);
  SparseMLAIndexGroup& g = *f.group;
  expect_error([&] { (void)g.convert_logical_to_physical_topk(1, *f.compute, f.rows(3), f.tables.batch, 0, true); },
               "layer 1 asks for the group's physical top-k before the leader (layer 0) converted");
  g.set_logical_topk_ready(0, *f.compute);
  (void)g.convert_logical_to_physical_topk(0, *f.compute, f.rows(3), f.tables.batch, 0, false);  // decode-sized: a view
  g.side_stream().synchronize();
  const auto converted = read(*device, *f.compute, g.physical_workspace());
  expect_error([&] { (void)g.convert_logical_to_physical_topk(1, *f.compute, f.rows(2), f.tables.batch, 0, false); },
               "layer 1 passes logical top-k of 2 rows but the leader converted 3 rows");
  expect_error([&] { (void)g.convert_logical_to_physical_topk(1, *f.compute, f.rows(3), f.tables.batch, 0, true); },
               "layer 1 asks for valid counts but the leader converted without them");
  f.expect_workspace(converted);
  EXPECT_EQ(g.conversion_counts().decode, 1u);
}

TEST_P(IndexGroupTest, RejectedFp8PrefillGathersWriteNothing) {
  auto rng = seeded_rng(11);
  auto compute = device->create_stream();
  Model m = make_model(device, index_every(2, 2), 8, 64, 4);
  SparseMLAIndexGroup& group = *m.builder->groups()[0];
  Fp8Prefill p = fp8_prefill(*device, *compute, rng);
  const BatchMetadata batch;
  expect_error([&] { group.gather_fp8_prefill(2, *compute, p.cache_view, p.dst_view, p.block_table_view,
                                              p.workspace_starts_view, 2, batch, 0); },
               "SparseMLAIndexGroup::gather_fp8_prefill: layer_index 2 is not a registered layer");
  const Tensor f32_dst = Tensor::of(p.dst, DType::f32, {12, 288});
  expect_error([&] { group.gather_fp8_prefill(0, *compute, p.cache_view, f32_dst, p.block_table_view,
                                              p.workspace_starts_view, 2, batch, 0); },
               "dst has dtype F32, expected BF16");
  EXPECT_EQ(download<std::uint16_t>(*device, *compute, p.dst, p.poison.size()), p.poison);
}

TEST_P(IndexGroupTest, BadBuilderArgumentsAreRejected) {
  Buffer storage = device->allocate(8 * 64 * 4, MemoryKind::device);
  const Tensor good = Tensor::of(storage, DType::i32, {8, 64});
  expect_error([&] { SparseMLAIndexGroupBuilder(device, Tensor::of(storage, DType::f32, {8, 64})); },
               "SparseMLAIndexGroupBuilder: logical_topk_buffer has dtype F32, expected I32");
  expect_error([&] { SparseMLAIndexGroupBuilder(device, Tensor::of(storage, DType::i32, {8, 0})); },
               "logical_topk_buffer has shape [8, 0]: top-k width K must be in [1, 2^31)");
  expect_error([&] { SparseMLAIndexGroupBuilder(device, good, -1); }, "max_decode_rows must be in [0, 2^31 - 1), got -1");
  expect_error([&] { SparseMLAIndexGroupBuilder(nullptr, good); }, "device is null");
  Buffer host_storage = device->allocate(8 * 64 * 4, MemoryKind::host);
  if (!device->kernel_accessible(MemoryKind::host)) {
    expect_error([&] { SparseMLAIndexGroupBuilder(device, Tensor::of(host_storage, DType::i32, {8, 64})); },
                 "logical_topk_buffer is in host memory");
  }
  SparseMLAIndexGroupBuilder builder(device, good, 0);  // one decode row plus the spare is a valid workspace
  EXPECT_EQ(builder.register_layer(true).group->workspace_rows(), 1);
}


}  // namespace
}  // namespace sparse_mla::testing
