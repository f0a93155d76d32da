// What host threads may share (docs/embedding.md): two threads, each driving
// its own index groups on its own streams, over one shared Device, for many
// decode steps; every layer's rows checked against the scalar reference. Run
// under ThreadSanitizer in CI (label "streams"), with the host delay switch
// so that the two threads' stream tasks interleave.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend_test.hpp"
#include "sparse_mla/fill.hpp"
#include "sparse_mla/index_group_builder.hpp"
#include "test_util.hpp"
#include "validation/reference/topk_reference.hpp"

namespace sparse_mla::testing {
namespace {

class ThreadsTest : public BackendTest {};
SPARSE_MLA_INSTANTIATE_BACKENDS(ThreadsTest);

constexpr std::int64_t top_k = 64, requests = 4, blocks = 6, max_tokens = 8;
constexpr std::int32_t block_size = 16;
constexpr int layers = 4, steps = 12;

// One engine thread: its own streams, logical buffer and groups (an indexer
// every other layer), several decode steps. Returns the differing entries.
std::int64_t drive(Device& device, std::shared_ptr<Device> shared, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto compute = device.create_stream();
  OwnedTensor logical_buffer(device, DType::i32, {max_tokens, top_k});
  SparseMLAIndexGroupBuilder builder(shared, logical_buffer, max_tokens - 1);
  std::vector<LayerRegistration> regs;
  for (int l = 0; l < layers; ++l) regs.push_back(builder.register_layer(l % 2 == 0));
  std::int64_t wrong = 0;
  for (int step = 0; step < steps; ++step) {
    const std::int64_t T = std::uniform_int_distribution<std::int64_t>(1, max_tokens)(rng);
    reference::TopkInputs in;
    in.num_tokens = T;
    in.num_topk = top_k;
    in.blocks_per_request = blocks;
    in.block_size = block_size;
    in.block_stride_rows = block_size;
    for (std::int64_t t = 0; t < T; ++t) in.req_id.push_back(static_cast<std::int32_t>(rng() % requests));
    for (std::int64_t i = 0; i < requests * blocks; ++i) in.block_table.push_back(static_cast<std::int32_t>(rng() % 1000));
    const OwnedTensor req_id = upload(*compute, in.req_id, {T});
    const OwnedTensor table = upload(*compute, in.block_table, {requests, blocks});
    BatchMetadata batch;
    batch.req_id_per_token = req_id;
    batch.block_table = table;
    batch.block_size = block_size;
    batch.num_decodes = T;
    batch.num_decode_tokens = T;
    std::vector<OwnedTensor> outputs;
    std::vector<reference::TopkOutputs> want;
    for (int l = 0; l < layers; ++l) {
      SparseMLAIndexGroup& group = *regs[std::size_t(l)].group;
      const int index = regs[std::size_t(l)].index_in_group;
      if (index == 0) {  // the group's indexer writes a fresh selection
        in.logical.clear();
        for (std::int64_t i = 0; i < T * top_k; ++i) {
          in.logical.push_back(static_cast<std::int32_t>(rng() % (blocks * block_size + 20)) - 2);
        }
        fill_i32(*compute, logical_buffer, poison_i32);
        upload_bytes(*compute, in.logical.data(), in.logical.size() * 4, logical_buffer);
      }
      group.set_logical_topk_ready(index, *compute);
      group.prepare_for_batch(index, batch, *compute);
      const TopkConversion r = group.convert_logical_to_physical_topk(index, *compute, logical_buffer.tensor().rows(0, T),
                                                                      batch, 0, true);
      outputs.emplace_back(device, DType::i32, std::vector<std::int64_t>{T, top_k});
      compute->copy_bytes(outputs.back().data(), r.physical.data(), static_cast<std::size_t>(T * top_k) * 4);
      if (index == 0) want.push_back(reference::convert_topk(in));
    }
    for (int l = 0; l < layers; ++l) {
      const auto got = download<std::int32_t>(*compute, outputs[std::size_t(l)]);
      const auto& expected = want[std::size_t(l / 2)].physical;
      for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != expected[i];
    }
  }
  for (const auto& group : builder.groups()) wrong += group->conversion_counts().decode != std::uint64_t(steps);
  return wrong;
}

TEST_P(ThreadsTest, TwoThreadsDriveTheirOwnGroupsOnOneSharedDevice) {
  SCOPED_TRACE(seed_trace());
  DelayScope delay(100);
  std::int64_t wrong[2] = {-1, -1};
  std::string failure[2];
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      try {
        wrong[i] = drive(*device, device, test_seed() + std::uint64_t(i) * 7919);
      } catch (const std::exception& e) {
        failure[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(failure[i], "") << "thread " << i;
    EXPECT_EQ(wrong[i], 0) << "thread " << i;
  }
}

}  // namespace
}  // namespace sparse_mla::testing
