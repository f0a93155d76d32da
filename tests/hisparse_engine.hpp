// The model the HiSparse group tests share: layers of HiSparse groups over
// one source table (distinct host blocks in random order), every layer's host
// pool filled with random rows through the host mirror, and the reference
// tables that describe it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "sparse_mla/hisparse_group.hpp"
#include "sparse_mla/index_group_builder.hpp"
#include "test_util.hpp"
#include "validation/reference/hisparse_reference.hpp"

namespace sparse_mla::testing {

// The sizes a test's groups are configured with.
struct HiSparseShape {
  std::int32_t top_k = 0;
  std::int32_t hot_slots = 0;
  std::int32_t requests = 0;
  std::int32_t blocks = 0;  // per request
  std::int32_t block_size = 0;
  std::int64_t max_decode_rows = 0;
};

struct HiSparseEngine {
  static constexpr std::int64_t logical_rows = 64;

  std::shared_ptr<Device> device;
  std::unique_ptr<Stream> compute;
  Buffer logical_storage;
  Tensor logical_buffer;  // int32 [logical_rows, K]
  std::unique_ptr<SparseMLAIndexGroupBuilder> builder;
  std::vector<LayerRegistration> layers;
  reference::HiSparseTables tables;
  DeviceTensor source;                           // tables.source_table on the device
  std::vector<std::vector<std::uint8_t>> pools;  // what each layer's host pool holds

  // `config` is the one the layers' LayerConfigs carry (its pool size and
  // attention block stride describe every group).
  HiSparseEngine(std::shared_ptr<Device> d, const HiSparseShape& shape, const HiSparseConfig& config,
                 const std::vector<bool>& producing, const std::vector<LayerConfig>& configs, std::mt19937_64& rng)
      : device(std::move(d)), compute(device->create_stream()) {
    logical_storage = device->allocate(std::size_t(logical_rows * shape.top_k) * 4, MemoryKind::device);
    logical_buffer = Tensor::of(logical_storage, DType::i32, {logical_rows, shape.top_k});
    builder = std::make_unique<SparseMLAIndexGroupBuilder>(device, logical_buffer, shape.max_decode_rows);
    for (std::size_t i = 0; i < producing.size(); ++i) layers.push_back(builder->register_layer(producing[i], configs[i]));
    tables.top_k = shape.top_k;
    tables.hot_slots = shape.hot_slots;
    tables.source_rows = shape.requests;
    tables.source_blocks = shape.blocks;
    tables.source_block_size = shape.block_size;
    tables.host_rows = config.host_pool_rows;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(config.host_pool_rows / shape.block_size));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    tables.source_table.assign(ids.begin(), ids.begin() + shape.requests * shape.blocks);
    tables.hot_block_size = shape.block_size;
    tables.hot_blocks_per_row = shape.hot_slots / shape.block_size;
    tables.attention_block_stride = config.attention_block_stride;
    source = device_tensor(*device, *compute, tables.source_table, {shape.requests, shape.blocks});
    fill_pools(rng);
  }

  HiSparseMLAIndexGroup& group(std::size_t layer) const {
    return dynamic_cast<HiSparseMLAIndexGroup&>(*layers[layer].group);
  }
  std::int64_t row_bytes(std::size_t layer) const { return group(layer).cache(layers[layer].index_in_group).row_bytes(); }

 private:
  // Every layer's host pool gets random rows through the host mirror.
  void fill_pools(std::mt19937_64& rng) {
    const std::int64_t rows = tables.host_rows;
    std::vector<std::int32_t> all(static_cast<std::size_t>(rows));
    std::iota(all.begin(), all.end(), 0);
    const auto ids = device_tensor(*device, *compute, all, {rows});
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const std::int64_t rb = row_bytes(l);
      std::vector<std::uint8_t> bytes(static_cast<std::size_t>(rows * rb));
      for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
      const auto src = device_tensor(*device, *compute, bytes, {rows, rb});
      group(l).write_rows(layers[l].index_in_group, *compute, src.tensor, ids.tensor);
      compute->synchronize();
      pools.push_back(std::move(bytes));
    }
  }
};

}  // namespace sparse_mla::testing
