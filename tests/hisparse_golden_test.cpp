// The golden HiSparse sequence (h1_hisparse_6steps, produced by the
// reference's CUDA kernels on an H200) replayed through this library's
// kernels on every backend: every defined output, the slot and LRU state and
// the hot cache after each of the 6 steps must match bit for bit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "backend_test.hpp"
#include "validation/hisparse_replay.hpp"
#include "validation/safetensors.hpp"

namespace sparse_mla::testing {
namespace {

std::string golden_path(const std::string& stem) {
  const char* env = std::getenv("SPARSE_MLA_GOLDEN_DIR");
  // The variable wins only where it names a folder that exists (a machine
  // may set it for another checkout); else the project's own copy.
  const bool usable = env && *env && std::filesystem::is_directory(env);
  const std::string dir = usable ? env : SPARSE_MLA_SOURCE_DIR "/tests/data/golden";
  return dir + "/" + stem + ".safetensors";
}

class HiSparseGoldenTest : public BackendTest {};
SPARSE_MLA_INSTANTIATE_BACKENDS(HiSparseGoldenTest);

TEST_P(HiSparseGoldenTest, H1SixStepsReplayExactly) {
  const std::string path = golden_path("h1_hisparse_6steps");
  ASSERT_TRUE(std::filesystem::exists(path)) << "golden file missing: " << path << " (set SPARSE_MLA_GOLDEN_DIR)";
  const SafetensorsFile file = SafetensorsFile::read(path);
  const HiSparseReplay replay = replay_hisparse_sequence(*device, file);
  // 6 steps x 11 tensors, plus the hit and miss totals.
  EXPECT_EQ(replay.checks.size(), 6u * 11u + 2u);
  EXPECT_GT(replay.compared, 6 * 9 * 64 * 656);  // the hot caches alone
  EXPECT_GT(replay.skipped, 0);                  // swap entries past the counts, the padding row's miss mask
  for (const ReplayCheck& check : replay.checks) {
    EXPECT_EQ(check.mismatches, 0) << check.name << ": " << check.mismatches << " of " << check.compared
                                   << " differ, first " << check.first_mismatch;
  }
  EXPECT_EQ(replay.mismatches, 0);
  EXPECT_EQ(replay.hits, 478u);
  EXPECT_EQ(replay.misses, 633u);
}

}  // namespace
}  // namespace sparse_mla::testing
