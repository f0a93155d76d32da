// Row gathers from pinned host memory into a device hot cache, the HiSparse
// gather kernel alone (SPEC section 5, zero-copy reads over the host link):
// 65536 rows of 656 bytes, and the swap-in's miss gather with every one of
// 2048 rows missing for 1 and for 128 request rows.
// Bytes: 656 read + 656 written per row; compared with the pinned copy.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "bench_data.hpp"
#include "bench_hisparse_rotation.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "validation/hisparse_rig.hpp"

namespace sparse_mla::cli {

namespace {

using namespace hisparse_shape;

class GatherCase final : public BenchCase {
 public:
  GatherCase(std::int32_t rows, std::uint64_t seed) : rows_(rows), seed_(seed) {}

  std::uint64_t gathered() const { return static_cast<std::uint64_t>(rows_) * K; }
  Traffic traffic() const override { return {gathered() * row_bytes, gathered() * row_bytes}; }
  // The rows a launch reads, its own hot cache (so writes rotate too) and its swap lists.
  std::size_t set_bytes() const override {
    return static_cast<std::size_t>(gathered() * row_bytes + static_cast<std::uint64_t>(rows_) * H * row_bytes +
                                    gathered() * 8 + static_cast<std::uint64_t>(rows_) * 4);
  }

  void setup(Device& device, Stream& stream, int sets) override {
    const std::int64_t per_set = static_cast<std::int64_t>(gathered());
    pool_ = device.allocate(static_cast<std::size_t>(per_set * sets * row_bytes), MemoryKind::pinned_host);
    validation::fill_pool(stream, pool_, seed_);
    hot_cache_ = device.allocate(static_cast<std::size_t>(rows_) * H * row_bytes * static_cast<std::size_t>(sets),
                                 MemoryKind::device);
    const auto lists = static_cast<std::size_t>(per_set) * static_cast<std::size_t>(sets) * 4;
    swap_host_ = device.allocate(lists, MemoryKind::device);
    swap_device_ = device.allocate(lists, MemoryKind::device);
    swap_counts_ = device.allocate(static_cast<std::size_t>(rows_) * 4, MemoryKind::device);
    upload_to(device, stream, swap_counts_, 0, std::vector<std::int32_t>(static_cast<std::size_t>(rows_), K));
    BenchRng rng(seed_);
    for (int s = 0; s < sets; ++s) {
      std::vector<std::int32_t> host_rows, hot_rows;
      make_lists(rng, s, host_rows, hot_rows);
      upload_to(device, stream, swap_host_, static_cast<std::size_t>(s) * host_rows.size() * 4, host_rows);
      upload_to(device, stream, swap_device_, static_cast<std::size_t>(s) * hot_rows.size() * 4, hot_rows);
      if (s == 0) {
        host_rows_0_ = host_rows;
        hot_rows_0_ = hot_rows;
      }
    }
    const std::int64_t all_rows = static_cast<std::int64_t>(rows_) * sets;
    const std::int64_t blocks = static_cast<std::int64_t>(rows_) * (H / block);
    for (int s = 0; s < sets; ++s) {
      const std::int64_t first = std::int64_t{s} * rows_;
      sets_.push_back({Tensor::of(pool_, DType::u8, {per_set * sets, row_bytes}),
                       Tensor::of(hot_cache_, DType::u8, {blocks * sets, block, row_bytes}).rows(blocks * s, blocks * (s + 1)),
                       Tensor::of(swap_host_, DType::i32, {all_rows, K}).rows(first, first + rows_),
                       Tensor::of(swap_device_, DType::i32, {all_rows, K}).rows(first, first + rows_),
                       Tensor::of(swap_counts_, DType::i32, {rows_})});
    }
  }

  void launch(Stream& stream, int set) override { gather_hisparse(stream, sets_[static_cast<std::size_t>(set)], rows_); }

  // Every gathered row holds its host row; every other hot row is untouched.
  std::string check(Device& device, Stream& stream) override {
    const std::size_t cache_bytes = static_cast<std::size_t>(rows_) * H * row_bytes;
    stream.fill(hot_cache_, 0, 0xEE, cache_bytes);
    launch(stream, 0);
    const auto cache = download_from<std::uint8_t>(device, stream, hot_cache_, 0, cache_bytes);
    std::vector<bool> written(static_cast<std::size_t>(rows_) * H, false);
    for (std::size_t e = 0; e < host_rows_0_.size(); ++e) {
      const std::string diff = validation::compare_pool_row(cache, row_bytes, hot_rows_0_[e], host_rows_0_[e], seed_);
      if (!diff.empty()) return diff;
      written[static_cast<std::size_t>(hot_rows_0_[e])] = true;
    }
    for (std::size_t x = 0; x < written.size(); ++x) {
      if (written[x]) continue;
      const auto* row = &cache[x * row_bytes];
      if (std::any_of(row, row + row_bytes, [](std::uint8_t b) { return b != 0xEE; })) {
        return "hot row " + std::to_string(x) + " was written but is in no swap pair";
      }
    }
    return "";
  }

 private:
  // Set s reads its own region of the pool in a shuffled order and writes
  // 2048 of each request row's 4096 hot slots, also shuffled.
  void make_lists(BenchRng& rng, int s, std::vector<std::int32_t>& host_rows, std::vector<std::int32_t>& hot_rows) const {
    const auto per_set = static_cast<std::int32_t>(gathered());
    host_rows.resize(static_cast<std::size_t>(per_set));
    std::iota(host_rows.begin(), host_rows.end(), s * per_set);
    for (std::size_t i = host_rows.size(); i > 1; --i) std::swap(host_rows[i - 1], host_rows[rng.below(static_cast<std::uint32_t>(i))]);
    hot_rows.clear();
    std::vector<std::int32_t> slots(H);
    for (std::int32_t r = 0; r < rows_; ++r) {
      std::iota(slots.begin(), slots.end(), 0);
      for (std::int32_t i = H; i > 1; --i) std::swap(slots[std::size_t(i - 1)], slots[rng.below(static_cast<std::uint32_t>(i))]);
      for (std::int32_t m = 0; m < K; ++m) hot_rows.push_back(r * H + slots[std::size_t(m)]);
    }
  }

  std::int32_t rows_;
  std::uint64_t seed_;
  Buffer pool_, hot_cache_, swap_host_, swap_device_, swap_counts_;
  std::vector<std::int32_t> host_rows_0_, hot_rows_0_;
  std::vector<HiSparseGatherTensors> sets_;
};

void add(std::vector<CaseSpec>& cases, const std::string& name, std::int32_t rows, const std::string& what,
         std::uint64_t seed) {
  cases.push_back({name, what, Ceiling::pinned_copy, false,
                   [rows, seed] { return std::make_unique<GatherCase>(rows, seed); }});
}

}  // namespace

void add_gather_cases(std::vector<CaseSpec>& cases, const BenchConfig& config) {
  const std::int32_t pinned_rows = config.quick ? 4 : 32;  // 65536 rows = 32 request rows of 2048
  add(cases, "pinned-gather/rows=" + std::to_string(pinned_rows * K), pinned_rows,
      std::to_string(pinned_rows * K) + " rows x 656 B from pinned", config.seed + 5);
  add(cases, "miss-gather/rows=1", 1, "1 row, all 2048 missing", config.seed + 6);
  const std::int32_t many = config.quick ? 16 : 128;
  add(cases, "miss-gather/rows=" + std::to_string(many), many, std::to_string(many) + " rows, all 2048 missing", config.seed + 7);
}

}  // namespace sparse_mla::cli
