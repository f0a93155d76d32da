#include "sparse_mla/dtype.hpp"

namespace sparse_mla {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::i32: return "I32";
    case DType::i16: return "I16";
    case DType::u8: return "U8";
    case DType::bf16: return "BF16";
    case DType::f32: return "F32";
    case DType::i64: return "I64";
  }
  return "?";
}

bool parse_dtype(const std::string& name, DType& out) {
  static const DType all[] = {DType::i32, DType::i16, DType::u8, DType::bf16, DType::f32, DType::i64};
  for (DType t : all) {
    if (name == dtype_name(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

}  // namespace sparse_mla
