// sparse-mla bench: times the library's kernels on one backend at
// DeepSeek-V3.2's shapes, next to copy ceilings measured in the same run.
//
// Each case is checked once against a reference before it is timed (a wrong
// kernel is never timed: the case fails and the exit code is 1). Method:
// bench_timing.hpp; cases: bench_*.cpp; output: bench_report.hpp.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "bench_report.hpp"
#include "bench_timing.hpp"
#include "bench_topk_inputs.hpp"
#include "commands.hpp"
#include "dcp_options.hpp"
#include "sparse_mla/device.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/kokkos_runtime.hpp"

namespace sparse_mla::cli {

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr int max_sets = 16384;  // bounds the launches a replay (or a graph) holds

struct BenchOptions {
  std::string backend = "host";
  int device = 0;
  bool quick = false;
  bool json = false;
  std::string json_file;  // --json-file: the JSON also goes here, the table to stdout
  bool list = false;
  std::vector<std::string> filters;
  int repeat = 0;         // 0: 20, or 5 with --quick
  int warmup = -1;        // -1: 3, or 1 with --quick
  int min_launches = 0;   // 0: 10, or 2 with --quick
  std::size_t rotate_mib = 0;  // 0: 200 (4x the H200's 50 MB L2), or 8 with --quick
  std::size_t memory_mib = 0;  // 0: a quarter of the device memory (2048 when unknown), or 512 with --quick
  std::uint64_t seed = 20260101;
  DcpConfig dcp;
  std::vector<std::int64_t> tokens;  // --tokens: the conversion cases' token counts (empty: the defaults)
};

struct Settings {
  RunInfo run;
  int repeat, warmup, min_launches;
};

Settings settle(const BenchOptions& o, const DeviceInfo& device) {
  Settings s;
  s.repeat = o.repeat > 0 ? o.repeat : (o.quick ? 5 : 20);
  s.warmup = o.warmup >= 0 ? o.warmup : (o.quick ? 1 : 3);
  s.min_launches = o.min_launches > 0 ? o.min_launches : (o.quick ? 2 : 10);
  s.run.device = device;
  s.run.quick = o.quick;
  s.run.seed = o.seed;
  s.run.rotate_bytes = (o.rotate_mib > 0 ? o.rotate_mib : (o.quick ? 8 : 200)) * MiB;
  std::size_t budget = o.memory_mib * MiB;
  if (budget == 0) budget = o.quick ? 512 * MiB : device.total_memory > 0 ? device.total_memory / 4 : 2048 * MiB;
  s.run.memory_budget = budget;
  return s;
}

std::vector<CaseSpec> select_cases(const BenchOptions& o, const BenchConfig& config) {
  std::vector<CaseSpec> all;
  add_copy_cases(all, config);
  add_convert_cases(all, config);
  add_upconvert_cases(all, config);
  add_group_cases(all, config);
  add_hisparse_cases(all, config);
  add_model_step_cases(all, config);
  add_gather_cases(all, config);
  add_floor_cases(all, config);  // derived from the cases above
  std::vector<std::regex> filters;
  for (const std::string& f : o.filters) {
    try {
      filters.emplace_back(f);
    } catch (const std::regex_error& e) {
      fail("bench --filter", "'", f, "' is not a regular expression: ", e.what());
    }
  }
  std::vector<CaseSpec> chosen;
  bool any_kernel = false;
  for (CaseSpec& c : all) {
    const bool match = filters.empty() || std::any_of(filters.begin(), filters.end(), [&](const std::regex& r) {
                         return std::regex_search(c.name, r);
                       });
    if (!match && !(c.is_ceiling && !o.list)) continue;  // ceilings always run: every ratio needs them
    any_kernel |= match;
    chosen.push_back(std::move(c));
  }
  if (!any_kernel) fail("bench --filter", "no case matches; `sparse-mla bench --list` shows them");
  return chosen;
}

// Rotation sets: enough copies of the working set to exceed rotate_bytes
// (and at least what the case's design needs), as many as fit in the memory
// budget. Launches per replay: whole cycles through the sets, so a stateful
// case sees its sets in the same order every replay.
TimingPlan plan_for(const BenchCase& c, const Settings& s) {
  const std::size_t set = std::max<std::size_t>(c.set_bytes(), 1);
  const std::size_t room = s.run.memory_budget > c.fixed_bytes() ? s.run.memory_budget - c.fixed_bytes() : 0;
  std::size_t sets = (s.run.rotate_bytes + set - 1) / set;
  sets = std::min<std::size_t>({sets, static_cast<std::size_t>(std::min(max_sets, c.max_sets())),
                                std::max<std::size_t>(room / set, 1)});
  TimingPlan plan;
  plan.sets = std::max(static_cast<int>(sets), c.min_sets());
  plan.launches = plan.sets * ((s.min_launches + plan.sets - 1) / plan.sets);
  plan.warmup = s.warmup;
  plan.repeat = s.repeat;
  return plan;
}

std::size_t bytes_needed(const BenchCase& c, const TimingPlan& plan) {
  return c.fixed_bytes() + c.set_bytes() * static_cast<std::size_t>(plan.sets);
}

CaseResult run_case(Device& device, Stream& stream, const CaseSpec& spec, const Settings& s, ProgressBar& progress) {
  CaseResult r;
  r.name = spec.name;
  r.shape = spec.shape;
  r.ceiling = spec.ceiling;
  r.is_ceiling = spec.is_ceiling;
  std::unique_ptr<BenchCase> bench_case = spec.make();
  r.traffic = bench_case->traffic();
  r.plan = plan_for(*bench_case, s);
  const int steps = 2 + r.plan.warmup + r.plan.repeat;
  if (bytes_needed(*bench_case, r.plan) > s.run.memory_budget) {
    r.outcome = "skipped: needs " + std::to_string(bytes_needed(*bench_case, r.plan) / MiB) +
                " MiB, over the memory cap (--memory-mib)";
    for (int i = 0; i < steps; ++i) progress.step(spec.name);
    return r;
  }
  progress.label(spec.name + " (setup)");
  bench_case->setup(device, stream, r.plan.sets);
  progress.step(spec.name + " (check)");
  const std::string mismatch = bench_case->check(device, stream);
  progress.step(spec.name);
  if (!mismatch.empty()) {
    r.outcome = "FAILED: " + mismatch;
    for (int i = 2; i < steps; ++i) progress.step(spec.name);
    return r;
  }
  r.timing = time_case(device, stream, *bench_case, r.plan, [&] { progress.step(spec.name); });
  r.timed = true;
  std::string note;
  const std::string broken = bench_case->after_timed(
      device, stream, static_cast<std::uint64_t>(r.plan.launches) * static_cast<std::uint64_t>(r.plan.repeat), note);
  r.outcome = broken.empty() ? "ok" : "FAILED: " + broken;
  if (!note.empty()) r.outcome += " (" + note + ")";
  return r;
}

int run_bench(const BenchOptions& o) {
  std::shared_ptr<Device> device = open_device(o.backend, o.device);
  Settings s = settle(o, device->info());
  s.run.kokkos = kokkos_version();
  s.run.execution_space = device->execution_space();
  BenchConfig config;
  config.quick = o.quick;
  config.seed = o.seed;
  check_dcp_options(o.dcp, TopkInputs::block_size, "bench");
  config.dcp = o.dcp;
  config.convert_tokens = o.tokens;
  config.copy_bytes = std::min(s.run.rotate_bytes, s.run.memory_budget / 2);
  const std::vector<CaseSpec> cases = select_cases(o, config);
  if (o.list) {
    for (const CaseSpec& c : cases) std::cout << c.name << "  (" << c.shape << ")\n";
    return exit_ok;
  }

  std::ofstream json_file;  // opened before the run, so that a path it cannot write fails at once
  if (!o.json_file.empty()) {
    json_file.open(o.json_file);
    if (!json_file) fail("bench --json-file", "cannot open '", o.json_file, "' for writing");
  }
  auto stream = device->create_stream();
  std::vector<CaseResult> results;
  {
    ProgressBar progress(static_cast<int>(cases.size()) * (2 + s.warmup + s.repeat));
    for (const CaseSpec& spec : cases) results.push_back(run_case(*device, *stream, spec, s, progress));
  }
  if (o.json) {
    print_json(std::cout, s.run, results);
  } else {
    print_table(std::cout, s.run, results);
  }
  if (json_file.is_open()) {
    print_json(json_file, s.run, results);
    if (!json_file.flush()) fail("bench --json-file", "cannot write '", o.json_file, "'");
  }
  const bool failed = std::any_of(results.begin(), results.end(),
                                  [](const CaseResult& r) { return r.outcome.rfind("FAILED", 0) == 0; });
  return failed ? exit_mismatch : exit_ok;
}

}  // namespace

void add_bench(CLI::App& app, Commands& commands) {
  auto options = std::make_shared<BenchOptions>();
  auto* bench = app.add_subcommand("bench", "Time the kernels at DeepSeek-V3.2 shapes against copy ceilings measured in the same run");
  bench->add_option("--backend", options->backend, "Backend to run on: host, cuda or hip")->capture_default_str();
  bench->add_option("--device", options->device, "Device index")->capture_default_str()->check(CLI::Range(0, 1023));
  bench->add_flag("--quick", options->quick, "A run of seconds: fewer replays, small rotation, the large shapes shrunk");
  bench->add_flag("--json", options->json, "Print the results as JSON on stdout");
  bench->add_option("--json-file", options->json_file, "Also write the results as JSON to this file");
  bench->add_flag("--list", options->list, "List the cases (after --filter) and exit");
  bench->add_option("--filter", options->filters, "Run only cases whose name matches this regular expression (repeatable)");
  bench->add_option("--repeat", options->repeat, "Timed replays per case (default 20, --quick 5)")->check(CLI::Range(1, 100000));
  bench->add_option("--warmup", options->warmup, "Untimed replays per case (default 3, --quick 1)")->check(CLI::Range(0, 100000));
  bench->add_option("--min-launches", options->min_launches, "Launches per replay at least (default 10, --quick 2)")
      ->check(CLI::Range(1, 100000));
  bench->add_option("--rotate-mib", options->rotate_mib, "Rotate each case through at least this many MiB of inputs (default 200, --quick 8)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
  bench->add_option("--memory-mib", options->memory_mib, "Most memory one case may use (default a quarter of the device's, --quick 512)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 24));
  bench->add_option("--seed", options->seed, "Seed of the generated inputs")->capture_default_str();
  add_dcp_options(*bench, options->dcp, "Conversion cases: ");
  bench->add_option("--tokens", options->tokens,
                    "Conversion cases: the token counts T to time (default 1 256 1024 32768, --quick 1 256 1024 4096)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  bench->callback([&commands, options] { commands.run = [options] { return run_bench(*options); }; });
}

}  // namespace sparse_mla::cli
