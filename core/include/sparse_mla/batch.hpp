// Per-step metadata the engine passes to the index groups: the reference's
// `attn_metadata` (SPEC sections 4 and 5). Tensors are views the engine owns
// and keeps alive until the work queued with them has run.
#pragma once

#include <cstdint>

#include "sparse_mla/tensor.hpp"

namespace sparse_mla {

// SPEC section 5's prefill staging plan (compact block table, host row ids,
// resident device row ids). Defined in hisparse_prefill.hpp.
struct HiSparsePrefillStagingPlan;
// The per-step tables of a HiSparse decode step (hisparse_config.hpp).
struct HiSparseBatch;

struct BatchMetadata {
  // int32 [>= T]: the batch row (request) of each query token, decode tokens
  // first; the first T entries are used.
  Tensor req_id_per_token;
  // int32 [R, B]: physical block id of each request's logical block.
  Tensor block_table;
  // Rows per KV-cache block.
  std::int32_t block_size = 0;
  // int32 [R + 1]: first token of each request; query_start_loc[R] = T.
  Tensor query_start_loc;
  // Decode requests come first: rows [0, num_decodes) of the block table,
  // tokens [0, num_decode_tokens); the num_prefills prefill requests follow.
  std::int64_t num_decodes = 0;
  std::int64_t num_decode_tokens = 0;
  std::int64_t num_prefills = 0;
  // HiSparse only (the reference's attn_metadata.prefill.host_staging_plan):
  // set by the engine for a step whose prefill requests do not have all their
  // pages resident on the device; not owned. Plain groups never read it.
  HiSparsePrefillStagingPlan* prefill_staging_plan = nullptr;
  // HiSparse only: the state row of each batch row and the resident and hot
  // block tables of the step; not owned. Required by HiSparse groups.
  const HiSparseBatch* hisparse = nullptr;
};

}  // namespace sparse_mla
