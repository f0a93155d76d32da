// What the two synthetic drivers (synthetic.cpp, synthetic_hisparse.cpp)
// share: the tally of compared results, the step's device staging, and the
// summary writer (one JSON object, or lines of text).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/tensor.hpp"

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

// Device tensors of one step, alive until the staging goes away (after the
// step's synchronize).
class SyntheticStaging {
 public:
  explicit SyntheticStaging(Stream& stream) : stream_(stream) {}
  template <class T>
  Tensor upload(const std::vector<T>& values, const std::vector<std::int64_t>& shape) {
    tensors_.push_back(sparse_mla::upload(stream_, values, shape));
    return tensors_.back();
  }
  // A new device tensor, contents undefined.
  Tensor allocate(DType dtype, const std::vector<std::int64_t>& shape) {
    tensors_.emplace_back(stream_.device(), dtype, shape);
    return tensors_.back();
  }
  // `values` into the first elements of contiguous `dst`.
  template <class T>
  void write(const Tensor& dst, const std::vector<T>& values) {
    upload_bytes(stream_, values.data(), values.size() * sizeof(T), dst);
  }
  template <class T>
  std::vector<T> download(const Tensor& view) {
    return sparse_mla::download<T>(stream_, view);
  }

 private:
  Stream& stream_;
  std::vector<OwnedTensor> tensors_;
};

// A run's summary: `fields` in order (the JSON object, after "ok"), `lines`
// the text form's figures. Both forms end with the tally.
struct SyntheticReport {
  nlohmann::ordered_json fields = nlohmann::ordered_json::object();
  std::vector<std::string> lines;
  void write(std::ostream& out, bool json, const SyntheticTally& tally, bool ok) const;
};

}  // namespace sparse_mla::cli
