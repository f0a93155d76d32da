// Fills an int32 array with one value.
#pragma once

#include <Kokkos_Core.hpp>

#include "kernels.hpp"

namespace sparse_mla::kernels {

struct FillI32 {
  FillI32Args a;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const { a.data[i] = a.value; }
};

template <class Space>
void fill_i32(const Space& space, const FillI32Args& a) {
  if (a.count == 0) return;
  Kokkos::parallel_for("sparse_mla::fill_i32",
                       Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, a.count), FillI32{a});
}

}  // namespace sparse_mla::kernels
