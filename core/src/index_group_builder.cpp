#include "sparse_mla/index_group_builder.hpp"

#include <utility>

#include "sparse_mla/error.hpp"
#include "sparse_mla/hisparse_group.hpp"

namespace sparse_mla {

SparseMLAIndexGroupBuilder::SparseMLAIndexGroupBuilder(std::shared_ptr<Device> device,
                                                       const Tensor& logical_topk_buffer,
                                                       std::optional<std::int64_t> max_decode_rows)
    : device_(std::move(device)), logical_topk_buffer_(logical_topk_buffer), max_decode_rows_(0) {
  constexpr const char* where = "SparseMLAIndexGroupBuilder";
  if (!device_) fail(where, "device is null");
  SparseMLAIndexGroup::check_logical_topk_buffer(where, logical_topk_buffer_, *device_);
  max_decode_rows_ = max_decode_rows.value_or(logical_topk_buffer_.dim(0));
  if (max_decode_rows_ < 0 || max_decode_rows_ >= int32_max) {
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

void SparseMLAIndexGroupBuilder::set_dcp(const DcpConfig& dcp) {
  for (const auto& group : groups_) group->set_dcp(dcp);
  dcp_ = dcp;
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
  group->set_dcp(dcp_);
  return group;
}

}  // namespace sparse_mla
