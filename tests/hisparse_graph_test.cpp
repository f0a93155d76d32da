// A whole HiSparse decode step of multi-layer groups (SPEC sections 4 and 5;
// docs/hisparse.md, "One decode step"), as an engine queues it:
//
//   per group:  write_rows for every layer + invalidate_rows once (host mirror)
//               indexer: the group's logical top-k into the engine's buffer
//   per layer:  set_logical_topk_ready, prepare_for_batch, convert (the leader
//               resolves once on the side stream, gathers every layer's rows
//               and records that layer's ready event; the compute stream
//               waits for the layer's own event), then "attention" on the
//               compute stream: the rows the layer's hot cache holds at its
//               attention indices, and the indices and valid counts it got.
//
// HiSparseStepTest runs a sequence of steps eagerly on every backend, host
// included. On the host, one side of the fork lags behind the other, every
// task delayed (the groups' side streams at even steps, the compute stream at
// odd ones), so that a missing or too weak wait gives wrong rows every time,
// and the step is queued behind a gate that holds the compute stream, so
// that a host synchronisation inside the step shows. HiSparseGraphTest runs
// the same steps with the same code, but captures one step into a graph and
// replays it with new selections, batch rows and new rows written in place;
// backends without graphs (host) skip with the reason they give.
//
// After every step both compare, exactly, against the scalar model
// (tools/validation/reference/hisparse_reference.hpp) stepping in lockstep: every
// layer's attention indices, valid counts and the bytes attention read (host
// rows of the layer's pool), every layer's whole hot cache and host pool,
// and each group's hot indices, miss mask, swap counts and swap lists (read
// from the device after the step), slot rows and LRU order.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend_test.hpp"
#include "host/host_device.hpp"
#include "validation/reference/hisparse_reference.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/hisparse_group.hpp"
#include "sparse_mla/index_group_builder.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "host_gate.hpp"
#include "test_util.hpp"

namespace sparse_mla::testing {
namespace {

constexpr std::int32_t K = 128;                 // top-k
constexpr std::int32_t H = 256;                 // hot slots per state row (2K)
constexpr std::int32_t block_size = 16;         // host pool and hot cache blocks
constexpr std::int32_t attention_stride = 32;   // rows between hot blocks as attention reads them
constexpr std::int32_t hot_blocks = H / block_size;  // hot blocks per state row
constexpr std::int32_t requests = 4;
constexpr std::int32_t state_rows = 6;          // max_requests: state rows a group holds
constexpr std::int32_t blocks = 40;             // source blocks per request: 640 tokens
constexpr std::int32_t context = blocks * block_size;
constexpr std::int32_t pool_blocks = state_rows * blocks + 8;
constexpr std::int64_t pool_rows = std::int64_t(pool_blocks) * block_size;
constexpr std::int32_t T = 6;                   // batch rows of every step: the requests, then padding
constexpr std::int64_t max_decode_rows = 8;
constexpr std::int64_t logical_rows = 16;       // rows of the engine's logical top-k buffer
constexpr int num_layers = 6;
constexpr int index_every = 3;                  // two groups of three layers
constexpr int num_groups = num_layers / index_every;
constexpr int steps = 8;

HiSparseConfig hisparse_config() {
  HiSparseConfig c;
  c.hot_slots = H;
  c.max_requests = state_rows;
  c.max_tokens_per_request = context;
  c.host_pool_rows = pool_rows;
  c.block_size = block_size;
  c.attention_block_stride = attention_stride;
  return c;
}

// Row sizes 656, 128, 32 | 1152, 656, 64 bytes.
LayerConfig layer_config(int layer) {
  static const std::pair<const char*, std::int64_t> kinds[num_layers] = {
      {"fp8_ds_mla", 576}, {"bfloat16", 64}, {"float32", 8}, {"bfloat16", 576}, {"fp8_ds_mla", 576}, {"float16", 32}};
  LayerConfig c;
  c.kv_cache_dtype = kinds[layer].first;
  c.head_size = kinds[layer].second;
  c.hisparse = hisparse_config();
  return c;
}

// One step's inputs, on the host.
struct StepPlan {
  std::vector<std::int32_t> request_ids, state_indices;  // [T]; state -1 = padding row
  std::vector<std::vector<std::int32_t>> logical;        // per group, [T, K]: what its indexer outputs
  std::vector<std::int32_t> write_host_rows;             // [requests]: host mirror, -1 = nothing
  std::vector<std::int32_t> write_state_rows;            // [requests]
  std::vector<std::vector<std::uint8_t>> write_bytes;    // per layer, [requests, row_bytes]
};

std::string hex(std::uint8_t b) {
  char s[8];
  std::snprintf(s, sizeof s, "0x%02x", b);
  return s;
}

// Compares rows of `width` entries; reports up to 5 mismatches, each with its
// row and column, and how many there are. Returns whether all match.
template <class V>
bool same(const std::string& where, const std::string& what, const std::vector<V>& got, const std::vector<V>& want,
          std::size_t width, const char* row_name, const char* column_name) {
  if (got.size() != want.size()) {
    ADD_FAILURE() << where << ": " << what << " has " << got.size() << " entries, want " << want.size();
    return false;
  }
  if (got == want) return true;
  std::size_t bad = 0;
  std::ostringstream out;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (bad++ < 5) {
      out << "\n  " << row_name << " " << i / width;
      if (width > 1) out << ", " << column_name << " " << i % width;
      out << ": got " << static_cast<long long>(got[i]) << ", want " << static_cast<long long>(want[i]);
    }
  }
  if (bad == 0) return true;
  ADD_FAILURE() << where << ": " << what << " differs in " << bad << " of " << got.size() << " entries" << out.str();
  return false;
}

// The model under test: two HiSparse groups of three layers built by the
// builder, the step's device inputs (rewritten in place by write_inputs, so
// that a captured step reads them), every layer's outputs, and the scalar
// model of all of it.
class StepRig {
 public:
  // engine_stream: the compute stream is the engine's own native stream,
  // wrapped (Device::wrap_stream); engine() is its owner, which captures.
  StepRig(std::shared_ptr<Device> d, std::mt19937_64& rng, bool engine_stream = false)
      : device_(std::move(d)),
        engine_(engine_stream ? device_->create_stream() : nullptr),
        compute_(engine_ ? device_->wrap_stream(engine_->native_handle()) : device_->create_stream()),
        rng_(rng) {
    logical_storage_ = device_->allocate(std::size_t(logical_rows * K) * 4, MemoryKind::device);
    logical_buffer_ = Tensor::of(logical_storage_, DType::i32, {logical_rows, K});
    builder_ = std::make_unique<SparseMLAIndexGroupBuilder>(device_, logical_buffer_, max_decode_rows);
    for (int l = 0; l < num_layers; ++l) {
      layers_.push_back(builder_->register_layer(l % index_every == 0, layer_config(l)));
      if (layers_.back().index_in_group == 0) group_first_layer_.push_back(l);
      group_of_layer_.push_back(static_cast<int>(group_first_layer_.size()) - 1);
    }
    if (builder_->groups().size() != std::size_t(num_groups)) fail("StepRig", "the builder made ", builder_->groups().size(), " groups");
    for (int l = 0; l < num_layers; ++l) row_bytes_.push_back(cache(l).row_bytes());

    // Tables: request r's logical blocks are random pool blocks; its last
    // block points past the pool (its tokens resolve to -1).
    tables_.top_k = K;
    tables_.hot_slots = H;
    tables_.source_rows = requests;
    tables_.source_blocks = blocks;
    tables_.source_block_size = block_size;
    tables_.host_rows = pool_rows;
    tables_.hot_block_size = block_size;
    tables_.hot_blocks_per_row = hot_blocks;
    tables_.attention_block_stride = attention_stride;
    std::vector<std::int32_t> ids(pool_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    tables_.source_table.assign(ids.begin(), ids.begin() + requests * blocks);
    for (std::int32_t r = 0; r < requests; ++r) tables_.source_table[std::size_t(r * blocks + blocks - 1)] = pool_blocks + r;
    std::vector<std::int32_t> states(state_rows);
    std::iota(states.begin(), states.end(), 0);
    std::shuffle(states.begin(), states.end(), rng_);
    request_state_.assign(states.begin(), states.begin() + requests);

    // Device inputs, written in place every step.
    source_ = device_tensor(*device_, *compute_, tables_.source_table, {requests, blocks});
    for (int g = 0; g < num_groups; ++g) indexer_out_.push_back(allocate(DType::i32, {T, K}));
    request_ids_ = allocate(DType::i32, {T});
    state_indices_ = allocate(DType::i32, {T});
    write_host_rows_ = allocate(DType::i32, {requests});
    write_state_rows_ = allocate(DType::i32, {requests});
    for (int l = 0; l < num_layers; ++l) write_rows_.push_back(allocate(DType::u8, {requests, row_bytes_[std::size_t(l)]}));
    hisparse_.request_state_indices = state_indices_.tensor;
    batch_.req_id_per_token = request_ids_.tensor;
    batch_.block_table = source_.tensor;
    batch_.block_size = block_size;
    batch_.num_decodes = T;
    batch_.num_decode_tokens = T;
    batch_.hisparse = &hisparse_;

    // Outputs of every layer's "attention".
    no_host_rows_ = device_tensor(*device_, *compute_, std::vector<std::int32_t>(std::size_t(T * K), -1), {T * K});
    for (int l = 0; l < num_layers; ++l) {
      attention_out_.push_back(allocate(DType::i32, {T, K}));
      valid_out_.push_back(allocate(DType::i32, {T}));
      read_out_.push_back(allocate(DType::u8, {T * K, row_bytes_[std::size_t(l)]}));
    }

    // Every layer's host pool starts with random rows, through the host mirror.
    std::vector<std::int32_t> all(static_cast<std::size_t>(pool_rows));
    std::iota(all.begin(), all.end(), 0);
    const DeviceTensor all_ids = device_tensor(*device_, *compute_, all, {pool_rows});
    for (int l = 0; l < num_layers; ++l) {
      std::vector<std::uint8_t> bytes(std::size_t(pool_rows * row_bytes_[std::size_t(l)]));
      for (auto& b : bytes) b = static_cast<std::uint8_t>(rng_());
      const DeviceTensor rows = device_tensor(*device_, *compute_, bytes, {pool_rows, row_bytes_[std::size_t(l)]});
      group(l).write_rows(layers_[std::size_t(l)].index_in_group, *compute_, rows.tensor, all_ids.tensor);
      compute_->synchronize();
      pools_.push_back(std::move(bytes));
      hot_.emplace_back(static_cast<std::size_t>(cache(l).attention_cache().numel()), std::uint8_t{0});
    }
    states_.assign(num_groups, reference::HiSparseState(state_rows, H));
    previous_.assign(num_groups, std::vector<std::vector<std::int32_t>>(requests));
    want_.resize(num_groups);
    hits_.assign(num_groups, 0);
    misses_.assign(num_groups, 0);
  }

  Stream& compute() { return *compute_; }
  Stream& engine() { return engine_ ? *engine_ : *compute_; }

  // Host backend: every task of the groups' side streams (side = true) or of
  // the compute stream (false) first sleeps `us` microseconds; 0 = neither.
  void lag(bool side, std::uint32_t us) {
    const auto set = [](Stream& stream, std::uint32_t delay) {
      if (auto* h = dynamic_cast<host::HostStream*>(&stream)) h->set_debug_delay_us(delay);
    };
    set(*compute_, side ? 0 : us);
    for (int gi = 0; gi < num_groups; ++gi) set(leader(gi).side_stream(), side ? us : 0);
  }

  // Random inputs of step `step`: every request (one idles at some steps) in
  // a random batch row, padding in the others; each group's selection keeps
  // about half of the request's previous one (hits) and adds new tokens
  // (misses, evictions once the slots fill up), with a few -1 entries,
  // duplicates and tokens past the table (and at some steps one row of
  // group 1 with nothing to look up). Each request also rewrites one row
  // through the host mirror, mostly one it selects again, so that the
  // invalidated slot must be reloaded with the new bytes.
  StepPlan make_plan(int step) {
    StepPlan p;
    std::vector<std::int32_t> active(requests);
    std::iota(active.begin(), active.end(), 0);
    std::shuffle(active.begin(), active.end(), rng_);
    if (step % 3 == 2) active.pop_back();
    std::vector<std::int32_t> rows(T);
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng_);
    p.request_ids.assign(T, 0);
    p.state_indices.assign(T, -1);
    for (std::int32_t b = 0; b < T; ++b) p.request_ids[std::size_t(b)] = static_cast<std::int32_t>(rng_() % requests);
    for (std::size_t i = 0; i < active.size(); ++i) {
      p.request_ids[std::size_t(rows[i])] = active[i];
      p.state_indices[std::size_t(rows[i])] = request_state_[std::size_t(active[i])];
    }
    std::vector<std::vector<std::int32_t>> before = previous_[0];
    for (int g = 0; g < num_groups; ++g) {
      p.logical.emplace_back(std::size_t(T * K));
      for (std::int32_t b = 0; b < T; ++b) {
        std::vector<std::int32_t> sel;
        if (p.state_indices[std::size_t(b)] < 0) {
          sel = selection({});  // padding: any tokens, the resolve must ignore them
        } else if (g == 1 && step % 4 == 3 && p.request_ids[std::size_t(b)] == active[0]) {
          // Nothing to look up (every entry -1 or past the table): the row
          // returns before it touches its LRU.
          for (std::int32_t j = 0; j < K; ++j) sel.push_back(j % 2 ? -1 : context + j);
          previous_[std::size_t(g)][std::size_t(active[0])].clear();
        } else {
          auto& prev = previous_[std::size_t(g)][std::size_t(p.request_ids[std::size_t(b)])];
          sel = selection(prev);
          prev = sel;
        }
        std::copy(sel.begin(), sel.end(), p.logical[std::size_t(g)].begin() + std::ptrdiff_t(b) * K);
      }
    }
    p.write_host_rows.assign(requests, -1);
    p.write_state_rows.assign(requests, -1);
    for (std::int32_t r = 0; r < requests; ++r) {
      p.write_state_rows[std::size_t(r)] = request_state_[std::size_t(r)];
      const auto& now = previous_[0][std::size_t(r)];
      const auto& old = before[std::size_t(r)];
      std::vector<std::int32_t> again;  // selected in group 0 last step and this step
      for (std::int32_t tok : now) {
        if (std::find(old.begin(), old.end(), tok) != old.end() && reference::model_host_row(tables_, r, tok) >= 0) again.push_back(tok);
      }
      const std::uint64_t pick = rng_() % 8;
      std::int32_t tok = -1;
      if (pick < 5 && !again.empty()) {
        tok = again[rng_() % again.size()];
      } else if (pick < 7) {
        tok = static_cast<std::int32_t>(rng_() % context);
      }
      p.write_host_rows[std::size_t(r)] = reference::model_host_row(tables_, r, tok);
    }
    for (int l = 0; l < num_layers; ++l) {
      p.write_bytes.emplace_back(std::size_t(requests * row_bytes_[std::size_t(l)]));
      for (auto& b : p.write_bytes.back()) b = static_cast<std::uint8_t>(rng_());
    }
    plans_.push_back(p);
    return p;
  }

  // Writes the step's inputs into the device buffers the step reads (in
  // place: a captured step reads the same memory), and waits for the copies.
  void write_inputs(const StepPlan& p) {
    for (int g = 0; g < num_groups; ++g) put(indexer_out_[std::size_t(g)], p.logical[std::size_t(g)]);
    put(request_ids_, p.request_ids);
    put(state_indices_, p.state_indices);
    put(write_host_rows_, p.write_host_rows);
    put(write_state_rows_, p.write_state_rows);
    for (int l = 0; l < num_layers; ++l) put(write_rows_[std::size_t(l)], p.write_bytes[std::size_t(l)]);
  }

  // Poisons what the step writes (every layer's outputs, each group's
  // resolve workspace) and the logical top-k buffer the indexers write, so
  // that anything the step leaves unwritten shows.
  void poison() {
    const auto fill = [&](const Tensor& t) { compute_->fill_bytes(t.data(), poison_byte, std::size_t(t.numel()) * t.element_size()); };
    fill(logical_buffer_);
    for (int l = 0; l < num_layers; ++l) {
      fill(attention_out_[std::size_t(l)].tensor);
      fill(valid_out_[std::size_t(l)].tensor);
      fill(read_out_[std::size_t(l)].tensor);
    }
    for (int g = 0; g < num_groups; ++g) {
      const HiSparseMLAIndexGroup& gr = leader(g);
      for (const Tensor* t : {&gr.physical_workspace(), &gr.valid_counts_workspace(), &gr.hot_indices(), &gr.miss_mask(),
                              &gr.swap_host_rows(), &gr.swap_device_rows(), &gr.swap_counts()}) {
        fill(*t);
      }
    }
    compute_->synchronize();
  }

  // The whole decode step, as the engine's forward pass queues it, on
  // `compute`: nothing else (no host reads, no synchronisation).
  void queue_step(Stream& compute) {
    const Tensor logical = logical_buffer_.rows(0, T);
    TopkConversion previous;
    for (int l = 0; l < num_layers; ++l) {
      const LayerRegistration& reg = layers_[std::size_t(l)];
      HiSparseMLAIndexGroup& g = group(l);
      const int gi = group_of_layer_[std::size_t(l)];
      if (reg.index_in_group == 0) {
        // Host mirror first, for every layer of the group; then the indexer.
        for (int i = 0; i < g.num_layers(); ++i) {
          g.write_rows(i, compute, write_rows_[std::size_t(group_first_layer_[std::size_t(gi)] + i)].tensor,
                       write_host_rows_.tensor);
        }
        g.invalidate_rows(compute, write_host_rows_.tensor, write_state_rows_.tensor);
        compute.copy(logical_storage_, 0, indexer_out_[std::size_t(gi)].buffer, 0, std::size_t(T * K) * 4);
      }
      g.set_logical_topk_ready(reg.index_in_group, compute);
      g.prepare_for_batch(reg.index_in_group, batch_, compute);
      TopkConversion conv = g.convert_logical_to_physical_topk(reg.index_in_group, compute, logical, batch_, 0, true);
      read_rows(compute, l, conv);
      if (l > 0) keep_indices(compute, l - 1, previous);
      previous = std::move(conv);
    }
    keep_indices(compute, num_layers - 1, previous);
  }

  // Steps the model through the plan: host mirror, invalidation, one resolve
  // per group, every layer's gather.
  void advance_model(const StepPlan& p) {
    for (int l = 0; l < num_layers; ++l) {
      const std::size_t rb = std::size_t(row_bytes_[std::size_t(l)]);
      for (std::int32_t n = 0; n < requests; ++n) {
        const std::int32_t g = p.write_host_rows[std::size_t(n)];
        if (g < 0 || g >= pool_rows) continue;
        std::copy_n(p.write_bytes[std::size_t(l)].begin() + std::ptrdiff_t(n * rb), rb,
                    pools_[std::size_t(l)].begin() + std::ptrdiff_t(std::size_t(g) * rb));
      }
    }
    for (int gi = 0; gi < num_groups; ++gi) {
      reference::HiSparseState& st = states_[std::size_t(gi)];
      std::vector<std::pair<std::int32_t, std::int32_t>> invalidated;  // (state row, host row)
      for (std::int32_t n = 0; n < requests; ++n) {
        const std::int32_t g = p.write_host_rows[std::size_t(n)], s = p.write_state_rows[std::size_t(n)];
        if (g < 0 || s < 0 || s >= state_rows) continue;
        for (std::int32_t slot = 0; slot < H; ++slot) {
          std::int32_t& held = st.slot_rows[std::size_t(s * H + slot)];
          if (held != g) continue;
          held = -1;
          ++invalidations_;
          invalidated.emplace_back(s, g);
        }
      }
      reference::HiSparseStep step;
      step.logical = p.logical[std::size_t(gi)];
      step.request_ids = p.request_ids;
      step.state_indices = p.state_indices;
      for (std::int32_t b = 0; b < T; ++b) {
        const std::int32_t s = p.state_indices[std::size_t(b)];
        for (std::int32_t i = 0; i < hot_blocks; ++i) step.hot_block_table.push_back(s < 0 ? 0 : s * hot_blocks + i);
      }
      const std::vector<std::int32_t> before = st.slot_rows;
      want_[std::size_t(gi)] = reference::resolve_model(tables_, step, st);
      hits_[std::size_t(gi)] += want_[std::size_t(gi)].hits;
      misses_[std::size_t(gi)] += want_[std::size_t(gi)].misses;
      for (std::size_t i = 0; i < before.size(); ++i) evictions_ += before[i] >= 0 && st.slot_rows[i] != before[i];
      for (const auto& [s, g] : invalidated) {
        const auto row = st.slot_rows.begin() + std::ptrdiff_t(s) * H;
        reloads_ += std::find(row, row + H, g) != row + H;
      }
    }
    for (int l = 0; l < num_layers; ++l) {
      reference::gather_model(want_[std::size_t(group_of_layer_[std::size_t(l)])], K, pools_[std::size_t(l)],
                              row_bytes_[std::size_t(l)], hot_[std::size_t(l)], block_size,
                              std::int64_t(attention_stride) * row_bytes_[std::size_t(l)]);
    }
  }

  // Everything the step produced against the model; `where` names the step.
  // Call after the compute stream has run the step.
  void check(const std::string& where) {
    const StepPlan& p = plans_.back();
    for (int l = 0; l < num_layers; ++l) {
      const int gi = group_of_layer_[std::size_t(l)];
      const reference::HiSparseResult& want = want_[std::size_t(gi)];
      const std::string at = where + ", layer " + std::to_string(l) + " (group " + std::to_string(gi) + ", index " +
                             std::to_string(layers_[std::size_t(l)].index_in_group) + ")";
      same(at, "attention indices the layer got", read<std::int32_t>(attention_out_[std::size_t(l)].tensor),
           want.attention_indices, K, "batch row", "column");
      same(at, "valid counts the layer got", read<std::int32_t>(valid_out_[std::size_t(l)].tensor), want.valid_counts, 1,
           "batch row", "");
      check_reads(at, l, p);
      check_hot_cache(at, l);
      same(at, "host pool", read<std::uint8_t>(cache(l).host_pool()), pools_[std::size_t(l)],
           std::size_t(row_bytes_[std::size_t(l)]), "host row", "byte");
    }
    for (int gi = 0; gi < num_groups; ++gi) {
      const HiSparseMLAIndexGroup& g = leader(gi);
      const reference::HiSparseResult& want = want_[std::size_t(gi)];
      const reference::HiSparseState& st = states_[std::size_t(gi)];
      const std::string at = where + ", group " + std::to_string(gi);
      same(at, "hot indices", read<std::int32_t>(g.hot_indices().rows(0, T)), want.hot_indices, K, "batch row", "column");
      same(at, "miss mask", read<std::int32_t>(g.miss_mask().rows(0, T)), want.miss_mask, K, "batch row", "column");
      const auto counts = read<std::int32_t>(g.swap_counts().rows(0, T));
      if (same(at, "swap counts", counts, want.swap_counts, 1, "batch row", "")) {
        // Only the first swap_counts[row] entries of the swap lists are defined.
        const auto host = read<std::int32_t>(g.swap_host_rows().rows(0, T));
        const auto dev = read<std::int32_t>(g.swap_device_rows().rows(0, T));
        std::size_t pairs = 0, bad = 0;
        std::ostringstream out;
        for (std::int32_t b = 0; b < T; ++b) {
          for (std::int32_t m = 0; m < counts[std::size_t(b)]; ++m, ++pairs) {
            const std::size_t i = std::size_t(b * K + m);
            if (host[i] == want.swap_host_rows[i] && dev[i] == want.swap_device_rows[i]) continue;
            if (bad++ < 5) {
              out << "\n  batch row " << b << ", swap " << m << ": got (host row " << host[i] << ", hot row " << dev[i]
                  << "), want (" << want.swap_host_rows[i] << ", " << want.swap_device_rows[i] << ")";
            }
          }
        }
        if (bad) ADD_FAILURE() << at << ": swap list differs in " << bad << " of " << pairs << " pairs" << out.str();
      }
      same(at, "slot_rows", read<std::int32_t>(g.slot_rows()), st.slot_rows, H, "state row", "slot");
      same(at, "lru", read<std::int16_t>(g.lru()), st.lru, H, "state row", "LRU position");
    }
  }

  // After the last step: the host-side counts of queued work, the device hit
  // and miss counters, and that the steps covered what they should.
  void check_totals(std::uint64_t resolves) {
    for (int gi = 0; gi < num_groups; ++gi) {
      HiSparseMLAIndexGroup& g = leader(gi);
      EXPECT_EQ(g.resolves(), resolves) << "group " << gi << ": one resolve queued per step";
      EXPECT_EQ(g.gathers(), resolves * std::uint64_t(g.num_layers())) << "group " << gi << ": one gather per layer per step";
      const HiSparseCounters c = g.counters();
      EXPECT_EQ(c.hits, hits_[std::size_t(gi)]) << "group " << gi << ": device hit counter";
      EXPECT_EQ(c.misses, misses_[std::size_t(gi)]) << "group " << gi << ": device miss counter";
      std::uint64_t bytes = 0;
      for (int i = 0; i < g.num_layers(); ++i) bytes += std::uint64_t(g.cache(i).row_bytes());
      EXPECT_EQ(c.bytes_moved, misses_[std::size_t(gi)] * bytes) << "group " << gi;
      EXPECT_GT(hits_[std::size_t(gi)], 0u) << "group " << gi << ": the steps had no hits";
      EXPECT_GT(misses_[std::size_t(gi)], 0u) << "group " << gi << ": the steps had no misses";
    }
    EXPECT_GT(evictions_, 0u) << "no step evicted a row: the slots never filled up";
    EXPECT_GT(invalidations_, 0u) << "the host mirror never rewrote a cached row";
    EXPECT_GT(reloads_, 0u) << "no rewritten row was loaded again";
  }

 private:
  DeviceTensor allocate(DType dtype, const std::vector<std::int64_t>& shape) {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    DeviceTensor t{device_->allocate(std::size_t(n) * dtype_size(dtype), MemoryKind::device), Tensor()};
    t.tensor = Tensor::of(t.buffer, dtype, shape);
    return t;
  }

  template <class V>
  void put(DeviceTensor& dst, const std::vector<V>& values) {
    if (values.size() != std::size_t(dst.tensor.numel())) fail("StepRig::put", values.size(), " values for ", dst.tensor.shape_string());
    Buffer staging = upload(*device_, *compute_, values, MemoryKind::pinned_host);
    compute_->copy(dst.buffer, 0, staging, 0, values.size() * sizeof(V));
    compute_->synchronize();
  }

  template <class V>
  std::vector<V> read(const Tensor& t) {
    return download_rows<V>(*device_, *compute_, t);
  }

  HiSparseMLAIndexGroup& group(int layer) const {
    return dynamic_cast<HiSparseMLAIndexGroup&>(*layers_[std::size_t(layer)].group);
  }
  HiSparseMLAIndexGroup& leader(int gi) const { return group(group_first_layer_[std::size_t(gi)]); }
  HiSparseCacheHandle& cache(int layer) const { return group(layer).cache(layers_[std::size_t(layer)].index_in_group); }

  // A layer's "attention", on the compute stream after the layer's wait:
  // reads the rows its attention indices point at in its hot cache (index
  // -1, or past the cache: zeros) ...
  void read_rows(Stream& compute, int l, const TopkConversion& conv) {
    const Tensor indices(conv.physical.data(), DType::i32, {T * K}, conv.physical.kind(), conv.physical.device());
    const HiSparseCacheHandle& c = cache(l);
    const Tensor& ac = c.attention_cache();
    const Tensor hot(ac.data(), DType::u8, {ac.dim(0) / block_size, block_size, ac.dim(1)}, ac.kind(), ac.device());
    stage_hisparse_rows(compute, c.host_pool(), no_host_rows_.tensor, hot, indices, read_out_[std::size_t(l)].tensor);
  }
  // ... and keeps the attention indices and valid counts it was given. The
  // step queues these copies behind the next layer's read, so that the reads
  // of consecutive layers follow each other closely: on the host backend,
  // under the delay switch, a layer that waits for less than its own gather
  // then often reads before that gather has run.
  void keep_indices(Stream& compute, int l, const TopkConversion& conv) {
    compute.copy_bytes(attention_out_[std::size_t(l)].tensor.data(), conv.physical.data(), std::size_t(T * K) * 4);
    compute.copy_bytes(valid_out_[std::size_t(l)].tensor.data(), conv.valid_counts.data(), std::size_t(T) * 4);
  }

  // The rows attention read: entry (b, j) is host row g of the layer's pool
  // (as this step's host mirror left it) when the entry resolved to g, else zeros.
  void check_reads(const std::string& at, int l, const StepPlan& p) {
    const std::size_t rb = std::size_t(row_bytes_[std::size_t(l)]);
    const reference::HiSparseResult& want = want_[std::size_t(group_of_layer_[std::size_t(l)])];
    const auto got = read<std::uint8_t>(read_out_[std::size_t(l)].tensor);
    const std::vector<std::uint8_t> zeros(rb, 0);
    std::size_t bad = 0;
    std::ostringstream out;
    for (std::size_t e = 0; e < std::size_t(T * K); ++e) {
      const std::int32_t g = want.resolved_rows[e];
      const std::uint8_t* expect = g >= 0 ? pools_[std::size_t(l)].data() + std::size_t(g) * rb : zeros.data();
      const std::uint8_t* have = got.data() + e * rb;
      if (std::memcmp(have, expect, rb) == 0) continue;
      const auto diff = std::mismatch(have, have + rb, expect);
      if (bad++ < 5) {
        out << "\n  batch row " << e / K << ", column " << e % K << " (token "
            << p.logical[std::size_t(group_of_layer_[std::size_t(l)])][e] << ", host row " << g << ", attention index "
            << want.attention_indices[e] << "): byte " << diff.first - have << " got " << hex(*diff.first) << ", want "
            << hex(*diff.second);
      }
    }
    if (bad) {
      ADD_FAILURE() << at << ": attention read the wrong bytes for " << bad << " of " << T * K
                    << " entries (want: the entry's host row as the host mirror left it, zeros for -1)" << out.str();
    }
  }

  // The layer's whole hot cache (gap rows between blocks included) against
  // the model's, which only the gathers change.
  void check_hot_cache(const std::string& at, int l) {
    const std::size_t rb = std::size_t(row_bytes_[std::size_t(l)]);
    const auto got = read<std::uint8_t>(cache(l).attention_cache());
    const std::vector<std::uint8_t>& want = hot_[std::size_t(l)];
    const reference::HiSparseState& st = states_[std::size_t(group_of_layer_[std::size_t(l)])];
    std::size_t bad = 0;
    std::ostringstream out;
    if (got == want) return;
    for (std::size_t x = 0; x < want.size() / rb; ++x) {
      if (std::memcmp(got.data() + x * rb, want.data() + x * rb, rb) == 0) continue;
      const auto diff = std::mismatch(got.begin() + std::ptrdiff_t(x * rb), got.begin() + std::ptrdiff_t((x + 1) * rb),
                                      want.begin() + std::ptrdiff_t(x * rb));
      if (bad++ < 5) {
        const std::size_t block = x / attention_stride, offset = x % attention_stride;
        out << "\n  row " << x;
        if (offset >= std::size_t(block_size)) {
          out << " (gap between hot blocks)";
        } else {
          const std::size_t s = block / hot_blocks, slot = (block % hot_blocks) * block_size + offset;
          out << " (state row " << s << ", slot " << slot << ", holds host row " << st.slot_rows[s * H + slot] << " in the model)";
        }
        out << ": byte " << diff.first - (got.begin() + std::ptrdiff_t(x * rb)) << " got " << hex(*diff.first) << ", want "
            << hex(*diff.second);
      }
    }
    if (bad) ADD_FAILURE() << at << ": hot cache differs from the model in " << bad << " rows" << out.str();
  }

  // K entries: about half of `previous` (its valid tokens), new tokens for
  // the rest, now and then -1, a duplicate, or a token past the table.
  std::vector<std::int32_t> selection(const std::vector<std::int32_t>& previous) {
    std::set<std::int32_t> chosen;
    std::vector<std::int32_t> out;
    for (std::int32_t tok : previous) {
      if (tok >= 0 && tok < context && rng_() % 2 == 0 && chosen.insert(tok).second) out.push_back(tok);
    }
    while (out.size() < std::size_t(K)) {
      const std::uint64_t u = rng_() % 64;
      if (u == 0) {
        out.push_back(-1);
      } else if (u == 1 && !out.empty()) {
        out.push_back(out[rng_() % out.size()]);
      } else if (u == 2) {
        out.push_back(context + static_cast<std::int32_t>(rng_() % 100));
      } else {
        const auto tok = static_cast<std::int32_t>(rng_() % context);
        if (chosen.insert(tok).second) out.push_back(tok);
      }
    }
    std::shuffle(out.begin(), out.end(), rng_);
    return out;
  }

  std::shared_ptr<Device> device_;
  std::unique_ptr<Stream> engine_;  // the engine's stream, when compute_ wraps it
  std::unique_ptr<Stream> compute_;
  std::mt19937_64& rng_;
  Buffer logical_storage_;
  Tensor logical_buffer_;
  DeviceTensor source_, request_ids_, state_indices_, write_host_rows_, write_state_rows_, no_host_rows_;
  std::vector<DeviceTensor> indexer_out_, write_rows_, attention_out_, valid_out_, read_out_;
  HiSparseBatch hisparse_;
  BatchMetadata batch_;
  // Declared after the buffers the groups' queued work reads: destroyed
  // first, each group draining its side stream.
  std::unique_ptr<SparseMLAIndexGroupBuilder> builder_;
  std::vector<LayerRegistration> layers_;
  std::vector<int> group_first_layer_, group_of_layer_;
  std::vector<std::int64_t> row_bytes_;

  // The model.
  reference::HiSparseTables tables_;
  std::vector<std::int32_t> request_state_;  // state row of each request
  std::vector<std::vector<std::uint8_t>> pools_, hot_;  // per layer
  std::vector<reference::HiSparseState> states_;       // per group
  std::vector<std::vector<std::vector<std::int32_t>>> previous_;  // per group, per request: last selection
  std::vector<reference::HiSparseResult> want_;        // per group, this step
  std::vector<StepPlan> plans_;
  std::vector<std::uint64_t> hits_, misses_;
  std::uint64_t evictions_ = 0, invalidations_ = 0, reloads_ = 0;
};

class HiSparseStepTest : public BackendTest {};
SPARSE_MLA_INSTANTIATE_BACKENDS(HiSparseStepTest);

class HiSparseGraphTest : public GraphBackendTest {};
SPARSE_MLA_INSTANTIATE_BACKENDS(HiSparseGraphTest);

// One eager step: inputs in place, poison, then the step queued behind a
// gate that holds the compute stream (host backend: a host synchronisation
// inside the step shows). On the host backend one side of the fork also lags
// behind the other, every one of its tasks delayed: the groups' side streams
// at even steps (a layer that waits for less than its own gather reads its
// rows before the gather), the compute stream at odd steps (a resolve or a
// gather that waits for less than the indexer and the host mirror runs
// before them).
void run_eager_step(StepRig& rig, int step) {
  const StepPlan plan = rig.make_plan(step);
  rig.write_inputs(plan);
  rig.poison();
  rig.lag(step % 2 == 0, 2000);
  {
    HostGate gate(rig.compute());
    rig.queue_step(rig.compute());
    EXPECT_TRUE(gate.still_closed()) << "step " << step
                                     << ": queueing the step waited for the held compute stream: a host synchronisation inside the step";
  }
  rig.compute().synchronize();
  rig.lag(false, 0);
  rig.advance_model(plan);
  rig.check("step " + std::to_string(step) + " (eager, " + (step % 2 == 0 ? "side streams" : "compute stream") + " lagging on the host)");
}

TEST_P(HiSparseStepTest, WholeDecodeStepsOfMultiLayerGroupsMatchTheModel) {
  SCOPED_TRACE(seed_trace());
  DelayScope delay(200);
  auto rng = seeded_rng(81);
  StepRig rig(device, rng);
  for (int s = 0; s < steps; ++s) {
    run_eager_step(rig, s);
    if (HasFailure()) return;  // later steps would only repeat the divergence
  }
  rig.check_totals(steps);
}

TEST_P(HiSparseGraphTest, WholeDecodeStepReplaysWithNewSelectionsInPlace) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(82);
  StepRig rig(device, rng);
  Stream& compute = rig.compute();
  // Step 0 eagerly, outside the capture: Kokkos sizes its launch resources
  // on a kernel's first launch, which a capture would refuse.
  run_eager_step(rig, 0);
  if (HasFailure()) return;

  compute.begin_capture();
  rig.queue_step(compute);
  const std::unique_ptr<Graph> graph = compute.end_capture();

  for (int s = 1; s <= steps; ++s) {
    const StepPlan plan = rig.make_plan(s);
    rig.write_inputs(plan);
    rig.poison();
    graph->replay(compute);
    compute.synchronize();
    rig.advance_model(plan);
    rig.check("step " + std::to_string(s) + " (graph replay " + std::to_string(s - 1) + ")");
    if (HasFailure()) return;
  }
  // The warm-up and the capture queued work on the host; replays re-run the
  // captured work without queueing more, and the device counters saw every step.
  rig.check_totals(2);
}

// The same with the engine's own stream, wrapped, captured by the engine on
// the native stream (not through the library's wrapper).
TEST_P(HiSparseGraphTest, TheEngineCapturesAWholeDecodeStepOnItsOwnStream) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(83);
  StepRig rig(device, rng, true);
  run_eager_step(rig, 0);
  if (HasFailure()) return;
  Stream& engine = rig.engine();
  engine.begin_capture();
  EXPECT_TRUE(rig.compute().is_capturing());
  rig.queue_step(rig.compute());
  const std::unique_ptr<Graph> graph = engine.end_capture();
  for (int s = 1; s <= steps; ++s) {
    const StepPlan plan = rig.make_plan(s);
    rig.write_inputs(plan);
    rig.poison();
    graph->replay(engine);
    engine.synchronize();
    rig.advance_model(plan);
    rig.check("step " + std::to_string(s) + " (engine graph replay " + std::to_string(s - 1) + ")");
    if (HasFailure()) return;
  }
  rig.check_totals(2);
}

}  // namespace
}  // namespace sparse_mla::testing
