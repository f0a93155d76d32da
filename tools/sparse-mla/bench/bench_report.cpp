#include "bench_report.hpp"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace sparse_mla::cli {

const char* ceiling_name(Ceiling ceiling) {
  return ceiling == Ceiling::device_copy ? "device_copy" : "pinned_copy";
}

double ceiling_gbps(const std::vector<CaseResult>& results, Ceiling ceiling) {
  for (const CaseResult& r : results) {
    if (r.is_ceiling && r.ceiling == ceiling && r.timed) return r.gbps();
  }
  return 0;
}

double at_ceiling_us(const std::vector<CaseResult>& results, const CaseResult& r) {
  const double ceiling = ceiling_gbps(results, r.ceiling);
  return ceiling > 0 ? static_cast<double>(r.traffic.total()) / (ceiling * 1e3) : 0;
}

namespace {

std::string fixed(double value, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << value;
  return s.str();
}

std::string mib(std::size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

void print_table(std::ostream& out, const RunInfo& run, const std::vector<CaseResult>& results) {
  out << "sparse-mla bench on " << run.device.backend << ": " << run.device.name << " (" << run.device.architecture
      << "), Kokkos " << run.kokkos << " " << run.execution_space << (run.quick ? ", --quick" : "") << "\n";
  out << "per-launch median over timed replays; each case rotates through >= " << mib(run.rotate_bytes)
      << " of inputs (memory cap " << mib(run.memory_budget) << "); GB/s counts bytes read + written\n"
      << "(cases against the pinned ceiling read their half over the host link: link rate = bytes read / time)\n\n";
  // Columns as wide as their longest entry (at least the usual widths).
  std::size_t name_width = 25, shape_width = 34;
  for (const CaseResult& r : results) {
    name_width = std::max(name_width, r.name.size() + 2);
    shape_width = std::max(shape_width, r.shape.size() + 2);
  }
  const auto nw = static_cast<int>(name_width), sw = static_cast<int>(shape_width);
  out << std::left << std::setw(nw) << "case" << std::setw(sw) << "shape" << std::right << std::setw(6) << "sets"
      << std::setw(8) << "method" << std::setw(12) << "median us" << std::setw(12) << "min us" << std::setw(10)
      << "GB/s" << std::setw(9) << "ceiling" << std::setw(14) << "at ceiling us" << "  check\n";
  for (const CaseResult& r : results) {
    out << std::left << std::setw(nw) << r.name << std::setw(sw) << r.shape << std::right;
    if (!r.timed) {
      out << std::setw(6) << "-" << std::setw(8) << "-" << std::setw(12) << "-" << std::setw(12) << "-"
          << std::setw(10) << "-" << std::setw(9) << "-" << std::setw(14) << "-" << "  " << r.outcome << "\n";
      continue;
    }
    const double ceiling = ceiling_gbps(results, r.ceiling);
    const std::string ratio = r.is_ceiling ? "=" + std::string(r.ceiling == Ceiling::device_copy ? "dev" : "pin")
                                           : ceiling > 0 ? fixed(100 * r.gbps() / ceiling, 0) + "%" : "-";
    out << std::setw(6) << r.plan.sets << std::setw(8) << r.timing.method << std::setw(12)
        << fixed(r.timing.median_us, 2) << std::setw(12) << fixed(r.timing.min_us, 2) << std::setw(10)
        << fixed(r.gbps(), 1) << std::setw(9) << ratio << std::setw(14)
        << (ceiling > 0 ? fixed(at_ceiling_us(results, r), 2) : "-") << "  " << r.outcome << "\n";
  }
}

void print_json(std::ostream& out, const RunInfo& run, const std::vector<CaseResult>& results) {
  nlohmann::ordered_json doc;
  doc["device"] = {{"backend", run.device.backend},
                   {"name", run.device.name},
                   {"architecture", run.device.architecture},
                   {"total_memory", run.device.total_memory},
                   {"index", run.device.index}};
  doc["kokkos"] = {{"version", run.kokkos}, {"execution_space", run.execution_space}};
  doc["config"] = {{"quick", run.quick},
                   {"rotate_bytes", run.rotate_bytes},
                   {"memory_budget", run.memory_budget},
                   {"seed", run.seed}};
  doc["ceilings_gbps"] = {{"device_copy", ceiling_gbps(results, Ceiling::device_copy)},
                          {"pinned_copy", ceiling_gbps(results, Ceiling::pinned_copy)}};
  nlohmann::ordered_json cases = nlohmann::ordered_json::array();
  for (const CaseResult& r : results) {
    nlohmann::ordered_json c = {{"name", r.name},
                        {"shape", r.shape},
                        {"ceiling", ceiling_name(r.ceiling)},
                        {"is_ceiling", r.is_ceiling},
                        {"bytes_read", r.traffic.read},
                        {"bytes_written", r.traffic.written},
                        {"outcome", r.outcome},
                        {"timed", r.timed}};
    if (r.timed) {
      const double ceiling = ceiling_gbps(results, r.ceiling);
      c["method"] = r.timing.method;
      c["sets"] = r.plan.sets;
      c["launches_per_replay"] = r.plan.launches;
      c["replays"] = r.plan.repeat;
      c["median_us"] = r.timing.median_us;
      c["min_us"] = r.timing.min_us;
      c["max_us"] = r.timing.max_us;
      c["per_launch_us"] = r.timing.per_launch_us;
      c["gbps"] = r.gbps();
      c["read_gbps"] = static_cast<double>(r.traffic.read) / (r.timing.median_us * 1e3);
      c["ratio_to_ceiling"] = ceiling > 0 ? r.gbps() / ceiling : 0.0;
      c["at_ceiling_us"] = at_ceiling_us(results, r);
    }
    cases.push_back(std::move(c));
  }
  doc["cases"] = std::move(cases);
  out << doc.dump(2) << "\n";
}

ProgressBar::ProgressBar(int total) : enabled_(isatty(fileno(stderr)) != 0), total_(std::max(total, 1)) {}

ProgressBar::~ProgressBar() {
  if (enabled_) std::cerr << "\r\033[K" << std::flush;
}

void ProgressBar::label(const std::string& label) {
  label_ = label;
  draw();
}

void ProgressBar::step(const std::string& label) {
  ++done_;
  label_ = label;
  draw();
}

void ProgressBar::draw() {
  if (!enabled_) return;
  constexpr int width = 30;
  const int filled = std::min(width, done_ * width / total_);
  std::cerr << "\r\033[K[" << std::string(static_cast<std::size_t>(filled), '=')
            << std::string(static_cast<std::size_t>(width - filled), ' ') << "] " << std::min(done_, total_) << "/"
            << total_ << " " << label_ << std::flush;
}

}  // namespace sparse_mla::cli
