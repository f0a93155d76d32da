#include "sparse_mla/hisparse_group.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

#include "sparse_mla/error.hpp"
#include "sparse_mla/fill.hpp"
#include "sparse_mla/fp8.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "kernels.hpp"

namespace sparse_mla {

namespace {

// A layer's KV row size from its LayerConfig, or the group's default.
std::int64_t layer_row_bytes(const LayerConfig& layer, const HiSparseConfig& config) {
  constexpr const char* where = "HiSparseMLAIndexGroup::register_layer";
  const std::string& dtype = layer.kv_cache_dtype;
  std::int64_t bytes = config.row_bytes;
  if (dtype == "fp8_ds_mla") {
    bytes = fp8_row_bytes;
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

}  // namespace

// The resolve's arguments for batch rows [0, T) of one step.
struct HiSparseMLAIndexGroup::ResolveCall {
  HiSparseResolveInputs in;
  HiSparseResolveOutputs out;
};

HiSparseMLAIndexGroup::ResolveCall HiSparseMLAIndexGroup::resolve_call(const StepCall& call) const {
  const std::int64_t T = call.num_tokens();
  const BatchMetadata& batch = call.batch;
  ResolveCall r;
  r.in.logical = call.logical_topk;
  r.in.request_ids = batch.req_id_per_token;
  r.in.request_state_indices = batch.hisparse->request_state_indices;
  r.in.source_block_table = batch.block_table;
  r.in.source_block_size = batch.block_size;
  r.in.host_rows = config_.host_pool_rows;
  r.in.resident_block_table = batch.hisparse->resident_block_table;
  r.in.resident_block_size = batch.block_size;
  r.in.resident_null_block = batch.hisparse->resident_null_block;
  r.in.hot_table_by_state = !batch.hisparse->hot_block_table.defined();
  r.in.hot_block_table = r.in.hot_table_by_state ? hot_block_table() : batch.hisparse->hot_block_table;
  r.in.hot_block_size = config_.block_size;
  r.in.attention_block_stride = config_.attention_block_stride;
  r.out.hot_indices = hot_indices_.tensor().rows(0, T);
  r.out.attention_indices = physical_workspace().rows(0, T);
  r.out.miss_mask = miss_mask_.tensor().rows(0, T);
  r.out.swap_host_rows = swap_host_rows_.tensor().rows(0, T);
  r.out.swap_device_rows = swap_device_rows_.tensor().rows(0, T);
  if (call.return_valid_counts) r.out.valid_counts = valid_counts_workspace().rows(0, T);
  r.out.swap_counts = swap_counts_.tensor().rows(0, T);
  r.out.hit_miss_counters = counters_;
  return r;
}

// Speculative decoding: the resolve over union rows [0, T), a request's at
// its first batch row (the rest padding), into the union workspace. Tables
// and state as the batch rows'; the union rows' attention indices and valid
// counts are not needed (the scatter derives each batch row's).
HiSparseMLAIndexGroup::ResolveCall HiSparseMLAIndexGroup::union_resolve_call(const StepCall& call) const {
  const std::int64_t T = call.num_tokens();
  ResolveCall r = resolve_call(call);
  r.in.logical = union_logical_.tensor().rows(0, T);
  r.in.request_state_indices = union_state_.tensor().rows(0, T);
  r.out.hot_indices = union_hot_.tensor().rows(0, T);
  r.out.attention_indices = Tensor();
  r.out.miss_mask = union_miss_.tensor().rows(0, T);
  r.out.swap_host_rows = union_swap_host_rows_.tensor().rows(0, T);
  r.out.swap_device_rows = union_swap_device_rows_.tensor().rows(0, T);
  r.out.valid_counts = Tensor();
  r.out.swap_counts = union_swap_counts_.tensor().rows(0, T);
  return r;
}

HiSparseMLAIndexGroup::HiSparseMLAIndexGroup(std::shared_ptr<Device> device, const Tensor& logical_topk_buffer,
                                             std::int64_t max_decode_rows, bool has_indexer, const HiSparseConfig& config)
    : SparseMLAIndexGroup(std::move(device), logical_topk_buffer, max_decode_rows, has_indexer),
      config_(resolve_hisparse_config(config, top_k())) {
  hot_blocks_per_state_ = (config_.hot_slots + config_.block_size - 1) / config_.block_size;
  allocate_state();
  allocate_union_workspace();
  prefill_stream_ = this->device().create_stream();
  if (!this->device().has_kernels()) return;
  const Kernels& kernels = detail::kernels_of(this->device());
  // The resolve runs over K entries a row, or over the union rows of
  // speculative decoding, whose pass before it has scratch of its own.
  const auto resolve_width = static_cast<std::int32_t>(max_union_rows(config_));
  std::size_t bytes = kernels.resolve_hisparse_scratch_bytes(resolve_width, config_.hot_slots, config_.block_size);
  if (config_.max_rows_per_request > 1) bytes = std::max(bytes, kernels.union_hisparse_scratch_bytes(resolve_width));
  kernels.reserve_team_scratch(side_stream(), bytes);
}

HiSparseMLAIndexGroup::~HiSparseMLAIndexGroup() {
  // Work queued on the group's streams reads the caches and the state.
  side_stream().synchronize();
  prefill_stream_->synchronize();
}

// The slot state starts empty (every slot free, LRU 0 .. H-1); state row s
// owns hot blocks s * hot_blocks_per_state ... unless the engine placed them
// (HiSparseStateStorage::hot_block_table).
void HiSparseMLAIndexGroup::allocate_state() {
  constexpr const char* where = "HiSparseMLAIndexGroup";
  Device& dev = device();
  Stream& stream = side_stream();
  const std::int64_t S = config_.max_requests, H = config_.hot_slots, K = top_k(), W = workspace_rows();
  const HiSparseStateStorage& engine = config_.state;
  std::vector<std::int16_t> lru(static_cast<std::size_t>(S * H));
  for (std::int64_t s = 0; s < S; ++s) std::iota(lru.begin() + s * H, lru.begin() + (s + 1) * H, std::int16_t{0});
  const std::vector<std::int32_t> empty(lru.size(), -1);
  if (engine.slot_rows.defined()) {
    check(where, "config.state.slot_rows", engine.slot_rows).dtype(DType::i32).rank(2).dim(0, S, "max_requests")
        .dim(1, H, "hot_slots").contiguous().kind(MemoryKind::device).on(dev);
    upload_bytes(stream, empty.data(), empty.size() * sizeof(std::int32_t), engine.slot_rows);
  } else {
    slot_rows_ = upload(stream, empty, {S, H});
  }
  if (engine.lru.defined()) {
    check(where, "config.state.lru", engine.lru).dtype(DType::i16).rank(2).dim(0, S, "max_requests")
        .dim(1, H, "hot_slots").contiguous().kind(MemoryKind::device).on(dev);
    upload_bytes(stream, lru.data(), lru.size() * sizeof(std::int16_t), engine.lru);
  } else {
    lru_ = upload(stream, lru, {S, H});
  }
  if (engine.hot_block_table.defined()) {
    check(where, "config.state.hot_block_table", engine.hot_block_table).dtype(DType::i32).rank(2)
        .dim(0, S, "max_requests").dim(1, hot_blocks_per_state_, "hot blocks per state (ceil(H / block_size))")
        .rows_contiguous().on(dev);
  } else {
    std::vector<std::int32_t> hot_blocks(static_cast<std::size_t>(S * hot_blocks_per_state_));
    std::iota(hot_blocks.begin(), hot_blocks.end(), 0);
    hot_block_table_ = upload(stream, hot_blocks, {S, hot_blocks_per_state_});
  }
  for (OwnedTensor* t : {&hot_indices_, &miss_mask_, &swap_host_rows_, &swap_device_rows_}) {
    *t = OwnedTensor(dev, DType::i32, {W, K});
  }
  swap_counts_ = OwnedTensor(dev, DType::i32, {W});
  counters_ = upload(stream, std::vector<std::int64_t>{0, 0}, {2});
}

// Speculative decoding's workspace, sized once: a union row for every
// workspace row (a request's union sits at its first batch row), the
// resolve's outputs for the union rows and each batch row's map into its
// union. Union rows start at -1; nothing of it exists for one row per request.
void HiSparseMLAIndexGroup::allocate_union_workspace() {
  if (config_.max_rows_per_request == 1) return;
  Device& dev = device();
  const std::int64_t W = workspace_rows(), K = top_k(), U = max_union_rows(config_);
  for (OwnedTensor* t : {&union_logical_, &union_hot_, &union_miss_, &union_swap_host_rows_, &union_swap_device_rows_}) {
    *t = OwnedTensor(dev, DType::i32, {W, U});
  }
  for (OwnedTensor* t : {&union_state_, &union_swap_counts_, &run_first_}) *t = OwnedTensor(dev, DType::i32, {W});
  entry_position_ = OwnedTensor(dev, DType::i32, {W, K});
  fill_i32(side_stream(), union_logical_, -1);
}

const Tensor& HiSparseMLAIndexGroup::slot_rows() const { return config_.state.slot_rows.defined() ? config_.state.slot_rows : slot_rows_.tensor(); }
const Tensor& HiSparseMLAIndexGroup::lru() const { return config_.state.lru.defined() ? config_.state.lru : lru_.tensor(); }
const Tensor& HiSparseMLAIndexGroup::hot_block_table() const {
  return config_.state.hot_block_table.defined() ? config_.state.hot_block_table : hot_block_table_.tensor();
}

int HiSparseMLAIndexGroup::register_layer(const LayerConfig& config) {
  const std::int64_t row_bytes = layer_row_bytes(config, config_);
  if (config.hisparse_storage) {
    caches_.push_back(std::make_unique<HiSparseCacheHandle>(device(), config_, row_bytes, *config.hisparse_storage));
  } else {
    caches_.push_back(std::make_unique<HiSparseCacheHandle>(device(), side_stream(), config_, row_bytes));
    side_stream().synchronize();  // the hot cache is cleared before anyone reads it
  }
  return SparseMLAIndexGroup::register_layer(config);
}

HiSparseCacheHandle& HiSparseMLAIndexGroup::cache(int layer_index) const {
  if (layer_index < 0 || layer_index >= static_cast<int>(caches_.size())) {
    fail("HiSparseMLAIndexGroup::cache", "layer_index ", layer_index, " is not a registered layer (", caches_.size(), " layers)");
  }
  return *caches_[static_cast<std::size_t>(layer_index)];
}

void HiSparseMLAIndexGroup::prepare_for_batch(int layer_index, const BatchMetadata& batch, Stream& compute) {
  check_layer("prepare_for_batch", layer_index, compute);
  if (layer_index != 0) return;
  const std::string w = where("prepare_for_batch");
  if (batch.hisparse == nullptr) fail(w, "batch.hisparse is null: a HiSparse group needs the step's state rows");
  check(w, "batch.hisparse->request_state_indices", batch.hisparse->request_state_indices).dtype(DType::i32).rank(1)
      .on(device());
}

// ---- The decode protocol's hooks ----

// Followers are checked by the protocol (the leader's rows and counts); the
// leader's resolve is checked here, before anything is queued.
void HiSparseMLAIndexGroup::check_decode_step(const StepCall& call) const {
  if (!call.leader()) return;
  const std::string w = where("convert_logical_to_physical_topk");
  if (call.batch.hisparse == nullptr) fail(w, "batch.hisparse is null: a HiSparse group needs the step's state rows");
  if (caches_.empty()) fail(w, "the group has no layers");
  const ResolveCall r = resolve_call(call);
  check_resolve_hisparse(device(), r.in, HiSparseSlotState{slot_rows(), lru()}, config_.hot_slots, r.out);
  if (config_.max_rows_per_request > 1) {
    // The pass before the union resolve reads the batch rows' state rows; the
    // batch-row checks above cover the rest of what it and the scatter read.
    if (!call.batch.hisparse->request_state_indices.defined()) {
      fail(w, "batch.hisparse->request_state_indices is undefined: with max_rows_per_request ",
           config_.max_rows_per_request, " a request's rows are found by their state rows");
    }
    const ResolveCall u = union_resolve_call(call);
    check_resolve_hisparse(device(), u.in, HiSparseSlotState{slot_rows(), lru()}, config_.hot_slots, u.out);
  }
}

void HiSparseMLAIndexGroup::queue_conversion(Stream& side, const StepCall& call) {
  if (config_.max_rows_per_request > 1) {
    queue_union_resolve(side, call);
  } else {
    const ResolveCall r = resolve_call(call);
    resolve_hisparse(side, r.in, HiSparseSlotState{slot_rows(), lru()}, config_.hot_slots, r.out);
  }
  ++resolves_;
}

// Speculative decoding: the requests' union rows, one resolve over them, then
// every batch row's outputs and share of its request's swap list, so that the
// gathers run over batch rows as without it.
void HiSparseMLAIndexGroup::queue_union_resolve(Stream& side, const StepCall& call) {
  const std::int64_t T = call.num_tokens();
  const BatchMetadata& batch = call.batch;
  const Kernels& kernels = detail::kernels_of(device());
  const auto K = static_cast<std::int32_t>(top_k());
  const auto U = static_cast<std::int32_t>(max_union_rows(config_));
  HiSparseUnionArgs u{};
  u.logical = call.logical_topk.data_as<std::int32_t>();
  u.logical_stride = call.logical_topk.stride(0);
  u.request_ids = batch.req_id_per_token.data_as<std::int32_t>();
  u.request_state_indices = batch.hisparse->request_state_indices.data_as<std::int32_t>();
  u.num_state_rows = static_cast<std::int32_t>(lru().dim(0));
  u.union_logical = union_logical_.data_as<std::int32_t>();
  u.union_stride = union_logical_.tensor().stride(0);
  u.union_state = union_state_.data_as<std::int32_t>();
  u.entry_position = entry_position_.data_as<std::int32_t>();
  u.entry_stride = entry_position_.tensor().stride(0);
  u.run_first = run_first_.data_as<std::int32_t>();
  u.num_rows = T;
  u.top_k = K;
  u.max_rows_per_request = config_.max_rows_per_request;
  u.union_width = U;
  kernels.union_hisparse_requests(side, u);

  const ResolveCall union_rows = union_resolve_call(call);
  resolve_hisparse(side, union_rows.in, HiSparseSlotState{slot_rows(), lru()}, config_.hot_slots, union_rows.out);

  const ResolveCall rows = resolve_call(call);
  HiSparseUnionScatterArgs s{};
  s.run_first = run_first_.data_as<std::int32_t>();
  s.entry_position = entry_position_.data_as<std::int32_t>();
  s.entry_stride = entry_position_.tensor().stride(0);
  s.union_hot = union_hot_.data_as<std::int32_t>();
  s.union_miss = union_miss_.data_as<std::int32_t>();
  s.union_swap_host_rows = union_swap_host_rows_.data_as<std::int32_t>();
  s.union_swap_device_rows = union_swap_device_rows_.data_as<std::int32_t>();
  s.union_stride = union_hot_.tensor().stride(0);
  s.union_swap_counts = union_swap_counts_.data_as<std::int32_t>();
  s.hot_block_size = config_.block_size;
  s.attention_block_stride = config_.attention_block_stride;
  s.hot_indices = rows.out.hot_indices.data_as<std::int32_t>();
  s.attention_indices = rows.out.attention_indices.data_as<std::int32_t>();
  s.attention_stride = rows.out.attention_indices.stride(0);
  s.miss_mask = rows.out.miss_mask.data_as<std::int32_t>();
  s.swap_host_rows = rows.out.swap_host_rows.data_as<std::int32_t>();
  s.swap_device_rows = rows.out.swap_device_rows.data_as<std::int32_t>();
  s.out_stride = rows.out.hot_indices.stride(0);
  s.valid_counts = rows.out.valid_counts.defined() ? rows.out.valid_counts.data_as<std::int32_t>() : nullptr;
  s.swap_counts = rows.out.swap_counts.data_as<std::int32_t>();
  s.num_rows = T;
  s.top_k = K;
  kernels.scatter_hisparse_union(side, s);
}

// Every layer's misses, from its host pool into its hot cache: the first
// layer's gather, then its ready event (its attention can start), then one
// gather for the later layers and their ready events. The later layers'
// events fire together; the compute stream reaches them a layer later anyway.
void HiSparseMLAIndexGroup::queue_layer_work(Stream& side, const StepCall& call) {
  const std::int64_t T = call.num_tokens();
  const Tensor swap_host = swap_host_rows_.tensor().rows(0, T), swap_device = swap_device_rows_.tensor().rows(0, T),
               swap_counts = swap_counts_.tensor().rows(0, T);
  const HiSparseCacheHandle& first = *caches_.front();
  gather_hisparse(side, HiSparseGatherTensors{first.host_pool(), first.hot_cache(), swap_host, swap_device, swap_counts}, T);
  first.ready().record(side);
  ++gathers_;
  ++gather_launches_;
  if (caches_.size() == 1) return;
  if (later_layers_.size() != caches_.size() - 1) {
    later_layers_.clear();
    for (std::size_t l = 1; l < caches_.size(); ++l) later_layers_.push_back({caches_[l]->host_pool(), caches_[l]->hot_cache()});
  }
  gather_launches_ += static_cast<std::uint64_t>(gather_hisparse_layers(side, later_layers_, swap_host, swap_device, swap_counts, T));
  for (std::size_t l = 1; l < caches_.size(); ++l) caches_[l]->ready().record(side);
  gathers_ += caches_.size() - 1;
}

Event& HiSparseMLAIndexGroup::layer_ready(int layer_index) const { return cache(layer_index).ready(); }

// Prefill-sized batches do not fit the decode workspace: their context pages
// are resident (or were staged), so they convert like plain groups through
// the resident block table.
TopkConversion HiSparseMLAIndexGroup::convert_prefill_sized(const StepCall& call) {
  if (call.batch.hisparse == nullptr || !call.batch.hisparse->resident_block_table.defined()) {
    fail(where("convert_logical_to_physical_topk"), "a prefill-sized batch (", call.num_tokens(), " rows, workspace ",
         workspace_rows(), ") needs batch.hisparse->resident_block_table: stage non-resident prefill rows first");
  }
  return convert_through(call.compute, call, call.batch.req_id_per_token, call.batch.hisparse->resident_block_table,
                         call.out, call.valid_counts_out);
}

// ---- Host mirror, counters ----

void HiSparseMLAIndexGroup::write_rows(int layer_index, Stream& compute, const Tensor& rows, const Tensor& host_row_ids) {
  check_layer("write_rows", layer_index, compute);
  write_hisparse_rows(compute, rows, host_row_ids, cache(layer_index).host_pool());
}

void HiSparseMLAIndexGroup::invalidate_rows(Stream& compute, const Tensor& host_row_ids, const Tensor& state_rows) {
  invalidate_hisparse_slots(compute, HiSparseSlotState{slot_rows(), lru()}, config_.hot_slots, host_row_ids, state_rows);
}

std::uint64_t HiSparseMLAIndexGroup::bytes_per_miss() const {
  std::uint64_t bytes = 0;
  for (const auto& layer : caches_) bytes += static_cast<std::uint64_t>(layer->row_bytes());
  return bytes;
}

HiSparseCounters HiSparseMLAIndexGroup::counters() {
  const std::vector<std::int64_t> hit_miss = download<std::int64_t>(side_stream(), counters_);
  const auto hits = static_cast<std::uint64_t>(hit_miss[0]), misses = static_cast<std::uint64_t>(hit_miss[1]);
  return HiSparseCounters{hits, misses, misses * bytes_per_miss()};
}

void HiSparseMLAIndexGroup::snapshot_counters(Stream& stream, const Tensor& out) {
  const std::string w = where("snapshot_counters");
  if (&stream.device() != &device()) fail(w, "the stream belongs to another device than the group's");
  check(w, "out", out).dtype(DType::i64).rank(1).dim(0, 2, "the counters {hits, misses}").contiguous().on(device());
  stream.wait(side_stream());
  stream.copy_bytes(out.data(), counters_.data(), 2 * sizeof(std::int64_t));
}

HiSparseFootprint HiSparseMLAIndexGroup::footprint() const {
  HiSparseFootprint total;
  for (const auto& layer : caches_) {
    total.host_bytes += layer->footprint().host_bytes;
    total.device_bytes += layer->footprint().device_bytes;
  }
  for (const OwnedTensor* t : {&slot_rows_, &lru_, &hot_block_table_, &hot_indices_, &miss_mask_, &swap_host_rows_,
                               &swap_device_rows_, &swap_counts_, &counters_}) {
    total.device_bytes += t->buffer().bytes();
  }
  for (const OwnedTensor* t : {&union_logical_, &union_state_, &union_hot_, &union_miss_, &union_swap_host_rows_,
                               &union_swap_device_rows_, &union_swap_counts_, &run_first_, &entry_position_}) {
    total.device_bytes += t->buffer().bytes();  // speculative decoding only
  }
  total.device_bytes += static_cast<std::uint64_t>(workspace_rows() * (top_k() + 1)) * 4;  // physical + valid counts
  return total;
}

// ---- Prefill ----

namespace {

// The plan's staged rows (num_blocks * block_size), once the plan is known
// to fit a group of `block_size`.
std::int64_t staged_rows_of(const std::string& w, const HiSparsePrefillStagingPlan& plan, std::int32_t block_size) {
  if (plan.block_size != block_size) fail(w, "the plan's block size ", plan.block_size, " differs from the group's ", block_size);
  const std::int64_t rows = plan.num_blocks * plan.block_size;
  if (plan.row_ids.numel() != rows) fail(w, "the plan has ", plan.row_ids.numel(), " row ids for ", rows, " staged rows");
  return rows;
}

}  // namespace

OwnedTensor HiSparseMLAIndexGroup::stage_prefill_rows(int layer_index, Stream& compute,
                                                      const HiSparsePrefillStagingPlan& plan,
                                                      const Tensor& resident_cache) {
  check_layer("stage_prefill_rows", layer_index, compute);
  staged_rows_of(where("stage_prefill_rows"), plan, config_.block_size);
  OwnedTensor staged(device(), DType::u8, {plan.num_blocks, plan.block_size, cache(layer_index).row_bytes()});
  stage_prefill_rows(layer_index, compute, plan, resident_cache, staged);
  return staged;
}

void HiSparseMLAIndexGroup::stage_prefill_rows(int layer_index, Stream& compute, const HiSparsePrefillStagingPlan& plan,
                                               const Tensor& resident_cache, const Tensor& staged) {
  check_layer("stage_prefill_rows", layer_index, compute);
  const std::string w = where("stage_prefill_rows");
  const std::int64_t rows = staged_rows_of(w, plan, config_.block_size);
  HiSparseCacheHandle& layer = cache(layer_index);
  const std::int64_t row_bytes = layer.row_bytes();
  check(w, "staged", staged).dtype(DType::u8).contiguous().on(device());
  if (staged.rank() == 3) {
    check(w, "staged", staged).dim_at_least(0, plan.num_blocks, "the plan's staged blocks")
        .dim(1, plan.block_size, "the plan's block size").dim(2, row_bytes, "row bytes of the layer");
  } else {
    check(w, "staged", staged).rank(2).dim_at_least(0, rows, "the plan's staged rows").dim(1, row_bytes, "row bytes of the layer");
  }
  const Tensor flat(staged.data(), DType::u8, {rows, row_bytes}, staged.kind(), staged.device());
  stage_hisparse_rows(compute, layer.host_pool(), plan.row_ids, resident_cache,
                      resident_cache.defined() ? plan.gpu_row_ids : Tensor(), flat);
}

Event* HiSparseMLAIndexGroup::gather_fp8_prefill(int layer_index, Stream& compute, const Tensor& source_cache,
                                                 const Tensor& dst, const Tensor& /*block_table: the plan's*/,
                                                 const Tensor& workspace_starts, std::int64_t batch_size,
                                                 const BatchMetadata& batch, std::int64_t request_start,
                                                 Fp8Format format) {
  check_layer("gather_fp8_prefill", layer_index, compute);
  const std::string w = where("gather_fp8_prefill");
  const HiSparsePrefillStagingPlan* plan = batch.prefill_staging_plan;
  if (plan == nullptr) fail(w, "batch.prefill_staging_plan is null: HiSparse prefill reads through a staging plan");
  HiSparseCacheHandle& layer = cache(layer_index);
  if (layer.row_bytes() != fp8_row_bytes) {
    fail(w, "layer ", layer_index, " has ", layer.row_bytes(), "-byte rows, not fp8_ds_mla rows (", fp8_row_bytes, " bytes)");
  }
  const std::int64_t plan_rows = plan->block_table.defined() ? plan->block_table.dim(0) : 0;
  if (request_start < 0 || batch_size < 0 || request_start + batch_size > plan_rows) {
    fail(w, "requests [", request_start, ", ", request_start + batch_size, ") are outside the plan's ", plan_rows, " requests");
  }
  Fp8GatherParams params;
  params.format = format;
  params.host_cache = layer.host_pool();
  params.host_row_ids = plan->row_ids;
  params.device_row_ids = plan->gpu_row_ids;
  params.block_size = plan->block_size;
  // Without a resident cache no staged row is read from the device; the hot
  // cache only stands in as the (unread) device cache argument.
  const Tensor& device_cache = source_cache.defined() ? source_cache : layer.hot_cache();
  if (!source_cache.defined()) {
    // A plan built on the device has no host copy to look at: one built with
    // a resident table may have resident rows.
    if (plan->built_on_device() && plan->has_resident_table) {
      fail(w, "the plan was built with a resident table but source_cache (the resident device cache) is undefined");
    }
    for (std::int32_t id : plan->host_gpu_row_ids) {
      if (id >= 0) fail(w, "the plan has resident rows but source_cache (the resident device cache) is undefined");
    }
  }
  prefill_stream_->wait(compute);
  gather_upconvert_fp8(*prefill_stream_, device_cache, dst, plan->block_table.rows(request_start, request_start + batch_size),
                       workspace_starts, batch_size, params);
  layer.prefill_ready().record(*prefill_stream_);
  return &layer.prefill_ready();
}

}  // namespace sparse_mla
