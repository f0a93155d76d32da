// libFuzzer target: the safetensors reader on untrusted bytes.
//
// Any input must either parse or be rejected with sparse_mla::Error; any
// other exception, crash or sanitizer report is a finding. A file that
// parses must survive the writer: serialize() and parse again gives the
// same tensors and metadata (and serialize() is then a fixed point).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "sparse_mla/error.hpp"
#include "validation/safetensors.hpp"

namespace {

[[noreturn]] void finding(const char* what) {
  __builtin_trap();  // libFuzzer saves the input as a crash artifact
  (void)what;
}

void round_trip(const sparse_mla::SafetensorsFile& file) {
  const std::vector<std::uint8_t> bytes = file.serialize();
  const auto again = sparse_mla::SafetensorsFile::parse(bytes.data(), bytes.size(), "round trip");
  if (again.names() != file.names() || again.metadata() != file.metadata()) finding("names or metadata changed");
  for (const std::string& name : file.names()) {
    const auto& a = file.tensor(name);
    const auto& b = again.tensor(name);
    if (a.dtype != b.dtype || a.shape != b.shape || a.bytes != b.bytes) finding("a tensor changed");
  }
  if (again.serialize() != bytes) finding("serialize() is not deterministic");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sparse_mla::SafetensorsFile file;
  try {
    file = sparse_mla::SafetensorsFile::parse(data, size, "fuzz");
  } catch (const sparse_mla::Error&) {
    return 0;  // rejected: the expected outcome for most inputs
  }
  round_trip(file);
  return 0;
}
