// A typed, shaped, non-owning view over device, pinned or host memory, and
// the checks every public entry point runs on its arguments before it queues
// any work (SPEC section 6: reject, name the argument and the values, write
// nothing).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/dtype.hpp"
#include "sparse_mla/error.hpp"

namespace sparse_mla {

class Tensor {
 public:
  static constexpr int max_rank = 4;

  Tensor() = default;
  // A contiguous (row-major) view of `data`.
  Tensor(void* data, DType dtype, const std::vector<std::int64_t>& shape, MemoryKind kind,
         const Device* device);
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

}  // namespace sparse_mla
