// sparse-mla validate: runs cases on one backend and compares them with what
// they must reproduce (validate.hpp). Exit 0 when every case matches, 1 when
// any differs, 2 when an input or an argument is unusable.
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "sparse_mla/error.hpp"
#include "synthetic.hpp"
#include "validation/cases.hpp"

namespace sparse_mla::cli {

namespace {

using namespace validation;

struct ValidateOptions {
  std::vector<std::string> golden;
  std::string backend = "host";
  bool json = false;
  std::string fp8_format;  // "" = each file's own
  std::string kv_format;   // "" = each file's own
  std::vector<CaseSource> sources;
  SyntheticOptions synthetic;  // --synthetic: synthetic.hpp
};

void print_text(const ValidateOptions& o, const std::vector<CaseResult>& results) {
  int failed = 0;
  for (const CaseResult& r : results) {
    failed += !r.ok();
    std::cout << (r.ok() ? "ok    " : "FAIL  ") << r.name << "  (" << r.kind << "): ";
    if (r.mismatches) {
      std::cout << r.mismatches << " of " << r.compared << " values differ\n";
    } else {
      std::cout << r.compared << " values match\n";
    }
    for (const std::string& m : r.first_mismatches) std::cout << "        " << m << "\n";
  }
  std::cout << results.size() << " case(s) on " << o.backend << ": " << results.size() - failed << " ok, " << failed
            << " failed\n";
}

void print_json(const ValidateOptions& o, const Device& device, const std::vector<CaseResult>& results,
                const nlohmann::ordered_json& synthetic) {
  nlohmann::ordered_json doc;
  bool ok = true;
  nlohmann::ordered_json cases = nlohmann::ordered_json::array();
  for (const CaseResult& r : results) {
    ok = ok && r.ok();
    cases.push_back({{"name", r.name},
                     {"kind", r.kind},
                     {"ok", r.ok()},
                     {"compared", r.compared},
                     {"mismatches", r.mismatches},
                     {"first_mismatches", r.first_mismatches},
                     {"details", r.details}});
  }
  doc["ok"] = ok;
  doc["backend"] = o.backend;
  doc["execution_space"] = device.execution_space();
  doc["fp8_format"] = o.fp8_format.empty() ? "per file" : o.fp8_format;
  doc["kv_format"] = o.kv_format.empty() ? "per file" : o.kv_format;
  doc["cases"] = cases;
  if (!synthetic.is_null()) {
    doc["synthetic"] = synthetic;
    doc["ok"] = ok && synthetic.value("ok", false);
  }
  std::cout << doc.dump(2) << "\n";
}

// The golden cases (and the other sources), prepared: every input is read
// and checked before anything runs.
std::vector<PreparedCase> prepare_all(const ValidateOptions& o) {
  std::vector<PreparedCase> prepared;
  for (const CaseSource& source : o.sources) {
    for (PreparedCase& c : source()) prepared.push_back(std::move(c));
  }
  return prepared;
}

std::optional<Fp8Format> chosen_format(const ValidateOptions& o) {
  if (o.fp8_format.empty()) return std::nullopt;
  Fp8Format format{};
  if (!parse_fp8_format(o.fp8_format, format)) fail("validate", "unknown --fp8-format '", o.fp8_format, "'");
  return format;
}

std::optional<KvFormat> chosen_kv_format(const ValidateOptions& o) {
  if (o.kv_format.empty()) return std::nullopt;
  KvFormat format{};
  if (!parse_kv_format(o.kv_format, format)) fail("validate", "unknown --kv-format '", o.kv_format, "'");
  return format;
}

int run_validate(const ValidateOptions& o) {
  if (!o.synthetic.dump_dir.empty() && !o.synthetic.enabled) {
    fail("validate", "--dump writes the synthetic schedule's cases; it needs --synthetic");
  }
  const std::vector<PreparedCase> prepared = prepare_all(o);
  if (prepared.empty() && !o.synthetic.enabled) {
    fail("validate", "nothing to validate: give --golden FILE... or --synthetic");
  }
  // --synthetic alone prints its own report.
  if (prepared.empty()) return run_synthetic(o.backend, o.json, o.synthetic, std::cout);
  auto device = open_device(o.backend);
  const ValidateContext context{*device, chosen_format(o), chosen_kv_format(o)};
  std::vector<CaseResult> results;
  bool ok = true;
  for (const PreparedCase& c : prepared) {
    results.push_back(c(context));
    ok = ok && results.back().ok();
  }
  std::ostringstream synthetic_report;
  if (o.synthetic.enabled) ok = run_synthetic(o.backend, o.json, o.synthetic, synthetic_report) == exit_ok && ok;
  if (o.json) {
    print_json(o, *device, results,
               o.synthetic.enabled ? nlohmann::ordered_json::parse(synthetic_report.str()) : nlohmann::ordered_json());
  } else {
    print_text(o, results);
    std::cout << synthetic_report.str();
  }
  return ok ? exit_ok : exit_mismatch;
}

}  // namespace

void add_validate(CLI::App& app, Commands& commands) {
  auto options = std::make_shared<ValidateOptions>();
  auto* validate = app.add_subcommand("validate", "Run cases on a backend and compare with golden outputs");
  validate->add_option("--golden", options->golden, "safetensors golden files (golden/README.md)")->expected(1, -1);
  validate->add_option("--backend", options->backend, "host, cuda or hip")
      ->check(CLI::IsMember({"host", "cuda", "hip"}));
  validate->add_flag("--json", options->json, "print one JSON object");
  validate->add_option("--fp8-format", options->fp8_format, "fp8 encoding of the caches (default: each file's own)")
      ->check(CLI::IsMember({"e4m3fn", "e4m3fnuz"}));
  validate->add_option("--kv-format", options->kv_format,
                       "cache format the gather-upconvert files must hold, fp8_ds_mla or model1_fp8 (default: each "
                       "file's own; a file of the other format is refused)")
      ->check(CLI::IsMember({"fp8_ds_mla", "model1_fp8"}));
  add_synthetic_options(*validate, options->synthetic);
  // The options own their sources: a source refers back to them by plain
  // pointer (a shared_ptr here would be a cycle, never freed).
  const ValidateOptions* golden = options.get();
  options->sources.push_back([golden] {
    std::vector<PreparedCase> cases;
    for (const std::string& path : golden->golden) cases.push_back(prepare_golden(path));
    return cases;
  });
  validate->callback([options, &commands] { commands.run = [options] { return run_validate(*options); }; });
}

}  // namespace sparse_mla::cli
