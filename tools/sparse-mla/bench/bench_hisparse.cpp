// The HiSparse swap-in (SPEC section 5): the residency resolve alone at 1,
// 32 and 128 request rows (top-k 2048, 4096 hot slots, 50% hits) and at 1 and
// 32 rows at 90, 99 and 100% hits (production rows: the resolve in LRU
// order), and the whole swap-in (resolve, then the row gather from the pinned
// host pool) at 0, 50, 90, 99 and 100% hits. bench_hisparse_rotation.hpp explains how each timed
// launch gets its exact hit rate; after the timed replays the device's hit
// and miss counters must show exactly that rate.
//
// Bytes: the resolve reads 4*rows*K and writes 4*rows*K + 4*rows (its
// indices, like the conversion; state and tables are extra); the gather adds
// 656 read + 656 written per missed row.
#include <memory>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "bench_hisparse_rotation.hpp"

namespace sparse_mla::cli {

namespace {

class SwapInCase final : public BenchCase {
 public:
  SwapInCase(std::int32_t rows, std::int32_t fixed, bool with_gather, std::uint64_t seed)
      : rig_(rows, fixed, with_gather, seed), rows_(rows), with_gather_(with_gather) {}

  Traffic traffic() const override {
    const auto entries = static_cast<std::uint64_t>(rows_) * HiSparseShape::top_k;
    Traffic t{4 * entries, 4 * entries + 4 * static_cast<std::uint64_t>(rows_)};
    if (with_gather_) {
      t.read += rig_.misses_per_launch() * HiSparseShape::row_bytes;
      t.written += rig_.misses_per_launch() * HiSparseShape::row_bytes;
    }
    return t;
  }
  std::size_t set_bytes() const override { return rig_.set_bytes(); }
  std::size_t fixed_bytes() const override { return rig_.fixed_bytes(); }
  int min_sets() const override { return rig_.min_sets(); }
  void setup(Device& device, Stream& stream, int sets) override { rig_.setup(device, stream, sets); }
  void launch(Stream& stream, int set) override {
    rig_.resolve(stream, set);
    if (with_gather_) rig_.gather(stream, set);
  }
  std::string check(Device&, Stream& stream) override { return rig_.check(stream); }

  void before_timed(Device&, Stream&) override { counters_before_ = rig_.counters(); }
  std::string after_timed(Device&, Stream&, std::uint64_t launches, std::string& note) override {
    const auto after = rig_.counters();
    const auto hits = static_cast<std::uint64_t>(after[0] - counters_before_[0]);
    const auto misses = static_cast<std::uint64_t>(after[1] - counters_before_[1]);
    return check_hit_counts(hits, misses, rig_.hits_per_launch() * launches, rig_.misses_per_launch() * launches, note);
  }

 private:
  HiSparseRotation rig_;
  std::int32_t rows_;
  bool with_gather_;
  std::vector<std::int64_t> counters_before_;
};

}  // namespace

void add_hisparse_cases(std::vector<CaseSpec>& cases, const BenchConfig& config) {
  // The resolve alone: 1, 32 and 128 rows at 50% hits, and where most of a
  // selection hits, 1 and 32 rows (8 with --quick) at 90, 99 and 100%.
  const std::int32_t many = config.quick ? 8 : 32;
  for (const std::int32_t rows : {1, 32, 128}) {
    const std::uint64_t seed = config.seed + 31 * static_cast<std::uint64_t>(rows);
    cases.push_back({"resolve/rows=" + std::to_string(rows), std::to_string(rows) + " rows, K=2048, H=4096, 50% hit",
                     Ceiling::device_copy, false, [rows, seed] {
                       return std::make_unique<SwapInCase>(rows, fixed_for_hits(50), false, seed);
                     }});
  }
  for (const std::int32_t rows : {1, many}) {
    for (const int hits : {90, 99, 100}) {
      const std::uint64_t seed = config.seed + 31 * static_cast<std::uint64_t>(rows) + static_cast<std::uint64_t>(hits);
      cases.push_back({"resolve/rows=" + std::to_string(rows) + ",hits=" + std::to_string(hits),
                       std::to_string(rows) + " rows, K=2048, H=4096, " + std::to_string(hits) + "% hit",
                       Ceiling::device_copy, false, [rows, hits, seed] {
                         return std::make_unique<SwapInCase>(rows, fixed_for_hits(hits), false, seed);
                       }});
    }
  }
  // The swap-in at every hit rate.
  for (const int hits : {0, 50, 90, 99, 100}) {
    const std::uint64_t seed = config.seed + 1000 + static_cast<std::uint64_t>(hits);
    cases.push_back({"swap-in/rows=" + std::to_string(many) + ",hits=" + std::to_string(hits),
                     std::to_string(many) + " rows, resolve+gather, " + std::to_string(hits) + "% hit",
                     Ceiling::pinned_copy, false, [many, hits, seed] {
                       return std::make_unique<SwapInCase>(many, fixed_for_hits(hits), true, seed);
                     }});
  }
}

}  // namespace sparse_mla::cli
