// SPEC section 5's prefill staging plan: for prefill requests whose pages
// are not all resident, the distinct host blocks they use packed into a
// compact block table, with each staged row's host row and resident device
// row. Implemented by core/src/hisparse_prefill.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/tensor.hpp"

namespace sparse_mla {

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
  // three views above share.
  std::vector<std::int32_t> host_block_table, host_row_ids, host_gpu_row_ids;
  OwnedTensor storage;
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

}  // namespace sparse_mla
