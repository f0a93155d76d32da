// A test rig for the HiSparse kernels: the tables, slot state, host pool and
// hot cache of reference::HiSparseTables on a device, and one call that runs
// a step (resolve, then gather) through the public ops on poisoned outputs
// and reads everything back.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "validation/reference/hisparse_reference.hpp"
#include "sparse_mla/fill.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "test_util.hpp"

namespace sparse_mla::testing {

struct HiSparseRig {
  Device& device;
  Stream& stream;
  reference::HiSparseTables tables;
  std::int32_t max_rows;
  std::int64_t row_bytes;
  std::int32_t hot_blocks;  // blocks of the hot cache
  std::vector<std::uint8_t> host_pool_bytes;
  DeviceTensor source, resident, slot_rows, lru, host_pool, hot_cache, counters;
  DeviceTensor hot_indices, attention, resolved, miss, swap_host, swap_device, valid, swaps;
  // When defined, the resolve reads this table by state row (hot_table_by_state)
  // instead of the step's table by batch row.
  DeviceTensor hot_table_by_state;
  // false: the resolve gets none of its optional outputs (attention indices,
  // resolved rows, miss mask, valid counts, counters); their buffers keep
  // the poison.
  bool optional_outputs = true;

  HiSparseRig(Device& d, Stream& s, const reference::HiSparseTables& t, const reference::HiSparseState& state,
              std::int32_t rows, std::int64_t bytes_per_row, std::int32_t hot_cache_blocks, std::mt19937_64& rng)
      : device(d), stream(s), tables(t), max_rows(rows), row_bytes(bytes_per_row), hot_blocks(hot_cache_blocks) {
    source = device_tensor(d, s, t.source_table, {t.source_rows, t.source_blocks});
    if (!t.resident_table.empty()) resident = device_tensor(d, s, t.resident_table, {t.resident_rows, t.resident_blocks});
    set_state(state);
    host_pool_bytes.resize(std::size_t(t.host_rows * row_bytes));
    for (auto& b : host_pool_bytes) b = static_cast<std::uint8_t>(rng());
    host_pool = device_tensor(d, s, host_pool_bytes, {t.host_rows, row_bytes}, MemoryKind::pinned_host);
    hot_cache = device_tensor(d, s, std::vector<std::uint8_t>(std::size_t(hot_blocks) * t.hot_block_size * row_bytes, 0xEE),
                              {hot_blocks, t.hot_block_size, row_bytes});
    counters = device_tensor(d, s, std::vector<std::int64_t>(2, 0), {2});
    allocate_outputs(t.top_k);
  }

  // Poisoned outputs for max_rows rows of `top_k` entries.
  void allocate_outputs(std::int32_t top_k) {
    const std::vector<std::int32_t> poison_rows(std::size_t(max_rows) * top_k, poison_i32);
    for (DeviceTensor* o : {&hot_indices, &attention, &resolved, &miss, &swap_host, &swap_device}) {
      *o = device_tensor(device, stream, poison_rows, {max_rows, top_k});
    }
    valid = device_tensor(device, stream, std::vector<std::int32_t>(std::size_t(max_rows), poison_i32), {max_rows});
    swaps = device_tensor(device, stream, std::vector<std::int32_t>(std::size_t(max_rows), poison_i32), {max_rows});
  }

  void set_state(const reference::HiSparseState& state) {
    slot_rows = device_tensor(device, stream, state.slot_rows, {state.states(), state.hot_slots});
    lru = device_tensor(device, stream, state.lru, {state.states(), state.hot_slots});
  }
  HiSparseSlotState slot_state() const { return HiSparseSlotState{slot_rows.tensor, lru.tensor}; }

  reference::HiSparseState state() {
    reference::HiSparseState out;
    out.hot_slots = tables.hot_slots;
    out.slot_rows = download<std::int32_t>(device, stream, slot_rows.buffer, std::size_t(slot_rows.tensor.numel()));
    out.lru = download<std::int16_t>(device, stream, lru.buffer, std::size_t(lru.tensor.numel()));
    return out;
  }
  std::vector<std::uint8_t> hot_cache_bytes() {
    return download<std::uint8_t>(device, stream, hot_cache.buffer, std::size_t(hot_cache.tensor.numel()));
  }
  std::vector<std::int64_t> hit_miss_counters() { return download<std::int64_t>(device, stream, counters.buffer, 2); }

  HiSparseResolveInputs inputs(const DeviceTensor& logical, const DeviceTensor& ids, const DeviceTensor& states,
                               const DeviceTensor& hot_table) const {
    HiSparseResolveInputs in;
    in.logical = logical.tensor;
    in.request_ids = ids.tensor;
    in.request_state_indices = states.tensor;
    in.source_block_table = source.tensor;
    in.source_block_size = tables.source_block_size;
    in.host_rows = tables.host_rows;
    in.resident_block_table = resident.tensor;
    in.resident_block_size = tables.resident_block_size;
    in.resident_null_block = tables.resident_null_block;
    in.hot_block_table = hot_table.tensor;
    in.hot_block_size = tables.hot_block_size;
    in.attention_block_stride = tables.attention_block_stride;
    return in;
  }
  HiSparseResolveOutputs outputs() const {
    HiSparseResolveOutputs out;
    out.hot_indices = hot_indices.tensor;
    out.swap_host_rows = swap_host.tensor;
    out.swap_device_rows = swap_device.tensor;
    out.swap_counts = swaps.tensor;
    if (optional_outputs) {
      out.attention_indices = attention.tensor;
      out.resolved_rows = resolved.tensor;
      out.miss_mask = miss.tensor;
      out.valid_counts = valid.tensor;
      out.hit_miss_counters = counters.tensor;
    }
    return out;
  }

  void poison_outputs() {
    for (DeviceTensor* o : {&hot_indices, &attention, &resolved, &miss, &swap_host, &swap_device, &valid, &swaps}) {
      fill_i32(stream, o->tensor, poison_i32);
    }
  }

  // Runs one step on the device: poison, resolve, gather; returns the
  // outputs of the step's rows. A step may select fewer entries a row than
  // the tables' top_k (a call of another shape on the same state).
  reference::HiSparseResult run(const reference::HiSparseStep& step) {
    const std::int32_t T = step.rows();
    const auto K = static_cast<std::int32_t>(step.logical.size() / std::size_t(T));
    if (K != hot_indices.tensor.dim(1)) allocate_outputs(K);
    const auto logical = device_tensor(device, stream, step.logical, {T, K});
    const auto ids = device_tensor(device, stream, step.request_ids, {T});
    const auto states = device_tensor(device, stream, step.state_indices, {T});
    const auto hot_table = device_tensor(device, stream, step.hot_block_table, {T, tables.hot_blocks_per_row});
    poison_outputs();
    HiSparseResolveInputs in = inputs(logical, ids, states, hot_table);
    if (hot_table_by_state.tensor.defined()) {
      in.hot_block_table = hot_table_by_state.tensor;
      in.hot_table_by_state = true;
    }
    resolve_hisparse(stream, in, slot_state(), tables.hot_slots, outputs());
    gather_hisparse(stream,
                    HiSparseGatherTensors{host_pool.tensor, hot_cache.tensor, swap_host.tensor, swap_device.tensor, swaps.tensor},
                    T);
    const std::size_t n = std::size_t(T) * std::size_t(K);
    reference::HiSparseResult r;
    r.hot_indices = download<std::int32_t>(device, stream, hot_indices.buffer, n);
    r.attention_indices = download<std::int32_t>(device, stream, attention.buffer, n);
    r.resolved_rows = download<std::int32_t>(device, stream, resolved.buffer, n);
    r.miss_mask = download<std::int32_t>(device, stream, miss.buffer, n);
    r.swap_host_rows = download<std::int32_t>(device, stream, swap_host.buffer, n);
    r.swap_device_rows = download<std::int32_t>(device, stream, swap_device.buffer, n);
    r.valid_counts = download<std::int32_t>(device, stream, valid.buffer, std::size_t(T));
    r.swap_counts = download<std::int32_t>(device, stream, swaps.buffer, std::size_t(T));
    return r;
  }
};

}  // namespace sparse_mla::testing
