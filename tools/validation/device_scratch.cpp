#include "validation/device_scratch.hpp"

#include "sparse_mla/fill.hpp"

namespace sparse_mla::validation {

Tensor DeviceScratch::keep(OwnedTensor tensor) {
  tensors_.push_back(std::move(tensor));
  return tensors_.back();
}

Tensor DeviceScratch::upload(const TensorRecord& record, MemoryKind kind) {
  OwnedTensor tensor(device_, record.dtype, record.shape, kind);
  upload_bytes(stream_, record.bytes.data(), record.bytes.size(), tensor);
  return keep(std::move(tensor));
}

Tensor DeviceScratch::allocate(DType dtype, const std::vector<std::int64_t>& shape) {
  return keep(OwnedTensor(device_, dtype, shape));
}

Tensor DeviceScratch::filled(DType dtype, const std::vector<std::int64_t>& shape, std::uint8_t byte) {
  OwnedTensor tensor(device_, dtype, shape);
  if (tensor.bytes() != 0) stream_.fill_bytes(tensor.data(), byte, tensor.bytes());
  return keep(std::move(tensor));
}

void DeviceScratch::poison(const Tensor& tensor, std::int32_t value) { fill_i32(stream_, tensor, value); }

std::vector<std::uint8_t> DeviceScratch::download(const Tensor& tensor) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(tensor.numel()) * tensor.element_size());
  download_bytes(stream_, tensor, out.data());
  return out;
}

}  // namespace sparse_mla::validation
