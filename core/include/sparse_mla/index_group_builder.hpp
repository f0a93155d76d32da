// SparseMLAIndexGroupBuilder (SPEC section 4): registers the model's layers
// in order and groups them, a new group at every index-producing layer.
// Mirrors the reference's builder. It is the one place that decides a new
// group's class: a LayerConfig carrying a HiSparse configuration makes it
// create HiSparseMLAIndexGroup (sparse_mla/hisparse_group.hpp), else
// SparseMLAIndexGroup (sparse_mla/index_group.hpp).
// Implemented by core/src/index_group_builder.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/index_group.hpp"
#include "sparse_mla/tensor.hpp"

namespace sparse_mla {

// Where register_layer put a layer.
struct LayerRegistration {
  std::shared_ptr<SparseMLAIndexGroup> group;
  int index_in_group = 0;
};

class SparseMLAIndexGroupBuilder {
 public:
  // `logical_topk_buffer`: int32 [max_tokens, K] on `device`. Decode-sized
  // batches have at most max_decode_rows + 1 rows; without a value,
  // max_decode_rows is max_tokens (the reference's None).
  SparseMLAIndexGroupBuilder(std::shared_ptr<Device> device, const Tensor& logical_topk_buffer,
                             std::optional<std::int64_t> max_decode_rows = std::nullopt);

  // Starts a new group when the layer produces indices or when there is no
  // group yet (then the group has no indexer), and adds the layer to it.
  LayerRegistration register_layer(bool is_index_producing_layer, const LayerConfig& config = {});

  // Every group created so far, in layer order.
  const std::vector<std::shared_ptr<SparseMLAIndexGroup>>& groups() const { return groups_; }
  // Sets piecewise capture mode on every group, present and future.
  void set_piecewise_capture(bool enabled);
  // Sets the DCP split on every group, present and future (SparseMLAIndexGroup::set_dcp).
  void set_dcp(const DcpConfig& dcp);
  std::int64_t max_decode_rows() const { return max_decode_rows_; }

 private:
  std::shared_ptr<SparseMLAIndexGroup> create_group(bool has_indexer, const LayerConfig& config);

  std::shared_ptr<Device> device_;
  Tensor logical_topk_buffer_;
  std::int64_t max_decode_rows_;
  bool piecewise_capture_ = false;
  DcpConfig dcp_;
  std::vector<std::shared_ptr<SparseMLAIndexGroup>> groups_;
};

}  // namespace sparse_mla
