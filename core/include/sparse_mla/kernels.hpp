// The operations a backend must run, as one interface.
//
// Every backend implements it with the same Kokkos sources in core/kernels/,
// instantiated for its execution space (core/kernels/kokkos_kernels.hpp).
// Arguments are plain views (pointers, sizes, strides in elements) that the
// public entry points have already validated: kernels never allocate, never
// synchronise and never check.
#pragma once

#include <cstdint>

namespace sparse_mla {

class Stream;

struct FillI32Args {
  std::int32_t* data;
  std::int64_t count;
  std::int32_t value;
};

// SPEC section 2. For t < num_tokens, j < num_topk, tok = logical[t, j]:
//   physical[t, j] = block_table[req_id[t], tok / block_size] * block_stride_rows + tok % block_size
// or -1 when tok < 0 or the block is outside the table. With the prefill
// workspace (workspace_request != nullptr), a token whose workspace_request
// p >= 0 maps to workspace_starts[p] + tok instead. Arithmetic wraps like
// the reference's int32.
struct TopkConvertArgs {
  const std::int32_t* req_id;       // [num_tokens]
  const std::int32_t* block_table;  // [*, blocks_per_request], row stride block_table_stride
  std::int64_t block_table_stride;
  std::int32_t blocks_per_request;
  const std::int32_t* logical;  // [num_tokens, num_topk], row stride logical_stride
  std::int64_t logical_stride;
  std::int32_t* physical;  // [num_tokens, num_topk], row stride physical_stride
  std::int64_t physical_stride;
  std::int32_t* valid_counts;  // [num_tokens], or nullptr
  std::int64_t num_tokens;
  std::int32_t num_topk;
  std::int32_t block_size;
  std::int32_t block_stride_rows;
  const std::int32_t* workspace_request;  // [num_tokens], or nullptr
  const std::int32_t* workspace_starts;   // [num_prefill_requests], or nullptr
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  // Kokkos's name of the execution space: "Serial", "OpenMP", "Cuda", "HIP".
  virtual const char* execution_space() const = 0;
  // Binds an execution-space instance to the stream (its kernel context).
  virtual void bind(Stream& stream) const = 0;

  // data[0 .. count) = value: poisoning outputs, clearing slot maps.
  virtual void fill_i32(Stream& stream, const FillI32Args& args) const = 0;
  // core/kernels/topk_convert.hpp
  virtual void convert_topk(Stream& stream, const TopkConvertArgs& args) const = 0;
};

}  // namespace sparse_mla
