// CUDA/HIP graphs over index groups: a whole decode step of a
// multi-layer model — the leader's fork onto the side stream and the join
// back through events — captured once and replayed with new inputs written in
// place; and the piecewise mode, where the indexer runs inside captured
// pieces and the conversion runs eagerly between them.
//
// Backends without graphs (host) skip with the reason they give.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "backend_test.hpp"
#include "validation/reference/topk_reference.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/index_group_builder.hpp"
#include "test_util.hpp"

namespace sparse_mla::testing {
namespace {

class GraphCaptureTest : public GraphBackendTest {};
SPARSE_MLA_INSTANTIATE_BACKENDS(GraphCaptureTest);

constexpr int num_layers = 6;
constexpr int index_every = 3;  // two groups of three layers
constexpr std::int64_t num_tokens = 4;
constexpr std::int64_t top_k = 128;
constexpr std::int64_t num_requests = 4;
constexpr std::int64_t blocks_per_request = 8;
constexpr std::int32_t block_size = 64;

// Device-resident inputs the captured graph reads, rewritten in place between
// replays, and one output per layer (what "attention" read).
struct Model {
  Buffer indexer_output;  // int32 [T, K]: what the indexer computes this step
  Buffer logical_buffer;  // int32 [T + 2, K]: the engine's logical top-k buffer
  Buffer req_id;          // int32 [T]
  Buffer block_table;     // int32 [R, B]
  std::vector<Buffer> layer_out;  // int32 [T, K] each
  SparseMLAIndexGroupBuilder builder;
  std::vector<LayerRegistration> layers;
  BatchMetadata batch;

  Model(const std::shared_ptr<Device>& device, const Tensor& logical_tensor)
      : builder(device, logical_tensor, num_tokens) {}
};

std::vector<std::int32_t> random_values(std::mt19937_64& rng, std::size_t n, std::int32_t lo, std::int32_t hi) {
  std::uniform_int_distribution<std::int32_t> d(lo, hi);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = std::max(d(rng), -1);
  return v;
}

// New step inputs, written in place into the model's device buffers.
struct StepInputs {
  std::vector<std::int32_t> logical, req_id, block_table;
};

StepInputs write_inputs(Device& device, Stream& stream, Model& m, std::mt19937_64& rng) {
  StepInputs in;
  const auto context = static_cast<std::int32_t>(blocks_per_request * block_size);
  in.logical = random_values(rng, num_tokens * top_k, -16, context + 64);
  in.req_id = random_values(rng, num_tokens, 0, num_requests - 1);
  in.block_table = random_values(rng, num_requests * blocks_per_request, 0, 999);
  const auto put = [&](Buffer& dst, const std::vector<std::int32_t>& v) {
    Buffer staging = upload(device, stream, v, MemoryKind::pinned_host);
    stream.copy(dst, 0, staging, 0, v.size() * 4);
    stream.synchronize();
  };
  put(m.indexer_output, in.logical);
  put(m.req_id, in.req_id);
  put(m.block_table, in.block_table);
  return in;
}

reference::TopkOutputs expected(const StepInputs& in) {
  reference::TopkInputs r;
  r.num_tokens = num_tokens;
  r.num_topk = top_k;
  r.blocks_per_request = blocks_per_request;
  r.block_size = block_size;
  r.block_stride_rows = block_size;
  r.req_id = in.req_id;
  r.block_table = in.block_table;
  r.logical = in.logical;
  return reference::convert_topk(r);
}

Tensor i32(const Buffer& b, std::vector<std::int64_t> shape) { return Tensor::of(b, DType::i32, std::move(shape)); }

std::unique_ptr<Model> make_model(const std::shared_ptr<Device>& device) {
  const std::size_t row_bytes = top_k * 4;
  Buffer logical = device->allocate((num_tokens + 2) * row_bytes, MemoryKind::device);
  auto m = std::make_unique<Model>(device, i32(logical, {num_tokens + 2, top_k}));
  m->logical_buffer = std::move(logical);
  m->indexer_output = device->allocate(num_tokens * row_bytes, MemoryKind::device);
  m->req_id = device->allocate(num_tokens * 4, MemoryKind::device);
  m->block_table = device->allocate(num_requests * blocks_per_request * 4, MemoryKind::device);
  for (int l = 0; l < num_layers; ++l) {
    m->layer_out.push_back(device->allocate(num_tokens * row_bytes, MemoryKind::device));
    m->layers.push_back(m->builder.register_layer(l % index_every == 0));
  }
  m->batch.req_id_per_token = i32(m->req_id, {num_tokens});
  m->batch.block_table = i32(m->block_table, {num_requests, blocks_per_request});
  m->batch.block_size = block_size;
  m->batch.num_decodes = num_requests;
  m->batch.num_decode_tokens = num_tokens;
  return m;
}

// The indexer of an index-producing layer: writes this step's logical top-k
// into the engine's buffer on the compute stream.
void run_indexer(Stream& compute, Model& m) {
  compute.copy(m.logical_buffer, 0, m.indexer_output, 0, m.indexer_output.bytes());
}

// One layer's index work and its "attention" read of the physical rows.
void run_layer_conversion(Stream& compute, Model& m, int l) {
  const LayerRegistration& r = m.layers[static_cast<std::size_t>(l)];
  const Tensor logical = i32(m.logical_buffer, {num_tokens + 2, top_k}).rows(0, num_tokens);
  r.group->prepare_for_batch(r.index_in_group, m.batch, compute);
  TopkConversion result = r.group->convert_logical_to_physical_topk(r.index_in_group, compute, logical, m.batch, 0, true);
  compute.copy_bytes(m.layer_out[static_cast<std::size_t>(l)].data(), result.physical.data(),
                     static_cast<std::size_t>(num_tokens * top_k * 4));
}

// A whole decode step, all layers, as the engine's forward pass queues it.
void decode_step(Stream& compute, Model& m) {
  for (int l = 0; l < num_layers; ++l) {
    const LayerRegistration& r = m.layers[static_cast<std::size_t>(l)];
    if (r.index_in_group == 0 && r.group->has_indexer()) run_indexer(compute, m);
    r.group->set_logical_topk_ready(r.index_in_group, compute);
    run_layer_conversion(compute, m, l);
  }
}

void expect_every_layer(Device& device, Stream& compute, Model& m, const StepInputs& in, int replay) {
  const auto want = expected(in);
  for (int l = 0; l < num_layers; ++l) {
    const auto got = download<std::int32_t>(device, compute, m.layer_out[static_cast<std::size_t>(l)],
                                            static_cast<std::size_t>(num_tokens * top_k));
    ASSERT_EQ(got, want.physical) << "replay " << replay << ", layer " << l;
  }
}

TEST_P(GraphCaptureTest, WholeDecodeStepReplaysWithNewInputsInPlace) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(61);
  auto compute = device->create_stream();
  auto m = make_model(device);
  // Warm-up outside the capture: Kokkos sizes its launch resources on the
  // first launch, which a capture would refuse.
  StepInputs in = write_inputs(*device, *compute, *m, rng);
  decode_step(*compute, *m);
  compute->synchronize();
  expect_every_layer(*device, *compute, *m, in, -1);

  compute->begin_capture();
  decode_step(*compute, *m);
  std::unique_ptr<Graph> graph = compute->end_capture();
  const auto counted = m->layers[0].group->conversion_counts().decode;

  for (int replay = 0; replay < 4; ++replay) {
    in = write_inputs(*device, *compute, *m, rng);
    for (auto& out : m->layer_out) compute->fill(out, 0, poison_byte, out.bytes());
    graph->replay(*compute);
    compute->synchronize();
    expect_every_layer(*device, *compute, *m, in, replay);
  }
  // Replays re-run captured work; the host-side counter saw one capture.
  EXPECT_EQ(m->layers[0].group->conversion_counts().decode, counted);
}

// The engine captures: the compute stream is the engine's own native stream,
// wrapped (Device::wrap_stream), and the capture is begun and ended on the
// native stream by its owner, not through the wrapper. The library sees the
// capture (is_capturing) and the graph replays with new inputs in place.
TEST_P(GraphCaptureTest, TheEngineCapturesAWholeDecodeStepOnItsOwnStream) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(63);
  auto engine = device->create_stream();  // stands for the engine's cudaStream_t / hipStream_t
  auto compute = device->wrap_stream(engine->native_handle());
  auto m = make_model(device);
  StepInputs in = write_inputs(*device, *compute, *m, rng);
  decode_step(*compute, *m);
  compute->synchronize();
  expect_every_layer(*device, *compute, *m, in, -1);

  EXPECT_FALSE(compute->is_capturing());
  engine->begin_capture();  // cudaStreamBeginCapture on the engine's stream
  EXPECT_TRUE(compute->is_capturing());
  decode_step(*compute, *m);
  std::unique_ptr<Graph> graph = engine->end_capture();
  EXPECT_FALSE(compute->is_capturing());

  for (int replay = 0; replay < 4; ++replay) {
    in = write_inputs(*device, *compute, *m, rng);
    for (auto& out : m->layer_out) compute->fill(out, 0, poison_byte, out.bytes());
    graph->replay(*engine);
    engine->synchronize();
    expect_every_layer(*device, *compute, *m, in, replay);
  }
}

TEST_P(GraphCaptureTest, PiecewiseModeConvertsEagerlyBetweenCapturedPieces) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(62);
  auto compute = device->create_stream();
  auto m = make_model(device);
  m->builder.set_piecewise_capture(true);
  for (const auto& group : m->builder.groups()) group->set_piecewise_capture(true);

  // Each group's indexer runs inside its own captured piece, where
  // set_logical_topk_ready must not record an event that the eager
  // conversion would then wait on.
  std::vector<std::unique_ptr<Graph>> pieces;
  for (int l = 0; l < num_layers; l += index_every) {
    const LayerRegistration& r = m->layers[static_cast<std::size_t>(l)];
    compute->begin_capture();
    run_indexer(*compute, *m);
    r.group->set_logical_topk_ready(r.index_in_group, *compute);
    pieces.push_back(compute->end_capture());
  }

  for (int replay = 0; replay < 3; ++replay) {
    const StepInputs in = write_inputs(*device, *compute, *m, rng);
    for (auto& out : m->layer_out) compute->fill(out, 0, poison_byte, out.bytes());
    for (int l = 0; l < num_layers; ++l) {
      if (l % index_every == 0) pieces[static_cast<std::size_t>(l / index_every)]->replay(*compute);
      run_layer_conversion(*compute, *m, l);  // eager, between the pieces
    }
    compute->synchronize();
    expect_every_layer(*device, *compute, *m, in, replay);
  }
}

}  // namespace
}  // namespace sparse_mla::testing
