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

const char* kv_format_name(KvFormat format) {
  return format == KvFormat::model1_fp8 ? "model1_fp8" : "fp8_ds_mla";
}

bool parse_kv_format(const std::string& name, KvFormat& out) {
  if (name == "fp8_ds_mla") {
    out = KvFormat::fp8_ds_mla;
  } else if (name == "model1_fp8") {
    out = KvFormat::model1_fp8;
  } else {
    return false;
  }
  return true;
}

}  // namespace sparse_mla
