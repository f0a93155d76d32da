// SPEC section 5's prefill staging plan: for prefill requests whose pages
// are not all resident, the distinct host blocks they use packed into a
// compact block table, with each staged row's host row and resident device
// row. Built on the host (build_hisparse_prefill_staging_plan: set-up, tests,
// the reference) or on the device into storage sized once
// (plan_hisparse_prefill_staging: the step path). Implemented by
// core/src/hisparse_prefill.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/tensor.hpp"

namespace sparse_mla {

class HiSparsePrefillPlanStorage;

// SPEC section 5's prefill staging plan, for prefill requests whose pages
// are not all resident. Rows of block_table are plan-relative: prefill
// request p (batch request num_decodes + p) is row p.
struct HiSparsePrefillStagingPlan {
  std::int32_t block_size = 0;
  std::int64_t num_blocks = 0;  // staged blocks, block 0 (the null block) included
  Tensor block_table;           // int32 [P, B]: compact block of each logical block, 0 = null
  Tensor row_ids;               // int32 [num_blocks * block_size]: host row of each staged row, -1 unused
  Tensor gpu_row_ids;           // int32 [num_blocks * block_size]: resident row, -1 when not resident
  // Host copies (what the plan was built from), and the device tensor the
  // three views above share. Empty for a plan built on the device.
  std::vector<std::int32_t> host_block_table, host_row_ids, host_gpu_row_ids;
  OwnedTensor storage;
  // Whether the plan was built with a resident table (its gpu_row_ids may
  // point into a resident device cache).
  bool has_resident_table = false;
  // The storage a plan built on the device lives in (its tensors are views
  // into it, num_blocks is its capacity); nullptr for a plan built on the host.
  const HiSparsePrefillPlanStorage* built_in = nullptr;
  bool built_on_device() const { return built_in != nullptr; }
};

// Builds a plan on the host from host copies of the prefill requests' source
// block table (int32 [P, B], row-major) and their context lengths, and
// uploads it on `stream` (waits for the copy). With a resident table
// (int32 [P, B'], same block size; resident_null_block = not resident), each
// staged row also gets its resident device row.
HiSparsePrefillStagingPlan build_hisparse_prefill_staging_plan(Device& device, Stream& stream,
                                                               const std::vector<std::int32_t>& block_table,
                                                               std::int64_t num_requests, std::int64_t blocks_per_request,
                                                               const std::vector<std::int64_t>& context_lengths,
                                                               std::int32_t block_size,
                                                               const std::vector<std::int32_t>& resident_block_table = {},
                                                               std::int64_t resident_blocks_per_request = 0,
                                                               std::int32_t resident_null_block = 0);

// Device storage for one prefill staging plan built on the device, sized once
// for up to max_requests prefill requests of up to blocks_per_request blocks
// that use up to max_staged_blocks distinct host blocks of a pool of
// pool_blocks blocks of block_size rows: the plan's block table, row ids,
// resident row ids and error record, and the scratch its kernel needs.
// Construction allocates (and may synchronise); building a plan into it does
// neither. It holds one plan at a time: building the next one overwrites the
// previous one, so the previous one's readers must be queued before it.
class HiSparsePrefillPlanStorage {
 public:
  HiSparsePrefillPlanStorage(Device& device, std::int64_t max_requests, std::int64_t blocks_per_request,
                             std::int64_t max_staged_blocks, std::int64_t pool_blocks, std::int32_t block_size);
  HiSparsePrefillPlanStorage(const HiSparsePrefillPlanStorage&) = delete;
  HiSparsePrefillPlanStorage& operator=(const HiSparsePrefillPlanStorage&) = delete;

  Device& device() const { return *device_; }
  std::int64_t max_requests() const { return max_requests_; }
  std::int64_t blocks_per_request() const { return blocks_per_request_; }
  std::int64_t max_staged_blocks() const { return max_staged_blocks_; }
  std::int64_t pool_blocks() const { return pool_blocks_; }
  std::int32_t block_size() const { return block_size_; }
  // Compact blocks of every plan built here, the null block included.
  std::int64_t num_blocks() const { return 1 + max_staged_blocks_; }

  // The storage itself (int32, contiguous), for tests that poison it first.
  const Tensor& block_table() const { return block_table_; }  // [max_requests * blocks_per_request]
  const Tensor& row_ids() const { return row_ids_; }          // [num_blocks * block_size]
  const Tensor& gpu_row_ids() const { return gpu_row_ids_; }  // [num_blocks * block_size]
  const Tensor& error_record() const { return error_record_; }  // [4]: code, request, block, value
  const Tensor& scratch() const { return scratch_; }  // [2 * pool_blocks + max_staged_blocks + 2]

 private:
  Device* device_;
  std::int64_t max_requests_, blocks_per_request_, max_staged_blocks_, pool_blocks_;
  std::int32_t block_size_;
  OwnedTensor block_table_, row_ids_, gpu_row_ids_, error_record_, scratch_;
};

// The plan of build_hisparse_prefill_staging_plan built on the device, queued
// on `stream`: no allocation, no host synchronisation, capturable. Arguments,
// on the storage's device:
//   block_table: int32 [P, B] (rows packed), the prefill requests' source
//     block table, P <= storage.max_requests(), B <= storage.blocks_per_request();
//   context_lengths: int32 [>= P], each request's context length in tokens;
//   resident_block_table: int32 [>= P, B'] (rows packed), or undefined: with
//     it each staged row also gets its resident row (a page < 0 or equal to
//     resident_null_block is not resident).
// Shapes, dtypes and devices are checked on the host (nothing is queued when
// they are wrong). The values are not: a bad entry (a context length < 0 or
// needing more than B blocks, a block id outside [0, storage.pool_blocks())
// inside a context, more distinct blocks than storage.max_staged_blocks())
// is staged as the null block and recorded for check_hisparse_prefill_plan.
// The returned plan's tensors are views into `storage` (num_blocks is its
// capacity; rows of compact blocks past the last one used are -1 in row_ids
// and gpu_row_ids); its host_* vectors are empty.
HiSparsePrefillStagingPlan plan_hisparse_prefill_staging(Stream& stream, const Tensor& block_table,
                                                         const Tensor& context_lengths,
                                                         const Tensor& resident_block_table,
                                                         std::int32_t resident_null_block,
                                                         HiSparsePrefillPlanStorage& storage);

// Throws the Error that build_hisparse_prefill_staging_plan would throw for
// the first bad entry of a plan built on the device (naming the request, the
// block and the value), or returns when there was none; a plan built on the
// host was checked when it was built. Waits for `stream` (the plan's stream,
// or one ordered after it): for tests and debugging, not the step path.
void check_hisparse_prefill_plan(Stream& stream, const HiSparsePrefillStagingPlan& plan);

}  // namespace sparse_mla
