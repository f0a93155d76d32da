// sparse-mla validate --synthetic (synthetic.hpp). The engine's side of a
// forward pass, as the index groups see it: per step and per layer, the
// group leader's indexer writes a fresh logical top-k on the compute stream,
// then every layer calls set_logical_topk_ready, prepare_for_batch and
// convert_logical_to_physical_topk, and "attention" (a copy on the compute
// stream) reads what it returned. After the step every layer's copy is
// compared with the scalar reference.
#include "synthetic.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "dcp_options.hpp"
#include "validation/reference/topk_reference.hpp"
#include "synthetic_common.hpp"
#include "validation/device_scratch.hpp"
#include "synthetic_dump.hpp"
#include "sparse_mla/device.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/index_group_builder.hpp"
#include "sparse_mla/topk_convert.hpp"
#include "sparse_mla/fp8_upconvert.hpp"

namespace sparse_mla::cli {

namespace {

constexpr const char* where = "validate --synthetic";
// Bounds the prefill step's top-k (T * K entries; several buffers of it).
constexpr std::int64_t max_prefill_entries = std::int64_t{1} << 27;

void check_options(const SyntheticOptions& o) {
  const auto at_least = [](const char* name, int value, int minimum) {
    if (value < minimum) fail(where, name, " must be at least ", minimum, ", got ", value);
  };
  at_least("--layers", o.layers, 1);
  at_least("--index-every", o.index_every, 1);
  at_least("--requests", o.requests, 1);
  at_least("--topk", o.topk, 1);
  at_least("--block-size", o.block_size, 1);
  at_least("--steps", o.steps, 0);
  if (!o.dump_dir.empty() && o.hisparse) fail(where, "--dump writes topk_convert files; it does not support --hisparse");
  check_dcp_options(o.dcp, o.block_size, where);
  if (o.dcp.enabled() && o.hisparse) fail(where, "--hisparse has no DCP form (--dcp-size ", o.dcp.size, ")");
  if (o.context <= o.steps) {
    fail(where, "--context must be larger than --steps (each request grows by one token per decode step), got ",
         o.context, " and ", o.steps);
  }
  const std::int64_t entries = std::int64_t{o.requests} * o.context * o.topk;
  if (entries > max_prefill_entries) {
    fail(where, "--requests x --context x --topk = ", entries, " entries of prefill top-k, more than the limit ",
         max_prefill_entries);
  }
}

// Requests, their lengths, and the block table (each request's blocks are
// distinct physical blocks, scattered over the pool as an allocator would).
struct Schedule {
  std::int64_t requests = 0;
  std::int64_t blocks_per_request = 0;
  std::int64_t num_physical_blocks = 0;
  std::vector<std::int32_t> block_table;  // [requests, blocks_per_request]
  std::vector<std::int32_t> lengths;      // tokens each request holds
};

Schedule make_schedule(const SyntheticOptions& o, std::mt19937_64& rng) {
  Schedule s;
  s.requests = o.requests;
  s.blocks_per_request = (o.context + o.block_size - 1) / o.block_size;
  s.num_physical_blocks = s.requests * s.blocks_per_request;
  s.block_table.resize(static_cast<std::size_t>(s.num_physical_blocks));
  for (std::size_t i = 0; i < s.block_table.size(); ++i) s.block_table[i] = static_cast<std::int32_t>(i);
  std::shuffle(s.block_table.begin(), s.block_table.end(), rng);
  // Prompts leave room for one token per decode step.
  std::uniform_int_distribution<std::int32_t> prompt(1, o.context - o.steps);
  for (int r = 0; r < o.requests; ++r) s.lengths.push_back(prompt(rng));
  return s;
}

// One step's query tokens: request and position of each.
struct StepTokens {
  std::vector<std::int32_t> req_id;
  std::vector<std::int32_t> position;
  std::vector<std::int32_t> query_start_loc;
  std::int64_t num_decodes = 0;
  std::int64_t num_prefills = 0;
  std::int64_t size() const { return static_cast<std::int64_t>(req_id.size()); }
};

StepTokens prefill_step_tokens(const Schedule& s) {
  StepTokens t;
  t.query_start_loc.push_back(0);
  for (std::int64_t r = 0; r < s.requests; ++r) {
    for (std::int32_t p = 0; p < s.lengths[static_cast<std::size_t>(r)]; ++p) {
      t.req_id.push_back(static_cast<std::int32_t>(r));
      t.position.push_back(p);
    }
    t.query_start_loc.push_back(static_cast<std::int32_t>(t.req_id.size()));
  }
  t.num_prefills = s.requests;
  return t;
}

// Every request decodes its next token.
StepTokens decode_step_tokens(Schedule& s) {
  StepTokens t;
  t.query_start_loc.push_back(0);
  for (std::int64_t r = 0; r < s.requests; ++r) {
    t.req_id.push_back(static_cast<std::int32_t>(r));
    t.position.push_back(s.lengths[static_cast<std::size_t>(r)]++);
    t.query_start_loc.push_back(static_cast<std::int32_t>(r + 1));
  }
  t.num_decodes = s.requests;
  return t;
}

// The indexer's output for a token at position p: causal positions in
// [0, p]. With p < K, all of them in order, then -1; otherwise K random
// positions (duplicates allowed: the conversion neither needs nor removes
// them).
std::vector<std::int32_t> indexer_topk(const StepTokens& t, std::int64_t top_k, std::mt19937_64& rng) {
  std::vector<std::int32_t> logical(static_cast<std::size_t>(t.size() * top_k));
  for (std::int64_t i = 0; i < t.size(); ++i) {
    const std::int32_t p = t.position[static_cast<std::size_t>(i)];
    std::int32_t* row = logical.data() + i * top_k;
    if (p < top_k) {
      for (std::int64_t j = 0; j < top_k; ++j) row[j] = j <= p ? static_cast<std::int32_t>(j) : -1;
    } else {
      std::uniform_int_distribution<std::int32_t> position(0, p);
      for (std::int64_t j = 0; j < top_k; ++j) row[j] = position(rng);
    }
  }
  return logical;
}

reference::TopkOutputs reference_topk(const Schedule& s, const StepTokens& t, const std::vector<std::int32_t>& logical,
                                      std::int64_t top_k, std::int32_t block_size, const DcpConfig& dcp) {
  reference::TopkInputs in;
  in.num_tokens = t.size();
  in.num_topk = top_k;
  in.blocks_per_request = s.blocks_per_request;
  in.block_size = block_size;
  in.block_stride_rows = block_size;
  in.req_id = t.req_id;
  in.block_table = s.block_table;
  in.logical = logical;
  in.set_dcp(dcp);
  return reference::convert_topk_dcp(in);
}

// Compares one layer's output with the reference; a differing entry is
// noted with its step, layer, token and column (-1: the valid count).
void compare_layer(SyntheticTally& tally, int step, int layer, const std::int32_t* physical, const std::int32_t* counts,
                   const reference::TopkOutputs& want, std::int64_t top_k) {
  ++tally.checked_results;
  const auto note = [&](std::int64_t token, std::int64_t column, std::int32_t got, std::int32_t expected) {
    std::ostringstream text;
    text << (step == 0 ? std::string("prefill step") : "decode step " + std::to_string(step)) << ", layer " << layer
         << ", token " << token << ", " << (column < 0 ? std::string("valid count") : "column " + std::to_string(column))
         << ": got " << got << ", expected " << expected;
    tally.note(text.str(), {{"step", step}, {"layer", layer}, {"token", token}, {"column", column}, {"got", got},
                            {"expected", expected}});
  };
  for (std::size_t i = 0; i < want.physical.size(); ++i) {
    if (physical[i] != want.physical[i]) {
      const auto at = static_cast<std::int64_t>(i);
      note(at / top_k, at % top_k, physical[i], want.physical[i]);
    }
  }
  for (std::size_t t = 0; t < want.valid_counts.size(); ++t) {
    if (counts[t] != want.valid_counts[t]) note(static_cast<std::int64_t>(t), -1, counts[t], want.valid_counts[t]);
  }
}

class SyntheticRun {
 public:
  SyntheticRun(const std::string& backend, const SyntheticOptions& o);
  void prefill_step();
  void decode_step(int step);

  const SyntheticOptions& options;
  std::uint64_t seed;
  std::mt19937_64 rng;
  Schedule schedule;
  std::shared_ptr<Device> device;
  std::unique_ptr<Stream> compute;
  OwnedTensor logical_buffer;
  std::unique_ptr<SparseMLAIndexGroupBuilder> builder;
  std::vector<LayerRegistration> layers;
  OwnedTensor block_table;
  std::int64_t prefill_tokens = 0;
  std::uint64_t prefill_conversions = 0;
  std::uint64_t decode_conversions = 0;
  bool once_per_group = true;  // every decode step converted exactly once in every group
  SyntheticTally tally;

 private:
  struct StepInputs;
  StepInputs upload_step(const StepTokens& tokens, validation::DeviceScratch& staging);
  reference::TopkOutputs produce_logical(const StepTokens& tokens, validation::DeviceScratch& staging,
                                         std::vector<std::int32_t>* keep = nullptr);
  // --dump: the first group's conversion of the step, after the step's checks.
  void dump(int step, const StepTokens& tokens, const std::vector<std::int32_t>& logical,
            const reference::TopkOutputs& want, std::uint64_t mismatches_before);

 public:
  std::vector<std::string> dumped;  // files written by --dump
  TopkConversion run_layer(std::size_t layer, const StepInputs& in);
  std::uint64_t total(std::uint64_t ConversionCounts::*field) const;
};

struct SyntheticRun::StepInputs {
  BatchMetadata batch;
  std::int64_t num_tokens = 0;
};

SyntheticRun::SyntheticRun(const std::string& backend, const SyntheticOptions& o)
    : options(o), seed(o.seed_given ? o.seed : (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()),
      rng(seed), schedule(make_schedule(o, rng)), device(open_device(backend)), compute(device->create_stream()) {
  std::int64_t max_tokens = 0;
  for (std::int32_t length : schedule.lengths) max_tokens += length;
  max_tokens = std::max<std::int64_t>(max_tokens, o.requests);
  logical_buffer = OwnedTensor(*device, DType::i32, {max_tokens, o.topk});
  // Decode steps have one token per request.
  builder = std::make_unique<SparseMLAIndexGroupBuilder>(device, logical_buffer, o.requests);
  for (int l = 0; l < o.layers; ++l) layers.push_back(builder->register_layer(l % o.index_every == 0));
  builder->set_dcp(o.dcp);
  block_table = upload(*compute, schedule.block_table, {schedule.requests, schedule.blocks_per_request});
}

SyntheticRun::StepInputs SyntheticRun::upload_step(const StepTokens& tokens, validation::DeviceScratch& staging) {
  // The library's deep check of the table values, as a validating caller runs it.
  check_topk_table_values(tokens.req_id.data(), tokens.size(), schedule.block_table.data(), schedule.requests,
                          schedule.blocks_per_request, schedule.num_physical_blocks);
  StepInputs in;
  in.num_tokens = tokens.size();
  in.batch.req_id_per_token = staging.upload(tokens.req_id, {in.num_tokens});
  in.batch.block_table = block_table;
  in.batch.block_size = options.block_size;
  in.batch.query_start_loc = staging.upload(tokens.query_start_loc, {schedule.requests + 1});
  in.batch.num_decodes = tokens.num_decodes;
  in.batch.num_decode_tokens = tokens.num_decodes;
  in.batch.num_prefills = tokens.num_prefills;
  return in;
}

// The leader's indexer: a fresh selection for this group, written on the
// compute stream. Returns what the group's layers must see.
reference::TopkOutputs SyntheticRun::produce_logical(const StepTokens& tokens, validation::DeviceScratch& staging,
                                                     std::vector<std::int32_t>* keep) {
  const std::vector<std::int32_t> logical = indexer_topk(tokens, options.topk, rng);
  staging.write(logical_buffer, logical);
  if (keep != nullptr) *keep = logical;
  return reference_topk(schedule, tokens, logical, options.topk, options.block_size, options.dcp);
}

void SyntheticRun::dump(int step, const StepTokens& tokens, const std::vector<std::int32_t>& logical,
                        const reference::TopkOutputs& want, std::uint64_t mismatches_before) {
  TopkDumpCase c;
  c.tokens = tokens.size();
  c.topk = options.topk;
  c.requests = schedule.requests;
  c.blocks_per_request = schedule.blocks_per_request;
  c.num_physical_blocks = schedule.num_physical_blocks;
  c.block_size = options.block_size;
  c.req_id = &tokens.req_id;
  c.block_table = &schedule.block_table;
  c.logical = &logical;
  c.physical = &want.physical;
  c.valid_counts = &want.valid_counts;
  c.extra_metadata = {{"seed", std::to_string(seed)},
                      {"step", std::to_string(step)},
                      {"group", "0"},
                      {"layers", std::to_string(options.layers)},
                      {"index_every", std::to_string(options.index_every)},
                      // the library's differences from the reference in this step, every layer
                      {"reference_mismatches", std::to_string(tally.mismatches - mismatches_before)}};
  if (options.dcp.enabled()) {  // the block table is this rank's
    c.extra_metadata["kind"] = "topk_convert_dcp";
    c.extra_metadata["dcp_size"] = std::to_string(options.dcp.size);
    c.extra_metadata["dcp_rank"] = std::to_string(options.dcp.rank);
    c.extra_metadata["dcp_interleave"] = std::to_string(options.dcp.interleave);
    c.extra_metadata["compact_to_front"] = options.dcp.compact ? "true" : "false";
  }
  char name[64];
  std::snprintf(name, sizeof name, "synthetic_step%02d_%s", step, step == 0 ? "prefill" : "decode");
  dumped.push_back(write_topk_dump(options.dump_dir, name, c));
}

TopkConversion SyntheticRun::run_layer(std::size_t layer, const StepInputs& in) {
  SparseMLAIndexGroup& group = *layers[layer].group;
  const int index = layers[layer].index_in_group;
  group.set_logical_topk_ready(index, *compute);
  group.prepare_for_batch(index, in.batch, *compute);
  return group.convert_logical_to_physical_topk(index, *compute, logical_buffer.tensor().rows(0, in.num_tokens), in.batch, 0,
                                                true);
}

std::uint64_t SyntheticRun::total(std::uint64_t ConversionCounts::*field) const {
  std::uint64_t n = 0;
  for (const auto& group : builder->groups()) n += group->conversion_counts().*field;
  return n;
}

// Prefill-sized: every layer converts into its own buffers; each layer's
// output is read back before the next (they are large).
void SyntheticRun::prefill_step() {
  validation::DeviceScratch staging(*compute);
  const StepTokens tokens = prefill_step_tokens(schedule);
  prefill_tokens = tokens.size();
  const StepInputs in = upload_step(tokens, staging);
  const std::uint64_t before = total(&ConversionCounts::prefill) + total(&ConversionCounts::decode);
  const std::uint64_t mismatches_before = tally.mismatches;
  const bool dumping = !options.dump_dir.empty();
  reference::TopkOutputs want, first_want;
  std::vector<std::int32_t> first_logical;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].index_in_group == 0) want = produce_logical(tokens, staging, dumping && l == 0 ? &first_logical : nullptr);
    if (dumping && l == 0) first_want = want;
    const TopkConversion result = run_layer(l, in);
    const std::vector<std::int32_t> physical = staging.download<std::int32_t>(result.physical);
    const std::vector<std::int32_t> counts = staging.download<std::int32_t>(result.valid_counts);
    compare_layer(tally, 0, static_cast<int>(l), physical.data(), counts.data(), want, options.topk);
  }
  prefill_conversions = total(&ConversionCounts::prefill) + total(&ConversionCounts::decode) - before;
  if (dumping) dump(0, tokens, first_logical, first_want, mismatches_before);
}

// Decode-sized: every layer's rows are copied out on the compute stream, as
// attention would read them, and checked after the step.
void SyntheticRun::decode_step(int step) {
  validation::DeviceScratch staging(*compute);
  const StepTokens tokens = decode_step_tokens(schedule);
  const StepInputs in = upload_step(tokens, staging);
  const std::size_t entries = static_cast<std::size_t>(in.num_tokens * options.topk);
  const auto num_layers = static_cast<std::int64_t>(layers.size());
  const Tensor physical = staging.allocate(DType::i32, {num_layers, in.num_tokens, options.topk});
  const Tensor counts = staging.allocate(DType::i32, {num_layers, in.num_tokens});
  std::vector<std::uint64_t> before;
  for (const auto& group : builder->groups()) before.push_back(group->conversion_counts().decode);
  std::vector<reference::TopkOutputs> want;
  const std::uint64_t mismatches_before = tally.mismatches;
  std::vector<std::int32_t> first_logical;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].index_in_group == 0) {
      want.push_back(produce_logical(tokens, staging, !options.dump_dir.empty() && l == 0 ? &first_logical : nullptr));
    }
    const TopkConversion result = run_layer(l, in);  // views of the group workspace
    compute->copy_bytes(physical.data_as<std::int32_t>() + l * entries, result.physical.data(), entries * 4);
    compute->copy_bytes(counts.data_as<std::int32_t>() + l * static_cast<std::size_t>(in.num_tokens),
                        result.valid_counts.data(), static_cast<std::size_t>(in.num_tokens) * 4);
  }
  const std::vector<std::int32_t> physical_host = staging.download<std::int32_t>(physical);
  const std::vector<std::int32_t> counts_host = staging.download<std::int32_t>(counts);
  std::size_t group = 0;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    if (l > 0 && layers[l].index_in_group == 0) ++group;
    compare_layer(tally, step, static_cast<int>(l), physical_host.data() + l * entries,
                  counts_host.data() + l * static_cast<std::size_t>(in.num_tokens), want[group], options.topk);
  }
  for (std::size_t g = 0; g < builder->groups().size(); ++g) {
    const std::uint64_t converted = builder->groups()[g]->conversion_counts().decode - before[g];
    decode_conversions += converted;
    once_per_group = once_per_group && converted == 1;
  }
  if (!options.dump_dir.empty()) dump(step, tokens, first_logical, want.front(), mismatches_before);
}

SyntheticReport report(const std::string& backend, const SyntheticRun& run) {
  const SyntheticOptions& o = run.options;
  const std::uint64_t groups = run.builder->groups().size();
  const std::uint64_t expected = groups * static_cast<std::uint64_t>(o.steps);
  SyntheticReport r;
  r.fields = {{"backend", backend}, {"layers", o.layers}, {"index_every", o.index_every}, {"groups", groups},
              {"requests", o.requests}, {"topk", o.topk}, {"block_size", o.block_size}, {"context", o.context},
              {"seed", run.seed}, {"prefill_tokens", run.prefill_tokens},
              {"prefill_conversions", run.prefill_conversions}, {"decode_steps", o.steps},
              {"decode_conversions", run.decode_conversions}, {"expected_decode_conversions", expected},
              {"dumped_files", run.dumped.size()}};
  if (o.dcp.enabled()) {
    r.fields["dcp_size"] = o.dcp.size;
    r.fields["dcp_rank"] = o.dcp.rank;
    r.fields["dcp_interleave"] = o.dcp.interleave;
    r.fields["compact"] = o.dcp.compact;
  }
  std::ostringstream heading;
  heading << "synthetic schedule on " << backend << " (seed " << run.seed << "): " << o.layers << " layers, " << groups
          << " index groups (an indexer every " << o.index_every << " layers), " << o.requests << " requests, top-k "
          << o.topk << ", block size " << o.block_size;
  if (o.dcp.enabled()) {
    heading << ", DCP rank " << o.dcp.rank << " of " << o.dcp.size << " (interleave " << o.dcp.interleave
            << (o.dcp.compact ? ", compacted)" : ")");
  }
  r.lines.push_back(heading.str());
  r.lines.push_back("  prefill step: " + std::to_string(run.prefill_tokens) + " tokens, " +
                    std::to_string(run.prefill_conversions) + " conversions");
  r.lines.push_back("  decode steps: " + std::to_string(o.steps) + ", " + std::to_string(run.decode_conversions) +
                    " conversions (expected " + std::to_string(expected) + ": once per group per step)");
  if (!run.dumped.empty()) {
    r.lines.push_back("  dumped " + std::to_string(run.dumped.size()) + " topk_convert files to " + o.dump_dir +
                      " (check them with: sparse-mla validate --golden " + o.dump_dir + "/*.safetensors)");
  }
  return r;
}

}  // namespace

void add_synthetic_options(CLI::App& validate, SyntheticOptions& o) {
  CLI::Option* synthetic = validate.add_flag("--synthetic", o.enabled,
                    "Run a DeepSeek-V3.2-shaped schedule through the index groups, checking every layer");
  validate.add_option("--layers", o.layers, "Synthetic: attention layers")->capture_default_str();
  validate.add_option("--index-every", o.index_every, "Synthetic: an index-producing layer every N layers")
      ->capture_default_str();
  validate.add_option("--requests", o.requests, "Synthetic: requests (decode rows per step)")->capture_default_str();
  validate.add_option("--topk", o.topk, "Synthetic: top-k width K")->capture_default_str();
  validate.add_option("--block-size", o.block_size, "Synthetic: KV-cache rows per block")->capture_default_str();
  validate.add_option("--context", o.context, "Synthetic: tokens per request at the end, at most")
      ->capture_default_str();
  validate.add_option("--steps", o.steps, "Synthetic: decode steps after the prefill step")->capture_default_str();
  validate.add_option_function<std::uint64_t>(
      "--seed", [&o](const std::uint64_t& seed) { o.seed = seed, o.seed_given = true; },
      "Synthetic: random seed (default: a fresh one, reported)");
  CLI::Option* hisparse =
      validate.add_flag("--hisparse", o.hisparse, "Synthetic: HiSparse groups (host pools, hot slots on the device)")
          ->needs(synthetic);
  validate.add_option("--hot-slots", o.hot_slots, "Synthetic, --hisparse: hot slots per request (0 = 2 x top-k)")
      ->capture_default_str()
      ->needs(hisparse);
  add_dcp_options(validate, o.dcp, "Synthetic: ");
  validate.add_option("--dump", o.dump_dir,
                      "Synthetic: write the first index group's conversion of every step to DIR as topk_convert "
                      "golden files (read them back with --golden)");
}

int run_synthetic(const std::string& backend, bool json, const SyntheticOptions& options, std::ostream& out) {
  check_options(options);
  if (options.hisparse) return run_hisparse_synthetic(backend, json, options, out);
  SyntheticRun run(backend, options);
  run.prefill_step();
  for (int step = 1; step <= options.steps; ++step) run.decode_step(step);
  const bool ok = run.tally.mismatches == 0 && run.once_per_group;
  report(backend, run).write(out, json, run.tally, ok);
  return ok ? exit_ok : exit_mismatch;
}

}  // namespace sparse_mla::cli
