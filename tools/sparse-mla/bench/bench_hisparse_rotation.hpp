// The HiSparse swap-in at DeepSeek-V3.2's shapes (top-k 2048, 4096 hot slots
// per request row, 656-byte rows, block size 64), set up so that every timed
// launch has an exact, designed hit rate, on the HiSparse rig of
// tools/validation (validation/hisparse_rig.hpp: the tables, slot state,
// host pool, hot cache and counters on the device).
//
// Each request row selects a *fixed* part (the same `fixed` positions every
// step: always hits once loaded) and a *rotating* part (K - fixed positions
// that change with the rotation set c). The rotating parts of a cycle of
// `sets` steps are disjoint and the cycle is long enough that a part is
// evicted before it comes back, so in steady state every launch has exactly
// `fixed` hits and K - fixed misses per row. The pinned host pool's bytes are
// a function of their position (validation::pool_word), so the gather is
// checked without a host copy of the pool.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "validation/hisparse_rig.hpp"

namespace sparse_mla::cli {

struct HiSparseShape {
  static constexpr std::int32_t top_k = 2048;
  static constexpr std::int32_t hot_slots = 4096;
  static constexpr std::int32_t block_size = 64;
  static constexpr std::int64_t row_bytes = 656;
  static constexpr std::int32_t hot_blocks_per_row = hot_slots / block_size;
};
// The shape's short names, for the HiSparse cases' sources.
namespace hisparse_shape {
inline constexpr std::int32_t K = HiSparseShape::top_k;
inline constexpr std::int32_t H = HiSparseShape::hot_slots;
inline constexpr std::int32_t block = HiSparseShape::block_size;
inline constexpr std::int64_t row_bytes = HiSparseShape::row_bytes;
}  // namespace hisparse_shape

// The fixed part of a selection that gives `hit_percent` hits in steady state.
inline std::int32_t fixed_for_hits(int hit_percent) {
  return static_cast<std::int32_t>((static_cast<std::int64_t>(HiSparseShape::top_k) * hit_percent + 50) / 100);
}

// After the timed launches: sets `note` to the hit rate counted, and returns
// "" when the counts are the design's, else what differs.
std::string check_hit_counts(std::uint64_t hits, std::uint64_t misses, std::uint64_t want_hits, std::uint64_t want_misses,
                             std::string& note);

class HiSparseRotation {
 public:
  // rows: request rows of the batch; fixed: hits per row in steady state;
  // with_pool: allocate the host pool and the hot cache (for the gather);
  // rotate_outputs: every rotation set has its own outputs (else the sets
  // share one, for a case whose many rotations would not fit otherwise).
  HiSparseRotation(std::int32_t rows, std::int32_t fixed, bool with_pool, std::uint64_t seed, bool rotate_outputs = true);

  // Sets a cycle of `sets` steps needs for the designed hit rate.
  int min_sets() const;
  std::size_t set_bytes() const;    // per rotation set: inputs, outputs, pool rows it brings in
  std::size_t fixed_bytes() const;  // state, tables, hot cache, the fixed part of the pool
  std::uint64_t misses_per_launch() const { return static_cast<std::uint64_t>(rows_) * (HiSparseShape::top_k - fixed_); }
  std::uint64_t hits_per_launch() const { return static_cast<std::uint64_t>(rows_) * fixed_; }

  // Allocates and fills the sets' inputs; the slot state starts empty.
  void setup(Device& device, Stream& stream, int sets);
  void resolve(Stream& stream, int set);
  void gather(Stream& stream, int set);
  // Resets the slot state to empty, runs set 0 (resolve, and the gather when
  // there is a pool) and compares the first and last rows with the scalar
  // model of tools/validation/reference and the gathered rows with the pool.
  std::string check(Stream& stream);
  // After check(): "" when every row that set 0 swapped in is, in
  // `hot_cache` (laid out as the rig's own), host row `pool_row_offset` + g of
  // a pool filled by validation::fill_pool(pool_seed).
  std::string check_gathered(Stream& stream, const Buffer& hot_cache, std::uint64_t pool_seed,
                             std::int64_t pool_row_offset) const;
  // Hits and misses added to the group counters so far.
  std::vector<std::int64_t> counters() const { return rig_->hit_miss_counters(); }

  // After setup: the outputs of a set (its swap lists), the host pool's rows
  // and the hot cache's blocks the rotation's tables address.
  const HiSparseResolveOutputs& outputs(int set) const { return outputs_[static_cast<std::size_t>(set)]; }
  std::int64_t host_rows() const { return static_cast<std::int64_t>(rows_) * context_blocks_ * HiSparseShape::block_size; }
  std::int64_t hot_cache_blocks() const { return 1 + static_cast<std::int64_t>(rows_) * HiSparseShape::hot_blocks_per_row; }

 private:
  std::vector<std::int32_t> selection(int set) const;  // [rows, top_k]
  reference::HiSparseTables tables() const;
  std::string compare_rows() const;

  std::int32_t rows_;
  std::int32_t fixed_;
  bool with_pool_;
  std::uint64_t seed_;
  bool rotate_outputs_;
  std::int32_t context_blocks_ = 0;  // source blocks per request
  std::vector<std::int32_t> source_table_;
  std::unique_ptr<validation::HiSparseRig> rig_;
  Buffer logical_, hot_table_, ids_;
  Buffer hot_indices_, attention_, swap_host_, swap_device_, valid_, swap_counts_;
  std::vector<HiSparseResolveInputs> inputs_;
  std::vector<HiSparseResolveOutputs> outputs_;
  HiSparseSlotState state_;
};

}  // namespace sparse_mla::cli
