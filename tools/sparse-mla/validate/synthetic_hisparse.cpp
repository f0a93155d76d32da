// sparse-mla validate --synthetic --hisparse: the synthetic schedule with
// HiSparse index groups (SPEC section 5). Every layer's KV rows live in its
// pinned host pool; each request keeps --hot-slots rows on the device.
//
// Prefill step: every layer's prompt rows reach its host pool (host mirror);
// a staging plan packs the prompts' blocks, every layer stages its rows, and
// the last prompt token's top-k is read through the compact block table.
// Decode steps (batch rows in a fresh order each step): every layer writes
// the new token's row (and now and then rewrites an old row, invalidating
// hot copies); each group's indexer selects about half of its previous
// selection plus new positions; every layer converts. Checked after each
// step: every layer's attention indices and the slot state against the
// scalar model, the bytes attention would read for every entry against the
// row the layer wrote, and every occupied hot slot against the host pool.
#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "validation/reference/hisparse_reference.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/hisparse_group.hpp"
#include "sparse_mla/index_group_builder.hpp"
#include "sparse_mla/topk_convert.hpp"
#include "sparse_mla/fp8_upconvert.hpp"
#include "synthetic.hpp"
#include "synthetic_common.hpp"
#include "validation/device_scratch.hpp"

namespace sparse_mla::cli {

namespace {

constexpr const char* where = "validate --synthetic --hisparse";
constexpr std::int64_t row_bytes = fp8_row_bytes;
constexpr int rewrite_every = 5;         // decode steps between rewrites of an old row

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The bytes layer `layer` wrote for host row `g` in its `version`-th write.
void row_content(std::uint64_t seed, std::size_t layer, std::int32_t g, std::uint32_t version, std::uint8_t* out) {
  std::uint64_t state = splitmix(seed ^ (layer << 40) ^ (std::uint64_t(std::uint32_t(g)) << 8) ^ (std::uint64_t(version) << 56));
  for (std::int64_t i = 0; i < row_bytes; i += 8) {
    state = splitmix(state);
    std::memcpy(out + i, &state, std::min<std::int64_t>(8, row_bytes - i));
  }
}

class HiSparseRun {
 public:
  HiSparseRun(const std::string& backend, const SyntheticOptions& o);
  void prefill_step();
  void decode_step(int step);
  SyntheticReport report(const std::string& backend);
  bool once_per_group() const;

  const SyntheticOptions& o;
  std::uint64_t seed;
  std::mt19937_64 rng;
  std::shared_ptr<Device> device;
  std::unique_ptr<Stream> compute;
  OwnedTensor logical_buffer;
  std::unique_ptr<SparseMLAIndexGroupBuilder> builder;
  std::vector<LayerRegistration> layers;
  std::vector<HiSparseMLAIndexGroup*> groups;
  std::vector<std::size_t> group_of;  // layer -> group
  reference::HiSparseTables tables;
  std::vector<reference::HiSparseState> models;  // per group
  std::vector<std::int32_t> lengths;
  std::vector<std::vector<std::vector<std::int32_t>>> selections;  // [group][request]
  std::vector<std::uint32_t> versions;                            // per host row
  std::vector<bool> ever_written;                                 // per host row: the layers wrote it (else zeros)
  OwnedTensor source_table;
  std::int64_t prefill_tokens = 0, staged_rows = 0;
  std::uint64_t hits = 0, misses = 0;
  SyntheticTally tally;

 private:
  std::int32_t host_row(std::int32_t request, std::int32_t tok) const;
  void write_rows(const std::vector<std::int32_t>& host_rows, const std::vector<std::int32_t>& states, validation::DeviceScratch& scratch);
  std::vector<std::int32_t> next_selection(const std::vector<std::int32_t>& previous, std::int32_t position);
  void check_prefill_layer(std::size_t layer, const HiSparsePrefillStagingPlan& plan, const std::vector<std::int32_t>& logical,
                           validation::DeviceScratch& scratch);
  void check_layer(std::size_t layer, const reference::HiSparseStep& step, const reference::HiSparseResult& want,
                   const std::vector<std::int32_t>& attention, const std::vector<std::int32_t>& counts, validation::DeviceScratch& scratch);
  void check_hot_caches(std::size_t group, validation::DeviceScratch& scratch);
  bool row_matches(std::size_t layer, std::int32_t g, const std::uint8_t* bytes) const;
};

HiSparseConfig hisparse_config(const SyntheticOptions& o) {
  HiSparseConfig c;
  c.hot_slots = o.hot_slots;
  c.max_requests = o.requests;
  c.max_tokens_per_request = o.context;
  c.block_size = o.block_size;
  c.host_pool_rows = std::int64_t{o.requests} * ((o.context + o.block_size - 1) / o.block_size) * o.block_size;
  return c;
}

HiSparseRun::HiSparseRun(const std::string& backend, const SyntheticOptions& options)
    : o(options), seed(o.seed_given ? o.seed : (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()),
      rng(seed), device(open_device(backend)), compute(device->create_stream()) {
  const HiSparseConfig config = hisparse_config(o);
  const std::int64_t blocks = (o.context + o.block_size - 1) / o.block_size;
  std::uniform_int_distribution<std::int32_t> prompt(1, o.context - o.steps);
  for (int r = 0; r < o.requests; ++r) lengths.push_back(prompt(rng));
  logical_buffer = OwnedTensor(*device, DType::i32, {o.requests, o.topk});
  builder = std::make_unique<SparseMLAIndexGroupBuilder>(device, logical_buffer, o.requests);
  LayerConfig layer;
  layer.kv_cache_dtype = "fp8_ds_mla";
  layer.head_size = 576;
  layer.hisparse = config;
  for (int l = 0; l < o.layers; ++l) {
    layers.push_back(builder->register_layer(l % o.index_every == 0, layer));
    if (layers.back().index_in_group == 0) groups.push_back(&dynamic_cast<HiSparseMLAIndexGroup&>(*layers.back().group));
    group_of.push_back(groups.size() - 1);
  }
  const HiSparseConfig& resolved = groups[0]->config();
  tables.top_k = o.topk;
  tables.hot_slots = resolved.hot_slots;
  tables.source_rows = o.requests;
  tables.source_blocks = static_cast<std::int32_t>(blocks);
  tables.source_block_size = o.block_size;
  tables.host_rows = config.host_pool_rows;
  tables.source_table.resize(static_cast<std::size_t>(o.requests * blocks));
  std::iota(tables.source_table.begin(), tables.source_table.end(), 0);
  std::shuffle(tables.source_table.begin(), tables.source_table.end(), rng);
  tables.hot_block_size = o.block_size;
  tables.hot_blocks_per_row = groups[0]->hot_blocks_per_state();
  tables.attention_block_stride = resolved.attention_block_stride;
  models.assign(groups.size(), reference::HiSparseState(o.requests, resolved.hot_slots));
  selections.assign(groups.size(), std::vector<std::vector<std::int32_t>>(static_cast<std::size_t>(o.requests)));
  versions.assign(static_cast<std::size_t>(config.host_pool_rows), 0);
  ever_written.assign(static_cast<std::size_t>(config.host_pool_rows), false);
  source_table = upload(*compute, tables.source_table, {o.requests, blocks});
}

std::int32_t HiSparseRun::host_row(std::int32_t request, std::int32_t tok) const {
  return reference::model_host_row(tables, request, tok);
}

// The host pools start zeroed; a row holds its content once written.
bool HiSparseRun::row_matches(std::size_t layer, std::int32_t g, const std::uint8_t* bytes) const {
  std::uint8_t want[row_bytes] = {};
  if (ever_written[static_cast<std::size_t>(g)]) row_content(seed, layer, g, versions[static_cast<std::size_t>(g)], want);
  return std::memcmp(want, bytes, row_bytes) == 0;
}

// The host mirror of one step: every layer writes its rows, and each group
// empties the hot slots that cache one of them.
void HiSparseRun::write_rows(const std::vector<std::int32_t>& host_rows, const std::vector<std::int32_t>& states,
                             validation::DeviceScratch& scratch) {
  const std::int64_t n = static_cast<std::int64_t>(host_rows.size());
  for (std::int32_t g : host_rows) ever_written[static_cast<std::size_t>(g)] = true;
  const Tensor ids = scratch.upload(host_rows, {n});
  const Tensor owners = scratch.upload(states, {n});
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(n * row_bytes));
  for (std::size_t l = 0; l < layers.size(); ++l) {
    for (std::int64_t i = 0; i < n; ++i) {
      row_content(seed, l, host_rows[std::size_t(i)], versions[std::size_t(host_rows[std::size_t(i)])], &bytes[std::size_t(i * row_bytes)]);
    }
    const Tensor rows = scratch.upload(bytes, {n, row_bytes});
    groups[group_of[l]]->write_rows(layers[l].index_in_group, *compute, rows, ids);
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    groups[g]->invalidate_rows(*compute, ids, owners);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int32_t s = states[std::size_t(i)];
      if (s < 0) continue;
      for (std::int32_t slot = 0; slot < tables.hot_slots; ++slot) {
        std::int32_t& held = models[g].slot_rows[std::size_t(s) * std::size_t(tables.hot_slots) + std::size_t(slot)];
        if (held == host_rows[std::size_t(i)]) held = -1;
      }
    }
  }
}

void HiSparseRun::prefill_step() {
  validation::DeviceScratch scratch(*compute);
  std::vector<std::int32_t> rows, owners;
  for (std::int32_t r = 0; r < o.requests; ++r) {
    for (std::int32_t p = 0; p < lengths[std::size_t(r)]; ++p) {
      rows.push_back(host_row(r, p));
      owners.push_back(-1);  // nothing is cached yet
    }
  }
  prefill_tokens = static_cast<std::int64_t>(rows.size());
  write_rows(rows, owners, scratch);
  std::vector<std::int64_t> context(lengths.begin(), lengths.end());
  const HiSparsePrefillStagingPlan plan = build_hisparse_prefill_staging_plan(
      *device, *compute, tables.source_table, o.requests, tables.source_blocks, context, o.block_size);
  staged_rows = plan.num_blocks * plan.block_size;
  std::vector<std::int32_t> last_tokens;  // the top-k of each request's last prompt token
  for (std::int32_t r = 0; r < o.requests; ++r) {
    const std::vector<std::int32_t> sel = next_selection({}, lengths[std::size_t(r)] - 1);
    last_tokens.insert(last_tokens.end(), sel.begin(), sel.end());
  }
  for (std::size_t l = 0; l < layers.size(); ++l) check_prefill_layer(l, plan, last_tokens, scratch);
  compute->synchronize();
}

// The layer's staged rows, and the last prompt token's top-k read through
// the compact block table.
void HiSparseRun::check_prefill_layer(std::size_t layer, const HiSparsePrefillStagingPlan& plan,
                                      const std::vector<std::int32_t>& logical, validation::DeviceScratch& scratch) {
  HiSparseMLAIndexGroup& group = *groups[group_of[layer]];
  const auto staged = group.stage_prefill_rows(layers[layer].index_in_group, *compute, plan, Tensor());
  const std::vector<std::uint8_t> bytes = scratch.download<std::uint8_t>(staged);
  for (std::size_t row = 0; row < plan.host_row_ids.size(); ++row) {
    const std::int32_t g = plan.host_row_ids[row];
    const std::uint8_t* got = &bytes[row * std::size_t(row_bytes)];
    const bool ok = g >= 0 ? row_matches(layer, g, got) : std::all_of(got, got + row_bytes, [](std::uint8_t b) { return b == 0; });  // the null block
    ++tally.checked_rows;
    if (!ok) tally.note("prefill, layer " + std::to_string(layer) + ": staged row " + std::to_string(row) + " differs");
  }
  std::vector<std::int32_t> req(static_cast<std::size_t>(o.requests));
  std::iota(req.begin(), req.end(), 0);
  TopkConvertParams params;
  params.block_size = o.block_size;
  const TopkConversion physical = convert_logical_to_physical_topk(*compute, scratch.upload(req, {o.requests}),
                                                                   plan.block_table, scratch.upload(logical, {o.requests, o.topk}), params);
  const std::vector<std::int32_t> rows = scratch.download<std::int32_t>(physical.physical);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::int32_t tok = logical[i];
    const std::int32_t r = static_cast<std::int32_t>(i / std::size_t(o.topk));
    if (tok < 0) continue;
    ++tally.checked_rows;
    if (rows[i] < 0 || !row_matches(layer, host_row(r, tok), &bytes[std::size_t(rows[i]) * std::size_t(row_bytes)])) {
      tally.note("prefill, layer " + std::to_string(layer) + ": request " + std::to_string(r) + " position " + std::to_string(tok) + " reads the wrong staged row");
    }
  }
}

// About half of the previous selection, then fresh causal positions; a
// request shorter than K selects all its positions, then -1.
std::vector<std::int32_t> HiSparseRun::next_selection(const std::vector<std::int32_t>& previous, std::int32_t position) {
  std::vector<std::int32_t> out;
  if (position + 1 <= o.topk) {
    for (std::int32_t j = 0; j < o.topk; ++j) out.push_back(j <= position ? j : -1);
  } else {
    std::set<std::int32_t> chosen;
    for (std::int32_t tok : previous) {
      if (tok >= 0 && rng() % 2 == 0 && chosen.insert(tok).second) out.push_back(tok);
    }
    std::uniform_int_distribution<std::int32_t> any(0, position);
    while (out.size() < std::size_t(o.topk)) {
      const std::int32_t tok = any(rng);
      if (chosen.insert(tok).second) out.push_back(tok);
    }
    std::shuffle(out.begin(), out.end(), rng);
  }
  return out;
}

void HiSparseRun::decode_step(int step) {
  validation::DeviceScratch scratch(*compute);
  std::vector<std::int32_t> order(static_cast<std::size_t>(o.requests));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  // The new token of every request; now and then an old row is rewritten too.
  std::vector<std::int32_t> written, owners;
  for (std::int32_t r : order) {
    written.push_back(host_row(r, lengths[std::size_t(r)]));
    owners.push_back(r);
  }
  if (step % rewrite_every == 0) {
    const std::int32_t r = order[0];
    const std::int32_t g = host_row(r, static_cast<std::int32_t>(rng() % std::uint64_t(lengths[std::size_t(r)])));
    ++versions[std::size_t(g)];
    written.push_back(g);
    owners.push_back(r);
  }
  write_rows(written, owners, scratch);
  reference::HiSparseStep model_step;
  model_step.request_ids = order;
  model_step.state_indices = order;
  for (std::int32_t r : order) {
    for (std::int32_t i = 0; i < tables.hot_blocks_per_row; ++i) model_step.hot_block_table.push_back(r * tables.hot_blocks_per_row + i);
  }
  HiSparseBatch hb;
  hb.request_state_indices = scratch.upload(order, {o.requests});
  BatchMetadata batch;
  batch.req_id_per_token = hb.request_state_indices;
  batch.block_table = source_table;
  batch.block_size = o.block_size;
  batch.num_decodes = batch.num_decode_tokens = o.requests;
  batch.hisparse = &hb;
  const std::int64_t entries = std::int64_t{o.requests} * o.topk;
  const auto num_layers = static_cast<std::int64_t>(layers.size());
  const Tensor attention = scratch.allocate(DType::i32, {num_layers, entries});
  const Tensor counts = scratch.allocate(DType::i32, {num_layers, o.requests});
  std::vector<reference::HiSparseStep> steps(groups.size(), model_step);
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const std::size_t g = group_of[l];
    const int index = layers[l].index_in_group;
    if (index == 0) {  // the group's indexer
      steps[g].logical.clear();
      for (std::int32_t r : order) {
        std::vector<std::int32_t>& sel = selections[g][std::size_t(r)];
        sel = next_selection(sel, lengths[std::size_t(r)]);
        steps[g].logical.insert(steps[g].logical.end(), sel.begin(), sel.end());
      }
      const Tensor src = scratch.upload(steps[g].logical, {o.requests, o.topk});
      compute->copy_bytes(logical_buffer.data(), src.data(), std::size_t(entries) * 4);
    }
    groups[g]->set_logical_topk_ready(index, *compute);
    groups[g]->prepare_for_batch(index, batch, *compute);
    const TopkConversion result = groups[g]->convert_logical_to_physical_topk(index, *compute, logical_buffer, batch, 0, true);
    compute->copy_bytes(attention.data_as<std::int32_t>() + l * std::size_t(entries), result.physical.data(), std::size_t(entries) * 4);
    compute->copy_bytes(counts.data_as<std::int32_t>() + l * std::size_t(o.requests), result.valid_counts.data(), std::size_t(o.requests) * 4);
  }
  const auto all_attention = scratch.download<std::int32_t>(attention);
  const auto all_counts = scratch.download<std::int32_t>(counts);
  std::vector<reference::HiSparseResult> want;
  for (std::size_t g = 0; g < groups.size(); ++g) want.push_back(reference::resolve_model(tables, steps[g], models[g]));
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const std::vector<std::int32_t> a(all_attention.begin() + std::ptrdiff_t(l) * entries, all_attention.begin() + std::ptrdiff_t(l + 1) * entries);
    const std::vector<std::int32_t> c(all_counts.begin() + std::ptrdiff_t(l) * o.requests, all_counts.begin() + std::ptrdiff_t(l + 1) * o.requests);
    check_layer(l, steps[group_of[l]], want[group_of[l]], a, c, scratch);
  }
  for (std::size_t g = 0; g < groups.size(); ++g) check_hot_caches(g, scratch);
  hits += want[0].hits;
  misses += want[0].misses;
  for (std::int32_t r = 0; r < o.requests; ++r) ++lengths[std::size_t(r)];
}

// One layer: attention indices and counts as the model says, and the bytes
// each index reads are the row the layer wrote for that position.
void HiSparseRun::check_layer(std::size_t layer, const reference::HiSparseStep& step, const reference::HiSparseResult& want,
                              const std::vector<std::int32_t>& attention, const std::vector<std::int32_t>& counts, validation::DeviceScratch& scratch) {
  ++tally.checked_results;
  const std::string name = "layer " + std::to_string(layer);
  for (std::size_t i = 0; i < attention.size(); ++i) {
    if (attention[i] != want.attention_indices[i]) {
      tally.note(name + ": attention index " + std::to_string(i) + " is " + std::to_string(attention[i]) + ", expected " + std::to_string(want.attention_indices[i]));
    }
  }
  if (counts != want.valid_counts) tally.note(name + ": valid counts differ from the model");
  HiSparseMLAIndexGroup& group = *groups[group_of[layer]];
  const auto cache = scratch.download<std::uint8_t>(group.cache(layers[layer].index_in_group).attention_cache());
  for (std::size_t i = 0; i < attention.size(); ++i) {
    const std::int32_t tok = step.logical[i];
    if (tok < 0 || attention[i] < 0) continue;
    const std::int32_t r = step.request_ids[i / std::size_t(o.topk)];
    ++tally.checked_rows;
    if (!row_matches(layer, host_row(r, tok), &cache[std::size_t(attention[i]) * std::size_t(row_bytes)])) {
      tally.note(name + ": request " + std::to_string(r) + " position " + std::to_string(tok) + " reads stale or wrong bytes");
    }
  }
}

// The slot state as the model says, and every occupied slot of every layer
// holds the host pool's row (and the pool holds what the layer wrote).
void HiSparseRun::check_hot_caches(std::size_t g, validation::DeviceScratch& scratch) {
  HiSparseMLAIndexGroup& group = *groups[g];
  const auto slot_rows = scratch.download<std::int32_t>(group.slot_rows());
  const auto lru = scratch.download<std::int16_t>(group.lru());
  if (slot_rows != models[g].slot_rows || lru != models[g].lru) tally.note("group " + std::to_string(g) + ": slot state differs from the model");
  const std::int32_t H = tables.hot_slots, bs = o.block_size;
  const std::int64_t stride = group.config().attention_block_stride;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    if (group_of[l] != g) continue;
    const HiSparseCacheHandle& cache = group.cache(layers[l].index_in_group);
    const auto hot = scratch.download<std::uint8_t>(cache.attention_cache());
    const auto* pool = static_cast<const std::uint8_t*>(cache.host_pool().data());  // pinned: readable here after the synchronize
    for (std::size_t i = 0; i < slot_rows.size(); ++i) {
      const std::int32_t row = slot_rows[i];
      if (row < 0) continue;
      const std::int64_t s = std::int64_t(i) / H, slot = std::int64_t(i) % H;
      const std::int64_t x = (s * group.hot_blocks_per_state() + slot / bs) * stride + slot % bs;
      const std::uint8_t* bytes = &hot[std::size_t(x * row_bytes)];
      ++tally.checked_rows;
      if (std::memcmp(bytes, pool + std::int64_t(row) * row_bytes, row_bytes) != 0 || !row_matches(l, row, bytes)) {
        tally.note("layer " + std::to_string(l) + ": state " + std::to_string(s) + " slot " + std::to_string(slot) + " does not hold host row " + std::to_string(row));
      }
    }
  }
}

bool HiSparseRun::once_per_group() const {
  for (const HiSparseMLAIndexGroup* g : groups) {
    if (g->resolves() != std::uint64_t(o.steps) || g->gathers() != std::uint64_t(o.steps) * std::uint64_t(g->num_layers())) return false;
  }
  return true;
}

SyntheticReport HiSparseRun::report(const std::string& backend) {
  HiSparseCounters total;
  HiSparseFootprint footprint;
  std::uint64_t resolves = 0;
  for (HiSparseMLAIndexGroup* g : groups) {
    const HiSparseCounters c = g->counters();
    total.hits += c.hits;
    total.misses += c.misses;
    total.bytes_moved += c.bytes_moved;
    footprint.host_bytes += g->footprint().host_bytes;
    footprint.device_bytes += g->footprint().device_bytes;
    resolves += g->resolves();
  }
  SyntheticReport r;
  r.fields = {{"backend", backend}, {"hisparse", true}, {"layers", o.layers}, {"index_every", o.index_every},
              {"groups", groups.size()}, {"requests", o.requests}, {"topk", o.topk}, {"hot_slots", tables.hot_slots},
              {"block_size", o.block_size}, {"context", o.context}, {"seed", seed},
              {"prefill_tokens", prefill_tokens}, {"staged_rows", staged_rows}, {"decode_steps", o.steps},
              // one resolve per group per decode step
              {"decode_conversions", resolves}, {"expected_decode_conversions", groups.size() * std::uint64_t(o.steps)},
              {"hits", total.hits}, {"misses", total.misses}, {"bytes_moved", total.bytes_moved},
              {"host_bytes", footprint.host_bytes}, {"device_bytes", footprint.device_bytes}};
  std::ostringstream heading;
  heading << "HiSparse synthetic schedule on " << backend << " (seed " << seed << "): " << o.layers << " layers, "
          << groups.size() << " groups, " << o.requests << " requests, top-k " << o.topk << ", " << tables.hot_slots
          << " hot slots, block size " << o.block_size;
  r.lines.push_back(heading.str());
  r.lines.push_back("  prefill: " + std::to_string(prefill_tokens) + " rows mirrored, " + std::to_string(staged_rows) +
                    " staged rows per layer");
  r.lines.push_back("  decode steps: " + std::to_string(o.steps) + ", hits " + std::to_string(total.hits) +
                    ", misses " + std::to_string(total.misses) + ", " + std::to_string(total.bytes_moved) +
                    " bytes moved");
  return r;
}

}  // namespace

int run_hisparse_synthetic(const std::string& backend, bool json, const SyntheticOptions& options, std::ostream& out) {
  if (options.hot_slots < 0) fail(where, "--hot-slots must not be negative, got ", options.hot_slots);
  HiSparseRun run(backend, options);
  run.prefill_step();
  for (int step = 1; step <= options.steps; ++step) run.decode_step(step);
  const bool ok = run.tally.mismatches == 0 && run.once_per_group();
  run.report(backend).write(out, json, run.tally, ok);
  return ok ? exit_ok : exit_mismatch;
}

}  // namespace sparse_mla::cli
