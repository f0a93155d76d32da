// What `sparse-mla bench` times: one BenchCase per kernel and shape.
//
// A case owns its inputs and outputs for several *rotation sets*: copies of
// the working set at different addresses, so that consecutive launches do
// not find their data in the device's L2 (the timed launch i uses set
// i % sets). bench.cpp decides how many sets fit, times launch() with the
// method of bench_timing.hpp and checks the output once with check().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/topk_convert.hpp"

namespace sparse_mla::cli {

// Bytes one launch moves, counted as the issues count them (reads and
// writes of the data the kernel exists to move; table reads are extra).
struct Traffic {
  std::uint64_t read = 0;
  std::uint64_t written = 0;
  std::uint64_t total() const { return read + written; }
};

// Which copy ceiling a case is compared with: device memory to device memory,
// or pinned host memory read by the device (over the host link).
enum class Ceiling { device_copy, pinned_copy };
const char* ceiling_name(Ceiling ceiling);

class BenchCase {
 public:
  virtual ~BenchCase() = default;
  virtual Traffic traffic() const = 0;
  // Device memory one rotation set occupies (inputs and outputs).
  virtual std::size_t set_bytes() const = 0;
  // Allocates `sets` rotation sets and fills their inputs.
  virtual void setup(Device& device, Stream& stream, int sets) = 0;
  // Queues one launch on `stream` over rotation set `set`. Must not allocate
  // or synchronise: it may be captured into a graph.
  virtual void launch(Stream& stream, int set) = 0;
  // Poisons set 0's outputs, launches once and compares them with a cheap
  // independent reference. Returns "" or what differs (first mismatch).
  virtual std::string check(Device& device, Stream& stream) = 0;

  // Rotation sets the case needs at least (a designed hit-rate cycle).
  virtual int min_sets() const { return 1; }
  // Rotation sets the case can take at most: a case whose launch queues many
  // graph nodes (a fork and join per layer) keeps its graph small enough to
  // capture and instantiate in seconds.
  virtual int max_sets() const { return 16384; }
  // Memory the case holds however many sets it has (state, tables, caches).
  virtual std::size_t fixed_bytes() const { return 0; }
  // Around the timed replays (after the warm-up): a case that carries state
  // checks a known relation over exactly the timed launches. after_timed
  // returns "" or what broke the relation, and may set a note for the table.
  virtual void before_timed(Device& /*device*/, Stream& /*stream*/) {}
  virtual std::string after_timed(Device& /*device*/, Stream& /*stream*/, std::uint64_t /*timed_launches*/,
                                  std::string& /*note*/) {
    return "";
  }
};

struct CaseSpec {
  std::string name;   // "convert/T=256": kernel, then shape
  std::string shape;  // "K=2048, 256 tokens", for the table
  Ceiling ceiling = Ceiling::device_copy;
  // A ceiling case measures its ceiling (a plain copy) instead of being
  // compared with it; ceilings run whatever --filter says.
  bool is_ceiling = false;
  std::function<std::unique_ptr<BenchCase>()> make;
};

// Sizes that depend on --quick and the options.
struct BenchConfig {
  bool quick = false;
  std::uint64_t seed = 0;
  std::size_t copy_bytes = 0;  // size of the copy-ceiling buffers
  DcpConfig dcp;               // --dcp-*: the DCP conversion cases (convert-dcp/...) when dcp.size > 1
  std::vector<std::int64_t> convert_tokens;  // --tokens: the conversion cases' token counts (empty: the defaults)
};

// The cases, in the order they run; each family lives in its own file.
void add_copy_cases(std::vector<CaseSpec>& cases, const BenchConfig& config);
void add_floor_cases(std::vector<CaseSpec>& cases, const BenchConfig& config);
void add_convert_cases(std::vector<CaseSpec>& cases, const BenchConfig& config);
void add_upconvert_cases(std::vector<CaseSpec>& cases, const BenchConfig& config);
void add_group_cases(std::vector<CaseSpec>& cases, const BenchConfig& config);
void add_hisparse_cases(std::vector<CaseSpec>& cases, const BenchConfig& config);
void add_model_step_cases(std::vector<CaseSpec>& cases, const BenchConfig& config);
void add_gather_cases(std::vector<CaseSpec>& cases, const BenchConfig& config);

}  // namespace sparse_mla::cli
