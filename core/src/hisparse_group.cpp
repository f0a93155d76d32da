#include <cstring>
#include <numeric>
#include <utility>

#include "sparse_mla/error.hpp"
#include "sparse_mla/hisparse.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "sparse_mla/kernels.hpp"

namespace sparse_mla {

namespace {

constexpr const char* convert_where = "HiSparseMLAIndexGroup::convert_logical_to_physical_topk";

// A layer's KV row size from its LayerConfig, or the group's default.
std::int64_t layer_row_bytes(const LayerConfig& layer, const HiSparseConfig& config) {
  constexpr const char* where = "HiSparseMLAIndexGroup::register_layer";
  const std::string& dtype = layer.kv_cache_dtype;
  std::int64_t bytes = config.row_bytes;
  if (dtype == "fp8_ds_mla") {
    bytes = 656;
  } else if (dtype == "bfloat16" || dtype == "float16" || dtype == "auto") {
    bytes = 2 * layer.head_size;
  } else if (dtype == "float32") {
    bytes = 4 * layer.head_size;
  } else if (!dtype.empty()) {
    fail(where, "kv_cache_dtype '", dtype, "' has no HiSparse row size (fp8_ds_mla, bfloat16, float16, auto, float32)");
  }
  if (bytes == 0) fail(where, "the layer gives no kv_cache_dtype and HiSparseConfig::row_bytes is 0: the row size is unknown");
  check_hisparse_row_bytes(where, bytes);
  return bytes;
}

template <class T>
Tensor device_copy(Device& device, Stream& stream, std::vector<Buffer>& owned, const std::vector<T>& values,
                   const std::vector<std::int64_t>& shape) {
  const std::size_t bytes = values.size() * sizeof(T);
  Buffer staging = device.allocate(bytes, MemoryKind::host);
  if (bytes) std::memcpy(staging.data(), values.data(), bytes);
  owned.push_back(device.allocate(bytes, MemoryKind::device));
  stream.copy(owned.back(), 0, staging, 0, bytes);
  stream.synchronize();  // the staging buffer goes away
  return Tensor::of(owned.back(), dtype_of<T>::value, shape);
}

struct ResolveCall {
  HiSparseResolveInputs in;
  HiSparseResolveOutputs out;
};

// The resolve's arguments for batch rows [0, T).
ResolveCall resolve_call(const HiSparseMLAIndexGroup& g, const Tensor& logical, const BatchMetadata& batch,
                                const Tensor& hot_indices, const Tensor& miss_mask, const Tensor& swap_host,
                                const Tensor& swap_device, const Tensor& swap_counts, const Tensor& counters,
                                bool return_valid_counts) {
  const std::int64_t T = logical.dim(0);
  const HiSparseConfig& c = g.config();
  ResolveCall call;
  call.in.logical = logical;
  call.in.request_ids = batch.req_id_per_token;
  call.in.request_state_indices = batch.hisparse->request_state_indices;
  call.in.source_block_table = batch.block_table;
  call.in.source_block_size = batch.block_size;
  call.in.host_rows = c.host_pool_rows;
  call.in.resident_block_table = batch.hisparse->resident_block_table;
  call.in.resident_block_size = batch.block_size;
  call.in.resident_null_block = batch.hisparse->resident_null_block;
  call.in.hot_table_by_state = !batch.hisparse->hot_block_table.defined();
  call.in.hot_block_table = call.in.hot_table_by_state ? g.hot_block_table() : batch.hisparse->hot_block_table;
  call.in.hot_block_size = c.block_size;
  call.in.attention_block_stride = c.attention_block_stride;
  call.out.hot_indices = hot_indices.rows(0, T);
  call.out.attention_indices = g.physical_workspace().rows(0, T);
  call.out.miss_mask = miss_mask.rows(0, T);
  call.out.swap_host_rows = swap_host.rows(0, T);
  call.out.swap_device_rows = swap_device.rows(0, T);
  if (return_valid_counts) call.out.valid_counts = g.valid_counts_workspace().rows(0, T);
  call.out.swap_counts = swap_counts.rows(0, T);
  call.out.hit_miss_counters = counters;
  return call;
}

}  // namespace

HiSparseMLAIndexGroup::HiSparseMLAIndexGroup(std::shared_ptr<Device> device, const Tensor& logical_topk_buffer,
                                             std::int64_t max_decode_rows, bool has_indexer, const HiSparseConfig& config)
    : SparseMLAIndexGroup(std::move(device), logical_topk_buffer, max_decode_rows, has_indexer),
      config_(resolve_hisparse_config(config, top_k())) {
  hot_blocks_per_state_ = (config_.hot_slots + config_.block_size - 1) / config_.block_size;
  allocate_state();
  prefill_stream_ = this->device().create_stream();
}

HiSparseMLAIndexGroup::~HiSparseMLAIndexGroup() {
  // Work queued on the group's streams reads the caches and the state.
  side_stream().synchronize();
  prefill_stream_->synchronize();
}

void HiSparseMLAIndexGroup::allocate_state() {
  Device& dev = device();
  Stream& stream = side_stream();
  const std::int64_t S = config_.max_requests, H = config_.hot_slots, K = top_k(), W = workspace_rows();
  std::vector<std::int16_t> lru(static_cast<std::size_t>(S * H));
  for (std::int64_t s = 0; s < S; ++s) std::iota(lru.begin() + s * H, lru.begin() + (s + 1) * H, std::int16_t{0});
  std::vector<std::int32_t> hot_blocks(static_cast<std::size_t>(S * hot_blocks_per_state_));
  std::iota(hot_blocks.begin(), hot_blocks.end(), 0);  // state s owns blocks s * hot_blocks_per_state ...
  slot_rows_ = device_copy(dev, stream, buffers_, std::vector<std::int32_t>(lru.size(), -1), {S, H});
  lru_ = device_copy(dev, stream, buffers_, lru, {S, H});
  hot_block_table_ = device_copy(dev, stream, buffers_, hot_blocks, {S, hot_blocks_per_state_});
  for (Tensor* t : {&hot_indices_, &miss_mask_, &swap_host_rows_, &swap_device_rows_}) {
    buffers_.push_back(dev.allocate(static_cast<std::size_t>(W * K) * 4, MemoryKind::device));
    *t = Tensor::of(buffers_.back(), DType::i32, {W, K});
  }
  buffers_.push_back(dev.allocate(static_cast<std::size_t>(W) * 4, MemoryKind::device));
  swap_counts_ = Tensor::of(buffers_.back(), DType::i32, {W});
  counters_ = device_copy(dev, stream, buffers_, std::vector<std::int64_t>{0, 0}, {2});
}

int HiSparseMLAIndexGroup::register_layer(const LayerConfig& config) {
  const std::int64_t row_bytes = layer_row_bytes(config, config_);
  auto cache = std::make_unique<HiSparseCacheHandle>(device(), side_stream(), config_, row_bytes);
  side_stream().synchronize();  // the hot cache is cleared before anyone reads it
  caches_.push_back(std::move(cache));
  return SparseMLAIndexGroup::register_layer(config);
}

HiSparseCacheHandle& HiSparseMLAIndexGroup::cache(int layer_index) const {
  if (layer_index < 0 || layer_index >= static_cast<int>(caches_.size())) {
    fail("HiSparseMLAIndexGroup::cache", "layer_index ", layer_index, " is not a registered layer (", caches_.size(), " layers)");
  }
  return *caches_[static_cast<std::size_t>(layer_index)];
}

void HiSparseMLAIndexGroup::prepare_for_batch(int layer_index, const BatchMetadata& batch, Stream& compute) {
  constexpr const char* where = "HiSparseMLAIndexGroup::prepare_for_batch";
  check_layer(where, layer_index, compute);
  if (layer_index != 0) return;
  if (batch.hisparse == nullptr) fail(where, "batch.hisparse is null: a HiSparse group needs the step's state rows");
  check(where, "batch.hisparse->request_state_indices", batch.hisparse->request_state_indices).dtype(DType::i32).rank(1)
      .on(device());
}

TopkConversion HiSparseMLAIndexGroup::convert_logical_to_physical_topk(int layer_index, Stream& compute,
                                                                      const Tensor& logical_topk,
                                                                      const BatchMetadata& batch,
                                                                      std::int64_t block_stride_rows,
                                                                      bool return_valid_counts) {
  check_layer(convert_where, layer_index, compute);
  check(convert_where, "logical top-k", logical_topk).dtype(DType::i32).rank(2);
  if (is_decode_sized(logical_topk.dim(0))) {
    return convert_decode(layer_index, compute, logical_topk, batch, return_valid_counts);
  }
  // Prefill-sized batches do not fit the decode workspace: their context
  // pages are resident (or were staged), so they convert like plain groups
  // through the resident block table.
  if (batch.hisparse == nullptr || !batch.hisparse->resident_block_table.defined()) {
    fail(convert_where, "a prefill-sized batch (", logical_topk.dim(0), " rows, workspace ", workspace_rows(),
         ") needs batch.hisparse->resident_block_table: stage non-resident prefill rows first");
  }
  return convert_once(layer_index, compute, logical_topk, batch.req_id_per_token, batch.hisparse->resident_block_table,
                      batch.block_size, block_stride_rows, return_valid_counts);
}


TopkConversion HiSparseMLAIndexGroup::convert_decode(int layer_index, Stream& compute, const Tensor& logical_topk,
                                                     const BatchMetadata& batch, bool return_valid_counts) {
  check_decode(layer_index, logical_topk, batch, return_valid_counts);
  if (layer_index == 0) resolve_and_gather(compute, logical_topk, batch, return_valid_counts);
  compute.wait(cache(layer_index).ready());
  const std::int64_t T = logical_topk.dim(0);
  TopkConversion result;
  result.physical = physical_workspace().rows(0, T);
  if (return_valid_counts) result.valid_counts = valid_counts_workspace().rows(0, T);
  return result;
}


// Everything that can reject, before anything is queued.
void HiSparseMLAIndexGroup::check_decode(int layer_index, const Tensor& logical_topk, const BatchMetadata& batch,
                                         bool return_valid_counts) const {
  check(convert_where, "logical top-k", logical_topk).dim(1, top_k(), "K of the group's logical top-k buffer");
  const std::int64_t T = logical_topk.dim(0);
  if (layer_index != 0) {
    if (leader_rows_ < 0) {
      fail(convert_where, "layer ", layer_index, " asks for the group's physical top-k before the leader (layer 0) resolved a decode-sized batch");
    }
    if (T != leader_rows_) {
      fail(convert_where, "layer ", layer_index, " passes logical top-k of ", T, " rows but the leader resolved ", leader_rows_, " rows");
    }
    if (return_valid_counts && !leader_counted_) {
      fail(convert_where, "layer ", layer_index, " asks for valid counts but the leader resolved without them");
    }
    return;
  }
  if (batch.hisparse == nullptr) fail(convert_where, "batch.hisparse is null: a HiSparse group needs the step's state rows");
  if (caches_.empty()) fail(convert_where, "the group has no layers");
  const ResolveCall call = resolve_call(*this, logical_topk, batch, hot_indices_, miss_mask_, swap_host_rows_,
                                        swap_device_rows_, swap_counts_, counters_, return_valid_counts);
  check_resolve_hisparse(device(), call.in, HiSparseSlotState{slot_rows_, lru_}, config_.hot_slots, call.out);
}

// The leader's work on the side stream: one resolve, then one gather per
// layer, each followed by that layer's ready event.
void HiSparseMLAIndexGroup::resolve_and_gather(Stream& compute, const Tensor& logical_topk, const BatchMetadata& batch,
                                               bool return_valid_counts) {
  Stream& side = side_stream();
  if (has_indexer() && !piecewise_capture()) {
    side.wait(logical_topk_ready());
  } else {
    side.wait(compute);
  }
  const ResolveCall call = resolve_call(*this, logical_topk, batch, hot_indices_, miss_mask_, swap_host_rows_,
                                        swap_device_rows_, swap_counts_, counters_, return_valid_counts);
  resolve_hisparse(side, call.in, HiSparseSlotState{slot_rows_, lru_}, config_.hot_slots, call.out);
  physical_topk_ready().record(side);
  ++resolves_;
  const std::int64_t T = logical_topk.dim(0);
  for (const auto& layer : caches_) {
    gather_hisparse(side, HiSparseGatherTensors{layer->host_pool(), layer->hot_cache(), call.out.swap_host_rows,
                                                call.out.swap_device_rows, call.out.swap_counts},
                    T);
    layer->ready().record(side);
    ++gathers_;
  }
  leader_rows_ = T;
  leader_counted_ = return_valid_counts;
}

void HiSparseMLAIndexGroup::write_rows(int layer_index, Stream& compute, const Tensor& rows, const Tensor& host_row_ids) {
  check_layer("HiSparseMLAIndexGroup::write_rows", layer_index, compute);
  write_hisparse_rows(compute, rows, host_row_ids, cache(layer_index).host_pool());
}

void HiSparseMLAIndexGroup::invalidate_rows(Stream& compute, const Tensor& host_row_ids, const Tensor& state_rows) {
  invalidate_hisparse_slots(compute, HiSparseSlotState{slot_rows_, lru_}, config_.hot_slots, host_row_ids, state_rows);
}

HiSparseCounters HiSparseMLAIndexGroup::counters() {
  Buffer staging = device().allocate(2 * sizeof(std::int64_t), MemoryKind::host);
  side_stream().copy_bytes(staging.data(), counters_.data(), 2 * sizeof(std::int64_t));
  side_stream().synchronize();
  std::uint64_t hit_miss[2];
  std::memcpy(hit_miss, staging.data(), sizeof hit_miss);
  std::uint64_t bytes_per_miss = 0;
  for (const auto& layer : caches_) bytes_per_miss += static_cast<std::uint64_t>(layer->row_bytes());
  return HiSparseCounters{hit_miss[0], hit_miss[1], hit_miss[1] * bytes_per_miss};
}

HiSparseFootprint HiSparseMLAIndexGroup::footprint() const {
  HiSparseFootprint total;
  for (const auto& layer : caches_) {
    total.host_bytes += layer->footprint().host_bytes;
    total.device_bytes += layer->footprint().device_bytes;
  }
  for (const Buffer& b : buffers_) total.device_bytes += b.bytes();
  total.device_bytes += static_cast<std::uint64_t>(workspace_rows() * (top_k() + 1)) * 4;  // physical + valid counts
  return total;
}

}  // namespace sparse_mla
