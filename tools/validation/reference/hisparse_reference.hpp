// A scalar model of HiSparse (SPEC section 5), written from the SPEC text
// with plain loops and standard containers: no hash set, no prefix sums.
// Tests compare the kernels against it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace sparse_mla::reference {

struct HiSparseTables {
  std::int32_t top_k = 0;
  std::int32_t hot_slots = 0;
  std::vector<std::int32_t> source_table;  // [source_rows, source_blocks]
  std::int32_t source_rows = 0, source_blocks = 0, source_block_size = 64;
  std::int64_t host_rows = 0;
  std::vector<std::int32_t> resident_table;  // [resident_rows, resident_blocks], may be empty
  std::int32_t resident_rows = 0, resident_blocks = 0, resident_block_size = 64, resident_null_block = 0;
  std::int32_t hot_blocks_per_row = 0, hot_block_size = 64;
  std::int64_t attention_block_stride = 64;
};

// Slot state of every state row.
struct HiSparseState {
  std::int32_t hot_slots = 0;
  std::vector<std::int32_t> slot_rows;  // [states, hot_slots]
  std::vector<std::int16_t> lru;        // [states, hot_slots]

  HiSparseState() = default;
  HiSparseState(std::int32_t states, std::int32_t H) : hot_slots(H), slot_rows(std::size_t(states) * H, -1), lru(std::size_t(states) * H) {
    for (std::int32_t s = 0; s < states; ++s)
      for (std::int32_t i = 0; i < H; ++i) lru[std::size_t(s) * H + i] = static_cast<std::int16_t>(i);
  }
  std::int32_t states() const { return hot_slots ? static_cast<std::int32_t>(lru.size() / hot_slots) : 0; }
};

// One step's inputs, by batch row.
struct HiSparseStep {
  std::vector<std::int32_t> logical;  // [rows, top_k]
  std::vector<std::int32_t> request_ids;
  std::vector<std::int32_t> state_indices;
  std::vector<std::int32_t> hot_block_table;  // [rows, hot_blocks_per_row]
  std::int32_t rows() const { return static_cast<std::int32_t>(request_ids.size()); }
};

// One step's outputs. Swap entries past swap_counts[row] are left at -2.
struct HiSparseResult {
  std::vector<std::int32_t> hot_indices, attention_indices, resolved_rows, miss_mask;
  std::vector<std::int32_t> swap_host_rows, swap_device_rows;
  std::vector<std::int32_t> valid_counts, swap_counts;
  std::uint64_t hits = 0, misses = 0;
};

inline std::int32_t model_host_row(const HiSparseTables& t, std::int32_t request, std::int32_t tok) {
  if (tok < 0 || request < 0 || request >= t.source_rows) return -1;
  const std::int32_t block = tok / t.source_block_size;
  if (block >= t.source_blocks) return -1;
  const std::int32_t physical = t.source_table[std::size_t(request) * t.source_blocks + block];
  if (physical < 0) return -1;
  const std::int64_t g = std::int64_t(physical) * t.source_block_size + tok % t.source_block_size;
  return g < t.host_rows ? static_cast<std::int32_t>(g) : -1;
}

inline std::int32_t model_resident_row(const HiSparseTables& t, std::int32_t request, std::int32_t tok) {
  if (t.resident_table.empty() || tok < 0 || request < 0 || request >= t.resident_rows) return -1;
  const std::int32_t block = tok / t.resident_block_size;
  if (block >= t.resident_blocks) return -1;
  const std::int32_t physical = t.resident_table[std::size_t(request) * t.resident_blocks + block];
  if (physical < 0 || physical == t.resident_null_block) return -1;
  return physical * t.resident_block_size + tok % t.resident_block_size;
}

inline std::int32_t model_hot_row(const HiSparseTables& t, const HiSparseStep& step, std::int32_t row, std::int32_t slot) {
  const std::int32_t block = step.hot_block_table[std::size_t(row) * t.hot_blocks_per_row + slot / t.hot_block_size];
  return block * t.hot_block_size + slot % t.hot_block_size;
}

inline std::int32_t model_attention_index(const HiSparseTables& t, std::int32_t x) {
  if (x < 0) return -1;
  return static_cast<std::int32_t>((x / t.hot_block_size) * t.attention_block_stride + x % t.hot_block_size);
}

// Resolves one step and updates `state` (the swap-in of SPEC section 5).
inline HiSparseResult resolve_model(const HiSparseTables& t, const HiSparseStep& step, HiSparseState& state) {
  const std::int32_t K = t.top_k, H = t.hot_slots;
  const std::size_t n = std::size_t(step.rows()) * K;
  HiSparseResult r;
  r.hot_indices.assign(n, -1);
  r.attention_indices.assign(n, -1);
  r.resolved_rows.assign(n, -1);
  r.miss_mask.assign(n, 0);
  r.swap_host_rows.assign(n, -2);
  r.swap_device_rows.assign(n, -2);
  r.valid_counts.assign(std::size_t(step.rows()), 0);
  r.swap_counts.assign(std::size_t(step.rows()), 0);
  for (std::int32_t b = 0; b < step.rows(); ++b) {
    const std::size_t base = std::size_t(b) * K;
    const std::int32_t s = step.state_indices[std::size_t(b)];
    if (s < 0 || s >= state.states()) continue;  // padding: all -1, counts 0, state untouched
    const std::int32_t request = step.request_ids[std::size_t(b)];

    // Step 1: host and resident rows; resident entries bypass the LRU.
    std::vector<std::int32_t> wanted;  // distinct host rows, in order of first selection
    std::vector<std::int32_t> first_entry;
    for (std::int32_t j = 0; j < K; ++j) {
      const std::int32_t tok = step.logical[base + j];
      const std::int32_t g = model_host_row(t, request, tok);
      const std::int32_t resident = model_resident_row(t, request, tok);
      r.resolved_rows[base + j] = g;
      if (resident >= 0 || g >= 0) ++r.valid_counts[std::size_t(b)];
      if (resident >= 0) {
        r.hot_indices[base + j] = resident;
      } else if (g >= 0 && std::find(wanted.begin(), wanted.end(), g) == wanted.end()) {
        wanted.push_back(g);
        first_entry.push_back(j);
      }
    }
    if (wanted.empty()) {
      for (std::int32_t j = 0; j < K; ++j) r.attention_indices[base + j] = model_attention_index(t, r.hot_indices[base + j]);
      continue;  // nothing consults the LRU
    }

    // Step 2: scan the slots in LRU order.
    std::int32_t* slot_rows = &state.slot_rows[std::size_t(s) * H];
    std::int16_t* lru = &state.lru[std::size_t(s) * H];
    std::vector<std::int32_t> hits, evictable;
    std::vector<std::int32_t> slot_of_wanted(wanted.size(), -1);
    for (std::int32_t p = 0; p < H; ++p) {
      const std::int32_t slot = lru[p];
      const auto it = std::find(wanted.begin(), wanted.end(), slot_rows[slot]);
      if (slot_rows[slot] >= 0 && it != wanted.end()) {
        hits.push_back(slot);
        slot_of_wanted[std::size_t(it - wanted.begin())] = slot;
      } else {
        evictable.push_back(slot);
      }
    }
    // Step 3: the m-th missing row takes the m-th oldest evictable slot.
    std::int32_t m = 0;
    for (std::size_t w = 0; w < wanted.size(); ++w) {
      if (slot_of_wanted[w] >= 0) continue;
      const std::int32_t slot = evictable[std::size_t(m)];
      slot_rows[slot] = wanted[w];
      slot_of_wanted[w] = slot;
      r.swap_host_rows[base + m] = wanted[w];
      r.swap_device_rows[base + m] = model_hot_row(t, step, b, slot);
      r.miss_mask[base + first_entry[w]] = 1;
      ++m;
    }
    // Step 4: untouched evictable, newly loaded, hits.
    std::vector<std::int32_t> order(evictable.begin() + m, evictable.end());
    order.insert(order.end(), evictable.begin(), evictable.begin() + m);
    order.insert(order.end(), hits.begin(), hits.end());
    for (std::int32_t p = 0; p < H; ++p) lru[p] = static_cast<std::int16_t>(order[std::size_t(p)]);
    r.swap_counts[std::size_t(b)] = m;
    r.hits += hits.size();
    r.misses += std::uint64_t(m);

    // Step 5: outputs.
    for (std::int32_t j = 0; j < K; ++j) {
      const std::int32_t g = r.resolved_rows[base + j];
      if (r.hot_indices[base + j] < 0 && g >= 0) {
        const std::size_t w = std::size_t(std::find(wanted.begin(), wanted.end(), g) - wanted.begin());
        r.hot_indices[base + j] = model_hot_row(t, step, b, slot_of_wanted[w]);
      }
      r.attention_indices[base + j] = model_attention_index(t, r.hot_indices[base + j]);
    }
  }
  return r;
}

// Speculative decoding (HiSparseConfig::max_rows_per_request = R > 1), as
// docs/hisparse.md "Speculative decoding" states it, one request at a time.
// A request is a maximal run of consecutive batch rows with a valid state
// index and equal state index and request id. A request of more than R rows,
// or one whose state row an earlier request of the step has, is refused: its
// rows stay padding (and a refused first request leaves its state
// untouched). Every other request resolves
// once: its union row (its rows' distinct non-negative positions in row-major
// order of first selection, then -1, R * K wide) goes through resolve_model
// with the request id and hot blocks of its first row, and each of its rows
// reads its entries' outputs from there (the miss mask only at the entry that
// selected a position first), counts its hot rows that are not -1 and takes
// the union's swap pairs r * K .. r * K + K - 1 (r: the row within the
// request). Hits and misses are the unions'.
inline HiSparseResult resolve_mtp_model(const HiSparseTables& t, const HiSparseStep& step, HiSparseState& state,
                                        std::int32_t max_rows_per_request) {
  const std::int32_t K = t.top_k, R = max_rows_per_request, T = step.rows();
  const std::size_t n = std::size_t(T) * K;
  HiSparseResult r;
  r.hot_indices.assign(n, -1);
  r.attention_indices.assign(n, -1);
  r.resolved_rows.assign(n, -1);
  r.miss_mask.assign(n, 0);
  r.swap_host_rows.assign(n, -2);
  r.swap_device_rows.assign(n, -2);
  r.valid_counts.assign(std::size_t(T), 0);
  r.swap_counts.assign(std::size_t(T), 0);

  struct Request {
    std::int32_t first, end;  // batch rows [first, end)
  };
  std::vector<Request> requests;
  for (std::int32_t b = 0; b < T;) {
    const std::int32_t s = step.state_indices[std::size_t(b)];
    if (s < 0 || s >= state.states()) {
      ++b;
      continue;
    }
    std::int32_t e = b + 1;
    while (e < T && step.state_indices[std::size_t(e)] == s && step.request_ids[std::size_t(e)] == step.request_ids[std::size_t(b)]) ++e;
    requests.push_back(Request{b, e});
    b = e;
  }

  HiSparseTables union_tables = t;
  union_tables.top_k = R * K;
  for (const Request& q : requests) {
    const std::int32_t s = step.state_indices[std::size_t(q.first)];
    bool refused = q.end - q.first > R;
    for (const Request& earlier : requests) {
      if (earlier.first < q.first && step.state_indices[std::size_t(earlier.first)] == s) refused = true;
    }
    if (refused) continue;

    std::vector<std::int32_t> positions;  // the union, in row-major order of first selection
    for (std::int32_t b = q.first; b < q.end; ++b) {
      for (std::int32_t j = 0; j < K; ++j) {
        const std::int32_t tok = step.logical[std::size_t(b) * K + j];
        if (tok >= 0 && std::find(positions.begin(), positions.end(), tok) == positions.end()) positions.push_back(tok);
      }
    }
    HiSparseStep u;
    u.logical = positions;
    u.logical.resize(std::size_t(R) * K, -1);
    u.request_ids = {step.request_ids[std::size_t(q.first)]};
    u.state_indices = {s};
    u.hot_block_table.assign(step.hot_block_table.begin() + std::ptrdiff_t(q.first) * t.hot_blocks_per_row,
                             step.hot_block_table.begin() + std::ptrdiff_t(q.first + 1) * t.hot_blocks_per_row);
    const HiSparseResult ur = resolve_model(union_tables, u, state);
    r.hits += ur.hits;
    r.misses += ur.misses;

    std::vector<std::int32_t> seen;  // positions already selected by an earlier entry of the request
    for (std::int32_t b = q.first; b < q.end; ++b) {
      const std::size_t base = std::size_t(b) * K;
      for (std::int32_t j = 0; j < K; ++j) {
        const std::int32_t tok = step.logical[base + j];
        if (tok < 0) continue;
        const std::size_t p = std::size_t(std::find(positions.begin(), positions.end(), tok) - positions.begin());
        const bool first = std::find(seen.begin(), seen.end(), tok) == seen.end();
        if (first) seen.push_back(tok);
        r.hot_indices[base + j] = ur.hot_indices[p];
        r.attention_indices[base + j] = ur.attention_indices[p];
        r.resolved_rows[base + j] = ur.resolved_rows[p];
        r.miss_mask[base + j] = first ? ur.miss_mask[p] : 0;
        if (ur.hot_indices[p] >= 0) ++r.valid_counts[std::size_t(b)];
      }
      const std::int32_t row = b - q.first;
      const std::int32_t count = std::max(0, std::min(K, ur.swap_counts[0] - row * K));
      r.swap_counts[std::size_t(b)] = count;
      for (std::int32_t c = 0; c < count; ++c) {
        r.swap_host_rows[base + c] = ur.swap_host_rows[std::size_t(row) * K + c];
        r.swap_device_rows[base + c] = ur.swap_device_rows[std::size_t(row) * K + c];
      }
    }
  }
  return r;
}

// The row gather: copies every swap pair from the host pool into the hot
// cache (hot row x at byte (x / block_size) * block_stride + (x % block_size) * row_bytes).
inline void gather_model(const HiSparseResult& r, std::int32_t top_k, const std::vector<std::uint8_t>& host_pool,
                         std::int64_t row_bytes, std::vector<std::uint8_t>& hot_cache, std::int32_t block_size,
                         std::int64_t block_stride) {
  const std::int64_t host_rows = std::int64_t(host_pool.size()) / row_bytes;
  const std::int64_t hot_rows = std::int64_t(hot_cache.size()) / block_stride * block_size;
  for (std::size_t b = 0; b < r.swap_counts.size(); ++b) {
    for (std::int32_t m = 0; m < r.swap_counts[b]; ++m) {
      const std::int32_t g = r.swap_host_rows[b * std::size_t(top_k) + std::size_t(m)];
      const std::int32_t x = r.swap_device_rows[b * std::size_t(top_k) + std::size_t(m)];
      if (g < 0 || x < 0 || x >= hot_rows) continue;
      std::uint8_t* dst = &hot_cache[std::size_t((x / block_size) * block_stride + (x % block_size) * row_bytes)];
      if (g < host_rows) {
        std::memcpy(dst, &host_pool[std::size_t(g * row_bytes)], std::size_t(row_bytes));
      } else {
        std::memset(dst, 0, std::size_t(row_bytes));
      }
    }
  }
}

}  // namespace sparse_mla::reference
