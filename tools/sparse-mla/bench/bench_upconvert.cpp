// The FP8 gather-upconvert (SPEC section 3) at DeepSeek-V3.2's shapes: 8
// requests whose pages (block size 64, 656-byte fp8_ds_mla rows) are
// scattered over the cache, 2048, 131072 and 524288 output rows of 576 bf16.
// Bytes: 656 read + 1152 written per row (block-table reads are extra).
// Beside them DeepSeek V4's prefill gather (upconvert/model1_fp8,rows=...):
// the same 8 requests and row counts in model1_fp8 pages of 64 tokens, each
// request's every token gathered by position range into its slice of
// 512-bf16 rows. Bytes: 584 read (576 data, 8 scale) + 1024 written a row.
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

// Token `token` of the model1_fp8 cache, a function of its index: fp8
// values without NaN, 7 scale bytes as writers give real data (2^-22 to
// 2^7), a zero pad byte, finite bf16 RoPE values. data: 576 bytes, scales: 8.
void make_model1_token(std::uint64_t seed, std::int64_t token, std::uint8_t* data, std::uint8_t* scales) {
  BenchRng rng(seed ^ (static_cast<std::uint64_t>(token) * 0xD1B54A32D192ED03ULL));
  for (int e = 0; e < 448; ++e) {
    const auto b = static_cast<std::uint8_t>(rng.next());
    data[e] = (b & 0x7F) == 0x7F ? static_cast<std::uint8_t>(b ^ 1) : b;
  }
  for (int e = 0; e < 64; ++e) {
    const auto bits = static_cast<std::uint16_t>(((rng.next() & 1) << 15) | ((100 + rng.below(55)) << 7) | (rng.next() & 0x7F));
    data[448 + 2 * e] = static_cast<std::uint8_t>(bits & 0xFF);
    data[448 + 2 * e + 1] = static_cast<std::uint8_t>(bits >> 8);
  }
  for (int j = 0; j < 7; ++j) scales[j] = static_cast<std::uint8_t>(105 + rng.below(30));
  scales[7] = 0;
}

class Model1GatherCase final : public BenchCase {
 public:
  static constexpr std::int64_t token_read = model1_token_bytes;
  static constexpr std::int64_t width = model1_row_width;

  Model1GatherCase(std::int64_t rows, std::uint64_t seed)
      : rows_(rows), per_request_(rows / batch), pages_per_request_((rows / batch + block - 1) / block), seed_(seed) {}

  Traffic traffic() const override {
    return {static_cast<std::uint64_t>(rows_ * token_read), static_cast<std::uint64_t>(rows_ * width * 2)};
  }
  std::size_t set_bytes() const override { return static_cast<std::size_t>(cache_bytes() + rows_ * width * 2); }

  void setup(Device& device, Stream& stream, int sets) override {
    const std::int64_t pages = num_pages();
    cache_ = device.allocate(static_cast<std::size_t>(cache_bytes()) * static_cast<std::size_t>(sets), MemoryKind::device);
    out_ = device.allocate(static_cast<std::size_t>(rows_ * width * 2) * static_cast<std::size_t>(sets), MemoryKind::device);
    constexpr std::int64_t chunk_pages = 1024;
    std::vector<std::uint8_t> chunk;
    for (std::int64_t first = 0; first < pages; first += chunk_pages) {
      const std::int64_t n = std::min(chunk_pages, pages - first);
      chunk.assign(static_cast<std::size_t>(n * page_bytes()), 0);
      for (std::int64_t p = 0; p < n; ++p) {
        std::uint8_t* page = &chunk[static_cast<std::size_t>(p * page_bytes())];
        for (std::int64_t t = 0; t < block; ++t) {
          make_model1_token(seed_, (first + p) * block + t, page + model1_token_data_bytes * t,
                            page + model1_token_data_bytes * block + model1_scale_group_bytes * t);
        }
      }
      upload_to(device, stream, cache_, static_cast<std::size_t>(first * page_bytes()), chunk);
    }
    replicate_slices(stream, cache_, static_cast<std::size_t>(cache_bytes()), sets);

    BenchRng rng(seed_);
    table_host_.resize(static_cast<std::size_t>(pages));
    std::iota(table_host_.begin(), table_host_.end(), 0);
    for (std::size_t i = table_host_.size(); i > 1; --i) std::swap(table_host_[i - 1], table_host_[rng.below(static_cast<std::uint32_t>(i))]);
    const std::vector<std::int32_t> lengths(batch, static_cast<std::int32_t>(per_request_));
    table_ = device.allocate(table_host_.size() * 4, MemoryKind::device);
    lengths_ = device.allocate(lengths.size() * 4, MemoryKind::device);
    upload_to(device, stream, table_, 0, table_host_);
    upload_to(device, stream, lengths_, 0, lengths);

    const auto cache_all = Tensor::of(cache_, DType::u8, {pages * sets, page_bytes()});
    const auto out_all = Tensor::of(out_, DType::bf16, {batch * sets, per_request_, width});
    for (int s = 0; s < sets; ++s) {
      cache_sets_.push_back(cache_all.rows(pages * s, pages * (s + 1)));
      out_sets_.push_back(out_all.rows(batch * s, batch * (s + 1)));
    }
    table_tensor_ = Tensor::of(table_, DType::i32, {batch, pages_per_request_});
    lengths_tensor_ = Tensor::of(lengths_, DType::i32, {batch});
  }

  // Every request's tokens, all of them gathered (seq_lens as gather_lens).
  void launch(Stream& stream, int set) override {
    const auto s = static_cast<std::size_t>(set);
    Fp8GatherParams params;
    params.kv_format = KvFormat::model1_fp8;
    params.block_size = block;
    gather_upconvert_fp8_range(stream, cache_sets_[s], out_sets_[s], lengths_tensor_, lengths_tensor_, table_tensor_, 0,
                               params);
  }

  // Every row up to 65536 rows, else every 7th, against tools/validation/reference.
  std::string check(Device& device, Stream& stream) override {
    stream.fill(out_, 0, 0xA5, static_cast<std::size_t>(rows_ * width * 2));
    launch(stream, 0);
    const auto out = download_from<std::uint16_t>(device, stream, out_, 0, static_cast<std::size_t>(rows_ * width));
    const std::int64_t step = rows_ <= 65536 ? 1 : 7;
    std::vector<std::uint8_t> token(model1_token_bytes);  // a page of one token
    std::vector<std::uint16_t> want(width);
    for (std::int64_t row = 0; row < rows_; row += step) {
      const std::int64_t r = row / per_request_, p = row % per_request_;
      const std::int32_t page = table_host_[static_cast<std::size_t>(r * pages_per_request_ + p / block)];
      make_model1_token(seed_, page * block + p % block, token.data(), token.data() + model1_token_data_bytes);
      reference::upconvert_model1_token(token.data(), 1, 0, false, want.data());
      for (std::int64_t e = 0; e < width; ++e) {
        const std::uint16_t got = out[static_cast<std::size_t>(row * width + e)];
        if (got != want[static_cast<std::size_t>(e)]) {
          return "out[" + std::to_string(r) + ", " + std::to_string(p) + ", " + std::to_string(e) + "] = " +
                 std::to_string(got) + ", the scalar reference gives " + std::to_string(want[static_cast<std::size_t>(e)]);
        }
      }
    }
    return "";
  }

 private:
  static constexpr std::int64_t page_bytes() { return model1_page_bytes(block); }
  std::int64_t num_pages() const { return batch * pages_per_request_; }
  std::int64_t cache_bytes() const { return num_pages() * page_bytes(); }

  std::int64_t rows_, per_request_, pages_per_request_;
  std::uint64_t seed_;
  std::vector<std::int32_t> table_host_;
  Buffer cache_, out_, table_, lengths_;
  std::vector<Tensor> cache_sets_, out_sets_;
  Tensor table_tensor_, lengths_tensor_;
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
  // DeepSeek V4's position-range gather of the same rows, next to them.
  for (const std::int64_t rows : row_counts) {
    const std::uint64_t seed = config.seed + 5 * static_cast<std::uint64_t>(rows);
    cases.push_back({"upconvert/model1_fp8,rows=" + std::to_string(rows),
                     "8 requests, " + std::to_string(rows) + " rows, V4 pages of 64, by position range",
                     Ceiling::device_copy, false, [rows, seed] { return std::make_unique<Model1GatherCase>(rows, seed); }});
  }
}

}  // namespace sparse_mla::cli
