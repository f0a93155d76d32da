#include "sparse_mla/hisparse_ops.hpp"

#include "kernels.hpp"
#include "sparse_mla/error.hpp"

namespace sparse_mla {

namespace {

constexpr std::int32_t max_hot_slots = hisparse_max_hot_slots;  // int16 slot ids; the resolve kernel packs K and H into 15-16 bits

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

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

void check_state(const char* where, const HiSparseSlotState& state, std::int32_t H, const Device& device) {
  check(where, "slot_rows", state.slot_rows).dtype(DType::i32).rank(2).rows_contiguous().dim_at_least(1, H, "hot_slots").on(device);
  check(where, "lru", state.lru).dtype(DType::i16).rank(2).rows_contiguous().dim(1, H, "hot_slots")
      .dim(0, state.slot_rows.dim(0), "state rows of slot_rows").on(device);
  if (state.lru.dim(0) > int32_max) fail(where, "lru has ", state.lru.dim(0), " state rows, more than 2^31 - 1");
}

void check_outputs(const char* where, const HiSparseResolveOutputs& out, std::int64_t T, std::int64_t K, const Device& device) {
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
  check_state(where, state, H, device);
  check_counts(where, "request_ids", in.request_ids, T, device);
  if (in.request_state_indices.defined()) check_counts(where, "request_state_indices", in.request_state_indices, T, device);
  check_table(where, "source_block_table", in.source_block_table, device);
  if (in.source_block_size < 1) fail(where, "source_block_size must be positive, got ", in.source_block_size);
  if (in.host_rows < 0) fail(where, "host_rows must not be negative, got ", in.host_rows);
  if (in.resident_block_table.defined()) check_table(where, "resident_block_table", in.resident_block_table, device);
  if (in.resident_block_size < 0) fail(where, "resident_block_size must not be negative, got ", in.resident_block_size);
  if (in.hot_block_size < 1) fail(where, "hot_block_size must be positive, got ", in.hot_block_size);
  check_table(where, "hot_block_table", in.hot_block_table, device);
  check(where, "hot_block_table", in.hot_block_table)
      .dim_at_least(0, in.hot_table_by_state ? state.lru.dim(0) : T, in.hot_table_by_state ? "one row per state row" : "one row per batch row")
      .dim_at_least(1, (H + in.hot_block_size - 1) / in.hot_block_size, "hot blocks covering hot_slots");
  if (in.attention_block_stride < 0 || (in.attention_block_stride != 0 && in.attention_block_stride < in.hot_block_size)) {
    fail(where, "attention_block_stride must be 0 or >= hot_block_size (", in.hot_block_size, "), got ",
         in.attention_block_stride);
  }
  check_outputs(where, out, T, K, device);
}


// A pool or cache of rows: uint8 [rows, row_bytes], row_bytes a positive multiple of 16, 16-byte aligned.
void check_row_pool(const char* where, const char* name, const Tensor& pool, const Device& device) {
  check(where, name, pool).dtype(DType::u8).rank(2).contiguous().on(device);
  if (pool.dim(1) < 16 || pool.dim(1) % 16 != 0) {
    fail(where, name, " rows are ", pool.dim(1), " bytes; HiSparse rows must be a positive multiple of 16 bytes");
  }
  if (!aligned16(pool.data())) fail(where, name, " must start on a 16-byte boundary (rows move in 16-byte units)");
  if (pool.dim(0) > int32_max) fail(where, name, " has ", pool.dim(0), " rows, more than 2^31 - 1");
}

template <class T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data_as<T>() : nullptr;
}

}  // namespace

void check_resolve_hisparse(const Device& device, const HiSparseResolveInputs& inputs, const HiSparseSlotState& state,
                            std::int32_t hot_slots, const HiSparseResolveOutputs& outputs) {
  check_resolve(inputs, state, hot_slots, outputs, device);
}

void resolve_hisparse(Stream& stream, const HiSparseResolveInputs& in, const HiSparseSlotState& state,
                      std::int32_t H, const HiSparseResolveOutputs& out) {
  Device& device = stream.device();
  check_resolve_hisparse(device, in, state, H, out);
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
  a.hot_table_by_state = in.hot_table_by_state;
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
  a.hit_miss_counters = reinterpret_cast<std::uint64_t*>(data_or_null<std::int64_t>(out.hit_miss_counters));
  a.num_rows = in.logical.dim(0);
  a.top_k = static_cast<std::int32_t>(in.logical.dim(1));
  a.hot_slots = H;
  detail::kernels_of(device).resolve_hisparse(stream, a);
}

namespace {

// A layer's pool and hot cache as the gather reads and fills them; throws
// naming the tensor (after `layer`, its place in the call's list) and what
// is wrong with it.
void check_layer_rows(const char* where, const std::string& layer, const HiSparseLayerRows& l, const Device& device) {
  const std::string pool = layer + "host_pool", hot = layer + "hot_cache";
  check_row_pool(where, pool.c_str(), l.host_pool, device);
  check(where, hot.c_str(), l.hot_cache).dtype(DType::u8).rank(3).rows_contiguous()
      .dim(2, l.host_pool.dim(1), "row bytes of its host_pool").on(device);
  if (l.hot_cache.dim(1) < 1 || l.hot_cache.dim(1) > int32_max) {
    fail(where, hot, " has shape ", l.hot_cache.shape_string(), "; its block size must be in [1, 2^31)");
  }
  if (l.hot_cache.stride(0) % 16 != 0) fail(where, hot, " block stride ", l.hot_cache.stride(0), " is not a multiple of 16 bytes");
  if (!aligned16(l.hot_cache.data())) fail(where, hot, " must start on a 16-byte boundary (rows move in 16-byte units)");
}

// Whether two layers can share one launch (HiSparseGatherArgs: one
// geometry for every layer).
bool same_geometry(const HiSparseLayerRows& a, const HiSparseLayerRows& b) {
  return a.host_pool.dim(0) == b.host_pool.dim(0) && a.host_pool.dim(1) == b.host_pool.dim(1) &&
         a.hot_cache.dim(0) == b.hot_cache.dim(0) && a.hot_cache.dim(1) == b.hot_cache.dim(1) &&
         a.hot_cache.stride(0) == b.hot_cache.stride(0);
}

}  // namespace

int gather_hisparse_layers(Stream& stream, const std::vector<HiSparseLayerRows>& layers, const Tensor& swap_host_rows,
                           const Tensor& swap_device_rows, const Tensor& swap_counts, std::int64_t num_rows) {
  constexpr const char* where = "gather_hisparse";
  Device& device = stream.device();
  for (std::size_t l = 0; l < layers.size(); ++l) {
    check_layer_rows(where, layers.size() == 1 ? std::string() : "layers[" + std::to_string(l) + "].", layers[l], device);
  }
  if (num_rows < 0 || num_rows > int32_max) fail(where, "num_rows must be in [0, 2^31), got ", num_rows);
  check(where, "swap_host_rows", swap_host_rows).dtype(DType::i32).rank(2).rows_contiguous()
      .dim_at_least(0, num_rows, "num_rows").on(device);
  const std::int64_t K = swap_host_rows.dim(1);
  if (K > int32_max) fail(where, "swap_host_rows has ", K, " columns, more than 2^31 - 1");
  check(where, "swap_device_rows", swap_device_rows).dtype(DType::i32).rank(2).rows_contiguous()
      .dim_at_least(0, num_rows, "num_rows").dim(1, K, "columns of swap_host_rows").on(device);
  if (swap_device_rows.stride(0) != swap_host_rows.stride(0)) {
    fail(where, "swap_device_rows has row stride ", swap_device_rows.stride(0), " but swap_host_rows has ",
         swap_host_rows.stride(0), "; they must match");
  }
  check(where, "swap_counts", swap_counts).dtype(DType::i32).rank(1).contiguous().dim_at_least(0, num_rows, "num_rows").on(device);

  // One launch for each run of up to max_gather_layers consecutive
  // layers of one geometry.
  int launches = 0;
  for (std::size_t first = 0; first < layers.size();) {
    const HiSparseLayerRows& f = layers[first];
    HiSparseGatherArgs a{};
    a.num_layers = 0;
    while (first + a.num_layers < layers.size() && a.num_layers < max_gather_layers &&
           same_geometry(f, layers[first + a.num_layers])) {
      const HiSparseLayerRows& l = layers[first + a.num_layers];
      a.host_pools[a.num_layers] = l.host_pool.data_as<std::uint8_t>();
      a.hot_caches[a.num_layers] = l.hot_cache.data_as<std::uint8_t>();
      ++a.num_layers;
    }
    a.host_rows = f.host_pool.dim(0);
    a.hot_rows = f.hot_cache.dim(0) * f.hot_cache.dim(1);
    a.hot_block_size = static_cast<std::int32_t>(f.hot_cache.dim(1));
    a.hot_block_stride_bytes = f.hot_cache.stride(0);
    a.row_bytes = f.host_pool.dim(1);
    a.swap_host_rows = swap_host_rows.data_as<std::int32_t>();
    a.swap_device_rows = swap_device_rows.data_as<std::int32_t>();
    a.swap_stride = swap_host_rows.stride(0);
    a.swap_counts = swap_counts.data_as<std::int32_t>();
    a.num_rows = num_rows;
    a.max_swaps = static_cast<std::int32_t>(K);
    detail::kernels_of(device).gather_hisparse(stream, a);
    first += static_cast<std::size_t>(a.num_layers);
    ++launches;
  }
  return launches;
}

void gather_hisparse(Stream& stream, const HiSparseGatherTensors& t, std::int64_t num_rows) {
  gather_hisparse_layers(stream, {HiSparseLayerRows{t.host_pool, t.hot_cache}}, t.swap_host_rows, t.swap_device_rows,
                         t.swap_counts, num_rows);
}

void write_hisparse_rows(Stream& stream, const Tensor& rows, const Tensor& host_row_ids, const Tensor& host_pool) {
  constexpr const char* where = "write_hisparse_rows";
  Device& device = stream.device();
  check_row_pool(where, "host_pool", host_pool, device);
  check(where, "rows", rows).dtype(DType::u8).rank(2).rows_contiguous().dim(1, host_pool.dim(1), "row bytes of host_pool").on(device);
  if (!aligned16(rows.data()) || rows.stride(0) % 16 != 0) fail(where, "rows must be 16-byte aligned with a row stride that is a multiple of 16");
  check(where, "host_row_ids", host_row_ids).dtype(DType::i32).rank(1).contiguous().dim_at_least(0, rows.dim(0), "one per row").on(device);
  HiSparseWriteRowsArgs a{};
  a.rows = rows.data_as<std::uint8_t>();
  a.rows_stride = rows.stride(0);
  a.host_row_ids = host_row_ids.data_as<std::int32_t>();
  a.host_pool = host_pool.data_as<std::uint8_t>();
  a.host_rows = host_pool.dim(0);
  a.row_bytes = host_pool.dim(1);
  a.num_rows = rows.dim(0);
  detail::kernels_of(device).write_hisparse_rows(stream, a);
}

void invalidate_hisparse_slots(Stream& stream, const HiSparseSlotState& state, std::int32_t hot_slots,
                               const Tensor& host_row_ids, const Tensor& state_rows) {
  constexpr const char* where = "invalidate_hisparse_slots";
  Device& device = stream.device();
  if (hot_slots < 1 || hot_slots > max_hot_slots) fail(where, "hot_slots must be in [1, ", max_hot_slots, "], got ", hot_slots);
  check_state(where, state, hot_slots, device);
  check(where, "host_row_ids", host_row_ids).dtype(DType::i32).rank(1).contiguous().on(device);
  if (host_row_ids.dim(0) > int32_max) fail(where, "host_row_ids has ", host_row_ids.dim(0), " entries, more than 2^31 - 1");
  check(where, "state_rows", state_rows).dtype(DType::i32).rank(1).contiguous().dim_at_least(0, host_row_ids.dim(0), "one per host row id").on(device);
  HiSparseInvalidateArgs a{};
  a.slot_rows = state.slot_rows.data_as<std::int32_t>();
  a.slot_rows_stride = state.slot_rows.stride(0);
  a.hot_slots = hot_slots;
  a.num_state_rows = static_cast<std::int32_t>(state.lru.dim(0));
  a.host_row_ids = host_row_ids.data_as<std::int32_t>();
  a.state_rows = state_rows.data_as<std::int32_t>();
  a.num_rows = host_row_ids.dim(0);
  detail::kernels_of(device).invalidate_hisparse_slots(stream, a);
}

void stage_hisparse_rows(Stream& stream, const Tensor& host_pool, const Tensor& host_row_ids, const Tensor& resident_cache,
                         const Tensor& device_row_ids, const Tensor& staged) {
  constexpr const char* where = "stage_hisparse_rows";
  Device& device = stream.device();
  check_row_pool(where, "host_pool", host_pool, device);
  const std::int64_t row_bytes = host_pool.dim(1);
  check_row_pool(where, "staged", staged, device);
  check(where, "staged", staged).dim(1, row_bytes, "row bytes of host_pool");
  const std::int64_t n = staged.dim(0);
  check(where, "host_row_ids", host_row_ids).dtype(DType::i32).rank(1).contiguous().dim_at_least(0, n, "one per staged row").on(device);
  HiSparseStageArgs a{};
  if (device_row_ids.defined() != resident_cache.defined()) {
    fail(where, "device_row_ids and resident_cache go together: give both or neither");
  }
  if (resident_cache.defined()) {
    check(where, "resident_cache", resident_cache).dtype(DType::u8).rank(3).rows_contiguous().dim(2, row_bytes, "row bytes of host_pool").on(device);
    if (!aligned16(resident_cache.data()) || resident_cache.stride(0) % 16 != 0 || resident_cache.dim(1) < 1 || resident_cache.dim(1) > int32_max) {
      fail(where, "resident_cache of shape ", resident_cache.shape_string(), " needs a 16-byte aligned start and block stride and a block size in [1, 2^31)");
    }
    check(where, "device_row_ids", device_row_ids).dtype(DType::i32).rank(1).contiguous().dim_at_least(0, n, "one per staged row").on(device);
    a.resident_cache = resident_cache.data_as<std::uint8_t>();
    a.resident_rows = resident_cache.dim(0) * resident_cache.dim(1);
    a.resident_block_size = static_cast<std::int32_t>(resident_cache.dim(1));
    a.resident_block_stride_bytes = resident_cache.stride(0);
    a.device_row_ids = device_row_ids.data_as<std::int32_t>();
  }
  a.host_pool = host_pool.data_as<std::uint8_t>();
  a.host_rows = host_pool.dim(0);
  a.host_row_ids = host_row_ids.data_as<std::int32_t>();
  a.staged = staged.data_as<std::uint8_t>();
  a.row_bytes = row_bytes;
  a.num_rows = n;
  detail::kernels_of(device).stage_hisparse_rows(stream, a);
}

}  // namespace sparse_mla
