// Replays a `hisparse_sequence` golden file (golden/README.md) through this
// library's HiSparse kernels on a device, step by step, and compares every
// output the reference defines, plus the slot state and the hot cache after
// each step. Used by `sparse-mla validate --golden` and by the tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparse_mla/device.hpp"
#include "validation/safetensors.hpp"

namespace sparse_mla {

// One compared tensor of one step ("step3.lru_slots").
struct ReplayCheck {
  std::string name;
  std::int64_t compared = 0;    // entries compared (the defined ones)
  std::int64_t mismatches = 0;
  std::string first_mismatch;   // "[1, 17]: got 5, expected 6", or ""
};

struct HiSparseReplay {
  std::vector<ReplayCheck> checks;
  std::int64_t compared = 0;
  std::int64_t mismatches = 0;
  std::int64_t skipped = 0;  // entries the reference leaves undefined
  std::uint64_t hits = 0;    // the kernels' hit and miss counters over all steps
  std::uint64_t misses = 0;
};

// Throws Error when the file is not a usable hisparse_sequence case (wrong
// kind, missing tensors, shapes that disagree with the metadata).
HiSparseReplay replay_hisparse_sequence(Device& device, const SafetensorsFile& file);

}  // namespace sparse_mla
