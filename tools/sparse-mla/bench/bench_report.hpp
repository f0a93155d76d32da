// What `sparse-mla bench` prints: a table for people, JSON for machines, and
// a progress bar on stderr when stderr is a terminal.
#pragma once

#include <cstddef>
#include <iosfwd>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "bench_timing.hpp"
#include "sparse_mla/device.hpp"

namespace sparse_mla::cli {

struct CaseResult {
  std::string name;
  std::string shape;
  Ceiling ceiling = Ceiling::device_copy;
  bool is_ceiling = false;
  Traffic traffic;
  TimingPlan plan;
  Timing timing;
  bool timed = false;
  std::string outcome;  // "ok", "FAILED: <first mismatch>" or "skipped: <why>"
  double gbps() const { return timed ? static_cast<double>(traffic.total()) / (timing.median_us * 1e3) : 0; }
};

struct RunInfo {
  DeviceInfo device;
  std::string kokkos;
  std::string execution_space;
  bool quick = false;
  std::size_t rotate_bytes = 0;
  std::size_t memory_budget = 0;
  std::uint64_t seed = 0;
};

// GB/s of the ceiling a case is compared with (0 when it was not measured).
double ceiling_gbps(const std::vector<CaseResult>& results, Ceiling ceiling);
// Microseconds a case's bytes take at its ceiling: the time it cannot beat
// (0 when the ceiling was not measured).
double at_ceiling_us(const std::vector<CaseResult>& results, const CaseResult& r);

void print_table(std::ostream& out, const RunInfo& run, const std::vector<CaseResult>& results);
void print_json(std::ostream& out, const RunInfo& run, const std::vector<CaseResult>& results);

// Draws "[=====>    ] 12/40 convert/T=256" on stderr, only when it is a terminal.
class ProgressBar {
 public:
  explicit ProgressBar(int total);
  ~ProgressBar();
  void step(const std::string& label);
  void label(const std::string& label);

 private:
  void draw();
  bool enabled_;
  int total_;
  int done_ = 0;
  std::string label_;
};

}  // namespace sparse_mla::cli
