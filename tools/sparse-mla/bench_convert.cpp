// Top-k conversion with valid counts (SPEC section 2) at DeepSeek-V3.2's
// K = 2048: T = 1, 256 and 1024 decode tokens and a 32768-token batch.
// Bytes: reads 4*T*K, writes 4*T*K + 4*T (block-table reads are extra).
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "bench_data.hpp"
#include "sparse_mla/ops.hpp"

namespace sparse_mla::cli {

namespace {

constexpr std::int32_t block_size = 64;
constexpr std::int32_t context_tokens = 32768;  // per request
constexpr std::int32_t blocks_per_request = context_tokens / block_size;
constexpr std::int32_t K = 2048;  // DeepSeek-V3.2's top-k

class ConvertCase final : public BenchCase {
 public:
  ConvertCase(std::int64_t tokens, std::int32_t topk, std::uint64_t seed)
      : T_(tokens), K_(topk), R_(static_cast<std::int32_t>(std::min<std::int64_t>(tokens, 128))), seed_(seed) {}

  Traffic traffic() const override {
    const auto entries = static_cast<std::uint64_t>(T_ * K_);
    return {4 * entries, 4 * entries + 4 * static_cast<std::uint64_t>(T_)};
  }
  std::size_t set_bytes() const override { return static_cast<std::size_t>(T_ * K_ * 8 + T_ * 4); }

  void setup(Device& device, Stream& stream, int sets) override {
    BenchRng rng(seed_);
    make_inputs(rng);
    const auto rows = static_cast<std::int64_t>(sets) * T_;
    logical_ = device.allocate(static_cast<std::size_t>(rows * K_) * 4, MemoryKind::device);
    physical_ = device.allocate(static_cast<std::size_t>(rows * K_) * 4, MemoryKind::device);
    counts_ = device.allocate(static_cast<std::size_t>(rows) * 4, MemoryKind::device);
    req_id_ = device.allocate(static_cast<std::size_t>(T_) * 4, MemoryKind::device);
    table_ = device.allocate(table_host_.size() * 4, MemoryKind::device);
    upload_to(device, stream, logical_, 0, logical_host_);
    replicate_slices(stream, logical_, static_cast<std::size_t>(T_ * K_) * 4, sets);
    upload_to(device, stream, req_id_, 0, req_id_host_);
    upload_to(device, stream, table_, 0, table_host_);

    const auto logical_all = Tensor::of(logical_, DType::i32, {rows, K_});
    const auto physical_all = Tensor::of(physical_, DType::i32, {rows, K_});
    const auto counts_all = Tensor::of(counts_, DType::i32, {rows});
    for (int s = 0; s < sets; ++s) {
      logical_sets_.push_back(logical_all.rows(s * T_, (s + 1) * T_));
      physical_sets_.push_back(physical_all.rows(s * T_, (s + 1) * T_));
      counts_sets_.push_back(counts_all.rows(s * T_, (s + 1) * T_));
    }
  }

  void launch(Stream& stream, int set) override {
    TopkConvertParams params;
    params.block_size = block_size;
    const auto s = static_cast<std::size_t>(set);
    convert_logical_to_physical_topk(stream, Tensor::of(req_id_, DType::i32, {T_}),
                                     Tensor::of(table_, DType::i32, {R_, blocks_per_request}), logical_sets_[s],
                                     params, physical_sets_[s], counts_sets_[s]);
  }

  std::string check(Device& device, Stream& stream) override {
    stream.fill(physical_, 0, 0xA5, static_cast<std::size_t>(T_ * K_) * 4);
    stream.fill(counts_, 0, 0xA5, static_cast<std::size_t>(T_) * 4);
    launch(stream, 0);
    const auto physical = download_from<std::int32_t>(device, stream, physical_, 0, static_cast<std::size_t>(T_ * K_));
    const auto counts = download_from<std::int32_t>(device, stream, counts_, 0, static_cast<std::size_t>(T_));
    for (std::int64_t t = 0; t < T_; ++t) {
      const std::int32_t* table = &table_host_[static_cast<std::size_t>(req_id_host_[static_cast<std::size_t>(t)]) *
                                               blocks_per_request];
      std::int32_t valid = 0;
      for (std::int64_t j = 0; j < K_; ++j) {
        const auto e = static_cast<std::size_t>(t * K_ + j);
        const std::int32_t tok = logical_host_[e];
        const std::int32_t want = tok < 0 ? -1 : table[tok / block_size] * block_size + tok % block_size;
        valid += want != -1;
        if (physical[e] != want) {
          return "physical[" + std::to_string(t) + ", " + std::to_string(j) + "] = " + std::to_string(physical[e]) +
                 ", expected " + std::to_string(want);
        }
      }
      if (counts[static_cast<std::size_t>(t)] != valid) {
        return "valid_counts[" + std::to_string(t) + "] = " + std::to_string(counts[static_cast<std::size_t>(t)]) +
               ", expected " + std::to_string(valid);
      }
    }
    return "";
  }

 private:
  // Token t belongs to request t % R; its K positions are drawn from the
  // request's 32768-token context, about 3% unused (-1). The block table is
  // a shuffle of every physical block, so pages are scattered.
  void make_inputs(BenchRng& rng) {
    req_id_host_.resize(static_cast<std::size_t>(T_));
    for (std::int64_t t = 0; t < T_; ++t) req_id_host_[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t % R_);
    table_host_.resize(static_cast<std::size_t>(R_) * blocks_per_request);
    std::iota(table_host_.begin(), table_host_.end(), 0);
    for (std::size_t i = table_host_.size(); i > 1; --i) {
      std::swap(table_host_[i - 1], table_host_[rng.below(static_cast<std::uint32_t>(i))]);
    }
    logical_host_.resize(static_cast<std::size_t>(T_ * K_));
    for (auto& tok : logical_host_) {
      const std::uint32_t draw = rng.below(100 * context_tokens);
      tok = draw < 3 * context_tokens ? -1 : static_cast<std::int32_t>(draw % context_tokens);
    }
  }

  std::int64_t T_;
  std::int32_t K_;
  std::int32_t R_;
  std::uint64_t seed_;
  std::vector<std::int32_t> req_id_host_, table_host_, logical_host_;
  Buffer logical_, physical_, counts_, req_id_, table_;
  std::vector<Tensor> logical_sets_, physical_sets_, counts_sets_;
};

}  // namespace

void add_convert_cases(std::vector<CaseSpec>& cases, const BenchConfig& config) {
  // --quick keeps the decode shapes and shrinks the large batch, so a host run
  // takes seconds.
  const std::vector<std::int64_t> token_counts = {1, 256, 1024, config.quick ? 4096 : 32768};
  for (const std::int64_t T : token_counts) {
    const std::uint64_t seed = config.seed + static_cast<std::uint64_t>(T);
    cases.push_back({"convert/T=" + std::to_string(T), "T=" + std::to_string(T) + ", K=" + std::to_string(K),
                     Ceiling::device_copy, false, [T, seed] { return std::make_unique<ConvertCase>(T, K, seed); }});
  }
}

}  // namespace sparse_mla::cli
