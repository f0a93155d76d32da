#include "sparse_mla/index_group.hpp"

#include <limits>
#include <utility>

#include "sparse_mla/error.hpp"
#include "sparse_mla/hisparse.hpp"

namespace sparse_mla {

namespace {
constexpr const char* convert_where = "SparseMLAIndexGroup::convert_logical_to_physical_topk";

void check_logical_topk_buffer(const char* where, const Tensor& buffer, const Device& device) {
  check(where, "logical_topk_buffer", buffer).dtype(DType::i32).rank(2).rows_contiguous().on(device);
  if (buffer.dim(1) < 1 || buffer.dim(1) > std::numeric_limits<std::int32_t>::max()) {
    fail(where, "logical_topk_buffer has shape ", buffer.shape_string(), ": top-k width K must be in [1, 2^31)");
  }
}
}  // namespace

struct SparseMLAIndexGroup::Conversion {
  int layer_index;
  Stream& compute;
  const Tensor& logical_topk;
  const Tensor& req_id_per_token;
  const Tensor& block_table;
  TopkConvertParams params;

  std::int64_t num_tokens() const { return logical_topk.dim(0); }
};

SparseMLAIndexGroup::SparseMLAIndexGroup(std::shared_ptr<Device> device, const Tensor& logical_topk_buffer,
                                         std::int64_t max_decode_rows, bool has_indexer)
    : device_(std::move(device)),
      logical_topk_buffer_(logical_topk_buffer),
      max_decode_rows_(max_decode_rows),
      has_indexer_(has_indexer) {
  constexpr const char* where = "SparseMLAIndexGroup";
  if (!device_) fail(where, "device is null");
  check_logical_topk_buffer(where, logical_topk_buffer_, *device_);
  if (max_decode_rows_ < 0 || max_decode_rows_ >= std::numeric_limits<std::int32_t>::max()) {
    fail(where, "max_decode_rows must be in [0, 2^31 - 1), got ", max_decode_rows_);
  }
  const std::int64_t rows = workspace_rows();
  const std::int64_t k = top_k();
  physical_storage_ = device_->allocate(static_cast<std::size_t>(rows * k) * sizeof(std::int32_t), MemoryKind::device);
  valid_counts_storage_ = device_->allocate(static_cast<std::size_t>(rows) * sizeof(std::int32_t), MemoryKind::device);
  physical_workspace_ = Tensor::of(physical_storage_, DType::i32, {rows, k});
  valid_counts_workspace_ = Tensor::of(valid_counts_storage_, DType::i32, {rows});
  logical_topk_ready_ = device_->create_event();
  physical_topk_ready_ = device_->create_event();
  side_stream_ = device_->create_stream();
}

SparseMLAIndexGroup::~SparseMLAIndexGroup() = default;

int SparseMLAIndexGroup::register_layer(const LayerConfig& /*config: plain groups need none of it*/) {
  return num_layers_++;
}

void SparseMLAIndexGroup::check_layer(const char* where, int layer_index, const Stream& compute) const {
  if (layer_index < 0 || layer_index >= num_layers_) {
    fail(where, "layer_index ", layer_index, " is not a registered layer of this group (", num_layers_, " layers)");
  }
  if (&compute.device() != device_.get()) {
    fail(where, "the compute stream belongs to another device (", backend_name(compute.device().backend()),
         ") than the group's (", backend_name(device_->backend()), ")");
  }
}

void SparseMLAIndexGroup::set_logical_topk_ready(int layer_index, Stream& compute) {
  check_layer("SparseMLAIndexGroup::set_logical_topk_ready", layer_index, compute);
  if (layer_index != 0 || !has_indexer_) return;
  // In piecewise capture mode this record would sit inside a captured piece,
  // and the eager conversion must never wait on it (cudaErrorInvalidValue):
  // the leader joins through the compute stream instead, so skip the record.
  if (piecewise_capture_) return;
  logical_topk_ready_->record(compute);
}

void SparseMLAIndexGroup::prepare_for_batch(int layer_index, const BatchMetadata& /*batch*/, Stream& compute) {
  check_layer("SparseMLAIndexGroup::prepare_for_batch", layer_index, compute);
}

Event* SparseMLAIndexGroup::gather_fp8_prefill(int layer_index, Stream& compute, const Tensor& source_cache,
                                               const Tensor& dst, const Tensor& block_table,
                                               const Tensor& workspace_starts, std::int64_t batch_size,
                                               const BatchMetadata& /*batch*/, std::int64_t /*request_start*/,
                                               Fp8Format format) {
  check_layer("SparseMLAIndexGroup::gather_fp8_prefill", layer_index, compute);
  Fp8GatherParams params;
  params.format = format;
  gather_upconvert_fp8(compute, source_cache, dst, block_table, workspace_starts, batch_size, params);
  return nullptr;
}

TopkConversion SparseMLAIndexGroup::convert_logical_to_physical_topk(int layer_index, Stream& compute,
                                                                     const Tensor& logical_topk,
                                                                     const BatchMetadata& batch,
                                                                     std::int64_t block_stride_rows,
                                                                     bool return_valid_counts) {
  return convert_once(layer_index, compute, logical_topk, batch.req_id_per_token, batch.block_table,
                      batch.block_size, block_stride_rows, return_valid_counts);
}

TopkConversion SparseMLAIndexGroup::convert_once(int layer_index, Stream& compute, const Tensor& logical_topk,
                                                 const Tensor& req_id_per_token, const Tensor& block_table,
                                                 std::int32_t block_size, std::int64_t block_stride_rows,
                                                 bool return_valid_counts) {
  TopkConvertParams params;
  params.block_size = block_size;
  params.block_stride_rows = block_stride_rows;
  params.return_valid_counts = return_valid_counts;
  const Conversion c{layer_index, compute, logical_topk, req_id_per_token, block_table, params};
  check_conversion(c);
  if (!is_decode_sized(c.num_tokens())) return convert_prefill_sized(c);
  if (layer_index == 0) convert_for_group(c);
  compute.wait(*physical_topk_ready_);
  return workspace_rows_view(c.num_tokens(), return_valid_counts);
}

// Everything that can reject, before anything is queued.
void SparseMLAIndexGroup::check_conversion(const Conversion& c) const {
  check_layer(convert_where, c.layer_index, c.compute);
  check(convert_where, "logical top-k", c.logical_topk).dtype(DType::i32).rank(2)
      .dim(1, top_k(), "K of the group's logical top-k buffer")
      .dim_at_most(0, logical_topk_buffer_.dim(0), "rows of the group's logical top-k buffer");
  if (!is_decode_sized(c.num_tokens())) {
    check_logical_to_physical_topk(*device_, c.req_id_per_token, c.block_table, c.logical_topk, c.params);
    return;
  }
  const Tensor counts = c.params.return_valid_counts ? valid_counts_workspace_ : Tensor();
  check_logical_to_physical_topk(*device_, c.req_id_per_token, c.block_table, c.logical_topk, c.params,
                                 physical_workspace_, counts);
  if (c.layer_index != 0) check_follower(c);
}

// A follower reads what the leader converted: the same rows, and counts only
// if the leader wrote them.
void SparseMLAIndexGroup::check_follower(const Conversion& c) const {
  if (leader_rows_ < 0) {
    fail(convert_where, "layer ", c.layer_index, " asks for the group's physical top-k before the leader (layer 0) ",
         "converted a decode-sized batch");
  }
  if (c.num_tokens() != leader_rows_) {
    fail(convert_where, "layer ", c.layer_index, " passes logical top-k of ", c.num_tokens(),
         " rows but the leader's last conversion had ", leader_rows_, " rows");
  }
  if (c.params.return_valid_counts && !leader_counted_) {
    fail(convert_where, "layer ", c.layer_index, " asks for valid counts but the leader converted without them");
  }
}

// Prefill-sized: no sharing, fresh buffers on the compute stream.
TopkConversion SparseMLAIndexGroup::convert_prefill_sized(const Conversion& c) {
  TopkConversion result = sparse_mla::convert_logical_to_physical_topk(c.compute, c.req_id_per_token, c.block_table,
                                                                       c.logical_topk, c.params);
  ++counts_.prefill;
  return result;
}

// The side stream starts after the indexer's writes: through the event the
// leader recorded, or (no indexer, or piecewise capture) after everything
// queued on the compute stream so far.
void SparseMLAIndexGroup::join_side_stream(Stream& compute) {
  if (has_indexer_ && !piecewise_capture_) {
    side_stream_->wait(*logical_topk_ready_);
  } else {
    side_stream_->wait(compute);
  }
}

void SparseMLAIndexGroup::convert_for_group(const Conversion& c) {
  join_side_stream(c.compute);
  const Tensor counts = c.params.return_valid_counts ? valid_counts_workspace_ : Tensor();
  sparse_mla::convert_logical_to_physical_topk(*side_stream_, c.req_id_per_token, c.block_table, c.logical_topk,
                                               c.params, physical_workspace_, counts);
  physical_topk_ready_->record(*side_stream_);
  ++counts_.decode;
  leader_rows_ = c.num_tokens();
  leader_counted_ = c.params.return_valid_counts;
}

TopkConversion SparseMLAIndexGroup::workspace_rows_view(std::int64_t num_tokens, bool return_valid_counts) const {
  TopkConversion result;
  result.physical = physical_workspace_.rows(0, num_tokens);
  if (return_valid_counts) result.valid_counts = valid_counts_workspace_.rows(0, num_tokens);
  return result;
}

SparseMLAIndexGroupBuilder::SparseMLAIndexGroupBuilder(std::shared_ptr<Device> device,
                                                       const Tensor& logical_topk_buffer,
                                                       std::optional<std::int64_t> max_decode_rows)
    : device_(std::move(device)), logical_topk_buffer_(logical_topk_buffer), max_decode_rows_(0) {
  constexpr const char* where = "SparseMLAIndexGroupBuilder";
  if (!device_) fail(where, "device is null");
  check_logical_topk_buffer(where, logical_topk_buffer_, *device_);
  max_decode_rows_ = max_decode_rows.value_or(logical_topk_buffer_.dim(0));
  if (max_decode_rows_ < 0 || max_decode_rows_ >= std::numeric_limits<std::int32_t>::max()) {
    fail(where, "max_decode_rows must be in [0, 2^31 - 1), got ", max_decode_rows_);
  }
}

LayerRegistration SparseMLAIndexGroupBuilder::register_layer(bool is_index_producing_layer,
                                                             const LayerConfig& config) {
  if (is_index_producing_layer || groups_.empty()) groups_.push_back(create_group(is_index_producing_layer, config));
  const std::shared_ptr<SparseMLAIndexGroup>& group = groups_.back();
  return LayerRegistration{group, group->register_layer(config)};
}

void SparseMLAIndexGroupBuilder::set_piecewise_capture(bool enabled) {
  piecewise_capture_ = enabled;
  for (const auto& group : groups_) group->set_piecewise_capture(enabled);
}

std::shared_ptr<SparseMLAIndexGroup> SparseMLAIndexGroupBuilder::create_group(bool has_indexer,
                                                                              const LayerConfig& config) {
  std::shared_ptr<SparseMLAIndexGroup> group;
  if (config.hisparse) {
    group = std::make_shared<HiSparseMLAIndexGroup>(device_, logical_topk_buffer_, max_decode_rows_, has_indexer,
                                                    *config.hisparse);
  } else {
    group = std::make_shared<SparseMLAIndexGroup>(device_, logical_topk_buffer_, max_decode_rows_, has_indexer);
  }
  group->set_piecewise_capture(piecewise_capture_);
  return group;
}

}  // namespace sparse_mla
