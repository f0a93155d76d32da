// Top-k conversion with valid counts (SPEC section 2) at DeepSeek-V3.2's
// K = 2048: T = 1, 256 and 1024 decode tokens and a 32768-token batch; with
// --dcp-size > 1 the same shapes through the DCP filter (SPEC section 2a,
// convert-dcp/...), the block table then being the rank's.
// Bytes: reads 4*T*K, writes 4*T*K + 4*T (block-table reads are extra).
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "bench_data.hpp"
#include "bench_topk_inputs.hpp"
#include "sparse_mla/topk_convert.hpp"
#include "sparse_mla/fp8_upconvert.hpp"

namespace sparse_mla::cli {

namespace {

constexpr std::int32_t K = 2048;  // DeepSeek-V3.2's top-k

class ConvertCase final : public BenchCase {
 public:
  // The inputs are drawn in setup(): making a case is cheap, so that the
  // bench's floor cases can ask one for its traffic().
  ConvertCase(std::int64_t tokens, std::uint64_t seed, const DcpConfig& dcp) : tokens_(tokens), seed_(seed), dcp_(dcp) {}

  Traffic traffic() const override {
    const auto entries = static_cast<std::uint64_t>(tokens_) * K;
    return {4 * entries, 4 * entries + 4 * static_cast<std::uint64_t>(tokens_)};
  }
  std::size_t set_bytes() const override { return static_cast<std::size_t>(tokens_) * (2 * K * 4 + 4); }

  void setup(Device& device, Stream& stream, int sets) override {
    const std::int64_t T = tokens_;
    in_.emplace(T, K, static_cast<std::int32_t>(std::min<std::int64_t>(T, 128)), seed_);
    const TopkInputs& in = *in_;
    const auto rows = static_cast<std::int64_t>(sets) * T;
    logical_ = device.allocate(static_cast<std::size_t>(rows) * K * 4, MemoryKind::device);
    physical_ = device.allocate(static_cast<std::size_t>(rows) * K * 4, MemoryKind::device);
    counts_ = device.allocate(static_cast<std::size_t>(rows) * 4, MemoryKind::device);
    req_id_ = device.allocate(static_cast<std::size_t>(T) * 4, MemoryKind::device);
    table_ = device.allocate(in.block_table.size() * 4, MemoryKind::device);
    upload_to(device, stream, logical_, 0, in.logical);
    replicate_slices(stream, logical_, in.logical_bytes(), sets);
    upload_to(device, stream, req_id_, 0, in.req_id);
    upload_to(device, stream, table_, 0, in.block_table);

    const auto logical_all = Tensor::of(logical_, DType::i32, {rows, K});
    const auto physical_all = Tensor::of(physical_, DType::i32, {rows, K});
    const auto counts_all = Tensor::of(counts_, DType::i32, {rows});
    for (int s = 0; s < sets; ++s) {
      logical_sets_.push_back(logical_all.rows(s * T, (s + 1) * T));
      physical_sets_.push_back(physical_all.rows(s * T, (s + 1) * T));
      counts_sets_.push_back(counts_all.rows(s * T, (s + 1) * T));
    }
    req_id_tensor_ = Tensor::of(req_id_, DType::i32, {T});
    table_tensor_ = Tensor::of(table_, DType::i32, {in.requests, TopkInputs::blocks_per_request});
  }

  void launch(Stream& stream, int set) override {
    TopkConvertParams params;
    params.block_size = TopkInputs::block_size;
    params.dcp = dcp_;
    const auto s = static_cast<std::size_t>(set);
    convert_logical_to_physical_topk(stream, req_id_tensor_, table_tensor_, logical_sets_[s], params,
                                     physical_sets_[s], counts_sets_[s]);
  }

  std::string check(Device& device, Stream& stream) override {
    const auto entries = static_cast<std::size_t>(tokens_) * K;
    stream.fill(physical_, 0, 0xA5, entries * 4);
    stream.fill(counts_, 0, 0xA5, static_cast<std::size_t>(tokens_) * 4);
    launch(stream, 0);
    return in_->compare(download_from<std::int32_t>(device, stream, physical_, 0, entries),
                        download_from<std::int32_t>(device, stream, counts_, 0, static_cast<std::size_t>(tokens_)), dcp_);
  }

 private:
  std::int64_t tokens_;
  std::uint64_t seed_;
  DcpConfig dcp_;
  std::optional<TopkInputs> in_;  // drawn by setup()
  Buffer logical_, physical_, counts_, req_id_, table_;
  Tensor req_id_tensor_, table_tensor_;
  std::vector<Tensor> logical_sets_, physical_sets_, counts_sets_;
};

}  // namespace

void add_convert_cases(std::vector<CaseSpec>& cases, const BenchConfig& config) {
  // --quick keeps the decode shapes and shrinks the large batch, so a host run
  // takes seconds.
  // --tokens: the counts given, each once, in the order given.
  std::vector<std::int64_t> token_counts;
  for (const std::int64_t T : config.convert_tokens) {
    if (std::find(token_counts.begin(), token_counts.end(), T) == token_counts.end()) token_counts.push_back(T);
  }
  if (token_counts.empty()) token_counts = {1, 256, 1024, config.quick ? 4096 : 32768};
  for (const std::int64_t T : token_counts) {
    const std::uint64_t seed = config.seed + static_cast<std::uint64_t>(T);
    cases.push_back({"convert/T=" + std::to_string(T), "T=" + std::to_string(T) + ", K=" + std::to_string(K),
                     Ceiling::device_copy, false, [T, seed] { return std::make_unique<ConvertCase>(T, seed, DcpConfig{}); }});
  }
  const DcpConfig dcp = config.dcp;
  if (!dcp.enabled()) return;
  const std::string split = ", DCP " + std::to_string(dcp.rank) + "/" + std::to_string(dcp.size) + " i" +
                            std::to_string(dcp.interleave) + (dcp.compact ? " compact" : "");
  for (const std::int64_t T : token_counts) {
    const std::uint64_t seed = config.seed + static_cast<std::uint64_t>(T);
    cases.push_back({"convert-dcp/T=" + std::to_string(T), "T=" + std::to_string(T) + ", K=" + std::to_string(K) + split,
                     Ceiling::device_copy, false, [T, seed, dcp] { return std::make_unique<ConvertCase>(T, seed, dcp); }});
  }
}

}  // namespace sparse_mla::cli
