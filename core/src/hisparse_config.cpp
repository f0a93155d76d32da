#include "sparse_mla/hisparse_config.hpp"

#include <algorithm>

#include "sparse_mla/error.hpp"

namespace sparse_mla {

namespace {
constexpr std::int32_t max_hot_slots = 32768;  // slot ids are int16 in the LRU
}  // namespace

void check_hisparse_row_bytes(const char* where, std::int64_t row_bytes) {
  if (row_bytes <= 0 || row_bytes % 16 != 0) {
    fail(where, "KV rows of ", row_bytes, " bytes are not a positive multiple of 16 bytes; HiSparse moves rows in ",
         "16-byte units");
  }
}

HiSparseConfig resolve_hisparse_config(const HiSparseConfig& config, std::int64_t group_top_k) {
  constexpr const char* where = "HiSparseConfig";
  HiSparseConfig r = config;
  if (group_top_k < 1 || group_top_k > max_hot_slots) fail(where, "top-k K must be in [1, ", max_hot_slots, "], got ", group_top_k);
  if (r.top_k == 0) r.top_k = static_cast<std::int32_t>(group_top_k);
  if (r.top_k != group_top_k) fail(where, "top_k is ", r.top_k, " but the group's logical top-k buffer has K = ", group_top_k);
  if (r.max_rows_per_request < 1) {
    fail(where, "max_rows_per_request must be at least 1 (one batch row per request), got ", r.max_rows_per_request);
  }
  const std::int64_t union_rows = max_union_rows(r);
  if (union_rows > max_hot_slots) {
    fail(where, "max_rows_per_request ", r.max_rows_per_request, " x top-k K ", r.top_k, " = ", union_rows,
         " selected rows per request exceeds ", max_hot_slots, " (the union must fit the hot slots, whose ids are int16)");
  }
  // Default: one top-k of slack beyond the largest union, as vLLM's device_buffer_size.
  if (r.hot_slots == 0) r.hot_slots = static_cast<std::int32_t>(std::min<std::int64_t>(union_rows + group_top_k, max_hot_slots));
  if (r.hot_slots < r.top_k) {
    fail(where, "hot_slots H = ", r.hot_slots, " is smaller than top-k K = ", r.top_k,
         ": a request's whole selection must fit in its hot slots (H >= K)");
  }
  if (r.hot_slots < union_rows) {
    fail(where, "hot_slots H = ", r.hot_slots, " is smaller than max_union_rows = max_rows_per_request ",
         r.max_rows_per_request, " x top-k K ", r.top_k, " = ", union_rows,
         ": the union of a request's rows must fit in its hot slots (H >= max_rows_per_request * K)");
  }
  if (r.hot_slots > max_hot_slots) fail(where, "hot_slots H = ", r.hot_slots, " exceeds ", max_hot_slots, " (slot ids are int16)");
  if (r.max_requests < 1) fail(where, "max_requests must be positive, got ", r.max_requests);
  if (r.block_size < 1) fail(where, "block_size must be positive, got ", r.block_size);
  if (r.attention_block_stride == 0) r.attention_block_stride = r.block_size;
  if (r.attention_block_stride < r.block_size) {
    fail(where, "attention_block_stride ", r.attention_block_stride, " is smaller than block_size ", r.block_size);
  }
  if (r.row_bytes != 0) check_hisparse_row_bytes(where, r.row_bytes);
  const std::int64_t tokens = r.max_tokens_per_request == 0 ? r.top_k : r.max_tokens_per_request;
  if (tokens < 1) fail(where, "max_tokens_per_request must not be negative, got ", r.max_tokens_per_request);
  const std::int64_t blocks_per_request = (tokens + r.block_size - 1) / r.block_size;
  const std::int64_t needed = static_cast<std::int64_t>(r.max_requests) * blocks_per_request * r.block_size;
  if (r.host_pool_rows < needed) {
    fail(where, "the host pool of ", r.host_pool_rows, " rows is too small for ", r.max_requests, " requests of ", tokens,
         " tokens (", blocks_per_request, " blocks of ", r.block_size, " rows each): it needs ", needed, " rows");
  }
  if (r.host_pool_rows > int32_max) fail(where, "host_pool_rows ", r.host_pool_rows, " exceeds 2^31 - 1 (host rows are int32)");
  const std::int64_t hot_blocks = static_cast<std::int64_t>(r.max_requests) * ((r.hot_slots + r.block_size - 1) / r.block_size);
  if (hot_blocks * r.attention_block_stride > int32_max) {
    fail(where, "the hot caches would hold ", hot_blocks * r.attention_block_stride, " rows, more than 2^31 - 1");
  }
  return r;
}

}  // namespace sparse_mla
