// sparse-mla validate: runs cases on one backend and compares them with what
// they must reproduce (validate.hpp). Exit 0 when every case matches, 1 when
// any differs, 2 when an input or an argument is unusable.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/kernels.hpp"
#include "validate.hpp"

namespace sparse_mla::cli {

namespace {

using namespace validation;

struct ValidateOptions {
  std::vector<std::string> golden;
  std::string backend = "host";
  bool json = false;
  std::string fp8_format;  // "" = each file's own
  std::vector<CaseSource> sources;
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

void print_json(const ValidateOptions& o, const Device& device, const std::vector<CaseResult>& results) {
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
  doc["execution_space"] = device.kernels().execution_space();
  doc["fp8_format"] = o.fp8_format.empty() ? "per file" : o.fp8_format;
  doc["cases"] = cases;
  std::cout << doc.dump(2) << "\n";
}

int run_validate(const ValidateOptions& o) {
  // Every input is read and checked before anything runs.
  std::vector<PreparedCase> prepared;
  for (const CaseSource& source : o.sources) {
    for (PreparedCase& c : source()) prepared.push_back(std::move(c));
  }
  if (prepared.empty()) fail("validate", "nothing to validate: give --golden FILE...");
  std::optional<Fp8Format> format;
  if (!o.fp8_format.empty()) {
    Fp8Format f{};
    if (!parse_fp8_format(o.fp8_format, f)) fail("validate", "unknown --fp8-format '", o.fp8_format, "'");
    format = f;
  }
  auto device = open_device(o.backend);
  const ValidateContext context{*device, format};
  std::vector<CaseResult> results;
  bool ok = true;
  for (const PreparedCase& c : prepared) {
    results.push_back(c(context));
    ok = ok && results.back().ok();
  }
  if (o.json) {
    print_json(o, *device, results);
  } else {
    print_text(o, results);
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
  options->sources.push_back([options] {
    std::vector<PreparedCase> cases;
    for (const std::string& path : options->golden) cases.push_back(prepare_golden(path));
    return cases;
  });
  validate->callback([options, &commands] { commands.run = [options] { return run_validate(*options); }; });
}

}  // namespace sparse_mla::cli
