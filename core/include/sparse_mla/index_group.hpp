// Index groups (SPEC section 4): the layers that reuse one sparse-indexer
// result convert its logical top-k to physical KV-cache rows once per group
// per decode step, on the group's side stream, instead of once per layer.
//
// Mirrors the reference's SparseMLAIndexGroup method for method. C++ has no
// "current stream", so every per-step method takes the compute stream
// explicitly. docs/index_groups.md walks through one decode step.
//
// The decode protocol is written once, here: the checks, the leader's join
// of the side stream, its bookkeeping, the followers' checks, every layer's
// wait and the workspace views. A derived group (HiSparse, SPEC section 5:
// sparse_mla/hisparse_group.hpp) changes only what the leader does on the
// side stream and which event a layer waits on, through the protected hooks.
// SparseMLAIndexGroupBuilder (sparse_mla/index_group_builder.hpp) decides a
// new group's class.
//
// Threading: one host thread drives a group (like the engine's forward pass).
// Lifetimes: the group's side stream and events must outlive the work queued
// on them; synchronise the compute stream before destroying a group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "sparse_mla/batch.hpp"
#include "sparse_mla/device.hpp"
#include "sparse_mla/fp8_upconvert.hpp"
#include "sparse_mla/hisparse_config.hpp"
#include "sparse_mla/tensor.hpp"
#include "sparse_mla/topk_convert.hpp"

namespace sparse_mla {

// What register_layer learns about a layer (the reference's keyword
// arguments). Plain groups need none of it; HiSparse groups size their
// per-layer caches from it.
struct LayerConfig {
  std::int64_t head_size = 0;
  std::string kv_cache_dtype;  // "fp8_ds_mla", "bfloat16", ...
  // Set: the builder creates HiSparse groups (sparse_mla/hisparse_group.hpp)
  // with this configuration.
  std::optional<HiSparseConfig> hisparse;
  // HiSparse only: the engine's own host pool and hot cache for this layer;
  // unset, the group allocates both.
  std::optional<HiSparseLayerStorage> hisparse_storage;
};

// Conversions a group has queued. Counted when the host queues them (a CUDA
// graph replay re-runs captured conversions without counting them again).
struct ConversionCounts {
  std::uint64_t decode = 0;   // decode-sized: one per group per step (by the leader)
  std::uint64_t prefill = 0;  // prefill-sized: one per layer call
};

class SparseMLAIndexGroup {
 public:
  // Team scratch reserved at construction: more than any conversion or
  // staging-plan kernel asks for (HiSparse groups reserve their resolve's too).
  static constexpr std::size_t step_team_scratch_bytes = 16 * 1024;

  // Allocates the workspace physical[max_decode_rows + 1, K] and
  // valid_counts[max_decode_rows + 1] (one spare row), creates the side stream
  // and the events logical_topk_ready and physical_topk_ready.
  // `logical_topk_buffer` (int32 [max_tokens, K]) is the engine's buffer the
  // indexer writes; its K is the group's K.
  SparseMLAIndexGroup(std::shared_ptr<Device> device, const Tensor& logical_topk_buffer,
                      std::int64_t max_decode_rows, bool has_indexer);
  virtual ~SparseMLAIndexGroup();
  SparseMLAIndexGroup(const SparseMLAIndexGroup&) = delete;
  SparseMLAIndexGroup& operator=(const SparseMLAIndexGroup&) = delete;

  // Adds a layer; returns its index in the group (0 is the leader).
  virtual int register_layer(const LayerConfig& config = {});

  // Step 1: the leader of a group with an indexer records logical_topk_ready
  // on `compute` (after the indexer's writes), except in piecewise capture
  // mode. Other layers: nothing.
  void set_logical_topk_ready(int layer_index, Stream& compute);

  // Step 2: nothing for plain groups (HiSparse: the leader checks the step's
  // tables).
  virtual void prepare_for_batch(int layer_index, const BatchMetadata& batch, Stream& compute);

  // Whether a call reads the BatchMetadata it is given, so that a binding
  // builds one only where it is read. prepare_for_batch: a HiSparse leader.
  // convert_logical_to_physical_topk with `num_tokens` rows: a prefill-sized
  // call, and the leader's decode-sized call; a follower's decode-sized call
  // only waits for what its leader converted.
  virtual bool prepare_reads_batch(int layer_index) const;
  bool convert_reads_batch(int layer_index, std::int64_t num_tokens) const {
    return layer_index == 0 || !is_decode_sized(num_tokens);
  }

  // Step 3: physical rows for `logical_topk` (int32 [T, K], at most max_tokens
  // rows: normally the first T rows of the logical top-k buffer).
  // Decode-sized (T <= max_decode_rows + 1): the leader converts once on the
  // side stream into the workspace; every layer makes `compute` wait for its
  // ready event and gets views of the workspace's first T rows.
  // Prefill-sized: converts on `compute` into `out` (int32 [T, K]) and
  // `valid_counts_out` (int32 [T]) when the caller passes them, which is the
  // step path's form (nothing allocated), else into fresh buffers that the
  // result owns: keep it until the compute stream has read them.
  // Decode-sized calls return the workspace's rows and leave `out` and
  // `valid_counts_out` untouched.
  // block_stride_rows 0 means batch.block_size. valid_counts is defined only
  // when return_valid_counts is set.
  [[nodiscard]] TopkConversion convert_logical_to_physical_topk(int layer_index, Stream& compute,
                                                                const Tensor& logical_topk, const BatchMetadata& batch,
                                                                std::int64_t block_stride_rows,
                                                                bool return_valid_counts, const Tensor& out = Tensor(),
                                                                const Tensor& valid_counts_out = Tensor());

  // Step 4, FP8 prefill: the gather-upconvert of SPEC section 3 (the
  // arguments of gather_upconvert_fp8 in fp8_upconvert.hpp). Plain groups run
  // it on `compute` and return nullptr: no event to wait on. HiSparse groups
  // run it on their prefill stream from the staging plan (batch,
  // request_start) and return the layer's prefill-ready event, which the
  // caller waits on before prefill attention.
  virtual Event* gather_fp8_prefill(int layer_index, Stream& compute, const Tensor& source_cache, const Tensor& dst,
                                    const Tensor& block_table, const Tensor& workspace_starts,
                                    std::int64_t batch_size, const BatchMetadata& batch, std::int64_t request_start,
                                    Fp8Format format = Fp8Format::e4m3fn);

  // Piecewise capture mode (SPEC section 4): no event recorded inside a
  // captured piece is waited on from outside it; the leader's side stream
  // waits for the compute stream instead. Set it before the step's calls.
  void set_piecewise_capture(bool enabled) { piecewise_capture_ = enabled; }
  bool piecewise_capture() const { return piecewise_capture_; }

  // Decode context parallelism (SPEC section 2a): every conversion of the
  // group (the leader's once per step, and prefill-sized ones) is filtered
  // to this rank's tokens through the batch's rank-local block table, and
  // counts its valid outputs. dcp.size 1 (the default) is no DCP. Set it
  // before the step's calls; HiSparse groups refuse it.
  void set_dcp(const DcpConfig& dcp);
  const DcpConfig& dcp() const { return dcp_; }

  bool has_indexer() const { return has_indexer_; }
  int num_layers() const { return num_layers_; }
  std::int64_t top_k() const { return logical_topk_buffer_.dim(1); }
  std::int64_t max_decode_rows() const { return max_decode_rows_; }
  std::int64_t workspace_rows() const { return max_decode_rows_ + 1; }
  bool is_decode_sized(std::int64_t num_tokens) const { return num_tokens <= workspace_rows(); }
  ConversionCounts conversion_counts() const { return counts_; }

  Device& device() const { return *device_; }
  // The group's resources, for derived groups and for tests that poison the
  // workspace or inspect the events.
  const Tensor& physical_workspace() const { return physical_workspace_; }
  const Tensor& valid_counts_workspace() const { return valid_counts_workspace_; }
  Stream& side_stream() const { return *side_stream_; }
  Event& logical_topk_ready() const { return *logical_topk_ready_; }
  Event& physical_topk_ready() const { return *physical_topk_ready_; }

  // Throws unless `buffer` can be a group's logical top-k buffer (int32
  // [max_tokens, K], rows packed, on `device`, 1 <= K < 2^31).
  static void check_logical_topk_buffer(const char* where, const Tensor& buffer, const Device& device);

 protected:
  // One call of step 3, as the protocol and its hooks see it.
  struct StepCall {
    int layer_index;
    Stream& compute;
    const Tensor& logical_topk;
    const BatchMetadata& batch;
    std::int64_t block_stride_rows;
    bool return_valid_counts;
    const Tensor& out;               // prefill-sized outputs, or undefined
    const Tensor& valid_counts_out;

    std::int64_t num_tokens() const { return logical_topk.dim(0); }
    bool leader() const { return layer_index == 0; }
  };

  // ---- Hooks of the decode protocol (the defaults are the plain group's) ----
  // Every check of a decode-sized call (each layer's, leader or follower),
  // before anything is queued. Default: the conversion's checks.
  virtual void check_decode_step(const StepCall& call) const;
  // The leader's conversion on the side stream, after the side stream has
  // joined the compute stream; physical_topk_ready is recorded after it.
  // Default: the top-k conversion into the workspace.
  virtual void queue_conversion(Stream& side, const StepCall& call);
  // The leader's per-layer work on the side stream after the conversion.
  // Default: nothing (HiSparse: each layer's row gather and ready event).
  virtual void queue_layer_work(Stream& side, const StepCall& call);
  // The event layer `layer_index` waits on before it reads the workspace.
  // Default: physical_topk_ready.
  virtual Event& layer_ready(int layer_index) const;
  // A prefill-sized call. Default: the conversion through the batch's
  // block table on the compute stream.
  virtual TopkConversion convert_prefill_sized(const StepCall& call);

  // The conversion of `call`'s logical top-k through explicit tables, on
  // `stream` into `out`/`valid_counts_out` (or fresh buffers when undefined):
  // the reference's _convert_once, for derived groups that take the tables
  // from elsewhere (HiSparse prefill through the resident table).
  TopkConversion convert_through(Stream& stream, const StepCall& call, const Tensor& req_id_per_token,
                                 const Tensor& block_table, const Tensor& out = Tensor(),
                                 const Tensor& valid_counts_out = Tensor());
  // Its checks, queueing nothing.
  void check_convert_through(const StepCall& call, const Tensor& req_id_per_token, const Tensor& block_table,
                             const Tensor& out = Tensor(), const Tensor& valid_counts_out = Tensor()) const;
  // Throws unless `layer_index` is a registered layer and `compute` is a
  // stream of this group's device.
  void check_layer(const char* method, int layer_index, const Stream& compute) const;
  // "SparseMLAIndexGroup::<method>", "HiSparseMLAIndexGroup::<method>": where errors say they come from.
  std::string where(const char* method) const;
  virtual const char* class_name() const { return "SparseMLAIndexGroup"; }
  // What the leader's step does, as errors name it ("converted", "resolved").
  virtual const char* leader_work() const { return "converted"; }
  // Whether the group's conversions can take a DCP filter (set_dcp).
  virtual bool supports_dcp() const { return true; }
  // Whether `call`'s conversion writes valid counts (TopkConvertParams::writes_valid_counts).
  bool counts_written(const StepCall& call) const;

 private:
  void check_step(const StepCall& call) const;
  void check_follower(const StepCall& call) const;
  void lead(const StepCall& call);
  TopkConvertParams conversion_params(const StepCall& call) const;
  void join_side_stream(Stream& compute);
  TopkConversion workspace_rows_view(std::int64_t num_tokens, bool return_valid_counts) const;

  std::shared_ptr<Device> device_;
  Tensor logical_topk_buffer_;
  std::int64_t max_decode_rows_;
  bool has_indexer_;
  bool piecewise_capture_ = false;
  DcpConfig dcp_;
  int num_layers_ = 0;
  ConversionCounts counts_;
  // What the leader's last decode-sized step produced, so that a follower
  // asking for other rows is refused instead of reading stale ones.
  std::int64_t leader_rows_ = -1;
  bool leader_counted_ = false;
  OwnedTensor physical_workspace_;
  OwnedTensor valid_counts_workspace_;
  std::unique_ptr<Event> logical_topk_ready_;
  std::unique_ptr<Event> physical_topk_ready_;
  std::unique_ptr<Stream> side_stream_;  // declared last: destroyed first, draining its work
};

}  // namespace sparse_mla
