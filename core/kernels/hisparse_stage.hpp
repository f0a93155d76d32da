// HiSparse prefill staging (SPEC section 5): fills a compact cache with the
// rows a prefill reads, resident rows device to device and the others from
// the pinned host pool directly (zero-copy), in 16-byte units.
#pragma once

#include <Kokkos_Core.hpp>

#include "components/memory.hpp"
#include "space_traits.hpp"
#include "kernels.hpp"

namespace sparse_mla::kernels {

struct HiSparseStage {
  HiSparseStageArgs a;
  std::int64_t units;  // 16-byte units per row

  KOKKOS_INLINE_FUNCTION const std::uint8_t* source(std::int64_t n) const {
    const std::int32_t x = a.device_row_ids != nullptr ? a.device_row_ids[n] : -1;
    if (x >= 0 && x < a.resident_rows) {
      return a.resident_cache + (x / a.resident_block_size) * a.resident_block_stride_bytes +
             (x % a.resident_block_size) * a.row_bytes;
    }
    const std::int32_t g = a.host_row_ids[n];
    return g >= 0 && g < a.host_rows ? a.host_pool + g * a.row_bytes : nullptr;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    const std::int64_t n = i / units, u = i % units;
    const std::uint8_t* src = source(n);
    Int4* dst = reinterpret_cast<Int4*>(a.staged + n * a.row_bytes);
    dst[u] = src != nullptr ? reinterpret_cast<const Int4*>(src)[u] : Int4{0, 0, 0, 0};
  }
};

template <class Space>
void stage_hisparse_rows(const Space& space, const HiSparseStageArgs& a) {
  if (a.num_rows == 0) return;
  const std::int64_t units = a.row_bytes / 16;
  Kokkos::parallel_for("sparse_mla::stage_hisparse_rows",
                       Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, a.num_rows * units),
                       HiSparseStage{a, units});
}

}  // namespace sparse_mla::kernels
