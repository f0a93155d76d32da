#include "validation/hisparse_rig.hpp"

#include <algorithm>
#include <cstring>

#include "sparse_mla/error.hpp"
#include "sparse_mla/fill.hpp"

namespace sparse_mla::validation {

// splitmix64 of the seed and the word's place.
std::uint64_t pool_word(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = (seed ^ (i * 0xD1B54A32D192ED03ULL)) + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

void fill_pool(Stream& stream, const Buffer& pool, std::uint64_t seed) {
  constexpr std::size_t chunk_words = std::size_t{8} << 20;  // 64 MiB per upload
  const std::size_t words = pool.bytes() / 8;
  const Tensor bytes = Tensor::of(pool, DType::u8, {static_cast<std::int64_t>(pool.bytes())});
  std::vector<std::uint64_t> chunk;
  for (std::size_t begin = 0; begin < words; begin += chunk_words) {
    chunk.resize(std::min(chunk_words, words - begin));
    for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = pool_word(seed, begin + i);
    const auto first = static_cast<std::int64_t>(begin * 8);
    upload_bytes(stream, chunk.data(), chunk.size() * 8, bytes.rows(first, first + static_cast<std::int64_t>(chunk.size() * 8)));
  }
}

std::vector<std::uint8_t> pool_row(std::uint64_t seed, std::int64_t row, std::int64_t row_bytes) {
  const std::int64_t words = row_bytes / 8;
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(row_bytes));
  for (std::int64_t w = 0; w < words; ++w) {
    const std::uint64_t word = pool_word(seed, static_cast<std::uint64_t>(row * words + w));
    std::memcpy(&bytes[static_cast<std::size_t>(w * 8)], &word, 8);
  }
  return bytes;
}

std::string compare_pool_row(const std::vector<std::uint8_t>& hot_cache, std::int64_t row_bytes, std::int64_t hot_row,
                             std::int64_t host_row, std::uint64_t seed) {
  const std::int64_t words = row_bytes / 8;
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

std::string compare_gathered(const std::vector<std::uint8_t>& hot_cache, std::int64_t row_bytes,
                             const reference::HiSparseResult& result, std::int32_t top_k, std::uint64_t seed,
                             std::int64_t pool_row_offset) {
  for (std::size_t r = 0; r < result.swap_counts.size(); ++r) {
    for (std::int32_t m = 0; m < result.swap_counts[r]; ++m) {
      const std::size_t e = r * static_cast<std::size_t>(top_k) + static_cast<std::size_t>(m);
      std::string diff = compare_pool_row(hot_cache, row_bytes, result.swap_device_rows[e],
                                          pool_row_offset + result.swap_host_rows[e], seed);
      if (!diff.empty()) return diff;
    }
  }
  return "";
}

HiSparseRig::HiSparseRig(Stream& stream, const reference::HiSparseTables& tables, const reference::HiSparseState& initial,
                         std::int32_t max_rows, std::int64_t row_bytes, std::int64_t hot_cache_blocks,
                         std::uint64_t pool_seed)
    : stream_(stream), tables_(tables), max_rows_(max_rows), row_bytes_(row_bytes), pool_seed_(pool_seed) {
  const reference::HiSparseTables& t = tables_;
  source_ = upload(stream, t.source_table, {t.source_rows, t.source_blocks});
  if (!t.resident_table.empty()) resident_ = upload(stream, t.resident_table, {t.resident_rows, t.resident_blocks});
  set_state(initial);
  counters_ = upload(stream, std::vector<std::int64_t>(2, 0), {2});
  if (hot_cache_blocks > 0) {
    host_pool_ = OwnedTensor(stream.device(), DType::u8, {t.host_rows, row_bytes}, MemoryKind::pinned_host);
    fill_pool(stream, host_pool_.buffer(), pool_seed);
    hot_cache_ = OwnedTensor(stream.device(), DType::u8, {hot_cache_blocks, t.hot_block_size, row_bytes});
    clear_hot_cache();
  }
}

void HiSparseRig::set_state(const reference::HiSparseState& state) {
  if (slot_rows_.defined() && slot_rows_.dim(0) == state.states() && slot_rows_.dim(1) == state.hot_slots) {
    upload_bytes(stream_, state.slot_rows.data(), state.slot_rows.size() * 4, slot_rows_);
    upload_bytes(stream_, state.lru.data(), state.lru.size() * 2, lru_);
    return;
  }
  slot_rows_ = upload(stream_, state.slot_rows, {state.states(), state.hot_slots});
  lru_ = upload(stream_, state.lru, {state.states(), state.hot_slots});
}

reference::HiSparseState HiSparseRig::state() const {
  reference::HiSparseState out;
  out.hot_slots = tables_.hot_slots;
  out.slot_rows = download<std::int32_t>(stream_, slot_rows_);
  out.lru = download<std::int16_t>(stream_, lru_);
  return out;
}

void HiSparseRig::clear_hot_cache() { stream_.fill(hot_cache_.buffer(), 0, 0xEE, hot_cache_.bytes()); }

std::vector<std::uint8_t> HiSparseRig::hot_cache_bytes() const { return download<std::uint8_t>(stream_, hot_cache_); }

std::vector<std::int64_t> HiSparseRig::hit_miss_counters() const { return download<std::int64_t>(stream_, counters_); }

HiSparseResolveInputs HiSparseRig::inputs(const Tensor& logical, const Tensor& request_ids, const Tensor& state_indices,
                                          const Tensor& hot_block_table) const {
  HiSparseResolveInputs in;
  in.logical = logical;
  in.request_ids = request_ids;
  in.request_state_indices = state_indices;
  in.source_block_table = source_;
  in.source_block_size = tables_.source_block_size;
  in.host_rows = tables_.host_rows;
  in.resident_block_table = resident_;
  in.resident_block_size = tables_.resident_block_size;
  in.resident_null_block = tables_.resident_null_block;
  in.hot_block_table = hot_block_table;
  in.hot_block_size = tables_.hot_block_size;
  in.attention_block_stride = tables_.attention_block_stride;
  return in;
}

void HiSparseRig::gather(const HiSparseResolveOutputs& out, std::int64_t rows) const {
  gather_hisparse(stream_, HiSparseGatherTensors{host_pool_, hot_cache_, out.swap_host_rows, out.swap_device_rows, out.swap_counts},
                  rows);
}

reference::HiSparseResult HiSparseRig::read(const HiSparseResolveOutputs& out, std::int32_t rows) const {
  const auto entries = [&](const Tensor& t) {
    return t.defined() ? download<std::int32_t>(stream_, t.rows(0, rows)) : std::vector<std::int32_t>{};
  };
  const auto counts = [&](const Tensor& t) {
    return t.defined() ? download<std::int32_t>(stream_, t.rows(0, rows)) : std::vector<std::int32_t>{};
  };
  reference::HiSparseResult r;
  r.hot_indices = entries(out.hot_indices);
  r.attention_indices = entries(out.attention_indices);
  r.resolved_rows = entries(out.resolved_rows);
  r.miss_mask = entries(out.miss_mask);
  r.swap_host_rows = entries(out.swap_host_rows);
  r.swap_device_rows = entries(out.swap_device_rows);
  r.valid_counts = counts(out.valid_counts);
  r.swap_counts = counts(out.swap_counts);
  return r;
}

void HiSparseRig::allocate_outputs(std::int32_t top_k) {
  if (hot_indices_.defined() && hot_indices_.dim(1) == top_k) return;
  for (OwnedTensor* o : {&hot_indices_, &attention_, &resolved_, &miss_, &swap_host_, &swap_device_}) {
    *o = OwnedTensor(stream_.device(), DType::i32, {max_rows_, top_k});
  }
  valid_ = OwnedTensor(stream_.device(), DType::i32, {max_rows_});
  swaps_ = OwnedTensor(stream_.device(), DType::i32, {max_rows_});
  poison_outputs();
}

HiSparseResolveOutputs HiSparseRig::outputs() {
  allocate_outputs(hot_indices_.defined() ? static_cast<std::int32_t>(hot_indices_.dim(1)) : tables_.top_k);
  HiSparseResolveOutputs out;
  out.hot_indices = hot_indices_;
  out.swap_host_rows = swap_host_;
  out.swap_device_rows = swap_device_;
  out.swap_counts = swaps_;
  if (optional_outputs) {
    out.attention_indices = attention_;
    out.resolved_rows = resolved_;
    out.miss_mask = miss_;
    out.valid_counts = valid_;
    out.hit_miss_counters = counters_;
  }
  return out;
}

void HiSparseRig::poison_outputs() {
  allocate_outputs(hot_indices_.defined() ? static_cast<std::int32_t>(hot_indices_.dim(1)) : tables_.top_k);
  for (const OwnedTensor* o : {&hot_indices_, &attention_, &resolved_, &miss_, &swap_host_, &swap_device_, &valid_, &swaps_}) {
    fill_i32(stream_, *o, poison);
  }
}

reference::HiSparseResult HiSparseRig::run(const reference::HiSparseStep& step) {
  const std::int32_t T = step.rows();
  const auto K = static_cast<std::int32_t>(step.logical.size() / static_cast<std::size_t>(T));
  allocate_outputs(K);
  const OwnedTensor logical = upload(stream_, step.logical, {T, K});
  const OwnedTensor ids = upload(stream_, step.request_ids, {T});
  const OwnedTensor states = upload(stream_, step.state_indices, {T});
  const OwnedTensor hot_table = upload(stream_, step.hot_block_table, {T, tables_.hot_blocks_per_row});
  poison_outputs();
  HiSparseResolveInputs in = inputs(logical, ids, states, hot_table);
  if (hot_table_by_state.defined()) {
    in.hot_block_table = hot_table_by_state;
    in.hot_table_by_state = true;
  }
  const HiSparseResolveOutputs out = outputs();
  resolve_hisparse(stream_, in, slot_state(), tables_.hot_slots, out);
  if (hot_cache_.defined()) gather(out, T);
  // Every output, the optional ones too (their buffers keep the poison when
  // the step did not ask for them).
  HiSparseResolveOutputs all = out;
  all.attention_indices = attention_;
  all.resolved_rows = resolved_;
  all.miss_mask = miss_;
  all.valid_counts = valid_;
  return read(all, T);
}

}  // namespace sparse_mla::validation
