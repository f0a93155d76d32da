#include "sparse_mla/hisparse_prefill.hpp"

#include <algorithm>

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

}  // namespace sparse_mla
