// HiSparse (SPEC section 5): every layer's full KV cache lives in a pinned
// host pool; each request keeps H hot row slots on the device, and the
// group's leader resolves the step's top-k against them once, then gathers
// the missing rows into every layer's hot cache.
//
// One decode step (docs/hisparse.md has the picture):
//   engine writes new rows      write_rows(layer) + invalidate_rows: host mirror
//   set_logical_topk_ready(0)   as for plain groups
//   prepare_for_batch(0)        the leader checks the step's HiSparse tables
//   convert(...)(layer 0)       side stream: wait, resolve once, then for each
//                               layer gather its rows and record its ready event
//   convert(...)(every layer)   the compute stream waits for that layer's event
// Rows a layer writes in a step must reach its host pool (write_rows) before
// the step's resolve is queued (before set_logical_topk_ready), or stay
// resident on the device until they do.
//
// Slot state (slot_rows, lru) belongs to the group: every layer of a group
// sees the same selection, so one resolve serves them all; each layer has
// its own host pool and hot cache with the same layout
// (sparse_mla/hisparse_cache.hpp).
//
// The decode protocol is SparseMLAIndexGroup's; this group supplies the
// leader's work (the resolve, then one gather per layer) and each layer's
// ready event through its hooks. Implemented by core/src/hisparse_group.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sparse_mla/batch.hpp"
#include "sparse_mla/hisparse_cache.hpp"
#include "sparse_mla/hisparse_config.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "sparse_mla/hisparse_prefill.hpp"
#include "sparse_mla/index_group.hpp"

namespace sparse_mla {

class HiSparseMLAIndexGroup final : public SparseMLAIndexGroup {
 public:
  // Refuses a configuration that cannot work (resolve_hisparse_config), then
  // allocates the slot state (empty slots, LRU 0..H-1), the group's hot
  // block table and the resolve workspaces.
  HiSparseMLAIndexGroup(std::shared_ptr<Device> device, const Tensor& logical_topk_buffer,
                        std::int64_t max_decode_rows, bool has_indexer, const HiSparseConfig& config);
  ~HiSparseMLAIndexGroup() override;

  // Adds a layer with its own host pool and hot cache. Its row size comes
  // from the LayerConfig (fp8_ds_mla: 656 bytes; bfloat16/float16/auto:
  // 2 * head_size; float32: 4 * head_size), else from HiSparseConfig::row_bytes.
  int register_layer(const LayerConfig& config = {}) override;
  // The leader checks the step's HiSparse tables (batch.hisparse).
  void prepare_for_batch(int layer_index, const BatchMetadata& batch, Stream& compute) override;
  bool prepare_reads_batch(int layer_index) const override { return layer_index == 0; }
  // convert_logical_to_physical_topk (the base's protocol), HiSparse's part:
  // Decode-sized: the leader resolves batch rows [0, T) once on the side
  // stream (into physical_workspace: attention indices, and
  // valid_counts_workspace) and gathers the misses into every layer's hot
  // cache, recording each layer's ready event; every layer's compute stream
  // waits for its own event. block_stride_rows is ignored: attention indices
  // use the configured attention_block_stride.
  // With config().max_rows_per_request > 1 (speculative decoding) the
  // consecutive rows of one request (equal state index and request id) are
  // resolved once, as the union of their selections, and each row's outputs
  // and share of the swap list come from that union (docs/hisparse.md). A
  // request of more rows, or a later request on a state row that an earlier
  // one of the batch has (rows apart), is bad input that lives on the
  // device: its rows come out as padding.
  // Prefill-sized: converts through batch.hisparse->resident_block_table
  // (every context page must be resident, or staged first); block_stride_rows
  // 0 means batch.block_size.

  // FP8 prefill from the staging plan (batch.prefill_staging_plan): the
  // host-backed gather-upconvert of SPEC section 3 for plan rows
  // [request_start, request_start + batch_size), each staged row read from
  // `source_cache` (the resident device cache, uint8 [blocks, block_size,
  // 656], where the plan's gpu_row_ids point; undefined only when the plan
  // has no resident rows, which for a plan built on the device means one
  // built without a resident table) or else straight from the layer's host
  // pool. Runs on the group's prefill stream after everything queued on
  // `compute`; returns the layer's prefill-ready event (wait on it before
  // prefill attention).
  // `block_table` is not read: the plan's compact table is used.
  Event* gather_fp8_prefill(int layer_index, Stream& compute, const Tensor& source_cache, const Tensor& dst,
                            const Tensor& block_table, const Tensor& workspace_starts, std::int64_t batch_size,
                            const BatchMetadata& batch, std::int64_t request_start,
                            Fp8Format format = Fp8Format::e4m3fn) override;

  // Host mirror. Rows (uint8 [n, row_bytes] on the device) written in a step
  // become host rows host_row_ids[n] of the layer's pool, on `compute`.
  void write_rows(int layer_index, Stream& compute, const Tensor& rows, const Tensor& host_row_ids);
  // Empties the hot slots of state_rows[n] that cache host_row_ids[n] (once
  // per step for the group: the slot state is shared by its layers).
  void invalidate_rows(Stream& compute, const Tensor& host_row_ids, const Tensor& state_rows);

  // Prefill staging for unquantised caches: a compact cache (uint8
  // [plan.num_blocks, block_size, row_bytes]) holding the plan's rows,
  // resident ones copied from `resident_cache` (uint8 [blocks, block_size,
  // row_bytes], optional) and the rest read from the layer's host pool, on
  // `compute`. The returned tensor owns the staged cache; keep it until the
  // compute stream has read it. Allocates it: a convenience, not the step path.
  [[nodiscard]] OwnedTensor stage_prefill_rows(int layer_index, Stream& compute, const HiSparsePrefillStagingPlan& plan,
                                               const Tensor& resident_cache);
  // The same into the caller's `staged` (uint8 [>= plan.num_blocks,
  // block_size, row_bytes], or [>= plan.num_blocks * block_size, row_bytes];
  // contiguous): allocates nothing, so it fits the step path.
  void stage_prefill_rows(int layer_index, Stream& compute, const HiSparsePrefillStagingPlan& plan,
                          const Tensor& resident_cache, const Tensor& staged);

  const HiSparseConfig& config() const { return config_; }
  HiSparseCacheHandle& cache(int layer_index) const;
  Stream& prefill_stream() const { return *prefill_stream_; }
  // Device state, for tests and the CLI's checks.
  // Device state (the engine's when HiSparseConfig::state gave it), for
  // tests and the CLI's checks.
  const Tensor& slot_rows() const;
  const Tensor& lru() const;
  const Tensor& hot_block_table() const;  // by state row
  std::int32_t hot_blocks_per_state() const { return hot_blocks_per_state_; }
  // The rest of the resolve's output for rows [0, T) of the last decode step
  // (the attention indices and valid counts are physical_workspace() and
  // valid_counts_workspace()): int32 [workspace_rows, K] hot rows, miss mask
  // and compact swap lists, int32 [workspace_rows] swap counts. They stay on
  // the device, where the gathers read the counts; read them after the step.
  const Tensor& hot_indices() const { return hot_indices_; }
  const Tensor& miss_mask() const { return miss_mask_; }
  const Tensor& swap_host_rows() const { return swap_host_rows_; }
  const Tensor& swap_device_rows() const { return swap_device_rows_; }
  const Tensor& swap_counts() const { return swap_counts_; }
  // Resolves and per-layer gathers queued so far (the resolve runs once per
  // step), and the launches the gathers took: the first layer's gather is a
  // launch of its own (its ready event can fire first), the later layers'
  // share launches of up to eight layers.
  std::uint64_t resolves() const { return resolves_; }
  std::uint64_t gathers() const { return gathers_; }
  std::uint64_t gather_launches() const { return gather_launches_; }
  // Reads the device counters: synchronises the side stream (not for the step path).
  HiSparseCounters counters();
  // The step path's form: queues on `stream`, after the group's work so far,
  // a copy of the device counters {hits, misses} into `out` (int64 [2],
  // device or pinned host memory), which the engine reads when `stream` has
  // reached it. Bytes moved are misses * bytes_per_miss().
  void snapshot_counters(Stream& stream, const Tensor& out);
  // Bytes one miss moves: the row sizes of every layer summed.
  std::uint64_t bytes_per_miss() const;
  HiSparseFootprint footprint() const;

 protected:
  // The decode protocol's hooks (index_group.hpp).
  void check_decode_step(const StepCall& call) const override;
  void queue_conversion(Stream& side, const StepCall& call) override;  // the resolve
  void queue_layer_work(Stream& side, const StepCall& call) override;  // the layers' gathers
  Event& layer_ready(int layer_index) const override;
  TopkConversion convert_prefill_sized(const StepCall& call) override;
  const char* class_name() const override { return "HiSparseMLAIndexGroup"; }
  const char* leader_work() const override { return "resolved"; }
  bool supports_dcp() const override { return false; }

 private:
  struct ResolveCall;
  ResolveCall resolve_call(const StepCall& call) const;
  void allocate_state();
  // Speculative decoding (config().max_rows_per_request > 1, docs/hisparse.md
  // "Speculative decoding"): the resolve of the step's union rows (one per
  // request, at its first batch row) and the passes around it.
  ResolveCall union_resolve_call(const StepCall& call) const;
  void queue_union_resolve(Stream& side, const StepCall& call);
  void allocate_union_workspace();

  HiSparseConfig config_;
  std::int32_t hot_blocks_per_state_ = 0;
  std::vector<std::unique_ptr<HiSparseCacheHandle>> caches_;
  OwnedTensor slot_rows_, lru_, hot_block_table_;
  OwnedTensor hot_indices_, miss_mask_, swap_host_rows_, swap_device_rows_, swap_counts_, counters_;
  // Speculative decoding only: union rows [workspace_rows, max_union_rows]
  // and the resolve's outputs for them, each state of a union row, and each
  // batch row's first row and entry positions in its union.
  OwnedTensor union_logical_, union_state_, union_hot_, union_miss_, union_swap_host_rows_, union_swap_device_rows_,
      union_swap_counts_, run_first_, entry_position_;
  std::uint64_t resolves_ = 0;
  std::uint64_t gathers_ = 0;
  std::uint64_t gather_launches_ = 0;
  std::vector<HiSparseLayerRows> later_layers_;  // the pools and hot caches of layers 1, 2, ... (queue_layer_work)
  std::unique_ptr<Stream> prefill_stream_;
};

}  // namespace sparse_mla
