// The top-k conversion (SPEC section 2) as a validated public operation:
// logical token positions to physical KV-cache rows. The call checks shapes,
// dtypes, devices and capacities, throws sparse_mla::Error naming the
// argument and the values, and queues nothing when it rejects.
// Implemented by core/src/topk_convert.cpp over core/kernels/topk_convert.hpp.
#pragma once

#include <cstdint>
#include <string>

#include "sparse_mla/device.hpp"
#include "sparse_mla/tensor.hpp"

namespace sparse_mla {

// Decode context parallelism (SPEC section 2a): the KV cache of a request
// is spread over `size` ranks in groups of `interleave` consecutive tokens
// (vLLM's cp_kv_cache_interleave_size); this rank converts only its own
// tokens, through its rank-local block table, and gives -1 for the others.
// size == 1 is the plain conversion exactly.
struct DcpConfig {
  std::int32_t size = 1;
  std::int32_t rank = 0;        // in [0, size)
  std::int32_t interleave = 1;  // divides the block size
  // The valid outputs of a row moved to a prefix [0, valid_count) in input
  // order and the rest -1 (the reference's compact_valid_to_front); else
  // every output stays in its input column.
  bool compact = true;
  bool enabled() const { return size > 1; }
};

// Throws Error naming `where` unless size >= 1 and 0 <= rank < size (the
// interleave is checked where the block size is known).
void check_dcp_split(const std::string& where, const DcpConfig& dcp);

struct TopkConvertParams {
  std::int32_t block_size = 64;
  // Rows between consecutive physical blocks; 0 means block_size.
  std::int64_t block_stride_rows = 0;
  // DCP conversions produce valid counts whatever this says (SPEC 2a).
  bool return_valid_counts = true;
  DcpConfig dcp;
  // Prefill-workspace variant: both defined, or neither (not with DCP).
  Tensor workspace_request;  // int32 [>= T]: -1 for a decode token, else its prefill request p
  Tensor workspace_starts;   // int32 [P]

  // Whether the conversion writes valid counts: when asked, and always with DCP.
  bool writes_valid_counts() const { return return_valid_counts || dcp.enabled(); }
};

struct TopkConversion {
  Tensor physical;      // int32 [T, K]
  Tensor valid_counts;  // int32 [T]; undefined unless requested or DCP
  // Own the outputs when the library allocated them (no caller buffers).
  // Keep them alive until the stream has run the conversion.
  OwnedTensor physical_storage;
  OwnedTensor valid_counts_storage;
};

// req_id: int32 [>= T] (the first T entries are used), block_table: int32
// [R, B], logical: int32 [T, K]. `out` (int32 [>= T, K]) and
// `valid_counts_out` (int32 [>= T]) are optional caller-owned outputs; when
// given, nothing is allocated.
TopkConversion convert_logical_to_physical_topk(Stream& stream, const Tensor& req_id, const Tensor& block_table,
                                                const Tensor& logical, const TopkConvertParams& params,
                                                const Tensor& out = Tensor(),
                                                const Tensor& valid_counts_out = Tensor());
// Every check of convert_logical_to_physical_topk, queueing nothing: for
// callers that queue other work (a stream wait) before the conversion and
// must reject before that (the index groups).
void check_logical_to_physical_topk(const Device& device, const Tensor& req_id, const Tensor& block_table,
                                    const Tensor& logical, const TopkConvertParams& params,
                                    const Tensor& out = Tensor(), const Tensor& valid_counts_out = Tensor());

// Host-side deep check for the validating entry points (CLI, debug): reads
// req_id and block_table (host-visible copies) and checks that every request
// id is a row of the table and every block id is in [0, num_physical_blocks).
// Throws naming the first bad position.
void check_topk_table_values(const std::int32_t* req_id, std::int64_t num_tokens, const std::int32_t* block_table,
                             std::int64_t num_requests, std::int64_t blocks_per_request,
                             std::int64_t num_physical_blocks);

}  // namespace sparse_mla
