#include "sparse_mla/hisparse_ops.hpp"

#include <limits>

#include "sparse_mla/error.hpp"
#include "sparse_mla/kernels.hpp"

namespace sparse_mla {

namespace {

constexpr std::int64_t int32_max = std::numeric_limits<std::int32_t>::max();
constexpr std::int32_t max_hot_slots = 32768;  // slot ids are int16 in the LRU

// A block table: int32 [rows, blocks], rows packed, on the device.
void check_table(const char* where, const char* name, const Tensor& table, const Device& device) {
  check(where, name, table).dtype(DType::i32).rank(2).rows_contiguous().on(device);
  if (table.dim(0) > int32_max || table.dim(1) > int32_max) {
    fail(where, name, " has shape ", table.shape_string(), ", more than 2^31 - 1 rows or blocks");
  }
}

void check_rows(const char* where, const char* name, const Tensor& t, std::int64_t rows, std::int64_t k,
                const Device& device) {
  check(where, name, t).dtype(DType::i32).rank(2).rows_contiguous().dim_at_least(0, rows, "rows of logical top-k")
      .dim(1, k, "K of logical top-k").on(device);
}

void check_counts(const char* where, const char* name, const Tensor& t, std::int64_t rows, const Device& device) {
  check(where, name, t).dtype(DType::i32).rank(1).contiguous().dim_at_least(0, rows, "one per batch row").on(device);
}

void check_resolve(const HiSparseResolveInputs& in, const HiSparseSlotState& state, std::int32_t H,
                   const HiSparseResolveOutputs& out, const Device& device) {
  constexpr const char* where = "resolve_hisparse";
  check(where, "logical top-k", in.logical).dtype(DType::i32).rank(2).rows_contiguous().on(device);
  const std::int64_t T = in.logical.dim(0);
  const std::int64_t K = in.logical.dim(1);
  if (K < 1 || T > int32_max) fail(where, "logical top-k has shape ", in.logical.shape_string(), ", expected [< 2^31, >= 1]");
  if (H < K || H > max_hot_slots) {
    fail(where, "hot_slots must be in [K, ", max_hot_slots, "] = [", K, ", ", max_hot_slots, "], got ", H);
  }
  check_counts(where, "request_ids", in.request_ids, T, device);
  if (in.request_state_indices.defined()) check_counts(where, "request_state_indices", in.request_state_indices, T, device);
  check_table(where, "source_block_table", in.source_block_table, device);
  if (in.source_block_size < 1) fail(where, "source_block_size must be positive, got ", in.source_block_size);
  if (in.host_rows < 0) fail(where, "host_rows must not be negative, got ", in.host_rows);
  if (in.resident_block_table.defined()) check_table(where, "resident_block_table", in.resident_block_table, device);
  if (in.resident_block_size < 0) fail(where, "resident_block_size must not be negative, got ", in.resident_block_size);
  if (in.hot_block_size < 1) fail(where, "hot_block_size must be positive, got ", in.hot_block_size);
  check_table(where, "hot_block_table", in.hot_block_table, device);
  check(where, "hot_block_table", in.hot_block_table).dim_at_least(0, T, "one row per batch row")
      .dim_at_least(1, (H + in.hot_block_size - 1) / in.hot_block_size, "hot blocks covering hot_slots");
  if (in.attention_block_stride < 0 || (in.attention_block_stride != 0 && in.attention_block_stride < in.hot_block_size)) {
    fail(where, "attention_block_stride must be 0 or >= hot_block_size (", in.hot_block_size, "), got ",
         in.attention_block_stride);
  }
  check(where, "slot_rows", state.slot_rows).dtype(DType::i32).rank(2).rows_contiguous().dim_at_least(1, H, "hot_slots").on(device);
  check(where, "lru", state.lru).dtype(DType::i16).rank(2).rows_contiguous().dim(1, H, "hot_slots")
      .dim(0, state.slot_rows.dim(0), "state rows of slot_rows").on(device);
  if (state.lru.dim(0) > int32_max) fail(where, "lru has ", state.lru.dim(0), " state rows, more than 2^31 - 1");
  check_rows(where, "hot_indices", out.hot_indices, T, K, device);
  check_rows(where, "swap_host_rows", out.swap_host_rows, T, K, device);
  check_rows(where, "swap_device_rows", out.swap_device_rows, T, K, device);
  const std::int64_t stride = out.hot_indices.stride(0);
  const auto same_stride = [&](const char* name, const Tensor& t) {
    if (t.stride(0) != stride) {
      fail(where, name, " has row stride ", t.stride(0), " but hot_indices has ", stride, "; they must match");
    }
  };
  same_stride("swap_host_rows", out.swap_host_rows);
  same_stride("swap_device_rows", out.swap_device_rows);
  if (out.resolved_rows.defined()) {
    check_rows(where, "resolved_rows", out.resolved_rows, T, K, device);
    same_stride("resolved_rows", out.resolved_rows);
  }
  if (out.miss_mask.defined()) {
    check_rows(where, "miss_mask", out.miss_mask, T, K, device);
    same_stride("miss_mask", out.miss_mask);
  }
  if (out.attention_indices.defined()) check_rows(where, "attention_indices", out.attention_indices, T, K, device);
  if (out.valid_counts.defined()) check_counts(where, "valid_counts", out.valid_counts, T, device);
  check_counts(where, "swap_counts", out.swap_counts, T, device);
  if (out.hit_miss_counters.defined()) {
    check(where, "hit_miss_counters", out.hit_miss_counters).dtype(DType::i64).rank(1).dim(0, 2, "hits, misses").on(device);
  }
}

template <class T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data_as<T>() : nullptr;
}

}  // namespace

void resolve_hisparse(Stream& stream, const HiSparseResolveInputs& in, const HiSparseSlotState& state,
                      std::int32_t H, const HiSparseResolveOutputs& out) {
  Device& device = stream.device();
  check_resolve(in, state, H, out, device);
  HiSparseResolveArgs a{};
  a.logical = in.logical.data_as<std::int32_t>();
  a.logical_stride = in.logical.stride(0);
  a.request_ids = in.request_ids.data_as<std::int32_t>();
  a.request_state_indices = data_or_null<std::int32_t>(in.request_state_indices);
  a.source_block_table = in.source_block_table.data_as<std::int32_t>();
  a.source_table_stride = in.source_block_table.stride(0);
  a.source_num_requests = static_cast<std::int32_t>(in.source_block_table.dim(0));
  a.source_blocks_per_request = static_cast<std::int32_t>(in.source_block_table.dim(1));
  a.source_block_size = in.source_block_size;
  a.host_rows = in.host_rows;
  if (in.resident_block_table.defined()) {
    a.resident_block_table = in.resident_block_table.data_as<std::int32_t>();
    a.resident_table_stride = in.resident_block_table.stride(0);
    a.resident_num_requests = static_cast<std::int32_t>(in.resident_block_table.dim(0));
    a.resident_blocks_per_request = static_cast<std::int32_t>(in.resident_block_table.dim(1));
  }
  a.resident_block_size = in.resident_block_size == 0 ? in.source_block_size : in.resident_block_size;
  a.resident_null_block = in.resident_null_block;
  a.hot_block_table = in.hot_block_table.data_as<std::int32_t>();
  a.hot_table_stride = in.hot_block_table.stride(0);
  a.hot_block_size = in.hot_block_size;
  a.attention_block_stride = in.attention_block_stride == 0 ? in.hot_block_size : in.attention_block_stride;
  a.slot_rows = state.slot_rows.data_as<std::int32_t>();
  a.slot_rows_stride = state.slot_rows.stride(0);
  a.lru = state.lru.data_as<std::int16_t>();
  a.lru_stride = state.lru.stride(0);
  a.num_state_rows = static_cast<std::int32_t>(state.lru.dim(0));
  a.hot_indices = out.hot_indices.data_as<std::int32_t>();
  a.attention_indices = data_or_null<std::int32_t>(out.attention_indices);
  a.attention_stride = out.attention_indices.defined() ? out.attention_indices.stride(0) : 0;
  a.resolved_rows = data_or_null<std::int32_t>(out.resolved_rows);
  a.miss_mask = data_or_null<std::int32_t>(out.miss_mask);
  a.swap_host_rows = out.swap_host_rows.data_as<std::int32_t>();
  a.swap_device_rows = out.swap_device_rows.data_as<std::int32_t>();
  a.out_stride = out.hot_indices.stride(0);
  a.valid_counts = data_or_null<std::int32_t>(out.valid_counts);
  a.swap_counts = out.swap_counts.data_as<std::int32_t>();
  // Counts never reach 2^63, so the int64 tensor holds them as unsigned.
  a.hit_miss_counters = reinterpret_cast<unsigned long long*>(data_or_null<std::int64_t>(out.hit_miss_counters));
  a.num_rows = in.logical.dim(0);
  a.top_k = static_cast<std::int32_t>(in.logical.dim(1));
  a.hot_slots = H;
  device.kernels().resolve_hisparse(stream, a);
}

void gather_hisparse(Stream& stream, const HiSparseGatherTensors& t, std::int64_t num_rows) {
  constexpr const char* where = "gather_hisparse";
  Device& device = stream.device();
  check(where, "host_pool", t.host_pool).dtype(DType::u8).rank(2).contiguous().on(device);
  const std::int64_t row_bytes = t.host_pool.dim(1);
  if (row_bytes < 16 || row_bytes % 16 != 0) {
    fail(where, "host_pool rows are ", row_bytes, " bytes; HiSparse rows must be a positive multiple of 16 bytes");
  }
  check(where, "hot_cache", t.hot_cache).dtype(DType::u8).rank(3).rows_contiguous().dim(2, row_bytes, "row bytes of host_pool")
      .on(device);
  if (t.hot_cache.dim(1) < 1 || t.hot_cache.dim(1) > int32_max) {
    fail(where, "hot_cache has shape ", t.hot_cache.shape_string(), "; its block size must be in [1, 2^31)");
  }
  if (t.hot_cache.stride(0) % 16 != 0) fail(where, "hot_cache block stride ", t.hot_cache.stride(0), " is not a multiple of 16 bytes");
  if (num_rows < 0 || num_rows > int32_max) fail(where, "num_rows must be in [0, 2^31), got ", num_rows);
  check(where, "swap_host_rows", t.swap_host_rows).dtype(DType::i32).rank(2).rows_contiguous().dim_at_least(0, num_rows, "num_rows")
      .on(device);
  const std::int64_t K = t.swap_host_rows.dim(1);
  if (K > int32_max) fail(where, "swap_host_rows has ", K, " columns, more than 2^31 - 1");
  check(where, "swap_device_rows", t.swap_device_rows).dtype(DType::i32).rank(2).rows_contiguous()
      .dim_at_least(0, num_rows, "num_rows").dim(1, K, "columns of swap_host_rows").on(device);
  if (t.swap_device_rows.stride(0) != t.swap_host_rows.stride(0)) {
    fail(where, "swap_device_rows has row stride ", t.swap_device_rows.stride(0), " but swap_host_rows has ",
         t.swap_host_rows.stride(0), "; they must match");
  }
  check(where, "swap_counts", t.swap_counts).dtype(DType::i32).rank(1).contiguous().dim_at_least(0, num_rows, "num_rows").on(device);
  const auto aligned = [](const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; };
  if (!aligned(t.host_pool.data()) || !aligned(t.hot_cache.data())) {
    fail(where, "host_pool and hot_cache must start on 16-byte boundaries (the gather moves 16-byte units)");
  }

  HiSparseGatherArgs a{};
  a.host_pool = t.host_pool.data_as<std::uint8_t>();
  a.host_rows = t.host_pool.dim(0);
  a.hot_cache = t.hot_cache.data_as<std::uint8_t>();
  a.hot_rows = t.hot_cache.dim(0) * t.hot_cache.dim(1);
  a.hot_block_size = static_cast<std::int32_t>(t.hot_cache.dim(1));
  a.hot_block_stride_bytes = t.hot_cache.stride(0);
  a.row_bytes = row_bytes;
  a.swap_host_rows = t.swap_host_rows.data_as<std::int32_t>();
  a.swap_device_rows = t.swap_device_rows.data_as<std::int32_t>();
  a.swap_stride = t.swap_host_rows.stride(0);
  a.swap_counts = t.swap_counts.data_as<std::int32_t>();
  a.num_rows = num_rows;
  a.max_swaps = static_cast<std::int32_t>(K);
  device.kernels().gather_hisparse(stream, a);
}

}  // namespace sparse_mla
