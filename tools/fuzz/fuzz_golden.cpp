// libFuzzer target: the golden dispatch of `sparse-mla validate --golden` on
// untrusted bytes: parse, dispatch by metadata `kind` to its handler
// (role, dtype, shape and metadata checks), and, for inputs of up to
// run_limit bytes, run the prepared case on the host backend (the kernels
// see every value a file can hold once its checks pass).
//
// Rejections (sparse_mla::Error) and mismatches are expected outcomes; any
// other exception, a crash or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "sparse_mla/device.hpp"
#include "sparse_mla/error.hpp"
#include "validation/safetensors.hpp"
#include "validation/cases.hpp"

namespace {
constexpr std::size_t run_limit = 128 * 1024;  // the -max_len of tools/ci/fuzz.sh
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sparse_mla;
  static const std::shared_ptr<Device> host = open_device("host");
  try {
    auto file = std::make_shared<const SafetensorsFile>(SafetensorsFile::parse(data, size, "fuzz"));
    const validation::PreparedCase prepared = validation::prepare_golden_file(file);
    if (size > run_limit) return 0;
    const validation::ValidateContext context{*host, std::nullopt, std::nullopt};
    (void)prepared(context);
  } catch (const Error&) {
  }
  return 0;
}
