#include "bench_hisparse_rig.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "validation/reference/hisparse_reference.hpp"
#include "sparse_mla/error.hpp"

namespace sparse_mla::cli {

namespace {

using namespace hisparse_shape;

std::string at(const char* what, std::int32_t row, std::int64_t j) {
  return std::string(what) + "[" + std::to_string(row) + ", " + std::to_string(j) + "]";
}

template <class T>
std::string compare_row(const char* what, std::int32_t row, const T* got, const T* want, std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j) {
    if (got[j] != want[j]) {
      return at(what, row, j) + " = " + std::to_string(got[j]) + ", the scalar model gives " + std::to_string(want[j]);
    }
  }
  return "";
}

}  // namespace

void fill_pool(Device& device, Stream& stream, Buffer& pool, std::uint64_t seed) {
  constexpr std::size_t chunk_words = std::size_t{8} << 20;  // 64 MiB per upload
  const std::size_t words = pool.bytes() / 8;
  std::vector<std::uint64_t> chunk;
  for (std::size_t begin = 0; begin < words; begin += chunk_words) {
    chunk.resize(std::min(chunk_words, words - begin));
    for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = pool_word(seed, begin + i);
    upload_to(device, stream, pool, begin * 8, chunk);
  }
}

std::string compare_pool_row(const std::vector<std::uint8_t>& hot_cache, std::int64_t hot_row, std::int64_t host_row,
                             std::uint64_t seed) {
  constexpr std::int64_t words = row_bytes / 8;
  for (std::int64_t w = 0; w < words; ++w) {
    std::uint64_t got;
    std::memcpy(&got, &hot_cache[static_cast<std::size_t>(hot_row * row_bytes + w * 8)], 8);
    if (got != pool_word(seed, static_cast<std::uint64_t>(host_row * words + w))) {
      return "hot row " + std::to_string(hot_row) + " differs from host row " + std::to_string(host_row) +
             " at byte " + std::to_string(w * 8);
    }
  }
  return "";
}

std::string check_hit_counts(std::uint64_t hits, std::uint64_t misses, std::uint64_t want_hits, std::uint64_t want_misses,
                             std::string& note) {
  note = "hits " + std::to_string(static_cast<int>(std::lround(100.0 * static_cast<double>(hits) /
                                                                 static_cast<double>(hits + misses)))) + "%";
  if (hits == want_hits && misses == want_misses) return "";
  return "the timed launches counted " + std::to_string(hits) + " hits and " + std::to_string(misses) +
         " misses; the design gives " + std::to_string(want_hits) + " and " + std::to_string(want_misses);
}

HiSparseRig::HiSparseRig(std::int32_t rows, std::int32_t fixed, bool with_pool, std::uint64_t seed, bool rotate_outputs)
    : rows_(rows), fixed_(fixed), with_pool_(with_pool), seed_(seed), rotate_outputs_(rotate_outputs) {}

int HiSparseRig::min_sets() const {
  const std::int32_t rotating = K - fixed_;
  if (rotating == 0) return 1;
  // A rotating part is evicted once (sets - 1) later parts have filled the
  // H - fixed evictable slots; one more for margin.
  return 2 + (H - fixed_ + rotating - 1) / rotating;
}

std::size_t HiSparseRig::set_bytes() const {
  const auto entries = static_cast<std::size_t>(rows_) * K;
  const std::size_t indices = rotate_outputs_ ? 5 * entries * 4 + 2 * static_cast<std::size_t>(rows_) * 4 : entries * 4;
  const std::size_t pool = with_pool_ ? static_cast<std::size_t>(rows_) * static_cast<std::size_t>(K - fixed_) * row_bytes : 0;
  return indices + pool;
}

std::size_t HiSparseRig::fixed_bytes() const {
  const auto rows = static_cast<std::size_t>(rows_);
  std::size_t bytes = rows * H * 6;
  if (!rotate_outputs_) bytes += 4 * rows * K * 4 + 2 * rows * 4;
  if (with_pool_) bytes += (1 + rows * HiSparseShape::hot_blocks_per_row) * block * row_bytes + rows * fixed_ * row_bytes;
  return bytes;
}

std::vector<std::int32_t> HiSparseRig::selection(int set) const {
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

void HiSparseRig::setup(Device& device, Stream& stream, int sets) {
  sets_ = sets;
  const std::int64_t context = fixed_ + static_cast<std::int64_t>(sets) * (K - fixed_);
  context_blocks_ = static_cast<std::int32_t>((context + block - 1) / block);
  const std::int64_t host_rows = this->host_rows();
  if (host_rows > std::numeric_limits<std::int32_t>::max()) {
    fail("bench", "a HiSparse pool of ", host_rows, " rows does not fit int32 row ids; lower --rotate-mib");
  }
  BenchRng rng(seed_);
  source_table_.resize(static_cast<std::size_t>(rows_) * context_blocks_);
  std::iota(source_table_.begin(), source_table_.end(), 0);
  for (std::size_t i = source_table_.size(); i > 1; --i) std::swap(source_table_[i - 1], source_table_[rng.below(static_cast<std::uint32_t>(i))]);
  std::vector<std::int32_t> hot_table(static_cast<std::size_t>(rows_) * HiSparseShape::hot_blocks_per_row);
  std::iota(hot_table.begin(), hot_table.end(), 1);  // block 0 stays unused, like a null block
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows_));
  std::iota(ids.begin(), ids.end(), 0);

  auto put = [&](Buffer& b, const auto& values) {
    b = device.allocate(values.size() * sizeof(values[0]), MemoryKind::device);
    upload_to(device, stream, b, 0, values);
  };
  put(source_, source_table_);
  put(hot_table_, hot_table);
  put(ids_, ids);
  put(counters_, std::vector<std::int64_t>(2, 0));
  slot_rows_ = device.allocate(static_cast<std::size_t>(rows_) * H * 4, MemoryKind::device);
  lru_ = device.allocate(static_cast<std::size_t>(rows_) * H * 2, MemoryKind::device);
  state_ = {Tensor::of(slot_rows_, DType::i32, {rows_, H}), Tensor::of(lru_, DType::i16, {rows_, H})};
  reset_state(device, stream);

  const auto per_set = static_cast<std::size_t>(rows_) * K;
  const auto output_sets = static_cast<std::size_t>(rotate_outputs_ ? sets : 1);
  logical_ = device.allocate(per_set * static_cast<std::size_t>(sets) * 4, MemoryKind::device);
  for (int s = 0; s < sets; ++s) upload_to(device, stream, logical_, per_set * static_cast<std::size_t>(s) * 4, selection(s));
  for (Buffer* b : {&hot_indices_, &attention_, &swap_host_, &swap_device_}) {
    *b = device.allocate(per_set * output_sets * 4, MemoryKind::device);
  }
  valid_ = device.allocate(static_cast<std::size_t>(rows_) * output_sets * 4, MemoryKind::device);
  swap_counts_ = device.allocate(static_cast<std::size_t>(rows_) * output_sets * 4, MemoryKind::device);
  if (with_pool_) {
    pool_ = device.allocate(static_cast<std::size_t>(host_rows * row_bytes), MemoryKind::pinned_host);
    fill_pool(device, stream, pool_, seed_);
    hot_cache_ = device.allocate(static_cast<std::size_t>(1 + rows_ * HiSparseShape::hot_blocks_per_row) * block * row_bytes,
                                 MemoryKind::device);
  }

  const std::int64_t all_rows = static_cast<std::int64_t>(rows_) * sets;
  const std::int64_t all_output_rows = static_cast<std::int64_t>(rows_) * static_cast<std::int64_t>(output_sets);
  auto rows_of = [&](const Buffer& b, int s) {
    return Tensor::of(b, DType::i32, {all_rows, K}).rows(std::int64_t{s} * rows_, std::int64_t{s + 1} * rows_);
  };
  auto output_rows_of = [&](const Buffer& b, std::int64_t columns, int s) {
    const std::int64_t first = rotate_outputs_ ? std::int64_t{s} * rows_ : 0;
    const Tensor all = columns > 1 ? Tensor::of(b, DType::i32, {all_output_rows, columns}) : Tensor::of(b, DType::i32, {all_output_rows});
    return all.rows(first, first + rows_);
  };
  for (int s = 0; s < sets; ++s) {
    HiSparseResolveInputs in;
    in.logical = rows_of(logical_, s);
    in.request_ids = Tensor::of(ids_, DType::i32, {rows_});
    in.request_state_indices = in.request_ids;
    in.source_block_table = Tensor::of(source_, DType::i32, {rows_, context_blocks_});
    in.source_block_size = block;
    in.host_rows = host_rows;
    in.hot_block_table = Tensor::of(hot_table_, DType::i32, {rows_, HiSparseShape::hot_blocks_per_row});
    in.hot_block_size = block;
    inputs_.push_back(in);
    HiSparseResolveOutputs out;
    out.hot_indices = output_rows_of(hot_indices_, K, s);
    out.attention_indices = output_rows_of(attention_, K, s);
    out.swap_host_rows = output_rows_of(swap_host_, K, s);
    out.swap_device_rows = output_rows_of(swap_device_, K, s);
    out.valid_counts = output_rows_of(valid_, 1, s);
    out.swap_counts = output_rows_of(swap_counts_, 1, s);
    out.hit_miss_counters = Tensor::of(counters_, DType::i64, {2});
    outputs_.push_back(out);
  }
}

void HiSparseRig::resolve(Stream& stream, int set) {
  const auto s = static_cast<std::size_t>(set);
  resolve_hisparse(stream, inputs_[s], state_, H, outputs_[s]);
}

void HiSparseRig::gather(Stream& stream, int set) {
  const auto s = static_cast<std::size_t>(set);
  HiSparseGatherTensors t{Tensor::of(pool_, DType::u8, {static_cast<std::int64_t>(pool_.bytes()) / row_bytes, row_bytes}),
                          Tensor::of(hot_cache_, DType::u8, {hot_cache_blocks(), block, row_bytes}), outputs_[s].swap_host_rows,
                          outputs_[s].swap_device_rows, outputs_[s].swap_counts};
  gather_hisparse(stream, t, rows_);
}

std::vector<std::int64_t> HiSparseRig::counters(Device& device, Stream& stream) {
  return download_from<std::int64_t>(device, stream, counters_, 0, 2);
}

void HiSparseRig::reset_state(Device& device, Stream& stream) {
  const reference::HiSparseState empty(rows_, H);
  upload_to(device, stream, slot_rows_, 0, empty.slot_rows);
  upload_to(device, stream, lru_, 0, empty.lru);
}

std::string HiSparseRig::check(Device& device, Stream& stream) {
  reset_state(device, stream);
  const auto entries = static_cast<std::size_t>(rows_) * K;
  for (Buffer* b : {&hot_indices_, &attention_, &swap_host_, &swap_device_}) stream.fill(*b, 0, 0xA5, entries * 4);
  stream.fill(valid_, 0, 0xA5, static_cast<std::size_t>(rows_) * 4);
  stream.fill(swap_counts_, 0, 0xA5, static_cast<std::size_t>(rows_) * 4);
  if (with_pool_) stream.fill(hot_cache_, 0, 0xEE, hot_cache_.bytes());
  resolve(stream, 0);
  if (with_pool_) gather(stream, 0);
  stream.synchronize();
  return compare_rows(device, stream);
}

// Rows 0 and rows-1 through the scalar model (it is quadratic in K, so not
// every row), and every gathered row against the pool.
std::string HiSparseRig::compare_rows(Device& device, Stream& stream) {
  const auto entries = static_cast<std::size_t>(rows_) * K;
  const auto hot = download_from<std::int32_t>(device, stream, hot_indices_, 0, entries);
  const auto attention = download_from<std::int32_t>(device, stream, attention_, 0, entries);
  const auto swap_host = download_from<std::int32_t>(device, stream, swap_host_, 0, entries);
  const auto swap_device = download_from<std::int32_t>(device, stream, swap_device_, 0, entries);
  const auto valid = download_from<std::int32_t>(device, stream, valid_, 0, static_cast<std::size_t>(rows_));
  const auto swaps = download_from<std::int32_t>(device, stream, swap_counts_, 0, static_cast<std::size_t>(rows_));
  const auto slot_rows = download_from<std::int32_t>(device, stream, slot_rows_, 0, static_cast<std::size_t>(rows_) * H);
  const auto lru = download_from<std::int16_t>(device, stream, lru_, 0, static_cast<std::size_t>(rows_) * H);

  reference::HiSparseTables tables;
  tables.top_k = K;
  tables.hot_slots = H;
  tables.source_table = source_table_;
  tables.source_rows = rows_;
  tables.source_blocks = context_blocks_;
  tables.source_block_size = block;
  tables.host_rows = host_rows();
  tables.hot_blocks_per_row = HiSparseShape::hot_blocks_per_row;
  tables.hot_block_size = block;
  tables.attention_block_stride = block;
  const std::vector<std::int32_t> logical = selection(0);
  std::vector<std::int32_t> checked{0};
  if (rows_ > 1) checked.push_back(rows_ - 1);
  for (const std::int32_t r : checked) {
    reference::HiSparseStep step;
    step.logical.assign(logical.begin() + std::ptrdiff_t(r) * K, logical.begin() + std::ptrdiff_t(r + 1) * K);
    step.request_ids = {r};
    step.state_indices = {0};
    for (std::int32_t b = 0; b < HiSparseShape::hot_blocks_per_row; ++b) step.hot_block_table.push_back(1 + r * HiSparseShape::hot_blocks_per_row + b);
    reference::HiSparseState state(1, H);
    const reference::HiSparseResult want = reference::resolve_model(tables, step, state);
    const std::size_t base = static_cast<std::size_t>(r) * K;
    std::string diff = compare_row("hot_indices", r, &hot[base], want.hot_indices.data(), K);
    if (diff.empty()) diff = compare_row("attention_indices", r, &attention[base], want.attention_indices.data(), K);
    if (diff.empty()) diff = compare_row("valid_counts", r, &valid[std::size_t(r)], want.valid_counts.data(), 1);
    if (diff.empty()) diff = compare_row("swap_counts", r, &swaps[std::size_t(r)], want.swap_counts.data(), 1);
    if (diff.empty()) diff = compare_row("swap_host_rows", r, &swap_host[base], want.swap_host_rows.data(), want.swap_counts[0]);
    if (diff.empty()) diff = compare_row("swap_device_rows", r, &swap_device[base], want.swap_device_rows.data(), want.swap_counts[0]);
    if (diff.empty()) diff = compare_row("slot_rows", r, &slot_rows[std::size_t(r) * H], state.slot_rows.data(), H);
    if (diff.empty()) diff = compare_row("lru", r, &lru[std::size_t(r) * H], state.lru.data(), H);
    if (!diff.empty()) return diff;
  }
  if (!with_pool_) return "";
  return compare_gathered(download_from<std::uint8_t>(device, stream, hot_cache_, 0, hot_cache_.bytes()), swap_host,
                          swap_device, swaps, seed_, 0);
}

std::string HiSparseRig::check_gathered(Device& device, Stream& stream, const Buffer& hot_cache, std::uint64_t pool_seed,
                                        std::int64_t pool_row_offset) {
  const auto entries = static_cast<std::size_t>(rows_) * K;
  return compare_gathered(download_from<std::uint8_t>(device, stream, hot_cache, 0, hot_cache.bytes()),
                          download_from<std::int32_t>(device, stream, swap_host_, 0, entries),
                          download_from<std::int32_t>(device, stream, swap_device_, 0, entries),
                          download_from<std::int32_t>(device, stream, swap_counts_, 0, static_cast<std::size_t>(rows_)),
                          pool_seed, pool_row_offset);
}

std::string HiSparseRig::compare_gathered(const std::vector<std::uint8_t>& cache, const std::vector<std::int32_t>& swap_host,
                                          const std::vector<std::int32_t>& swap_device, const std::vector<std::int32_t>& swaps,
                                          std::uint64_t pool_seed, std::int64_t pool_row_offset) const {
  for (std::int32_t r = 0; r < rows_; ++r) {
    for (std::int32_t m = 0; m < swaps[std::size_t(r)]; ++m) {
      const std::size_t e = static_cast<std::size_t>(r) * K + static_cast<std::size_t>(m);
      std::string diff = compare_pool_row(cache, swap_device[e], pool_row_offset + swap_host[e], pool_seed);
      if (!diff.empty()) return diff;
    }
  }
  return "";
}

}  // namespace sparse_mla::cli
