#include "sparse_mla/hisparse_prefill.hpp"

#include <algorithm>

#include "kernels.hpp"
#include "sparse_mla/error.hpp"

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
  plan.has_resident_table = !resident.empty();
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
  // One device tensor: block table, row ids, resident row ids.
  std::vector<std::int32_t> packed = plan.host_block_table;
  packed.insert(packed.end(), plan.host_row_ids.begin(), plan.host_row_ids.end());
  packed.insert(packed.end(), plan.host_gpu_row_ids.begin(), plan.host_gpu_row_ids.end());
  const auto entries = static_cast<std::int64_t>(packed.size());
  if (&stream.device() != &device) fail(plan_where, "the stream belongs to another device than `device`");
  plan.storage = upload(stream, packed);
  const Tensor& all = plan.storage;
  const std::int64_t table_entries = static_cast<std::int64_t>(plan.host_block_table.size());
  plan.block_table = Tensor::of(plan.storage.buffer(), DType::i32, {P, B});
  plan.row_ids = all.rows(table_entries, table_entries + static_cast<std::int64_t>(rows));
  plan.gpu_row_ids = all.rows(table_entries + static_cast<std::int64_t>(rows), entries);
  return plan;
}

// ---- Built on the device ----

namespace {

constexpr const char* storage_where = "HiSparsePrefillPlanStorage";
constexpr const char* device_plan_where = "plan_hisparse_prefill_staging";

OwnedTensor int32_tensor(Device& device, std::int64_t n) { return OwnedTensor(device, DType::i32, {n}); }

}  // namespace

HiSparsePrefillPlanStorage::HiSparsePrefillPlanStorage(Device& device, std::int64_t max_requests,
                                                       std::int64_t blocks_per_request, std::int64_t max_staged_blocks,
                                                       std::int64_t pool_blocks, std::int32_t block_size)
    : device_(&device),
      max_requests_(max_requests),
      blocks_per_request_(blocks_per_request),
      max_staged_blocks_(max_staged_blocks),
      pool_blocks_(pool_blocks),
      block_size_(block_size) {
  if (max_requests < 0 || blocks_per_request < 0 || max_staged_blocks < 0 || pool_blocks < 0 || block_size < 1) {
    fail(storage_where, "need max_requests, blocks_per_request, max_staged_blocks, pool_blocks >= 0 and block_size >= 1; got ",
         max_requests, ", ", blocks_per_request, ", ", max_staged_blocks, ", ", pool_blocks, ", ", block_size);
  }
  if (max_requests > int32_max || blocks_per_request >= int32_max || max_requests * (blocks_per_request + 1) >= int32_max) {
    fail(storage_where, "max_requests ", max_requests, " * (blocks_per_request ", blocks_per_request,
         " + 1) must be below 2^31 - 1 (the kernel numbers every entry and context length in int32)");
  }
  if (max_staged_blocks >= int32_max || (max_staged_blocks + 1) * block_size > int32_max) {
    fail(storage_where, "(max_staged_blocks ", max_staged_blocks, " + 1) * block_size ", block_size,
         " staged rows do not fit int32 row ids");
  }
  if (pool_blocks > int32_max || pool_blocks * block_size > int32_max) {
    fail(storage_where, "pool_blocks ", pool_blocks, " * block_size ", block_size, " host rows do not fit int32 row ids");
  }
  const std::int64_t rows = num_blocks() * block_size;
  block_table_ = int32_tensor(device, max_requests * blocks_per_request);
  row_ids_ = int32_tensor(device, rows);
  gpu_row_ids_ = int32_tensor(device, rows);
  error_record_ = int32_tensor(device, 4);
  scratch_ = int32_tensor(device, 2 * pool_blocks + max_staged_blocks + 2);
}

HiSparsePrefillStagingPlan plan_hisparse_prefill_staging(Stream& stream, const Tensor& block_table,
                                                         const Tensor& context_lengths,
                                                         const Tensor& resident_block_table,
                                                         std::int32_t resident_null_block,
                                                         HiSparsePrefillPlanStorage& storage) {
  const char* where = device_plan_where;
  Device& device = stream.device();
  if (&device != &storage.device()) fail(where, "the stream belongs to another device than the plan storage");
  check(where, "block_table", block_table).dtype(DType::i32).rank(2).rows_contiguous()
      .dim_at_most(0, storage.max_requests(), "max_requests of the plan storage")
      .dim_at_most(1, storage.blocks_per_request(), "blocks_per_request of the plan storage").on(device);
  const std::int64_t P = block_table.dim(0), B = block_table.dim(1);
  check(where, "context_lengths", context_lengths).dtype(DType::i32).rank(1).contiguous()
      .dim_at_least(0, P, "one per row of block_table").on(device);
  HiSparsePlanArgs a{};
  if (resident_block_table.defined()) {
    check(where, "resident_block_table", resident_block_table).dtype(DType::i32).rank(2).rows_contiguous()
        .dim_at_least(0, P, "one per row of block_table").on(device);
    if (resident_block_table.dim(1) > int32_max) {
      fail(where, "resident_block_table has shape ", resident_block_table.shape_string(), ", more than 2^31 - 1 blocks");
    }
    a.resident_block_table = resident_block_table.data_as<std::int32_t>();
    a.resident_table_stride = resident_block_table.stride(0);
    a.resident_blocks_per_request = static_cast<std::int32_t>(resident_block_table.dim(1));
  }
  a.resident_null_block = resident_null_block;
  a.block_table = block_table.data_as<std::int32_t>();
  a.block_table_stride = block_table.stride(0);
  a.context_lengths = context_lengths.data_as<std::int32_t>();
  a.num_requests = static_cast<std::int32_t>(P);
  a.blocks_per_request = static_cast<std::int32_t>(B);
  a.block_size = storage.block_size();
  a.pool_blocks = static_cast<std::int32_t>(storage.pool_blocks());
  a.max_staged_blocks = static_cast<std::int32_t>(storage.max_staged_blocks());
  a.plan_block_table = storage.block_table().data_as<std::int32_t>();
  a.row_ids = storage.row_ids().data_as<std::int32_t>();
  a.gpu_row_ids = storage.gpu_row_ids().data_as<std::int32_t>();
  a.error_record = storage.error_record().data_as<std::int32_t>();
  std::int32_t* scratch = storage.scratch().data_as<std::int32_t>();
  a.first_use = scratch;
  a.compact_block = scratch + storage.pool_blocks();
  a.staged_host_block = scratch + 2 * storage.pool_blocks();
  a.totals = scratch + 2 * storage.pool_blocks() + storage.max_staged_blocks();
  detail::kernels_of(device).plan_hisparse_prefill(stream, a);

  HiSparsePrefillStagingPlan plan;
  plan.block_size = storage.block_size();
  plan.num_blocks = storage.num_blocks();
  const Tensor& table = storage.block_table();
  plan.block_table = Tensor(table.data(), DType::i32, {P, B}, table.kind(), &device);
  plan.row_ids = storage.row_ids();
  plan.gpu_row_ids = storage.gpu_row_ids();
  plan.has_resident_table = resident_block_table.defined();
  plan.built_in = &storage;
  return plan;
}

void check_hisparse_prefill_plan(Stream& stream, const HiSparsePrefillStagingPlan& plan) {
  if (!plan.built_on_device()) return;
  const HiSparsePrefillPlanStorage& storage = *plan.built_in;
  if (&stream.device() != &storage.device()) fail("check_hisparse_prefill_plan", "the stream belongs to another device than the plan storage");
  const std::vector<std::int32_t> record = download<std::int32_t>(stream, storage.error_record());
  const auto code = static_cast<HiSparsePlanError>(record[0]);
  const std::int32_t p = record[1], b = record[2], value = record[3];
  const std::int64_t B = plan.block_table.dim(1);
  const char* where = device_plan_where;
  switch (code) {
    case HiSparsePlanError::none:
      return;
    case HiSparsePlanError::bad_context_length:
      fail(where, "context length ", value, " of prefill request ", p, " needs ",
           (std::int64_t{value} + plan.block_size - 1) / plan.block_size, " blocks but the block table has ", B);
    case HiSparsePlanError::negative_block:
      fail(where, "block_table[", p, ", ", b, "] = ", value, " lies inside the context of request ", p);
    case HiSparsePlanError::block_outside_pool:
      fail(where, "block_table[", p, ", ", b, "] = ", value, " lies inside the context of request ", p,
           " but outside the host pool's ", storage.pool_blocks(), " blocks");
    case HiSparsePlanError::too_many_blocks:
      fail(where, "the prefill requests use ", value, " distinct blocks but the plan storage holds ",
           storage.max_staged_blocks(), " (block_table[", p, ", ", b, "] is the first that does not fit)");
  }
  fail("check_hisparse_prefill_plan", "the plan's error record holds an unknown code ", record[0]);
}

}  // namespace sparse_mla
