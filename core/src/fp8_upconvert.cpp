#include "sparse_mla/fp8_upconvert.hpp"

#include "kernels.hpp"
#include "sparse_mla/error.hpp"

namespace sparse_mla {

namespace {

constexpr const char* where = "gather_upconvert_fp8";

// The host-backed variant's tensors, checked; fills the args' host fields.
void check_host_backed(const Device& device, const Fp8GatherParams& p, Fp8UpconvertArgs& args) {
  check(where, "host_cache", p.host_cache).dtype(DType::u8).rank(2).dim(1, fp8_row_bytes, "bytes per fp8_ds_mla row")
      .rows_contiguous().kind(MemoryKind::pinned_host).on(device);
  check(where, "host_row_ids", p.host_row_ids).dtype(DType::i32).contiguous().on(device);
  check(where, "device_row_ids", p.device_row_ids).dtype(DType::i32).contiguous().on(device);
  if (p.host_row_ids.numel() != p.device_row_ids.numel()) {
    fail(where, "host_row_ids has ", p.host_row_ids.numel(), " entries but device_row_ids has ",
         p.device_row_ids.numel(), "; both hold one entry per staged row");
  }
  args.host_cache = static_cast<const std::uint8_t*>(p.host_cache.data());
  args.host_row_stride = p.host_cache.stride(0);
  args.host_rows = p.host_cache.dim(0);
  args.host_row_ids = p.host_row_ids.data_as<std::int32_t>();
  args.device_row_ids = p.device_row_ids.data_as<std::int32_t>();
  args.staged_rows = p.host_row_ids.numel();
}

}  // namespace

void gather_upconvert_fp8(Stream& stream, const Tensor& src_cache, const Tensor& dst, const Tensor& block_table,
                          const Tensor& workspace_starts, std::int64_t batch_size, const Fp8GatherParams& params) {
  Device& device = stream.device();
  check(where, "src_cache", src_cache).dtype(DType::u8).rank(3).dim(2, fp8_row_bytes, "bytes per fp8_ds_mla row")
      .rows_contiguous().on(device);
  check(where, "dst", dst).dtype(DType::bf16).rank(2).dim(1, upconverted_row_width, "bf16 per upconverted row")
      .rows_contiguous().on(device);
  if (batch_size < 0 || batch_size > int32_max) fail(where, "batch_size must be in [0, 2^31), got ", batch_size);
  check(where, "block_table", block_table).dtype(DType::i32).rank(2).rows_contiguous()
      .dim_at_least(0, batch_size, "one row per request").on(device);
  check(where, "workspace_starts", workspace_starts).dtype(DType::i32).rank(1).contiguous()
      .dim_at_least(0, batch_size, "one per request").on(device);
  if (params.seq_starts.defined()) {
    check(where, "seq_starts", params.seq_starts).dtype(DType::i32).rank(1).contiguous()
        .dim_at_least(0, batch_size, "one per request").on(device);
  }
  const std::int64_t cache_block_size = src_cache.dim(1);
  if (cache_block_size < 1) fail(where, "src_cache has block size 0 (shape ", src_cache.shape_string(), ")");
  const bool host_backed =
      params.host_cache.defined() || params.host_row_ids.defined() || params.device_row_ids.defined();
  const std::int64_t block_size = params.block_size == 0 ? cache_block_size : params.block_size;
  if (block_size < 1 || block_size > int32_max) fail(where, "block_size must be in [1, 2^31), got ", block_size);
  if (!host_backed && block_size != cache_block_size) {
    fail(where, "block_size ", block_size, " differs from src_cache's block size ", cache_block_size,
         " (only the host-backed variant's staged pages may differ)");
  }
  if (dst.dim(0) > int32_max) fail(where, "dst has ", dst.dim(0), " rows, more than 2^31 - 1");
  if (block_table.dim(1) > int32_max) fail(where, "block_table has ", block_table.dim(1), " columns, more than 2^31 - 1");
  if ((dst.dim(0) + block_size - 1) / block_size + 2 * batch_size > int32_max) {
    fail(where, "too many page tasks for one launch: ", dst.dim(0), " rows of ", batch_size, " requests in pages of ",
         block_size);
  }

  Fp8UpconvertArgs args{};
  if (host_backed) check_host_backed(device, params, args);
  args.cache = static_cast<const std::uint8_t*>(src_cache.data());
  args.cache_block_stride = src_cache.stride(0);
  args.cache_row_stride = src_cache.stride(1);
  args.cache_blocks = src_cache.dim(0);
  args.cache_block_size = static_cast<std::int32_t>(cache_block_size);
  args.dst = static_cast<std::uint16_t*>(dst.data());
  args.dst_row_stride = dst.stride(0);
  args.total_rows = static_cast<std::int32_t>(dst.dim(0));
  args.block_table = block_table.data_as<std::int32_t>();
  args.block_table_stride = block_table.stride(0);
  args.blocks_per_request = static_cast<std::int32_t>(block_table.dim(1));
  args.workspace_starts = workspace_starts.data_as<std::int32_t>();
  args.seq_starts = params.seq_starts.defined() ? params.seq_starts.data_as<std::int32_t>() : nullptr;
  args.batch = static_cast<std::int32_t>(batch_size);
  args.block_size = static_cast<std::int32_t>(block_size);
  args.format = params.format;
  detail::kernels_of(device).gather_upconvert_fp8(stream, args);
}

void check_fp8_gather_values(const std::int32_t* block_table, std::int64_t blocks_per_request,
                             const std::int32_t* workspace_starts, const std::int32_t* seq_starts,
                             std::int64_t batch, std::int64_t total_rows, std::int64_t block_size,
                             std::int64_t num_blocks) {
  for (std::int64_t r = 0; r < batch; ++r) {
    const std::int64_t begin = workspace_starts[r];
    if (begin < 0 || begin > total_rows || (r > 0 && begin < workspace_starts[r - 1])) {
      fail(where, "workspace_starts[", r, "] = ", begin, " is not in [", r > 0 ? workspace_starts[r - 1] : 0, ", ",
           total_rows, "] (non-decreasing, at most the ", total_rows, " output rows)");
    }
  }
  for (std::int64_t r = 0; r < batch; ++r) {
    const std::int64_t end = r + 1 < batch ? workspace_starts[r + 1] : total_rows;
    const std::int64_t length = end - workspace_starts[r];
    const std::int64_t source = seq_starts ? seq_starts[r] : 0;
    if (source < 0) fail(where, "seq_starts[", r, "] = ", source, " is negative");
    if (length == 0) continue;
    const std::int64_t last_block = (source + length - 1) / block_size;
    if (last_block >= blocks_per_request) {
      fail(where, "request ", r, " reads tokens [", source, ", ", source + length, ") but its block table holds ",
           blocks_per_request, " blocks of ", block_size);
    }
    for (std::int64_t b = source / block_size; b <= last_block; ++b) {
      const std::int32_t id = block_table[r * blocks_per_request + b];
      if (id < 0 || id >= num_blocks) {
        fail(where, "block_table[", r, ", ", b, "] = ", id, " is outside the cache's ", num_blocks, " blocks");
      }
    }
  }
}

}  // namespace sparse_mla
