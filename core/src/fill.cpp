#include "sparse_mla/fill.hpp"

#include "kernels.hpp"
#include "sparse_mla/error.hpp"

namespace sparse_mla {

void fill_i32(Stream& stream, const Tensor& tensor, std::int32_t value) {
  constexpr const char* where = "fill_i32";
  Device& device = stream.device();
  check(where, "tensor", tensor).defined().dtype(DType::i32).contiguous().on(device);
  if (tensor.numel() == 0) return;
  detail::kernels_of(device).fill_i32(stream, FillI32Args{tensor.data_as<std::int32_t>(), tensor.numel(), value});
}

}  // namespace sparse_mla
