#include "sparse_mla/tensor.hpp"

#include <cstring>
#include <limits>
#include <sstream>

namespace sparse_mla {

Tensor::Tensor(void* data, DType dtype, const std::vector<std::int64_t>& shape, MemoryKind kind,
               const Device* device)
    : data_(data), dtype_(dtype), rank_(static_cast<int>(shape.size())), kind_(kind), device_(device) {
  if (shape.empty() || shape.size() > static_cast<std::size_t>(max_rank)) {
    fail("Tensor", "rank must be 1 to ", max_rank, ", got ", shape.size());
  }
  std::int64_t stride = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    const std::int64_t d = shape[static_cast<std::size_t>(i)];
    if (d < 0) fail("Tensor", "dimension ", i, " is negative (", d, ")");
    shape_[static_cast<std::size_t>(i)] = d;
    strides_[static_cast<std::size_t>(i)] = stride;
    if (d != 0 && stride > std::numeric_limits<std::int64_t>::max() / d) fail("Tensor", "shape overflows int64");
    stride *= d;
  }
}

Tensor::Tensor(void* data, DType dtype, const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides,
               MemoryKind kind, const Device* device)
    : Tensor(data, dtype, shape, kind, device) {
  if (strides.size() != shape.size()) {
    fail("Tensor", "strides has ", strides.size(), " entries for a shape of rank ", shape.size());
  }
  for (std::size_t i = 0; i < strides.size(); ++i) {
    if (strides[i] < 0) fail("Tensor", "stride ", i, " is negative (", strides[i], ")");
    strides_[i] = strides[i];
  }
}

Tensor Tensor::of(const Buffer& buffer, DType dtype, const std::vector<std::int64_t>& shape) {
  Tensor t(buffer.data(), dtype, shape, buffer.kind(), buffer.device());
  const std::int64_t n = t.numel();
  if (n > 0 && static_cast<std::uint64_t>(n) > buffer.bytes() / dtype_size(dtype)) {
    fail("Tensor::of", "shape ", t.shape_string(), " of ", dtype_name(dtype), " needs ",
         static_cast<std::uint64_t>(n) * dtype_size(dtype), " bytes but the buffer holds ", buffer.bytes());
  }
  return t;
}

std::int64_t Tensor::numel() const {
  if (rank_ == 0) return 0;
  std::int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= shape_[static_cast<std::size_t>(i)];
  return n;
}

Tensor Tensor::rows(std::int64_t begin, std::int64_t end) const {
  if (rank_ == 0) fail("Tensor::rows", "tensor is undefined");
  return narrow(0, begin, end);
}

Tensor Tensor::narrow(int dim, std::int64_t begin, std::int64_t end) const {
  if (dim < 0 || dim >= rank_) fail("Tensor::narrow", "no dimension ", dim, " in a tensor of shape ", shape_string());
  const auto d = static_cast<std::size_t>(dim);
  if (begin < 0 || end < begin || end > shape_[d]) {
    fail("Tensor::narrow", "range [", begin, ", ", end, ") of dimension ", dim, " is outside a tensor of shape ",
         shape_string());
  }
  Tensor t = *this;
  t.shape_[d] = end - begin;
  t.data_ = static_cast<char*>(data_) + static_cast<std::ptrdiff_t>(begin * strides_[d]) *
                                            static_cast<std::ptrdiff_t>(element_size());
  return t;
}

bool Tensor::rows_contiguous() const {
  std::int64_t expected = 1;
  for (int i = rank_ - 1; i >= 1; --i) {
    if (strides_[static_cast<std::size_t>(i)] != expected) return false;
    expected *= shape_[static_cast<std::size_t>(i)];
  }
  return rank_ == 0 || strides_[0] >= expected;
}

bool Tensor::contiguous() const {
  std::int64_t expected = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    if (shape_[static_cast<std::size_t>(i)] != 1 && strides_[static_cast<std::size_t>(i)] != expected) return false;
    expected *= shape_[static_cast<std::size_t>(i)];
  }
  return true;
}

std::string Tensor::shape_string() const {
  std::ostringstream out;
  out << '[';
  for (int i = 0; i < rank_; ++i) out << (i ? ", " : "") << shape_[static_cast<std::size_t>(i)];
  out << ']';
  return out.str();
}

std::string index_string(const std::vector<std::int64_t>& shape, std::int64_t flat) {
  std::vector<std::int64_t> index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  std::ostringstream out;
  out << '[';
  for (std::size_t d = 0; d < index.size(); ++d) out << (d ? ", " : "") << index[d];
  out << ']';
  return out.str();
}

TensorCheck::TensorCheck(std::string where, std::string name, const Tensor& tensor)
    : where_(std::move(where)), name_(std::move(name)), tensor_(tensor) {}

void TensorCheck::reject(const std::string& why) const { throw Error(where_, name_ + " " + why); }

TensorCheck& TensorCheck::defined() {
  if (!tensor_.defined()) reject("is missing (undefined tensor)");
  return *this;
}

TensorCheck& TensorCheck::dtype(DType expected) {
  defined();
  if (tensor_.dtype() != expected) {
    reject(detail::concat("has dtype ", dtype_name(tensor_.dtype()), ", expected ", dtype_name(expected)));
  }
  return *this;
}

TensorCheck& TensorCheck::rank(int expected) {
  defined();
  if (tensor_.rank() != expected) {
    reject(detail::concat("has shape ", tensor_.shape_string(), " (", tensor_.rank(), " dims), expected ", expected, " dims"));
  }
  return *this;
}

static std::string what_suffix(const char* what) { return what ? detail::concat(" (", what, ")") : std::string(); }

TensorCheck& TensorCheck::dim(int i, std::int64_t expected, const char* what) {
  if (i >= tensor_.rank()) reject(detail::concat("has shape ", tensor_.shape_string(), ", no dimension ", i));
  if (tensor_.dim(i) != expected) {
    reject(detail::concat("has shape ", tensor_.shape_string(), " but dimension ", i, " must be ", expected, what_suffix(what)));
  }
  return *this;
}

TensorCheck& TensorCheck::dim_at_least(int i, std::int64_t minimum, const char* what) {
  if (i >= tensor_.rank()) reject(detail::concat("has shape ", tensor_.shape_string(), ", no dimension ", i));
  if (tensor_.dim(i) < minimum) {
    reject(detail::concat("has shape ", tensor_.shape_string(), " but dimension ", i, " must be >= ", minimum, what_suffix(what)));
  }
  return *this;
}

TensorCheck& TensorCheck::dim_at_most(int i, std::int64_t maximum, const char* what) {
  if (i >= tensor_.rank()) reject(detail::concat("has shape ", tensor_.shape_string(), ", no dimension ", i));
  if (tensor_.dim(i) > maximum) {
    reject(detail::concat("has shape ", tensor_.shape_string(), " but dimension ", i, " must be <= ", maximum, what_suffix(what)));
  }
  return *this;
}

TensorCheck& TensorCheck::rows_contiguous() {
  if (!tensor_.rows_contiguous()) reject(detail::concat("of shape ", tensor_.shape_string(), " is not row-contiguous"));
  return *this;
}

TensorCheck& TensorCheck::contiguous() {
  if (!tensor_.contiguous()) reject(detail::concat("of shape ", tensor_.shape_string(), " is not contiguous"));
  return *this;
}

TensorCheck& TensorCheck::on(const Device& device) {
  defined();
  if (tensor_.device() != &device) {
    reject(detail::concat("lives on another device (", tensor_.device() ? backend_name(tensor_.device()->backend()) : "none",
                          "), expected the ", backend_name(device.backend()), " device of this call"));
  }
  if (tensor_.numel() > 0 && tensor_.data() == nullptr) reject("has no data (null pointer)");
  if (!device.kernel_accessible(tensor_.kind())) {
    reject(detail::concat("is in ", memory_kind_name(tensor_.kind()), " memory, which ", backend_name(device.backend()),
                          " kernels cannot reach; use device or pinned_host memory"));
  }
  return *this;
}

TensorCheck& TensorCheck::kind(MemoryKind expected) {
  if (tensor_.kind() != expected) {
    reject(detail::concat("is in ", memory_kind_name(tensor_.kind()), " memory, expected ", memory_kind_name(expected)));
  }
  return *this;
}

OwnedTensor::OwnedTensor(Device& device, DType dtype, const std::vector<std::int64_t>& shape, MemoryKind kind) {
  const Tensor layout(nullptr, dtype, shape, kind, &device);  // checks the shape
  const auto bytes = static_cast<std::uint64_t>(layout.numel()) * dtype_size(dtype);
  buffer_ = device.allocate(static_cast<std::size_t>(bytes), kind);
  tensor_ = Tensor::of(buffer_, dtype, shape);
}

namespace {
// Bytes from the first element of `view` to one past its last (0 when empty).
std::size_t span_bytes(const Tensor& view) {
  if (!view.defined() || view.numel() == 0) return 0;
  std::int64_t last = 0;
  for (int i = 0; i < view.rank(); ++i) last += (view.dim(i) - 1) * view.stride(i);
  return static_cast<std::size_t>(last + 1) * view.element_size();
}
}  // namespace

void upload_bytes(Stream& stream, const void* src, std::size_t bytes, const Tensor& dst) {
  constexpr const char* where = "upload";
  if (bytes == 0) return;
  check(where, "dst", dst).defined().contiguous();
  if (dst.device() != &stream.device()) fail(where, "dst lives on another device than the stream");
  const std::size_t capacity = static_cast<std::size_t>(dst.numel()) * dst.element_size();
  if (bytes > capacity) fail(where, bytes, " bytes do not fit dst of shape ", dst.shape_string(), " (", capacity, " bytes)");
  Buffer staging = stream.device().allocate(bytes, MemoryKind::host);
  std::memcpy(staging.data(), src, bytes);
  stream.copy_bytes(dst.data(), staging.data(), bytes);
  stream.synchronize();  // the staging buffer goes away
}

void download_bytes(Stream& stream, const Tensor& view, void* dst) {
  constexpr const char* where = "download";
  const std::size_t span = span_bytes(view);
  if (span == 0) return;
  if (view.device() != &stream.device()) fail(where, "the tensor lives on another device than the stream");
  Buffer staging = stream.device().allocate(span, MemoryKind::host);
  stream.copy_bytes(staging.data(), view.data(), span);
  stream.synchronize();
  // Walk the elements in row-major order, contiguous runs of the last dimension at once.
  const std::size_t elem = view.element_size();
  const int rank = view.rank();
  const std::int64_t inner = view.dim(rank - 1);
  const bool packed_inner = view.stride(rank - 1) == 1;
  const std::int64_t outer = view.numel() / inner;
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = staging.as<const unsigned char>();
  for (std::int64_t o = 0; o < outer; ++o) {
    std::int64_t offset = 0, rest = o;
    for (int i = rank - 2; i >= 0; --i) {
      offset += (rest % view.dim(i)) * view.stride(i);
      rest /= view.dim(i);
    }
    if (packed_inner) {
      std::memcpy(out, in + static_cast<std::size_t>(offset) * elem, static_cast<std::size_t>(inner) * elem);
      out += static_cast<std::size_t>(inner) * elem;
    } else {
      for (std::int64_t j = 0; j < inner; ++j, out += elem) {
        std::memcpy(out, in + static_cast<std::size_t>(offset + j * view.stride(rank - 1)) * elem, elem);
      }
    }
  }
}

}  // namespace sparse_mla
