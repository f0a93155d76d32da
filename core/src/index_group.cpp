#include "sparse_mla/index_group.hpp"

#include <utility>

#include "sparse_mla/error.hpp"
#include "kernels.hpp"

namespace sparse_mla {

SparseMLAIndexGroup::SparseMLAIndexGroup(std::shared_ptr<Device> device, const Tensor& logical_topk_buffer,
                                         std::int64_t max_decode_rows, bool has_indexer)
    : device_(std::move(device)),
      logical_topk_buffer_(logical_topk_buffer),
      max_decode_rows_(max_decode_rows),
      has_indexer_(has_indexer) {
  constexpr const char* where = "SparseMLAIndexGroup";
  if (!device_) fail(where, "device is null");
  check_logical_topk_buffer(where, logical_topk_buffer_, *device_);
  if (max_decode_rows_ < 0 || max_decode_rows_ >= int32_max) {
    fail(where, "max_decode_rows must be in [0, 2^31 - 1), got ", max_decode_rows_);
  }
  physical_workspace_ = OwnedTensor(*device_, DType::i32, {workspace_rows(), top_k()});
  valid_counts_workspace_ = OwnedTensor(*device_, DType::i32, {workspace_rows()});
  logical_topk_ready_ = device_->create_event();
  physical_topk_ready_ = device_->create_event();
  side_stream_ = device_->create_stream();
  // The step path's kernels must never grow Kokkos' team scratch.
  if (device_->has_kernels()) detail::kernels_of(*device_).reserve_team_scratch(*side_stream_, step_team_scratch_bytes);
}

SparseMLAIndexGroup::~SparseMLAIndexGroup() = default;

void SparseMLAIndexGroup::check_logical_topk_buffer(const char* where, const Tensor& buffer, const Device& device) {
  check(where, "logical_topk_buffer", buffer).dtype(DType::i32).rank(2).rows_contiguous().on(device);
  if (buffer.dim(1) < 1 || buffer.dim(1) > int32_max) {
    fail(where, "logical_topk_buffer has shape ", buffer.shape_string(), ": top-k width K must be in [1, 2^31)");
  }
}

std::string SparseMLAIndexGroup::where(const char* method) const {
  return std::string(class_name()) + "::" + method;
}

void SparseMLAIndexGroup::set_dcp(const DcpConfig& dcp) {
  if (dcp.enabled() && !supports_dcp()) {
    fail(where("set_dcp"), "this group's decode step has no DCP form (dcp.size ", dcp.size, ")");
  }
  check_dcp_split(where("set_dcp"), dcp);
  if (dcp.interleave < 1) fail(where("set_dcp"), "dcp.interleave must be positive, got ", dcp.interleave);
  dcp_ = dcp;
}

int SparseMLAIndexGroup::register_layer(const LayerConfig& /*config: plain groups need none of it*/) {
  return num_layers_++;
}

void SparseMLAIndexGroup::check_layer(const char* method, int layer_index, const Stream& compute) const {
  if (layer_index < 0 || layer_index >= num_layers_) {
    fail(where(method), "layer_index ", layer_index, " is not a registered layer of this group (", num_layers_,
         " layers)");
  }
  if (&compute.device() != device_.get()) {
    fail(where(method), "the compute stream belongs to another device (", backend_name(compute.device().backend()),
         ") than the group's (", backend_name(device_->backend()), ")");
  }
}

void SparseMLAIndexGroup::set_logical_topk_ready(int layer_index, Stream& compute) {
  check_layer("set_logical_topk_ready", layer_index, compute);
  if (layer_index != 0 || !has_indexer_) return;
  // In piecewise capture mode this record would sit inside a captured piece,
  // and the eager conversion must never wait on it (cudaErrorInvalidValue):
  // the leader joins through the compute stream instead, so skip the record.
  if (piecewise_capture_) return;
  logical_topk_ready_->record(compute);
}

bool SparseMLAIndexGroup::prepare_reads_batch(int /*layer_index*/) const { return false; }

void SparseMLAIndexGroup::prepare_for_batch(int layer_index, const BatchMetadata& /*batch*/, Stream& compute) {
  check_layer("prepare_for_batch", layer_index, compute);
}

Event* SparseMLAIndexGroup::gather_fp8_prefill(int layer_index, Stream& compute, const Tensor& source_cache,
                                               const Tensor& dst, const Tensor& block_table,
                                               const Tensor& workspace_starts, std::int64_t batch_size,
                                               const BatchMetadata& /*batch*/, std::int64_t /*request_start*/,
                                               Fp8Format format) {
  check_layer("gather_fp8_prefill", layer_index, compute);
  Fp8GatherParams params;
  params.format = format;
  gather_upconvert_fp8(compute, source_cache, dst, block_table, workspace_starts, batch_size, params);
  return nullptr;
}

// ---- The decode protocol ----

TopkConversion SparseMLAIndexGroup::convert_logical_to_physical_topk(int layer_index, Stream& compute,
                                                                     const Tensor& logical_topk,
                                                                     const BatchMetadata& batch,
                                                                     std::int64_t block_stride_rows,
                                                                     bool return_valid_counts, const Tensor& out,
                                                                     const Tensor& valid_counts_out) {
  const StepCall call{layer_index, compute, logical_topk, batch, block_stride_rows, return_valid_counts, out,
                      valid_counts_out};
  check_step(call);
  if (!is_decode_sized(call.num_tokens())) {
    TopkConversion result = convert_prefill_sized(call);
    ++counts_.prefill;
    return result;
  }
  check_decode_step(call);
  if (call.leader()) {
    lead(call);
  } else {
    check_follower(call);
  }
  compute.wait(layer_ready(layer_index));
  return workspace_rows_view(call.num_tokens(), return_valid_counts);
}

// What every call is checked for first: the layer, the stream, the logical top-k's shape.
void SparseMLAIndexGroup::check_step(const StepCall& call) const {
  constexpr const char* method = "convert_logical_to_physical_topk";
  check_layer(method, call.layer_index, call.compute);
  check(where(method), "logical top-k", call.logical_topk).dtype(DType::i32).rank(2)
      .dim(1, top_k(), "K of the group's logical top-k buffer")
      .dim_at_most(0, logical_topk_buffer_.dim(0), "rows of the group's logical top-k buffer");
}

// A follower reads what the leader produced: the same rows, and counts only
// if the leader wrote them.
void SparseMLAIndexGroup::check_follower(const StepCall& call) const {
  const std::string w = where("convert_logical_to_physical_topk");
  if (leader_rows_ < 0) {
    fail(w, "layer ", call.layer_index, " asks for the group's physical top-k before the leader (layer 0) ",
         leader_work(), " a decode-sized batch");
  }
  if (call.num_tokens() != leader_rows_) {
    fail(w, "layer ", call.layer_index, " passes logical top-k of ", call.num_tokens(),
         " rows but the leader ", leader_work(), " ", leader_rows_, " rows");
  }
  if (call.return_valid_counts && !leader_counted_) {
    fail(w, "layer ", call.layer_index, " asks for valid counts but the leader ", leader_work(), " without them");
  }
}

// The leader: the side stream joins the compute stream, the group's work
// runs there once, and the bookkeeping the followers are checked against.
void SparseMLAIndexGroup::lead(const StepCall& call) {
  join_side_stream(call.compute);
  queue_conversion(*side_stream_, call);
  physical_topk_ready_->record(*side_stream_);
  queue_layer_work(*side_stream_, call);
  ++counts_.decode;
  leader_rows_ = call.num_tokens();
  leader_counted_ = counts_written(call);
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

TopkConversion SparseMLAIndexGroup::workspace_rows_view(std::int64_t num_tokens, bool return_valid_counts) const {
  TopkConversion result;
  result.physical = physical_workspace().rows(0, num_tokens);
  if (return_valid_counts) result.valid_counts = valid_counts_workspace().rows(0, num_tokens);
  return result;
}

// ---- The plain group's hooks ----

void SparseMLAIndexGroup::check_decode_step(const StepCall& call) const {
  if (!call.leader()) return;  // a follower reads no batch (convert_reads_batch)
  const Tensor counts = counts_written(call) ? valid_counts_workspace() : Tensor();
  check_convert_through(call, call.batch.req_id_per_token, call.batch.block_table, physical_workspace(), counts);
}

void SparseMLAIndexGroup::queue_conversion(Stream& side, const StepCall& call) {
  const Tensor counts = counts_written(call) ? valid_counts_workspace() : Tensor();
  (void)convert_through(side, call, call.batch.req_id_per_token, call.batch.block_table, physical_workspace(), counts);
}

void SparseMLAIndexGroup::queue_layer_work(Stream& /*side*/, const StepCall& /*call*/) {}

Event& SparseMLAIndexGroup::layer_ready(int /*layer_index*/) const { return *physical_topk_ready_; }

// Prefill-sized: no sharing; on the compute stream into the caller's outputs
// (or fresh buffers).
TopkConversion SparseMLAIndexGroup::convert_prefill_sized(const StepCall& call) {
  return convert_through(call.compute, call, call.batch.req_id_per_token, call.batch.block_table, call.out,
                         call.valid_counts_out);
}

void SparseMLAIndexGroup::check_convert_through(const StepCall& call, const Tensor& req_id_per_token,
                                                const Tensor& block_table, const Tensor& out,
                                                const Tensor& valid_counts_out) const {
  check_logical_to_physical_topk(*device_, req_id_per_token, block_table, call.logical_topk,
                                 conversion_params(call), out, valid_counts_out);
}

TopkConversion SparseMLAIndexGroup::convert_through(Stream& stream, const StepCall& call,
                                                    const Tensor& req_id_per_token, const Tensor& block_table,
                                                    const Tensor& out, const Tensor& valid_counts_out) {
  return sparse_mla::convert_logical_to_physical_topk(
      stream, req_id_per_token, block_table, call.logical_topk,
      conversion_params(call), out, valid_counts_out);
}

bool SparseMLAIndexGroup::counts_written(const StepCall& call) const { return conversion_params(call).writes_valid_counts(); }

TopkConvertParams SparseMLAIndexGroup::conversion_params(const StepCall& call) const {
  TopkConvertParams params;
  params.block_size = call.batch.block_size;
  params.block_stride_rows = call.block_stride_rows;
  params.return_valid_counts = call.return_valid_counts;
  params.dcp = dcp_;
  return params;
}

}  // namespace sparse_mla
