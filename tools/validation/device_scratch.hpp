// Tensors of one validation case on a device, on one stream, alive as long
// as the scratch: the staging of the golden handlers, the HiSparse replay
// and the CLI's synthetic schedules.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/tensor.hpp"
#include "validation/safetensors.hpp"

namespace sparse_mla::validation {

class DeviceScratch {
 public:
  // On a stream of its own.
  explicit DeviceScratch(Device& device) : device_(device), owned_(device.create_stream()), stream_(*owned_) {}
  // On `stream` (a caller's, which must outlive the scratch), so that its
  // copies are ordered with the caller's work.
  explicit DeviceScratch(Stream& stream) : device_(stream.device()), stream_(stream) {}
  Device& device() { return device_; }
  Stream& stream() { return stream_; }
  // A copy of a file's tensor in memory of `kind`.
  Tensor upload(const TensorRecord& record, MemoryKind kind = MemoryKind::device);
  // A new device tensor of `shape` holding `values`.
  template <class T>
  Tensor upload(const std::vector<T>& values, const std::vector<std::int64_t>& shape) {
    return keep(sparse_mla::upload(stream_, values, shape));
  }
  // `values` into the first elements of contiguous `dst`.
  template <class T>
  void write(const Tensor& dst, const std::vector<T>& values) {
    upload_bytes(stream_, values.data(), values.size() * sizeof(T), dst);
  }
  // Every element of `view` (rows may be strided), after everything queued so far.
  template <class T>
  std::vector<T> download(const Tensor& view) {
    return sparse_mla::download<T>(stream_, view);
  }
  // A new device tensor, contents undefined.
  Tensor allocate(DType dtype, const std::vector<std::int64_t>& shape);
  // A new device tensor whose every byte is `byte` (poison).
  Tensor filled(DType dtype, const std::vector<std::int64_t>& shape, std::uint8_t byte);
  // Every int32 of `tensor` becomes `value`, queued on the stream.
  void poison(const Tensor& tensor, std::int32_t value);
  // A tensor's bytes, after everything queued so far.
  std::vector<std::uint8_t> download(const Tensor& tensor);

 private:
  Tensor keep(OwnedTensor tensor);
  Device& device_;
  std::vector<OwnedTensor> tensors_;
  // Declared after the tensors, so destroyed first: work still queued on an
  // own stream when a case throws drains before the tensors it uses are freed.
  std::unique_ptr<Stream> owned_;
  Stream& stream_;
};

// Reinterprets downloaded bytes as values.
template <class T>
std::vector<T> values_of(const std::vector<std::uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

}  // namespace sparse_mla::validation
