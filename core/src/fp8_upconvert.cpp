#include "sparse_mla/fp8_upconvert.hpp"

#include "kernels.hpp"
#include "sparse_mla/error.hpp"

namespace sparse_mla {

namespace {

constexpr const char* where = "gather_upconvert_fp8";
constexpr const char* range_where = "gather_upconvert_fp8_range";

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

// An fp8_ds_mla cache [num_blocks, block_size, 656]; returns its block size.
std::int64_t check_row_cache(const char* w, const Device& device, const Tensor& cache, Fp8UpconvertArgs& args) {
  check(w, "src_cache", cache).dtype(DType::u8).rank(3).dim(2, fp8_row_bytes, "bytes per fp8_ds_mla row")
      .rows_contiguous().on(device);
  const std::int64_t tokens = cache.dim(1);
  if (tokens < 1) fail(w, "src_cache has block size 0 (shape ", cache.shape_string(), ")");
  args.cache_row_stride = cache.stride(1);
  return tokens;
}

// A model1_fp8 cache (fp8_upconvert.hpp lists the shapes it may have);
// returns its tokens a page.
std::int64_t check_page_cache(const char* w, const Device& device, const Tensor& cache, std::int64_t block_size,
                              Fp8UpconvertArgs& args) {
  auto c = check(w, "src_cache", cache);
  c.dtype(DType::u8).on(device);
  std::int64_t tokens = 0;
  if (cache.rank() == 3 || cache.rank() == 4) {
    if (cache.rank() == 4) c.dim(2, 1, "one KV head");
    c.dim(cache.rank() - 1, model1_token_bytes, "bytes per model1_fp8 token").rows_contiguous();
    tokens = cache.dim(1);
    if (block_size != 0 && block_size != tokens) {
      fail(w, "block_size ", block_size, " differs from src_cache's ", tokens, " tokens a page (shape ",
           cache.shape_string(), ")");
    }
  } else if (cache.rank() == 2) {
    c.rows_contiguous();
    if (block_size < 1) {
      fail(w, "src_cache of shape ", cache.shape_string(),
           " holds whole model1_fp8 pages; block_size must say how many tokens a page holds, got ", block_size);
    }
    tokens = block_size;
    if (cache.dim(1) < model1_token_bytes * tokens) {
      fail(w, "src_cache has shape ", cache.shape_string(), " but a model1_fp8 page of ", tokens, " tokens holds ",
           model1_token_bytes * tokens, " bytes (584 a token)");
    }
  } else {
    fail(w, "src_cache has shape ", cache.shape_string(),
         "; a model1_fp8 cache is [num_blocks, tokens, 584], [num_blocks, tokens, 1, 584] or [num_blocks, bytes]");
  }
  if (tokens < 1) fail(w, "src_cache has 0 tokens a page (shape ", cache.shape_string(), ")");
  if (tokens > int32_max) fail(w, "src_cache has ", tokens, " tokens a page, more than 2^31 - 1");
  // One page needs no stride (torch gives a single page a packed one).
  const std::int64_t page = model1_page_bytes(tokens);
  if (cache.dim(0) > 1 && cache.stride(0) < page) {
    fail(w, "src_cache's pages are ", cache.stride(0), " bytes apart (stride(0) of shape ", cache.shape_string(),
         "), less than the ", page, " bytes of a model1_fp8 page of ", tokens, " tokens (584 * ", tokens,
         " rounded up to a multiple of 576), the stride every writer allocates: a packed [num_blocks, ", tokens,
         ", 584] tensor is not this layout");
  }
  args.cache_row_stride = model1_token_data_bytes;
  args.cache_scale_offset = model1_token_data_bytes * tokens;
  return tokens;
}

// The cache of either format into the args; returns its tokens a page.
std::int64_t check_cache(const char* w, const Device& device, const Tensor& cache, const Fp8GatherParams& params,
                         bool host_backed, Fp8UpconvertArgs& args) {
  const std::int64_t tokens = params.kv_format == KvFormat::model1_fp8
                                  ? check_page_cache(w, device, cache, host_backed ? 0 : params.block_size, args)
                                  : check_row_cache(w, device, cache, args);
  args.cache = static_cast<const std::uint8_t*>(cache.data());
  args.cache_block_stride = cache.stride(0);
  args.cache_blocks = cache.dim(0);
  args.cache_block_size = static_cast<std::int32_t>(tokens);
  args.kv_format = params.kv_format;
  args.format = params.format;
  return tokens;
}

// Rows of `rows` of the output: bf16, the format's width, packed.
void check_output(const char* w, const char* name, const Device& device, const Tensor& rows, int rank, KvFormat format) {
  check(w, name, rows).dtype(DType::bf16).rank(rank)
      .dim(rank - 1, upconverted_width(format), format == KvFormat::model1_fp8 ? "bf16 per upconverted model1_fp8 token"
                                                                                 : "bf16 per upconverted row")
      .rows_contiguous().on(device);
}

void check_block_table(const char* w, const Device& device, const Tensor& block_table, std::int64_t requests) {
  check(w, "block_table", block_table).dtype(DType::i32).rank(2).rows_contiguous()
      .dim_at_least(0, requests, "one row per request").on(device);
  if (block_table.dim(1) > int32_max) fail(w, "block_table has ", block_table.dim(1), " columns, more than 2^31 - 1");
}

void set_block_table(const Tensor& block_table, Fp8UpconvertArgs& args) {
  args.block_table = block_table.data_as<std::int32_t>();
  args.block_table_stride = block_table.stride(0);
  args.blocks_per_request = static_cast<std::int32_t>(block_table.dim(1));
}

}  // namespace

void gather_upconvert_fp8(Stream& stream, const Tensor& src_cache, const Tensor& dst, const Tensor& block_table,
                          const Tensor& workspace_starts, std::int64_t batch_size, const Fp8GatherParams& params) {
  Device& device = stream.device();
  const bool host_backed =
      params.host_cache.defined() || params.host_row_ids.defined() || params.device_row_ids.defined();
  if (host_backed && params.kv_format != KvFormat::fp8_ds_mla) {
    fail(where, "the host-backed variant (host_cache, host_row_ids, device_row_ids) reads fp8_ds_mla rows, not ",
         kv_format_name(params.kv_format), " pages");
  }
  Fp8UpconvertArgs args{};
  const std::int64_t cache_block_size = check_cache(where, device, src_cache, params, host_backed, args);
  check_output(where, "dst", device, dst, 2, params.kv_format);
  if (batch_size < 0 || batch_size > int32_max) fail(where, "batch_size must be in [0, 2^31), got ", batch_size);
  check_block_table(where, device, block_table, batch_size);
  check(where, "workspace_starts", workspace_starts).dtype(DType::i32).rank(1).contiguous()
      .dim_at_least(0, batch_size, "one per request").on(device);
  if (params.seq_starts.defined()) {
    check(where, "seq_starts", params.seq_starts).dtype(DType::i32).rank(1).contiguous()
        .dim_at_least(0, batch_size, "one per request").on(device);
  }
  const std::int64_t block_size =
      params.block_size == 0 || (!host_backed && params.kv_format == KvFormat::model1_fp8) ? cache_block_size
                                                                                            : params.block_size;
  if (block_size < 1 || block_size > int32_max) fail(where, "block_size must be in [1, 2^31), got ", block_size);
  if (!host_backed && block_size != cache_block_size) {
    fail(where, "block_size ", block_size, " differs from src_cache's block size ", cache_block_size,
         " (only the host-backed variant's staged pages may differ)");
  }
  if (dst.dim(0) > int32_max) fail(where, "dst has ", dst.dim(0), " rows, more than 2^31 - 1");
  if ((dst.dim(0) + block_size - 1) / block_size + 2 * batch_size > int32_max) {
    fail(where, "too many page tasks for one launch: ", dst.dim(0), " rows of ", batch_size, " requests in pages of ",
         block_size);
  }

  if (host_backed) check_host_backed(device, params, args);
  args.dst = static_cast<std::uint16_t*>(dst.data());
  args.dst_row_stride = dst.stride(0);
  args.total_rows = static_cast<std::int32_t>(dst.dim(0));
  set_block_table(block_table, args);
  args.workspace_starts = workspace_starts.data_as<std::int32_t>();
  args.seq_starts = params.seq_starts.defined() ? params.seq_starts.data_as<std::int32_t>() : nullptr;
  args.batch = static_cast<std::int32_t>(batch_size);
  args.block_size = static_cast<std::int32_t>(block_size);
  detail::kernels_of(device).gather_upconvert_fp8(stream, args);
}

void gather_upconvert_fp8_range(Stream& stream, const Tensor& src_cache, const Tensor& out, const Tensor& seq_lens,
                                const Tensor& gather_lens, const Tensor& block_table, std::int64_t offset,
                                const Fp8GatherParams& params) {
  Device& device = stream.device();
  if (params.seq_starts.defined() || params.host_cache.defined() || params.host_row_ids.defined() ||
      params.device_row_ids.defined()) {
    fail(range_where, "seq_starts and the host-backed tensors belong to the workspace gather (gather_upconvert_fp8); "
                      "a position-range gather reads each request's last gather_lens tokens from src_cache");
  }
  Fp8UpconvertArgs args{};
  const std::int64_t block_size = check_cache(range_where, device, src_cache, params, false, args);
  if (params.kv_format == KvFormat::fp8_ds_mla && params.block_size != 0 && params.block_size != block_size) {
    fail(range_where, "block_size ", params.block_size, " differs from src_cache's block size ", block_size);
  }
  check(range_where, "seq_lens", seq_lens).dtype(DType::i32).rank(1).contiguous().on(device);
  const std::int64_t requests = seq_lens.dim(0);
  if (requests > int32_max) fail(range_where, "seq_lens has ", requests, " requests, more than 2^31 - 1");
  if (gather_lens.defined()) {
    check(range_where, "gather_lens", gather_lens).dtype(DType::i32).rank(1).contiguous()
        .dim_at_least(0, requests, "one per request").on(device);
  }
  check_output(range_where, "out", device, out, 3, params.kv_format);
  check(range_where, "out", out).dim_at_least(0, requests, "one slice per request");
  check_block_table(range_where, device, block_table, requests);
  const std::int64_t slice_rows = out.dim(1);
  if (slice_rows > int32_max) fail(range_where, "out has ", slice_rows, " rows a request, more than 2^31 - 1");
  if (offset < 0 || offset > slice_rows) {
    fail(range_where, "offset must be in [0, ", slice_rows, "] (out's rows a request, shape ", out.shape_string(),
         "), got ", offset);
  }
  if (((slice_rows - offset + block_size - 1) / block_size + 1) * requests > int32_max) {
    fail(range_where, "too many page tasks for one launch: ", requests, " requests of up to ", slice_rows - offset,
         " rows in pages of ", block_size);
  }

  args.dst = static_cast<std::uint16_t*>(out.data());
  args.dst_row_stride = out.stride(1);
  args.dst_request_stride = out.stride(0);
  args.seq_lens = seq_lens.data_as<std::int32_t>();
  args.gather_lens = gather_lens.defined() ? gather_lens.data_as<std::int32_t>() : nullptr;
  args.first_output = static_cast<std::int32_t>(offset);
  args.request_rows = static_cast<std::int32_t>(slice_rows);
  set_block_table(block_table, args);
  args.batch = static_cast<std::int32_t>(requests);
  args.block_size = static_cast<std::int32_t>(block_size);
  detail::kernels_of(device).gather_upconvert_fp8(stream, args);
}

namespace {

// Every block request r reads for tokens [source, source + length) lies in
// its table row and the cache.
void check_blocks(const char* w, const std::int32_t* block_table, std::int64_t blocks_per_request, std::int64_t r,
                  std::int64_t source, std::int64_t length, std::int64_t block_size, std::int64_t num_blocks) {
  if (length == 0) return;
  const std::int64_t last_block = (source + length - 1) / block_size;
  if (last_block >= blocks_per_request) {
    fail(w, "request ", r, " reads tokens [", source, ", ", source + length, ") but its block table holds ",
         blocks_per_request, " blocks of ", block_size);
  }
  for (std::int64_t b = source / block_size; b <= last_block; ++b) {
    const std::int32_t id = block_table[r * blocks_per_request + b];
    if (id < 0 || id >= num_blocks) {
      fail(w, "block_table[", r, ", ", b, "] = ", id, " is outside the cache's ", num_blocks, " blocks");
    }
  }
}

}  // namespace

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
    const std::int64_t source = seq_starts ? seq_starts[r] : 0;
    if (source < 0) fail(where, "seq_starts[", r, "] = ", source, " is negative");
    check_blocks(where, block_table, blocks_per_request, r, source, end - workspace_starts[r], block_size, num_blocks);
  }
}

void check_fp8_range_values(const std::int32_t* block_table, std::int64_t blocks_per_request,
                            const std::int32_t* seq_lens, const std::int32_t* gather_lens, std::int64_t batch,
                            std::int64_t slice_rows, std::int64_t block_size, std::int64_t num_blocks) {
  for (std::int64_t r = 0; r < batch; ++r) {
    const std::int64_t length = seq_lens[r];
    const std::int64_t gather = gather_lens ? gather_lens[r] : length;
    if (gather < 0 || gather > length) {
      fail(range_where, "gather_lens[", r, "] = ", gather, " is not in [0, seq_lens[", r, "] = ", length, "]");
    }
    if (gather > slice_rows) {
      fail(range_where, "request ", r, " gathers ", gather, " tokens but its output slice holds ", slice_rows,
           " rows after the offset");
    }
    check_blocks(range_where, block_table, blocks_per_request, r, length - gather, gather, block_size, num_blocks);
  }
}

}  // namespace sparse_mla
