// The golden-file handlers of `sparse-mla validate --golden`, one per
// metadata `kind` (golden/README.md), and the device staging they share.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/safetensors.hpp"
#include "sparse_mla/tensor.hpp"
#include "validate.hpp"

namespace sparse_mla::cli::validation {

PreparedCase prepare_topk_convert(std::shared_ptr<const SafetensorsFile> file);
PreparedCase prepare_fp8_gather_upconvert(std::shared_ptr<const SafetensorsFile> file);
PreparedCase prepare_hisparse_sequence(std::shared_ptr<const SafetensorsFile> file);

// Tensors of one case on the device, on one stream, alive as long as this.
class DeviceScratch {
 public:
  explicit DeviceScratch(Device& device) : device_(device), stream_(device.create_stream()) {}
  Stream& stream() { return *stream_; }
  // A copy of a file's tensor in device memory.
  Tensor upload(const TensorRecord& record);
  // A new device tensor whose every byte is `byte` (poison).
  Tensor filled(DType dtype, const std::vector<std::int64_t>& shape, std::uint8_t byte);
  // A device tensor's bytes, after everything queued so far.
  std::vector<std::uint8_t> download(const Tensor& tensor);

 private:
  Tensor keep(Buffer buffer, DType dtype, const std::vector<std::int64_t>& shape);
  Device& device_;
  std::vector<Buffer> buffers_;
  // Declared last, so destroyed first: work still queued when a case throws
  // drains before the buffers it uses are freed.
  std::unique_ptr<Stream> stream_;
};

// Reinterprets downloaded bytes as values.
template <class T>
std::vector<T> values_of(const std::vector<std::uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

}  // namespace sparse_mla::cli::validation
