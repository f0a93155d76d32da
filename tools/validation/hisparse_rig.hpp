// One HiSparse set-up on a device, shared by the kernels' tests and the
// benchmark: the tables of a reference::HiSparseTables (source and resident),
// the slot state, a pinned host pool whose bytes are a function of their
// place (pool_word), a hot cache and the hit and miss counters. run() takes
// a step through the public operations (resolve, then gather) on poisoned
// outputs and reads everything back, to be compared with the scalar model of
// validation/reference/hisparse_reference.hpp; compare_row() and
// compare_gathered() say where a result differs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "sparse_mla/tensor.hpp"
#include "validation/reference/hisparse_reference.hpp"

namespace sparse_mla::validation {

// Word `i` (8 bytes) of a host pool filled with `seed`.
std::uint64_t pool_word(std::uint64_t seed, std::uint64_t i);
// Fills `pool` (all its bytes, a multiple of 8) with pool_word, in chunks.
void fill_pool(Stream& stream, const Buffer& pool, std::uint64_t seed);
// Row `row` of a pool of rows of `row_bytes` (a multiple of 8) filled with `seed`.
std::vector<std::uint8_t> pool_row(std::uint64_t seed, std::int64_t row, std::int64_t row_bytes);
// "" when row `hot_row` of `hot_cache` (a host copy, rows of `row_bytes`
// packed) holds row `host_row` of a pool filled with `seed`.
std::string compare_pool_row(const std::vector<std::uint8_t>& hot_cache, std::int64_t row_bytes, std::int64_t hot_row,
                             std::int64_t host_row, std::uint64_t seed);
// "" when every swap pair of `result` (rows of `top_k` entries) put host row
// `pool_row_offset` + its host row of a pool filled with `seed` into its hot
// row of `hot_cache`.
std::string compare_gathered(const std::vector<std::uint8_t>& hot_cache, std::int64_t row_bytes,
                             const reference::HiSparseResult& result, std::int32_t top_k, std::uint64_t seed,
                             std::int64_t pool_row_offset = 0);
// "" when the `n` values of `got` and `want` (row `row` of output `what`)
// agree, else the first that differs.
template <class T>
std::string compare_row(const char* what, std::int32_t row, const T* got, const T* want, std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j) {
    if (got[j] != want[j]) {
      return std::string(what) + "[" + std::to_string(row) + ", " + std::to_string(j) + "] = " + std::to_string(got[j]) +
             ", the scalar model gives " + std::to_string(want[j]);
    }
  }
  return "";
}

class HiSparseRig {
 public:
  // What the rig's own outputs hold before a step: what no kernel wrote.
  static constexpr std::int32_t poison = -123456789;

  // `hot_cache_blocks` blocks of tables.hot_block_size rows of `row_bytes`
  // (bytes 0xEE) and a pinned pool of tables.host_rows rows filled with
  // `pool_seed`; with hot_cache_blocks 0 neither (the resolve alone). The
  // rig's own outputs, of `max_rows` rows, are allocated when first used.
  HiSparseRig(Stream& stream, const reference::HiSparseTables& tables, const reference::HiSparseState& initial,
              std::int32_t max_rows, std::int64_t row_bytes, std::int64_t hot_cache_blocks, std::uint64_t pool_seed);

  Stream& stream() const { return stream_; }
  const reference::HiSparseTables& tables() const { return tables_; }
  std::int64_t row_bytes() const { return row_bytes_; }
  std::uint64_t pool_seed() const { return pool_seed_; }

  // The slot state on the device; set_state() keeps its tensors where the
  // shape is the same.
  HiSparseSlotState slot_state() const { return HiSparseSlotState{slot_rows_, lru_}; }
  void set_state(const reference::HiSparseState& state);
  reference::HiSparseState state() const;

  const Tensor& host_pool() const { return host_pool_; }
  const Tensor& hot_cache() const { return hot_cache_; }
  // Every hot cache byte becomes 0xEE.
  void clear_hot_cache();
  std::vector<std::uint8_t> hot_cache_bytes() const;
  // Row `row` of the host pool as it was filled.
  std::vector<std::uint8_t> pool_row(std::int64_t row) const { return validation::pool_row(pool_seed_, row, row_bytes_); }
  const Tensor& counters() const { return counters_; }
  std::vector<std::int64_t> hit_miss_counters() const;

  // The resolve's inputs for a step's tensors, with the rig's tables.
  HiSparseResolveInputs inputs(const Tensor& logical, const Tensor& request_ids, const Tensor& state_indices,
                               const Tensor& hot_block_table) const;
  // The gather of `out`'s swap lists from the pool into the hot cache.
  void gather(const HiSparseResolveOutputs& out, std::int64_t rows) const;
  // The first `rows` rows of `out`'s outputs, read back (an output `out`
  // does not give stays empty).
  reference::HiSparseResult read(const HiSparseResolveOutputs& out, std::int32_t rows) const;

  // The rig's own outputs, of max_rows rows of the last step's K (the
  // tables' top_k before any step): the resolve's required ones, and its
  // optional ones (attention indices, resolved rows, miss mask, valid
  // counts, counters) unless optional_outputs is false.
  HiSparseResolveOutputs outputs();
  // Every int32 of the rig's own outputs becomes `poison`.
  void poison_outputs();
  // Poisons the rig's own outputs, resolves `step` into them and gathers
  // (when the rig has a pool); returns them read back. A step may select
  // fewer or more entries a row than the tables' top_k (a call of another
  // shape on the same state).
  reference::HiSparseResult run(const reference::HiSparseStep& step);

  // false: the rig's steps ask for none of the resolve's optional outputs;
  // their buffers keep the poison.
  bool optional_outputs = true;
  // When defined, the rig's steps read this table by state row
  // (hot_table_by_state) instead of the step's table by batch row.
  OwnedTensor hot_table_by_state;

 private:
  // Poisoned outputs of max_rows rows of `top_k` entries, unless they are.
  void allocate_outputs(std::int32_t top_k);

  Stream& stream_;
  reference::HiSparseTables tables_;
  std::int32_t max_rows_;
  std::int64_t row_bytes_;
  std::uint64_t pool_seed_;
  OwnedTensor source_, resident_, slot_rows_, lru_, host_pool_, hot_cache_, counters_;
  OwnedTensor hot_indices_, attention_, resolved_, miss_, swap_host_, swap_device_, valid_, swaps_;
};

}  // namespace sparse_mla::validation
