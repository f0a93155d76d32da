// Filling a tensor with one value, queued on a stream: poisoning outputs
// before a kernel runs, clearing tables. Checked like every public
// operation. Implemented by core/src/fill.cpp over core/kernels/fill.hpp.
#pragma once

#include <cstdint>

#include "sparse_mla/device.hpp"
#include "sparse_mla/tensor.hpp"

namespace sparse_mla {

// Every element of `tensor` (contiguous int32, in memory the stream's
// device's kernels reach) becomes `value`.
void fill_i32(Stream& stream, const Tensor& tensor, std::int32_t value);

}  // namespace sparse_mla
