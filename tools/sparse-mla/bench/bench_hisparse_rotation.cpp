#include "bench_hisparse_rotation.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "bench_data.hpp"
#include "sparse_mla/error.hpp"
#include "validation/reference/hisparse_reference.hpp"

namespace sparse_mla::cli {

using namespace hisparse_shape;

std::string check_hit_counts(std::uint64_t hits, std::uint64_t misses, std::uint64_t want_hits, std::uint64_t want_misses,
                             std::string& note) {
  note = "hits " + std::to_string(static_cast<int>(std::lround(100.0 * static_cast<double>(hits) /
                                                                 static_cast<double>(hits + misses)))) + "%";
  if (hits == want_hits && misses == want_misses) return "";
  return "the timed launches counted " + std::to_string(hits) + " hits and " + std::to_string(misses) +
         " misses; the design gives " + std::to_string(want_hits) + " and " + std::to_string(want_misses);
}

HiSparseRotation::HiSparseRotation(std::int32_t rows, std::int32_t fixed, bool with_pool, std::uint64_t seed,
                                   bool rotate_outputs)
    : rows_(rows), fixed_(fixed), with_pool_(with_pool), seed_(seed), rotate_outputs_(rotate_outputs) {}

int HiSparseRotation::min_sets() const {
  const std::int32_t rotating = K - fixed_;
  if (rotating == 0) return 1;
  // A rotating part is evicted once (sets - 1) later parts have filled the
  // H - fixed evictable slots; one more for margin.
  return 2 + (H - fixed_ + rotating - 1) / rotating;
}

std::size_t HiSparseRotation::set_bytes() const {
  const auto entries = static_cast<std::size_t>(rows_) * K;
  const std::size_t indices = rotate_outputs_ ? 5 * entries * 4 + 2 * static_cast<std::size_t>(rows_) * 4 : entries * 4;
  const std::size_t pool = with_pool_ ? static_cast<std::size_t>(rows_) * static_cast<std::size_t>(K - fixed_) * row_bytes : 0;
  return indices + pool;
}

std::size_t HiSparseRotation::fixed_bytes() const {
  const auto rows = static_cast<std::size_t>(rows_);
  std::size_t bytes = rows * H * 6;
  if (!rotate_outputs_) bytes += 4 * rows * K * 4 + 2 * rows * 4;
  if (with_pool_) bytes += (1 + rows * HiSparseShape::hot_blocks_per_row) * block * row_bytes + rows * fixed_ * row_bytes;
  return bytes;
}

std::vector<std::int32_t> HiSparseRotation::selection(int set) const {
  const std::int32_t rotating = K - fixed_;
  std::vector<std::int32_t> logical(static_cast<std::size_t>(rows_) * K);
  BenchRng rng(seed_ + static_cast<std::uint64_t>(set) * 0x9E37);
  for (std::int32_t r = 0; r < rows_; ++r) {
    std::int32_t* row = &logical[static_cast<std::size_t>(r) * K];
    std::iota(row, row + fixed_, 0);
    std::iota(row + fixed_, row + K, fixed_ + set * rotating);
    for (std::int32_t i = K; i > 1; --i) std::swap(row[i - 1], row[rng.below(static_cast<std::uint32_t>(i))]);
  }
  return logical;
}

// Request r on state row r, its hot blocks 1 + r * hot_blocks_per_row, ...
// (block 0 stays unused, like a null block).
reference::HiSparseTables HiSparseRotation::tables() const {
  reference::HiSparseTables t;
  t.top_k = K;
  t.hot_slots = H;
  t.source_table = source_table_;
  t.source_rows = rows_;
  t.source_blocks = context_blocks_;
  t.source_block_size = block;
  t.host_rows = host_rows();
  t.hot_blocks_per_row = HiSparseShape::hot_blocks_per_row;
  t.hot_block_size = block;
  t.attention_block_stride = block;
  return t;
}

void HiSparseRotation::setup(Device& device, Stream& stream, int sets) {
  const std::int64_t context = fixed_ + static_cast<std::int64_t>(sets) * (K - fixed_);
  context_blocks_ = static_cast<std::int32_t>((context + block - 1) / block);
  if (host_rows() > std::numeric_limits<std::int32_t>::max()) {
    fail("bench", "a HiSparse pool of ", host_rows(), " rows does not fit int32 row ids; lower --rotate-mib");
  }
  BenchRng rng(seed_);
  source_table_.resize(static_cast<std::size_t>(rows_) * context_blocks_);
  std::iota(source_table_.begin(), source_table_.end(), 0);
  for (std::size_t i = source_table_.size(); i > 1; --i) std::swap(source_table_[i - 1], source_table_[rng.below(static_cast<std::uint32_t>(i))]);
  rig_ = std::make_unique<validation::HiSparseRig>(stream, tables(), reference::HiSparseState(rows_, H), rows_, row_bytes,
                                                   with_pool_ ? hot_cache_blocks() : 0, seed_);
  state_ = rig_->slot_state();

  std::vector<std::int32_t> hot_table(static_cast<std::size_t>(rows_) * HiSparseShape::hot_blocks_per_row);
  std::iota(hot_table.begin(), hot_table.end(), 1);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows_));
  std::iota(ids.begin(), ids.end(), 0);
  auto put = [&](Buffer& b, const auto& values) {
    b = device.allocate(values.size() * sizeof(values[0]), MemoryKind::device);
    upload_to(device, stream, b, 0, values);
  };
  put(hot_table_, hot_table);
  put(ids_, ids);

  const auto per_set = static_cast<std::size_t>(rows_) * K;
  const auto output_sets = static_cast<std::size_t>(rotate_outputs_ ? sets : 1);
  logical_ = device.allocate(per_set * static_cast<std::size_t>(sets) * 4, MemoryKind::device);
  for (int s = 0; s < sets; ++s) upload_to(device, stream, logical_, per_set * static_cast<std::size_t>(s) * 4, selection(s));
  for (Buffer* b : {&hot_indices_, &attention_, &swap_host_, &swap_device_}) {
    *b = device.allocate(per_set * output_sets * 4, MemoryKind::device);
  }
  valid_ = device.allocate(static_cast<std::size_t>(rows_) * output_sets * 4, MemoryKind::device);
  swap_counts_ = device.allocate(static_cast<std::size_t>(rows_) * output_sets * 4, MemoryKind::device);

  const std::int64_t all_rows = static_cast<std::int64_t>(rows_) * sets;
  const std::int64_t all_output_rows = static_cast<std::int64_t>(rows_) * static_cast<std::int64_t>(output_sets);
  auto output_rows_of = [&](const Buffer& b, std::int64_t columns, int s) {
    const std::int64_t first = rotate_outputs_ ? std::int64_t{s} * rows_ : 0;
    const Tensor all = columns > 1 ? Tensor::of(b, DType::i32, {all_output_rows, columns}) : Tensor::of(b, DType::i32, {all_output_rows});
    return all.rows(first, first + rows_);
  };
  const Tensor ids_tensor = Tensor::of(ids_, DType::i32, {rows_});
  for (int s = 0; s < sets; ++s) {
    const Tensor logical = Tensor::of(logical_, DType::i32, {all_rows, K}).rows(std::int64_t{s} * rows_, std::int64_t{s + 1} * rows_);
    inputs_.push_back(rig_->inputs(logical, ids_tensor, ids_tensor,
                                   Tensor::of(hot_table_, DType::i32, {rows_, HiSparseShape::hot_blocks_per_row})));
    HiSparseResolveOutputs out;
    out.hot_indices = output_rows_of(hot_indices_, K, s);
    out.attention_indices = output_rows_of(attention_, K, s);
    out.swap_host_rows = output_rows_of(swap_host_, K, s);
    out.swap_device_rows = output_rows_of(swap_device_, K, s);
    out.valid_counts = output_rows_of(valid_, 1, s);
    out.swap_counts = output_rows_of(swap_counts_, 1, s);
    out.hit_miss_counters = rig_->counters();
    outputs_.push_back(out);
  }
}

void HiSparseRotation::resolve(Stream& stream, int set) {
  const auto s = static_cast<std::size_t>(set);
  resolve_hisparse(stream, inputs_[s], state_, H, outputs_[s]);
}

void HiSparseRotation::gather(Stream& stream, int set) {
  const HiSparseResolveOutputs& out = outputs_[static_cast<std::size_t>(set)];
  gather_hisparse(stream, {rig_->host_pool(), rig_->hot_cache(), out.swap_host_rows, out.swap_device_rows, out.swap_counts},
                  rows_);
}

std::string HiSparseRotation::check(Stream& stream) {
  rig_->set_state(reference::HiSparseState(rows_, H));
  const auto entries = static_cast<std::size_t>(rows_) * K;
  for (Buffer* b : {&hot_indices_, &attention_, &swap_host_, &swap_device_}) stream.fill(*b, 0, 0xA5, entries * 4);
  stream.fill(valid_, 0, 0xA5, static_cast<std::size_t>(rows_) * 4);
  stream.fill(swap_counts_, 0, 0xA5, static_cast<std::size_t>(rows_) * 4);
  if (with_pool_) rig_->clear_hot_cache();
  resolve(stream, 0);
  if (with_pool_) gather(stream, 0);
  stream.synchronize();
  return compare_rows();
}

// Rows 0 and rows-1 through the scalar model (it is quadratic in K, so not
// every row), and every gathered row against the pool.
std::string HiSparseRotation::compare_rows() const {
  using validation::compare_row;
  const reference::HiSparseResult got = rig_->read(outputs_[0], rows_);
  const reference::HiSparseState state = rig_->state();
  const reference::HiSparseTables t = tables();
  const std::vector<std::int32_t> logical = selection(0);
  std::vector<std::int32_t> checked{0};
  if (rows_ > 1) checked.push_back(rows_ - 1);
  for (const std::int32_t r : checked) {
    reference::HiSparseStep step;
    step.logical.assign(logical.begin() + std::ptrdiff_t(r) * K, logical.begin() + std::ptrdiff_t(r + 1) * K);
    step.request_ids = {r};
    step.state_indices = {0};
    for (std::int32_t b = 0; b < HiSparseShape::hot_blocks_per_row; ++b) step.hot_block_table.push_back(1 + r * HiSparseShape::hot_blocks_per_row + b);
    reference::HiSparseState want_state(1, H);
    const reference::HiSparseResult want = reference::resolve_model(t, step, want_state);
    const std::size_t base = static_cast<std::size_t>(r) * K;
    std::string diff = compare_row("hot_indices", r, &got.hot_indices[base], want.hot_indices.data(), K);
    if (diff.empty()) diff = compare_row("attention_indices", r, &got.attention_indices[base], want.attention_indices.data(), K);
    if (diff.empty()) diff = compare_row("valid_counts", r, &got.valid_counts[std::size_t(r)], want.valid_counts.data(), 1);
    if (diff.empty()) diff = compare_row("swap_counts", r, &got.swap_counts[std::size_t(r)], want.swap_counts.data(), 1);
    if (diff.empty()) diff = compare_row("swap_host_rows", r, &got.swap_host_rows[base], want.swap_host_rows.data(), want.swap_counts[0]);
    if (diff.empty()) diff = compare_row("swap_device_rows", r, &got.swap_device_rows[base], want.swap_device_rows.data(), want.swap_counts[0]);
    if (diff.empty()) diff = compare_row("slot_rows", r, &state.slot_rows[std::size_t(r) * H], want_state.slot_rows.data(), H);
    if (diff.empty()) diff = compare_row("lru", r, &state.lru[std::size_t(r) * H], want_state.lru.data(), H);
    if (!diff.empty()) return diff;
  }
  if (!with_pool_) return "";
  return validation::compare_gathered(rig_->hot_cache_bytes(), row_bytes, got, K, seed_);
}

std::string HiSparseRotation::check_gathered(Stream& stream, const Buffer& hot_cache, std::uint64_t pool_seed,
                                             std::int64_t pool_row_offset) const {
  return validation::compare_gathered(download_from<std::uint8_t>(stream.device(), stream, hot_cache, 0, hot_cache.bytes()),
                                      row_bytes, rig_->read(outputs_[0], rows_), K, pool_seed, pool_row_offset);
}

}  // namespace sparse_mla::cli
