// Scalar reference of the logical-to-physical top-k conversion (SPEC section
// 2), a plain loop over host vectors, independent of the library's kernels.
// Used by the index-group tests and by `sparse-mla validate --synthetic`.
#pragma once

#include <cstdint>
#include <vector>

namespace sparse_mla::reference {

struct PhysicalTopk {
  std::vector<std::int32_t> physical;      // [T, K]
  std::vector<std::int32_t> valid_counts;  // [T]
};

// req_id[T], block_table[R, blocks_per_request] (row-major), logical[T, K].
// block_stride_rows 0 means block_size.
inline PhysicalTopk logical_to_physical_topk(const std::vector<std::int32_t>& req_id,
                                             const std::vector<std::int32_t>& block_table,
                                             std::int64_t blocks_per_request,
                                             const std::vector<std::int32_t>& logical, std::int64_t num_tokens,
                                             std::int64_t top_k, std::int64_t block_size,
                                             std::int64_t block_stride_rows = 0) {
  const std::int64_t stride = block_stride_rows == 0 ? block_size : block_stride_rows;
  PhysicalTopk out;
  out.physical.assign(static_cast<std::size_t>(num_tokens * top_k), -1);
  out.valid_counts.assign(static_cast<std::size_t>(num_tokens), 0);
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    const std::int64_t request = req_id[static_cast<std::size_t>(t)];
    for (std::int64_t j = 0; j < top_k; ++j) {
      const std::int64_t tok = logical[static_cast<std::size_t>(t * top_k + j)];
      if (tok < 0) continue;
      const std::int64_t block = tok / block_size;
      if (block >= blocks_per_request) continue;
      const std::int64_t physical_block = block_table[static_cast<std::size_t>(request * blocks_per_request + block)];
      // int32 wrap-around, as the reference engine's kernel computes it.
      const auto row = static_cast<std::int32_t>(
          static_cast<std::uint32_t>(physical_block * stride + tok % block_size));
      out.physical[static_cast<std::size_t>(t * top_k + j)] = row;
      if (row != -1) ++out.valid_counts[static_cast<std::size_t>(t)];
    }
  }
  return out;
}

}  // namespace sparse_mla::reference
