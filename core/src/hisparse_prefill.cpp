// HiSparse prefill (SPEC section 5): the staging plan, the staging copy for
// unquantised caches and the FP8 gather-upconvert straight from the host pool.
#include <algorithm>
#include <cstring>

#include "sparse_mla/error.hpp"
#include "sparse_mla/hisparse.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "sparse_mla/ops.hpp"

namespace sparse_mla {

namespace {

constexpr const char* plan_where = "build_hisparse_prefill_staging_plan";

// The distinct host blocks the requests' contexts use, ascending.
std::vector<std::int32_t> used_blocks(const std::vector<std::int32_t>& table, std::int64_t P, std::int64_t B,
                                      const std::vector<std::int64_t>& lengths, std::int32_t block_size) {
  std::vector<std::int32_t> used;
  for (std::int64_t p = 0; p < P; ++p) {
    const std::int64_t blocks = (lengths[static_cast<std::size_t>(p)] + block_size - 1) / block_size;
    if (lengths[static_cast<std::size_t>(p)] < 0 || blocks > B) {
      fail(plan_where, "context length ", lengths[static_cast<std::size_t>(p)], " of prefill request ", p, " needs ",
           blocks, " blocks but the block table has ", B);
    }
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int32_t id = table[static_cast<std::size_t>(p * B + b)];
      if (id < 0) fail(plan_where, "block_table[", p, ", ", b, "] = ", id, " lies inside the context of request ", p);
      used.push_back(id);
    }
  }
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  return used;
}

}  // namespace

HiSparsePrefillStagingPlan build_hisparse_prefill_staging_plan(Device& device, Stream& stream,
                                                               const std::vector<std::int32_t>& table,
                                                               std::int64_t P, std::int64_t B,
                                                               const std::vector<std::int64_t>& lengths,
                                                               std::int32_t block_size,
                                                               const std::vector<std::int32_t>& resident,
                                                               std::int64_t resident_B, std::int32_t resident_null_block) {
  if (P < 0 || B < 0 || block_size < 1) fail(plan_where, "need P >= 0, B >= 0, block_size >= 1; got ", P, ", ", B, ", ", block_size);
  if (table.size() != static_cast<std::size_t>(P * B)) fail(plan_where, "block_table has ", table.size(), " entries, expected P * B = ", P * B);
  if (lengths.size() != static_cast<std::size_t>(P)) fail(plan_where, "context_lengths has ", lengths.size(), " entries, expected P = ", P);
  if (!resident.empty() && resident.size() != static_cast<std::size_t>(P * resident_B)) {
    fail(plan_where, "resident_block_table has ", resident.size(), " entries, expected P * B' = ", P * resident_B);
  }
  const std::vector<std::int32_t> used = used_blocks(table, P, B, lengths, block_size);
  HiSparsePrefillStagingPlan plan;
  plan.block_size = block_size;
  plan.num_blocks = 1 + static_cast<std::int64_t>(used.size());  // compact block 0 is the null block
  const std::size_t rows = static_cast<std::size_t>(plan.num_blocks) * static_cast<std::size_t>(block_size);
  plan.host_block_table.assign(table.size(), 0);
  plan.host_row_ids.assign(rows, -1);
  plan.host_gpu_row_ids.assign(rows, -1);
  std::vector<bool> seen(used.size(), false);
  for (std::int64_t p = 0; p < P; ++p) {
    const std::int64_t blocks = (lengths[static_cast<std::size_t>(p)] + block_size - 1) / block_size;
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int32_t id = table[static_cast<std::size_t>(p * B + b)];
      const std::size_t u = static_cast<std::size_t>(std::lower_bound(used.begin(), used.end(), id) - used.begin());
      const std::int32_t compact = static_cast<std::int32_t>(u + 1);
      plan.host_block_table[static_cast<std::size_t>(p * B + b)] = compact;
      if (seen[u]) continue;  // the first request using a block decides its resident page
      seen[u] = true;
      const std::int32_t page = !resident.empty() && b < resident_B ? resident[static_cast<std::size_t>(p * resident_B + b)] : -1;
      for (std::int32_t off = 0; off < block_size; ++off) {
        const std::size_t row = static_cast<std::size_t>(compact) * static_cast<std::size_t>(block_size) + static_cast<std::size_t>(off);
        plan.host_row_ids[row] = id * block_size + off;
        if (page >= 0 && page != resident_null_block) plan.host_gpu_row_ids[row] = page * block_size + off;
      }
    }
  }
  // One device buffer: block table, row ids, resident row ids.
  const std::size_t entries = plan.host_block_table.size() + 2 * rows;
  Buffer staging = device.allocate(entries * 4, MemoryKind::host);
  auto* out = staging.as<std::int32_t>();
  std::copy(plan.host_block_table.begin(), plan.host_block_table.end(), out);
  std::copy(plan.host_row_ids.begin(), plan.host_row_ids.end(), out + plan.host_block_table.size());
  std::copy(plan.host_gpu_row_ids.begin(), plan.host_gpu_row_ids.end(), out + plan.host_block_table.size() + rows);
  plan.storage = device.allocate(entries * 4, MemoryKind::device);
  stream.copy(plan.storage, 0, staging, 0, entries * 4);
  stream.synchronize();
  const Tensor all = Tensor::of(plan.storage, DType::i32, {static_cast<std::int64_t>(entries)});
  const std::int64_t table_entries = static_cast<std::int64_t>(plan.host_block_table.size());
  plan.block_table = Tensor::of(plan.storage, DType::i32, {P, B});
  plan.row_ids = all.rows(table_entries, table_entries + static_cast<std::int64_t>(rows));
  plan.gpu_row_ids = all.rows(table_entries + static_cast<std::int64_t>(rows), static_cast<std::int64_t>(entries));
  return plan;
}

HiSparseMLAIndexGroup::StagedCache HiSparseMLAIndexGroup::stage_prefill_rows(int layer_index, Stream& compute,
                                                                             const HiSparsePrefillStagingPlan& plan,
                                                                             const Tensor& resident_cache) {
  constexpr const char* where = "HiSparseMLAIndexGroup::stage_prefill_rows";
  check_layer(where, layer_index, compute);
  if (plan.block_size != config_.block_size) {
    fail(where, "the plan's block size ", plan.block_size, " differs from the group's ", config_.block_size);
  }
  HiSparseCacheHandle& layer = cache(layer_index);
  const std::int64_t rows = plan.num_blocks * plan.block_size;
  if (plan.row_ids.numel() != rows) fail(where, "the plan has ", plan.row_ids.numel(), " row ids for ", rows, " staged rows");
  StagedCache staged;
  staged.storage = device().allocate(static_cast<std::size_t>(rows * layer.row_bytes()), MemoryKind::device);
  const Tensor flat = Tensor::of(staged.storage, DType::u8, {rows, layer.row_bytes()});
  stage_hisparse_rows(compute, layer.host_pool(), plan.row_ids, resident_cache,
                      resident_cache.defined() ? plan.gpu_row_ids : Tensor(), flat);
  staged.cache = Tensor::of(staged.storage, DType::u8, {plan.num_blocks, plan.block_size, layer.row_bytes()});
  return staged;
}

Event* HiSparseMLAIndexGroup::gather_fp8_prefill(int layer_index, Stream& compute, const Tensor& source_cache,
                                                 const Tensor& dst, const Tensor& /*block_table: the plan's*/,
                                                 const Tensor& workspace_starts, std::int64_t batch_size,
                                                 const BatchMetadata& batch, std::int64_t request_start,
                                                 Fp8Format format) {
  constexpr const char* where = "HiSparseMLAIndexGroup::gather_fp8_prefill";
  check_layer(where, layer_index, compute);
  const HiSparsePrefillStagingPlan* plan = batch.prefill_staging_plan;
  if (plan == nullptr) fail(where, "batch.prefill_staging_plan is null: HiSparse prefill reads through a staging plan");
  HiSparseCacheHandle& layer = cache(layer_index);
  if (layer.row_bytes() != fp8_row_bytes) {
    fail(where, "layer ", layer_index, " has ", layer.row_bytes(), "-byte rows, not fp8_ds_mla rows (", fp8_row_bytes, " bytes)");
  }
  const std::int64_t plan_rows = plan->block_table.defined() ? plan->block_table.dim(0) : 0;
  if (request_start < 0 || batch_size < 0 || request_start + batch_size > plan_rows) {
    fail(where, "requests [", request_start, ", ", request_start + batch_size, ") are outside the plan's ", plan_rows, " requests");
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
    for (std::int32_t id : plan->host_gpu_row_ids) {
      if (id >= 0) fail(where, "the plan has resident rows but source_cache (the resident device cache) is undefined");
    }
  }
  prefill_stream_->wait(compute);
  gather_upconvert_fp8(*prefill_stream_, device_cache, dst, plan->block_table.rows(request_start, request_start + batch_size),
                       workspace_starts, batch_size, params);
  layer.prefill_ready().record(*prefill_stream_);
  return &layer.prefill_ready();
}

}  // namespace sparse_mla
