// A typed, shaped, non-owning view over device, pinned or host memory, and
// the checks every public entry point runs on its arguments before it queues
// any work (SPEC section 6: reject, name the argument and the values, write
// nothing).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/dtype.hpp"
#include "sparse_mla/error.hpp"

namespace sparse_mla {

// The largest int32: sizes, strides and indices the kernels take as int32
// are checked against it.
inline constexpr std::int64_t int32_max = 2147483647;

class Tensor {
 public:
  static constexpr int max_rank = 4;

  Tensor() = default;
  // A contiguous (row-major) view of `data`.
  Tensor(void* data, DType dtype, const std::vector<std::int64_t>& shape, MemoryKind kind,
         const Device* device);
  // A strided view of `data` (strides in elements, each >= 0): the engine's
  // memory as it lies, e.g. one layer's blocks inside a KV slab.
  Tensor(void* data, DType dtype, const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides,
         MemoryKind kind, const Device* device);
  // A contiguous view over the start of `buffer`; throws when it does not fit.
  static Tensor of(const Buffer& buffer, DType dtype, const std::vector<std::int64_t>& shape);

  bool defined() const { return rank_ > 0 || data_ != nullptr; }
  void* data() const { return data_; }
  template <class T>
  T* data_as() const {
    if (dtype_of<T>::value != dtype_) fail("Tensor::data_as", "tensor has dtype ", dtype_name(dtype_), ", asked for ", dtype_name(dtype_of<T>::value));
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  int rank() const { return rank_; }
  std::int64_t dim(int i) const { return shape_.at(static_cast<std::size_t>(i)); }
  std::int64_t stride(int i) const { return strides_.at(static_cast<std::size_t>(i)); }  // in elements
  std::int64_t numel() const;
  std::size_t element_size() const { return dtype_size(dtype_); }
  MemoryKind kind() const { return kind_; }
  const Device* device() const { return device_; }

  // Rows [begin, end) along dimension 0 (torch's t[begin:end]).
  Tensor rows(std::int64_t begin, std::int64_t end) const;
  // Entries [begin, end) along dimension `dim`, strides kept (torch's
  // narrow): columns of a wider tensor give rows with a larger row stride.
  Tensor narrow(int dim, std::int64_t begin, std::int64_t end) const;
  // Every dimension but the first is packed row-major (row stride may be larger).
  bool rows_contiguous() const;
  bool contiguous() const;
  std::string shape_string() const;  // "[4, 64]"

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::u8;
  int rank_ = 0;
  std::array<std::int64_t, max_rank> shape_{};
  std::array<std::int64_t, max_rank> strides_{};
  MemoryKind kind_ = MemoryKind::host;
  const Device* device_ = nullptr;
};

// Argument checks with messages of one form:
//   "<where>: <name> has dtype I16, expected I32"
//   "<where>: <name> has shape [4096, 64] but dimension 0 must be <= 513 (group workspace rows)"
class TensorCheck {
 public:
  TensorCheck(std::string where, std::string name, const Tensor& tensor);
  TensorCheck& defined();
  TensorCheck& dtype(DType expected);
  TensorCheck& rank(int expected);
  TensorCheck& dim(int i, std::int64_t expected, const char* what = nullptr);
  TensorCheck& dim_at_least(int i, std::int64_t minimum, const char* what = nullptr);
  TensorCheck& dim_at_most(int i, std::int64_t maximum, const char* what = nullptr);
  TensorCheck& rows_contiguous();
  TensorCheck& contiguous();
  // On `device`, in memory its kernels can reach.
  TensorCheck& on(const Device& device);
  TensorCheck& kind(MemoryKind expected);

 private:
  [[noreturn]] void reject(const std::string& why) const;
  std::string where_;
  std::string name_;
  const Tensor& tensor_;
};

// The position of row-major element `flat` in `shape`, as "[i, j, k]": how
// mismatch reports name an element.
std::string index_string(const std::vector<std::int64_t>& shape, std::int64_t flat);

inline TensorCheck check(std::string where, std::string name, const Tensor& tensor) {
  return TensorCheck(std::move(where), std::move(name), tensor);
}

// A Tensor that owns its memory: one Buffer and the contiguous view over it.
// Move-only, like the Buffer. Converts to the view, so it can be passed
// wherever a Tensor is taken.
class OwnedTensor {
 public:
  OwnedTensor() = default;
  // Allocates a contiguous tensor of `shape` (contents undefined).
  OwnedTensor(Device& device, DType dtype, const std::vector<std::int64_t>& shape,
              MemoryKind kind = MemoryKind::device);

  const Tensor& tensor() const { return tensor_; }
  operator const Tensor&() const { return tensor_; }  // NOLINT(google-explicit-constructor): a view of itself
  const Buffer& buffer() const { return buffer_; }
  Buffer& buffer() { return buffer_; }
  bool defined() const { return tensor_.defined(); }
  explicit operator bool() const { return defined(); }
  void* data() const { return tensor_.data(); }
  template <class T>
  T* data_as() const { return tensor_.data_as<T>(); }
  std::int64_t dim(int i) const { return tensor_.dim(i); }
  std::int64_t numel() const { return tensor_.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(tensor_.numel()) * tensor_.element_size(); }

 private:
  Buffer buffer_;
  Tensor tensor_;
};

// Moving data between the host and any tensor, through a pageable staging
// buffer and `stream`. Each call waits for its copy: they are for set-up,
// tests and tools, never for the step path.
//
// upload_bytes: `bytes` from `src` into contiguous `dst` (bytes <= its size).
// download_bytes: every element of `view` (rows may be strided, as from
// Tensor::rows or Tensor::narrow), packed row-major into `dst`.
void upload_bytes(Stream& stream, const void* src, std::size_t bytes, const Tensor& dst);
void download_bytes(Stream& stream, const Tensor& view, void* dst);

// A new tensor of `shape` holding `values` (values.size() == the shape's
// element count), in memory of `kind` on the stream's device. `dtype`
// defaults to T's (pass DType::bf16 for raw std::uint16_t bf16 bits).
template <class T>
OwnedTensor upload(Stream& stream, const std::vector<T>& values, const std::vector<std::int64_t>& shape,
                   MemoryKind kind = MemoryKind::device, DType dtype = dtype_of<T>::value) {
  OwnedTensor t(stream.device(), dtype, shape, kind);
  if (static_cast<std::size_t>(t.numel()) != values.size() || dtype_size(dtype) != sizeof(T)) {
    fail("upload", values.size(), " values of ", sizeof(T), " bytes do not fill a tensor of shape ",
         t.tensor().shape_string(), " and dtype ", dtype_name(dtype));
  }
  upload_bytes(stream, values.data(), values.size() * sizeof(T), t);
  return t;
}
// A rank-1 tensor holding `values`.
template <class T>
OwnedTensor upload(Stream& stream, const std::vector<T>& values, MemoryKind kind = MemoryKind::device) {
  return upload(stream, values, {static_cast<std::int64_t>(values.size())}, kind);
}

// Every element of `view`, packed row-major. T must have the view's element size.
template <class T>
std::vector<T> download(Stream& stream, const Tensor& view) {
  if (view.element_size() != sizeof(T)) {
    fail("download", "a tensor of dtype ", dtype_name(view.dtype()), " read as ", sizeof(T), "-byte values");
  }
  std::vector<T> values(static_cast<std::size_t>(view.numel()));
  download_bytes(stream, view, values.data());
  return values;
}

}  // namespace sparse_mla
