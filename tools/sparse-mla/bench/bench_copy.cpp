// The copy ceilings, measured in the same run on the same device as the
// kernels: a device-to-device copy, and a copy from pinned host memory into
// device memory (the most a kernel reading host rows over the link can hope
// for). Bytes count what is read plus what is written, like the kernels.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "bench_data.hpp"

namespace sparse_mla::cli {

namespace {

class CopyCase final : public BenchCase {
 public:
  CopyCase(std::size_t bytes, MemoryKind source_kind, std::uint64_t seed)
      : bytes_(bytes), source_kind_(source_kind), seed_(seed) {}

  Traffic traffic() const override { return {bytes_, bytes_}; }
  std::size_t set_bytes() const override { return 2 * bytes_; }

  void setup(Device& device, Stream& stream, int sets) override {
    src_ = device.allocate(bytes_ * static_cast<std::size_t>(sets), source_kind_);
    dst_ = device.allocate(bytes_ * static_cast<std::size_t>(sets), MemoryKind::device);
    BenchRng rng(seed_);
    std::vector<std::uint64_t> words(bytes_ / 8);
    for (auto& w : words) w = rng.next();
    upload_to(device, stream, src_, 0, words);
    replicate_slices(stream, src_, bytes_, sets);
  }

  void launch(Stream& stream, int set) override {
    const std::size_t offset = bytes_ * static_cast<std::size_t>(set);
    stream.copy_bytes(dst_.as<char>() + offset, src_.as<const char>() + offset, bytes_);
  }

  std::string check(Device& device, Stream& stream) override {
    stream.fill(dst_, 0, 0xA5, bytes_);
    launch(stream, 0);
    const auto got = download_from<std::uint8_t>(device, stream, dst_, 0, bytes_);
    const auto want = download_from<std::uint8_t>(device, stream, src_, 0, bytes_);
    for (std::size_t i = 0; i < bytes_; ++i) {
      if (got[i] != want[i]) return "byte " + std::to_string(i) + " of the copy differs from its source";
    }
    return "";
  }

 private:
  std::size_t bytes_;
  MemoryKind source_kind_;
  std::uint64_t seed_;
  Buffer src_;
  Buffer dst_;
};

std::string mib(std::size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

std::string kib(std::size_t bytes) { return std::to_string(bytes >> 10) + " KiB"; }

}  // namespace

void add_copy_cases(std::vector<CaseSpec>& cases, const BenchConfig& config) {
  const std::size_t bytes = config.copy_bytes / 8 * 8;
  const std::uint64_t seed = config.seed;
  cases.push_back({"ceiling/device-copy", mib(bytes) + " device -> device", Ceiling::device_copy, true,
                   [bytes, seed] { return std::make_unique<CopyCase>(bytes, MemoryKind::device, seed); }});
  cases.push_back({"ceiling/pinned-copy", mib(bytes) + " pinned host -> device", Ceiling::pinned_copy, true,
                   [bytes, seed] { return std::make_unique<CopyCase>(bytes, MemoryKind::pinned_host, seed); }});
}

void add_floor_cases(std::vector<CaseSpec>& cases, const BenchConfig& config) {
  // A plain device copy moving as many bytes as a latency-bound case (read
  // plus written, half each way; the case's own traffic(), less its last
  // partial 4 KiB), timed the same way: launch, latency and transfer with no
  // work in between, so a target below it asks for less time than copying
  // the case's bytes takes on this device. Placed after the ceilings.
  const char* const latency_bound[] = {"convert/T=1", "convert/T=256", "convert/T=1024", "upconvert/rows=2048"};
  const std::uint64_t seed = config.seed;
  std::vector<CaseSpec> floors;
  for (const char* like : latency_bound) {
    const auto spec = std::find_if(cases.begin(), cases.end(), [&](const CaseSpec& c) { return c.name == like; });
    if (spec == cases.end()) continue;
    // Whole 4 KiB pages: on the H200 a memcpy node of 8194 KiB took 7.7 us
    // against 5.5 for 8192 KiB, and 2 MiB + 512 B 2.95 against 2.45 for
    // 2 MiB: odd sizes measured something other than the bytes.
    // The cases' odd bytes are their counts (4 per token).
    const std::size_t bytes = spec->make()->traffic().total() / 2 / 4096 * 4096;
    floors.push_back({std::string("floor/") + like, kib(bytes) + " each way, as " + like, Ceiling::device_copy, false,
                      [bytes, seed] { return std::make_unique<CopyCase>(bytes, MemoryKind::device, seed); }});
  }
  const auto after_ceilings =
      std::find_if(cases.begin(), cases.end(), [](const CaseSpec& c) { return !c.is_ceiling; });
  cases.insert(after_ceilings, floors.begin(), floors.end());
}

}  // namespace sparse_mla::cli
