#include "sparse_mla/fp8.hpp"

namespace sparse_mla {

const char* fp8_format_name(Fp8Format format) {
  return format == Fp8Format::e4m3fnuz ? "e4m3fnuz" : "e4m3fn";
}

bool parse_fp8_format(const std::string& name, Fp8Format& out) {
  if (name == "e4m3fn") {
    out = Fp8Format::e4m3fn;
  } else if (name == "e4m3fnuz") {
    out = Fp8Format::e4m3fnuz;
  } else {
    return false;
  }
  return true;
}

}  // namespace sparse_mla
