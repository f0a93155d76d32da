// A whole index-group decode step (SPEC section 4): every layer of a
// 4-layer group calls set_logical_topk_ready, prepare_for_batch and
// convert_logical_to_physical_topk; the leader converts once on the side
// stream and every layer's compute stream joins it. Timed on the compute
// stream, fork and join included. Bytes: one conversion per step.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "bench_data.hpp"
#include "bench_topk_inputs.hpp"
#include "sparse_mla/index_group_builder.hpp"

namespace sparse_mla::cli {

namespace {

constexpr std::int32_t K = 2048;
constexpr int layers = 4;

class GroupStepCase final : public BenchCase {
 public:
  // A decode batch: one token per request.
  GroupStepCase(std::int64_t tokens, std::uint64_t seed) : in_(tokens, K, static_cast<std::int32_t>(tokens), seed) {}

  Traffic traffic() const override {
    const auto entries = static_cast<std::uint64_t>(in_.tokens) * K;
    return {4 * entries, 4 * entries + 4 * static_cast<std::uint64_t>(in_.tokens)};
  }
  // The group's workspace is one; the rotation moves the indexer's output.
  std::size_t set_bytes() const override { return in_.logical_bytes(); }
  // Each launch is about 5 graph nodes per layer across two streams; 16384
  // sets made a graph that took minutes to capture. 64 sets keep T=256's
  // inputs (128 MiB) past the L2; T=1's (512 KiB) stay in it.
  int max_sets() const override { return 64; }

  void setup(Device& device, Stream& stream, int sets) override {
    const std::int64_t T = in_.tokens;
    const auto rows = static_cast<std::int64_t>(sets) * T;
    logical_ = device.allocate(static_cast<std::size_t>(rows) * K * 4, MemoryKind::device);
    upload_to(device, stream, logical_, 0, in_.logical);
    replicate_slices(stream, logical_, in_.logical_bytes(), sets);
    const auto logical_all = Tensor::of(logical_, DType::i32, {rows, K});
    for (int s = 0; s < sets; ++s) logical_sets_.push_back(logical_all.rows(s * T, (s + 1) * T));

    req_id_ = device.allocate(static_cast<std::size_t>(T) * 4, MemoryKind::device);
    table_ = device.allocate(in_.block_table.size() * 4, MemoryKind::device);
    query_start_ = device.allocate(static_cast<std::size_t>(T + 1) * 4, MemoryKind::device);
    upload_to(device, stream, req_id_, 0, in_.req_id);
    upload_to(device, stream, table_, 0, in_.block_table);
    std::vector<std::int32_t> starts(static_cast<std::size_t>(T + 1));
    for (std::size_t i = 0; i < starts.size(); ++i) starts[i] = static_cast<std::int32_t>(i);
    upload_to(device, stream, query_start_, 0, starts);
    batch_.req_id_per_token = Tensor::of(req_id_, DType::i32, {T});
    batch_.block_table = Tensor::of(table_, DType::i32, {in_.requests, TopkInputs::blocks_per_request});
    batch_.block_size = TopkInputs::block_size;
    batch_.query_start_loc = Tensor::of(query_start_, DType::i32, {T + 1});
    batch_.num_decodes = T;
    batch_.num_decode_tokens = T;

    // The engine's logical top-k buffer; the group reads whichever rows a
    // step passes in.
    SparseMLAIndexGroupBuilder builder(device.shared_from_this(), logical_sets_[0], T);
    for (int layer = 0; layer < layers; ++layer) {
      LayerRegistration r = builder.register_layer(layer == 0);
      group_ = r.group;
    }
  }

  void launch(Stream& compute, int set) override {
    const Tensor& logical = logical_sets_[static_cast<std::size_t>(set)];
    for (int layer = 0; layer < layers; ++layer) {
      group_->set_logical_topk_ready(layer, compute);
      group_->prepare_for_batch(layer, batch_, compute);
      // A decode step's result is a view of the group's workspace, which
      // check() reads; nothing is allocated that the view would keep alive.
      static_cast<void>(group_->convert_logical_to_physical_topk(layer, compute, logical, batch_, 0, true));
    }
  }

  // The workspace after one step, and the known relation of the protocol:
  // one decode-sized conversion per group per step, however many layers.
  std::string check(Device& device, Stream& stream) override {
    const auto entries = static_cast<std::size_t>(in_.tokens) * K;
    stream.fill_bytes(group_->physical_workspace().data(), 0xA5, entries * 4);
    stream.fill_bytes(group_->valid_counts_workspace().data(), 0xA5, static_cast<std::size_t>(in_.tokens) * 4);
    const std::uint64_t before = group_->conversion_counts().decode;
    launch(stream, 0);
    stream.synchronize();
    const std::uint64_t conversions = group_->conversion_counts().decode - before;
    if (conversions != 1) return "one step queued " + std::to_string(conversions) + " conversions, expected 1";
    Buffer physical = device.allocate(entries * 4, MemoryKind::device);
    Buffer counts = device.allocate(static_cast<std::size_t>(in_.tokens) * 4, MemoryKind::device);
    stream.copy_bytes(physical.data(), group_->physical_workspace().data(), entries * 4);
    stream.copy_bytes(counts.data(), group_->valid_counts_workspace().data(), static_cast<std::size_t>(in_.tokens) * 4);
    return in_.compare(download_from<std::int32_t>(device, stream, physical, 0, entries),
                       download_from<std::int32_t>(device, stream, counts, 0, static_cast<std::size_t>(in_.tokens)));
  }

 private:
  TopkInputs in_;
  Buffer logical_, req_id_, table_, query_start_;
  std::vector<Tensor> logical_sets_;
  BatchMetadata batch_;
  std::shared_ptr<SparseMLAIndexGroup> group_;
};

}  // namespace

void add_group_cases(std::vector<CaseSpec>& cases, const BenchConfig& config) {
  for (const std::int64_t T : {1, 256}) {
    const std::uint64_t seed = config.seed + 7 * static_cast<std::uint64_t>(T);
    cases.push_back({"group-step/T=" + std::to_string(T),
                     "T=" + std::to_string(T) + ", K=" + std::to_string(K) + ", " + std::to_string(layers) + " layers",
                     Ceiling::device_copy, false, [T, seed] { return std::make_unique<GroupStepCase>(T, seed); }});
  }
}

}  // namespace sparse_mla::cli
