// sparse-mla validate: the pieces its sources share.
//
// The command runs cases and compares each with what it must reproduce. A
// source turns options into prepared cases: every check of the input is done
// while preparing (an unusable input throws sparse_mla::Error, exit 2, before
// anything runs); running a prepared case only computes and compares.
//   --golden FILE...  golden_cases.cpp: one case per file, by metadata `kind`
//                     (golden_handlers(): add a kind there).
// Another source (say --synthetic) adds its options to the subcommand and
// pushes a CaseSource in add_validate (validate.cpp).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/fp8.hpp"
#include "validation/safetensors.hpp"

namespace sparse_mla::validation {

struct CaseResult {
  std::string name;  // the file, or the schedule's description
  std::string kind;
  std::int64_t compared = 0;    // values compared
  std::int64_t mismatches = 0;  // values that differ
  std::vector<std::string> first_mismatches;  // "physical[2, 17]: got 5, expected 6", a few
  nlohmann::ordered_json details = nlohmann::ordered_json::object();  // kind-specific figures
  bool ok() const { return mismatches == 0 && compared > 0; }
};

// What every case runs with.
struct ValidateContext {
  Device& device;
  std::optional<Fp8Format> fp8_format;  // --fp8-format; unset: each file's own
  std::optional<KvFormat> kv_format;    // --kv-format; unset: each file's own
};

using PreparedCase = std::function<CaseResult(const ValidateContext&)>;
// Called after the command line is parsed; prepares every case of a source.
using CaseSource = std::function<std::vector<PreparedCase>()>;

// Golden files: kind -> preparation. Throws Error naming the file when it is
// not a usable case of that kind.
using GoldenHandler = PreparedCase (*)(std::shared_ptr<const SafetensorsFile> file);
const std::map<std::string, GoldenHandler>& golden_handlers();
// Reads a file and prepares it through its kind's handler.
PreparedCase prepare_golden(const std::string& path);
// The dispatch alone, on a file already read (the fuzzer's entry point).
PreparedCase prepare_golden_file(std::shared_ptr<const SafetensorsFile> file);

// Counts compared values and keeps the first few differences.
class MismatchLog {
 public:
  explicit MismatchLog(CaseResult& result) : result_(result) {}
  // Compares `count` values of tensor `name` (row-major `shape`); `show`
  // prints one value.
  template <class T, class Show>
  void compare(const std::string& name, const std::vector<std::int64_t>& shape, const T* got, const T* want,
               std::int64_t count, Show show) {
    for (std::int64_t i = 0; i < count; ++i) {
      if (got[i] == want[i]) continue;
      ++result_.mismatches;
      if (result_.first_mismatches.size() < max_shown) {
        result_.first_mismatches.push_back(name + position(shape, i) + ": got " + show(got[i]) + ", expected " +
                                           show(want[i]));
      }
    }
    result_.compared += count;
  }
  static constexpr std::size_t max_shown = 5;

 private:
  static std::string position(const std::vector<std::int64_t>& shape, std::int64_t flat);
  CaseResult& result_;
};

}  // namespace sparse_mla::validation
