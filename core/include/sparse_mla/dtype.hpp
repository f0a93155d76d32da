// Element types the library reads and writes. Names follow safetensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sparse_mla {

enum class DType : std::uint8_t { i32, i16, u8, bf16, f32, i64 };

inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::i32: return 4;
    case DType::i16: return 2;
    case DType::u8: return 1;
    case DType::bf16: return 2;
    case DType::f32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

// The safetensors spelling: "I32", "I16", "U8", "BF16", "F32", "I64".
const char* dtype_name(DType t);
// Parses the safetensors spelling; returns false for anything else.
bool parse_dtype(const std::string& name, DType& out);

template <class T> struct dtype_of;
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<std::int16_t> { static constexpr DType value = DType::i16; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::i64; };

}  // namespace sparse_mla
