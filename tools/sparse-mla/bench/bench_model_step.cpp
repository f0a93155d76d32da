// The HiSparse bookkeeping of one decode step of a DeepSeek-V3.2-shaped
// model (SPEC section 5): 61 layers, a new index group every 4 layers (16
// groups, the last of one layer). Each group resolves the batch once against
// its own hot slots (its own selection, state and counters) and every layer
// of the group gathers the group's missed rows from its own host pool into
// its own hot cache, as HiSparseMLAIndexGroup does in a step: the first
// layer's gather alone, then one gather for the group's later layers.
//
// Bytes: the missed rows alone, 656 read over the host link and 656 written
// per missed row per layer, so that the time they take at the pinned copy
// ceiling of the same run ("at ceiling us": the floor) is what a step cannot beat; the rest
// of the step is the bookkeeping the library adds. The groups' rotations
// (bench_hisparse_rotation.hpp) give every step its designed hit rate; after the
// timed replays the counters of every group must show exactly that rate.
//
// The 16 groups share the layers' pools and hot caches (layer i of every
// group uses pool i and hot cache i, i < 4), so the memory is that of 4
// layers rather than 61. So that no two groups read the same host rows in a
// step (a row read twice could come from the L2), the groups' rigs are alike
// (one seed: the same tables and selections) and group g runs rotation set
// (step + g) % sets: the rotating parts of different sets are disjoint
// positions, so their host rows are too, and each group still cycles through
// its sets in order, which keeps its hit rate exact.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "bench_hisparse_rotation.hpp"
#include "validation/hisparse_rig.hpp"

namespace sparse_mla::cli {

namespace {

using namespace hisparse_shape;

constexpr std::int32_t model_layers = 61;
constexpr std::int32_t index_every = 4;  // layers per index group (the last group may have fewer)
constexpr std::int32_t model_groups = (model_layers + index_every - 1) / index_every;

std::int32_t layers_of_group(std::int32_t group) { return std::min(index_every, model_layers - group * index_every); }

class ModelStepCase final : public BenchCase {
 public:
  ModelStepCase(std::int32_t rows, std::int32_t fixed, std::uint64_t seed) : rows_(rows), fixed_(fixed), seed_(seed) {
    rigs_.reserve(model_groups);
    for (std::int32_t g = 0; g < model_groups; ++g) rigs_.emplace_back(rows, fixed, false, seed, false);
  }

  Traffic traffic() const override {
    // Every group has the same misses a step, and its layers each gather them.
    const std::uint64_t bytes = rigs_.front().misses_per_launch() * model_layers * static_cast<std::uint64_t>(row_bytes);
    return {bytes, bytes};
  }
  std::size_t set_bytes() const override {
    const std::size_t pool = static_cast<std::size_t>(index_every) * static_cast<std::size_t>(rows_) *
                             static_cast<std::size_t>(K - fixed_) * static_cast<std::size_t>(row_bytes);
    return static_cast<std::size_t>(model_groups) * rigs_.front().set_bytes() + pool;
  }
  std::size_t fixed_bytes() const override {
    const std::size_t cache = static_cast<std::size_t>(index_every) *
                              static_cast<std::size_t>(1 + rows_ * HiSparseShape::hot_blocks_per_row) * block * row_bytes;
    const std::size_t pool = static_cast<std::size_t>(index_every) * static_cast<std::size_t>(rows_) *
                             static_cast<std::size_t>(fixed_) * static_cast<std::size_t>(row_bytes);
    return static_cast<std::size_t>(model_groups) * rigs_.front().fixed_bytes() + cache + pool;
  }
  // A set for each group at least (each step's groups run different sets),
  // and a graph small enough to capture in seconds: a step is 47 launches.
  int min_sets() const override { return std::max(rigs_.front().min_sets(), model_groups); }
  int max_sets() const override { return 64; }

  void setup(Device& device, Stream& stream, int sets) override {
    sets_ = sets;
    for (HiSparseRotation& rig : rigs_) rig.setup(device, stream, sets);
    const std::int64_t host_rows = rigs_.front().host_rows();  // of each layer's pool
    pool_ = device.allocate(static_cast<std::size_t>(index_every * host_rows * row_bytes), MemoryKind::pinned_host);
    validation::fill_pool(stream, pool_, seed_);
    const Tensor pool = Tensor::of(pool_, DType::u8, {index_every * host_rows, row_bytes});
    for (std::int32_t i = 0; i < index_every; ++i) {
      layer_pools_.push_back(pool.rows(i * host_rows, (i + 1) * host_rows));
      hot_caches_.push_back(device.allocate(
          static_cast<std::size_t>(rigs_.front().hot_cache_blocks() * block * row_bytes), MemoryKind::device));
    }
  }

  void launch(Stream& stream, int set) override {
    for (std::int32_t g = 0; g < model_groups; ++g) {
      const int group_set = (set + g) % sets_;
      rigs_[static_cast<std::size_t>(g)].resolve(stream, group_set);
      gather_layers(stream, g, group_set);
    }
  }

  // Group 0 from an empty state through the scalar model, then the rows its
  // layers gathered against their pools.
  std::string check(Device&, Stream& stream) override {
    for (Buffer& cache : hot_caches_) stream.fill(cache, 0, 0xEE, cache.bytes());
    std::string diff = rigs_.front().check(stream);
    if (!diff.empty()) return "group 0: " + diff;
    gather_layers(stream, 0, 0);
    stream.synchronize();
    for (std::int32_t i = 0; i < layers_of_group(0); ++i) {
      diff = rigs_.front().check_gathered(stream, hot_caches_[static_cast<std::size_t>(i)], seed_,
                                          i * rigs_.front().host_rows());
      if (!diff.empty()) return "layer " + std::to_string(i) + ": " + diff;
    }
    return "";
  }

  void before_timed(Device&, Stream&) override { counted_before_ = counted(); }
  std::string after_timed(Device&, Stream&, std::uint64_t launches, std::string& note) override {
    const std::vector<std::uint64_t> after = counted();
    return check_hit_counts(after[0] - counted_before_[0], after[1] - counted_before_[1],
                            static_cast<std::uint64_t>(model_groups) * rigs_.front().hits_per_launch() * launches,
                            misses_per_step() * launches, note);
  }

 private:
  // Misses of a step, summed over the groups' resolves.
  std::uint64_t misses_per_step() const { return static_cast<std::uint64_t>(model_groups) * rigs_.front().misses_per_launch(); }

  // The group's layers' gathers: the first layer's, then one for the rest.
  void gather_layers(Stream& stream, std::int32_t group, int set) {
    const HiSparseResolveOutputs& out = rigs_[static_cast<std::size_t>(group)].outputs(set);
    std::vector<HiSparseLayerRows> layers;
    for (std::int32_t i = 0; i < layers_of_group(group); ++i) {
      layers.push_back({layer_pools_[static_cast<std::size_t>(i)],
                        Tensor::of(hot_caches_[static_cast<std::size_t>(i)], DType::u8,
                                   {rigs_.front().hot_cache_blocks(), block, row_bytes})});
    }
    gather_hisparse(stream, {layers[0].host_pool, layers[0].hot_cache, out.swap_host_rows, out.swap_device_rows, out.swap_counts},
                    rows_);
    layers.erase(layers.begin());
    gather_hisparse_layers(stream, layers, out.swap_host_rows, out.swap_device_rows, out.swap_counts, rows_);
  }

  // Hits and misses over every group's counters.
  std::vector<std::uint64_t> counted() const {
    std::vector<std::uint64_t> sum(2, 0);
    for (const HiSparseRotation& rig : rigs_) {
      const std::vector<std::int64_t> c = rig.counters();
      sum[0] += static_cast<std::uint64_t>(c[0]);
      sum[1] += static_cast<std::uint64_t>(c[1]);
    }
    return sum;
  }

  std::int32_t rows_;
  std::int32_t fixed_;
  std::uint64_t seed_;
  int sets_ = 1;
  std::vector<HiSparseRotation> rigs_;
  Buffer pool_;                 // pinned: the index_every layer pools, one after another
  std::vector<Tensor> layer_pools_;
  std::vector<Buffer> hot_caches_;
  std::vector<std::uint64_t> counted_before_;
};

}  // namespace

void add_model_step_cases(std::vector<CaseSpec>& cases, const BenchConfig& config) {
  const std::vector<std::int32_t> batches = config.quick ? std::vector<std::int32_t>{1} : std::vector<std::int32_t>{1, 32, 128};
  for (const std::int32_t rows : batches) {
    for (const int hits : {90, 99, 100}) {
      const std::uint64_t seed = config.seed + 5000 + 131 * static_cast<std::uint64_t>(rows) + static_cast<std::uint64_t>(hits);
      const std::int32_t fixed = fixed_for_hits(hits);
      cases.push_back({"model-step/rows=" + std::to_string(rows) + ",hits=" + std::to_string(hits),
                       std::to_string(model_layers) + " layers, " + std::to_string(model_groups) + " groups, " +
                           std::to_string(rows) + " rows, " + std::to_string(hits) + "% hit",
                       Ceiling::pinned_copy, false,
                       [rows, fixed, seed] { return std::make_unique<ModelStepCase>(rows, fixed, seed); }});
    }
  }
}

}  // namespace sparse_mla::cli
