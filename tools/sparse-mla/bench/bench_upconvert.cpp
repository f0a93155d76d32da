// The FP8 gather-upconvert (SPEC section 3) at DeepSeek-V3.2's shapes: 8
// requests whose pages (block size 64, 656-byte fp8_ds_mla rows) are
// scattered over the cache, 2048, 131072 and 524288 output rows of 576 bf16.
// Bytes: 656 read + 1152 written per row (block-table reads are extra).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "bench_data.hpp"
#include "validation/reference/fp8_reference.hpp"
#include "sparse_mla/fp8.hpp"
#include "sparse_mla/topk_convert.hpp"
#include "sparse_mla/fp8_upconvert.hpp"

namespace sparse_mla::cli {

namespace {

constexpr std::int64_t batch = 8;
constexpr std::int64_t block = 64;
constexpr std::int64_t entry_bytes = 656;
constexpr std::int64_t head_dim = 576;

// The bytes of cache row `row`, a function of its position (so the check
// needs no host copy of a large cache): fp8 values without NaN, four
// positive normal scales, and finite bf16 RoPE values.
void make_row(std::uint64_t seed, std::int64_t row, std::uint8_t* out) {
  BenchRng rng(seed ^ (static_cast<std::uint64_t>(row) * 0xD1B54A32D192ED03ULL));
  for (int e = 0; e < 512; ++e) {
    const auto b = static_cast<std::uint8_t>(rng.next());
    out[e] = (b & 0x7F) == 0x7F ? static_cast<std::uint8_t>(b ^ 1) : b;  // 0x7F, 0xFF are NaN in e4m3fn
  }
  for (int i = 0; i < 4; ++i) {
    // 2^-10 .. 2^-1 with a random mantissa
    const std::uint32_t bits = ((117u + rng.below(10)) << 23) | (static_cast<std::uint32_t>(rng.next()) & 0x7FFFFFu);
    std::memcpy(out + 512 + 4 * i, &bits, 4);
  }
  for (int e = 0; e < 64; ++e) {
    // sign, exponent 100..154 (finite), mantissa
    const auto bits = static_cast<std::uint16_t>(((rng.next() & 1) << 15) | ((100 + rng.below(55)) << 7) | (rng.next() & 0x7F));
    out[528 + 2 * e] = static_cast<std::uint8_t>(bits & 0xFF);
    out[528 + 2 * e + 1] = static_cast<std::uint8_t>(bits >> 8);
  }
}

class UpconvertCase final : public BenchCase {
 public:
  UpconvertCase(std::int64_t rows, std::uint64_t seed)
      : rows_(rows), per_request_(rows / batch), blocks_per_request_((rows / batch + block - 1) / block), seed_(seed) {}

  Traffic traffic() const override {
    return {static_cast<std::uint64_t>(rows_ * entry_bytes), static_cast<std::uint64_t>(rows_ * head_dim * 2)};
  }
  std::size_t set_bytes() const override { return static_cast<std::size_t>(cache_bytes() + rows_ * head_dim * 2); }

  void setup(Device& device, Stream& stream, int sets) override {
    const std::int64_t blocks = num_blocks();
    cache_ = device.allocate(static_cast<std::size_t>(cache_bytes()) * static_cast<std::size_t>(sets), MemoryKind::device);
    dst_ = device.allocate(static_cast<std::size_t>(rows_ * head_dim * 2) * static_cast<std::size_t>(sets), MemoryKind::device);
    constexpr std::int64_t chunk_rows = 65536;
    std::vector<std::uint8_t> chunk;
    for (std::int64_t first = 0; first < blocks * block; first += chunk_rows) {
      const std::int64_t n = std::min(chunk_rows, blocks * block - first);
      chunk.resize(static_cast<std::size_t>(n * entry_bytes));
      for (std::int64_t i = 0; i < n; ++i) make_row(seed_, first + i, &chunk[static_cast<std::size_t>(i * entry_bytes)]);
      upload_to(device, stream, cache_, static_cast<std::size_t>(first * entry_bytes), chunk);
    }
    replicate_slices(stream, cache_, static_cast<std::size_t>(cache_bytes()), sets);

    BenchRng rng(seed_);
    table_host_.resize(static_cast<std::size_t>(blocks));
    std::iota(table_host_.begin(), table_host_.end(), 0);
    for (std::size_t i = table_host_.size(); i > 1; --i) std::swap(table_host_[i - 1], table_host_[rng.below(static_cast<std::uint32_t>(i))]);
    std::vector<std::int32_t> starts(batch);
    for (std::int64_t r = 0; r < batch; ++r) starts[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(r * per_request_);
    table_ = device.allocate(table_host_.size() * 4, MemoryKind::device);
    starts_ = device.allocate(starts.size() * 4, MemoryKind::device);
    upload_to(device, stream, table_, 0, table_host_);
    upload_to(device, stream, starts_, 0, starts);

    const auto cache_all = Tensor::of(cache_, DType::u8, {blocks * sets, block, entry_bytes});
    const auto dst_all = Tensor::of(dst_, DType::bf16, {rows_ * sets, head_dim});
    for (int s = 0; s < sets; ++s) {
      cache_sets_.push_back(cache_all.rows(blocks * s, blocks * (s + 1)));
      dst_sets_.push_back(dst_all.rows(rows_ * s, rows_ * (s + 1)));
    }
    table_tensor_ = Tensor::of(table_, DType::i32, {batch, blocks_per_request_});
    starts_tensor_ = Tensor::of(starts_, DType::i32, {batch});
  }

  void launch(Stream& stream, int set) override {
    const auto s = static_cast<std::size_t>(set);
    gather_upconvert_fp8(stream, cache_sets_[s], dst_sets_[s], table_tensor_, starts_tensor_, batch);
  }

  // Every row up to 65536 rows, else every 7th (7 is prime to the block
  // size, so every offset in a block is checked), against tools/validation/reference.
  std::string check(Device& device, Stream& stream) override {
    stream.fill(dst_, 0, 0xA5, static_cast<std::size_t>(rows_ * head_dim * 2));
    launch(stream, 0);
    const auto dst = download_from<std::uint16_t>(device, stream, dst_, 0, static_cast<std::size_t>(rows_ * head_dim));
    const std::int64_t step = rows_ <= 65536 ? 1 : 7;
    std::vector<std::uint8_t> source(entry_bytes);
    std::vector<std::uint16_t> want(head_dim);
    for (std::int64_t row = 0; row < rows_; row += step) {
      const std::int64_t r = row / per_request_, s = row % per_request_;
      const std::int32_t physical = table_host_[static_cast<std::size_t>(r * blocks_per_request_ + s / block)];
      make_row(seed_, physical * block + s % block, source.data());
      reference::upconvert_row(source.data(), false, want.data());
      for (std::int64_t e = 0; e < head_dim; ++e) {
        const std::uint16_t got = dst[static_cast<std::size_t>(row * head_dim + e)];
        if (got != want[static_cast<std::size_t>(e)]) {
          return "dst[" + std::to_string(row) + ", " + std::to_string(e) + "] = " + std::to_string(got) +
                 ", the scalar reference gives " + std::to_string(want[static_cast<std::size_t>(e)]);
        }
      }
    }
    return "";
  }

 private:
  std::int64_t num_blocks() const { return batch * blocks_per_request_; }
  std::int64_t cache_bytes() const { return num_blocks() * block * entry_bytes; }

  std::int64_t rows_, per_request_, blocks_per_request_;
  std::uint64_t seed_;
  std::vector<std::int32_t> table_host_;
  Buffer cache_, dst_, table_, starts_;
  std::vector<Tensor> cache_sets_, dst_sets_;
  Tensor table_tensor_, starts_tensor_;
};

}  // namespace

void add_upconvert_cases(std::vector<CaseSpec>& cases, const BenchConfig& config) {
  // 2048 rows take the few-page launch; 131072 (151 MB out) and 524288
  // (604 MB out) the many-page one, with plain and with streaming stores.
  // --quick keeps a host run to seconds.
  const std::vector<std::int64_t> row_counts =
      config.quick ? std::vector<std::int64_t>{2048, 16384} : std::vector<std::int64_t>{2048, 131072, 524288};
  for (const std::int64_t rows : row_counts) {
    const std::uint64_t seed = config.seed + 3 * static_cast<std::uint64_t>(rows);
    cases.push_back({"upconvert/rows=" + std::to_string(rows), "8 requests, " + std::to_string(rows) + " rows, bs 64",
                     Ceiling::device_copy, false, [rows, seed] { return std::make_unique<UpconvertCase>(rows, seed); }});
  }
}

}  // namespace sparse_mla::cli
