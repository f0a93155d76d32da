// Strict reader and deterministic writer for safetensors files (the golden
// vectors, the CLI's inputs and outputs). See docs/safetensors.md for every
// check the reader makes.
//
// File layout: 8 bytes little-endian u64 N, N bytes of a UTF-8 JSON object
// (tensor name -> {"dtype", "shape", "data_offsets"}, plus an optional
// "__metadata__" string -> string map), then the tensor bytes, packed,
// row-major, little-endian. Only the dtypes of dtype.hpp are accepted.
//
// Every failure throws sparse_mla::Error whose where() is the file's origin
// (the path for read(), the caller's label for parse()) and whose message is
// one line naming the offending tensor or key and the values involved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sparse_mla/dtype.hpp"
#include "sparse_mla/error.hpp"

namespace sparse_mla {

// One tensor: element type, row-major shape and its raw little-endian bytes.
struct TensorRecord {
  std::string name;
  DType dtype = DType::u8;
  std::vector<std::int64_t> shape;  // empty = scalar (one element)
  std::vector<std::uint8_t> bytes;  // numel() * dtype_size(dtype) bytes

  // Product of the dims (1 for a scalar, 0 if any dim is 0). Throws Error on a
  // negative dim or when the product overflows int64.
  std::int64_t numel() const;
  // numel() * dtype_size(dtype); throws Error when that overflows.
  std::size_t byte_size() const;

  // Typed view of bytes. T must match dtype (std::uint16_t reads BF16 as raw
  // bits); throws Error on a dtype mismatch or when bytes.size() != byte_size().
  template <class T> const T* data() const;
  template <class T> T* data();

  // Builds a record of dtype_of<T> (BF16 for std::uint16_t); throws Error when
  // values.size() != the shape's element count.
  template <class T>
  static TensorRecord from_values(std::string name, std::vector<std::int64_t> shape,
                                  const std::vector<T>& values);

 private:
  void check_access(DType want, std::size_t elem_size, std::size_t elem_align) const;
};

class SafetensorsFile {
 public:
  // Largest header accepted (the same cap as the reference Rust reader).
  static constexpr std::uint64_t kMaxHeaderBytes = 100000000;
  // Deepest JSON nesting accepted in a header (a valid header needs 3).
  static constexpr int kMaxHeaderDepth = 16;

  // An empty file; its origin (used in error messages) is "<memory>".
  SafetensorsFile() = default;
  explicit SafetensorsFile(std::string origin) : origin_(std::move(origin)) {}

  // Reads and validates a whole file. The header is checked completely
  // before any tensor data is read.
  static SafetensorsFile read(const std::string& path);
  // Same checks on an in-memory image; `origin` names it in error messages.
  static SafetensorsFile parse(const std::uint8_t* data, std::size_t size,
                               const std::string& origin);

  // The bytes write() stores: tensors sorted by name, packed from offset 0,
  // metadata always included (possibly {}), header padded with spaces to a
  // multiple of 8 bytes. Equal contents give identical bytes.
  std::vector<std::uint8_t> serialize() const;
  // Writes serialize() to `path` (through `path`.partial, then renamed).
  void write(const std::string& path) const;

  const std::string& origin() const { return origin_; }

  // Tensors.
  const std::vector<std::string>& names() const { return names_; }  // sorted
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws Error "ORIGIN: missing tensor 'x'".
  const TensorRecord& tensor(const std::string& name) const;
  // Role checks: the tensor exists and has this dtype and shape / rank. In
  // `shape`, a negative dim matches any size (printed as '*'). (The rank form
  // has its own name: an overload would make require(n, d, {7}) mean rank 7.)
  const TensorRecord& require(const std::string& name, DType dtype,
                              const std::vector<std::int64_t>& shape) const;
  const TensorRecord& require_rank(const std::string& name, DType dtype, std::size_t rank) const;
  // Adds a tensor. Throws Error on an empty, "__metadata__", non-UTF-8 or
  // duplicate name, a negative or overflowing shape, or bytes.size() != byte_size().
  void add(TensorRecord t);

  // Metadata. Values are strings; numbers, booleans and lists are JSON text
  // inside the string ("64", "true", "[1, 65, 200]").
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has_meta(const std::string& key) const { return metadata_.count(key) != 0; }
  // Throws Error "ORIGIN: missing metadata key 'k'".
  const std::string& meta(const std::string& key) const;
  // A JSON integer: optional '-', digits, no leading zeros, no spaces, no
  // '+', no fraction or exponent, within int64. "64" -> 64; "64.0" is rejected.
  std::int64_t meta_int(const std::string& key) const;
  // Exactly "true" or "false" (JSON booleans). "True", "1", "0" are rejected.
  bool meta_bool(const std::string& key) const;
  // A JSON array of integers within int64, e.g. "[1, 65, 200]" or "[]".
  std::vector<std::int64_t> meta_int_list(const std::string& key) const;
  // Sets (or replaces) a metadata entry; key and value must be valid UTF-8.
  void set_meta(std::string key, std::string value);

 private:
  std::string origin_ = "<memory>";
  std::map<std::string, TensorRecord> tensors_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

// ---- template definitions ----

namespace detail {
template <class T>
constexpr DType access_dtype() {
  if constexpr (std::is_same_v<T, std::uint16_t>) {
    return DType::bf16;
  } else {
    return dtype_of<T>::value;
  }
}
}  // namespace detail

template <class T>
const T* TensorRecord::data() const {
  check_access(detail::access_dtype<T>(), sizeof(T), alignof(T));
  return reinterpret_cast<const T*>(bytes.data());
}

template <class T>
T* TensorRecord::data() {
  check_access(detail::access_dtype<T>(), sizeof(T), alignof(T));
  return reinterpret_cast<T*>(bytes.data());
}

template <class T>
TensorRecord TensorRecord::from_values(std::string name, std::vector<std::int64_t> shape,
                                       const std::vector<T>& values) {
  TensorRecord t;
  t.name = std::move(name);
  t.dtype = detail::access_dtype<T>();
  t.shape = std::move(shape);
  const std::size_t need = t.byte_size();
  if (need != values.size() * sizeof(T)) {
    fail("tensor '" + t.name + "'", "shape needs ", t.numel(), " values, got ", values.size());
  }
  t.bytes.resize(need);
  if (need != 0) std::memcpy(t.bytes.data(), values.data(), need);  // little-endian host
  return t;
}

}  // namespace sparse_mla
