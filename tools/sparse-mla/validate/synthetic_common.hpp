// What the two synthetic drivers (synthetic.cpp, synthetic_hisparse.cpp)
// share: the tally of compared results and the summary writer (one JSON
// object, or lines of text). A step's device staging is a
// validation::DeviceScratch on the run's compute stream.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>


namespace sparse_mla::cli {

// Counts compared results and keeps the first few differences, each as a
// line of text and as a JSON value (an object with the details, or the text).
struct SyntheticTally {
  std::uint64_t checked_results = 0;  // layer outputs compared with the reference
  std::uint64_t checked_rows = 0;     // rows whose bytes were compared (HiSparse)
  std::uint64_t mismatches = 0;
  std::vector<std::string> first;
  std::vector<nlohmann::ordered_json> first_json;
  static constexpr std::size_t max_shown = 5;
  void note(const std::string& text, nlohmann::ordered_json detail = nullptr);
};

// A run's summary: `fields` in order (the JSON object, after "ok"), `lines`
// the text form's figures. Both forms end with the tally.
struct SyntheticReport {
  nlohmann::ordered_json fields = nlohmann::ordered_json::object();
  std::vector<std::string> lines;
  void write(std::ostream& out, bool json, const SyntheticTally& tally, bool ok) const;
};

}  // namespace sparse_mla::cli
