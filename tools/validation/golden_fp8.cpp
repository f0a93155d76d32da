// validate --golden, kinds fp8_gather_upconvert and v4_dequant_gather
// (golden/README.md): runs the gather-upconvert (for v4 files the
// position-range gather of model1_fp8 pages) on the file's cache and tables
// and compares every bf16 bit of the output with the file's.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "validation/golden_cases.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/topk_convert.hpp"
#include "sparse_mla/fp8_upconvert.hpp"

namespace sparse_mla::validation {

namespace {

struct Fp8Case {
  std::int64_t block_size, num_blocks, batch, total_rows;
  bool seq_starts;
  Fp8Format format;  // the file's own
};

// The file's fp8 format: the first word of its `fp8_format` metadata
// ("e4m3fn, bytes 0-511 values, ..."), e4m3fn when it has none.
Fp8Format file_format(const SafetensorsFile& f) {
  if (!f.has_meta("fp8_format")) return Fp8Format::e4m3fn;
  const std::string& text = f.meta("fp8_format");
  const std::string word = text.substr(0, text.find_first_of(", "));
  Fp8Format format{};
  if (!parse_fp8_format(word, format)) {
    fail(f.origin(), "metadata fp8_format '", word, "' names no known format (e4m3fn, e4m3fnuz)");
  }
  return format;
}

Fp8Case read_case(const SafetensorsFile& f) {
  Fp8Case c{f.meta_int("block_size"), f.meta_int("num_blocks"), f.meta_int("batch_size"),
            f.meta_int("total_tokens"), f.meta_bool("has_seq_starts"), file_format(f)};
  if (c.block_size < 1) fail(f.origin(), "metadata block_size must be positive, got ", c.block_size);
  for (const auto& [key, want] : {std::pair<const char*, std::int64_t>{"entry_bytes", fp8_row_bytes},
                                  std::pair<const char*, std::int64_t>{"head_dim", upconverted_row_width}}) {
    if (f.has_meta(key) && f.meta_int(key) != want) {
      fail(f.origin(), "metadata ", key, " is ", f.meta_int(key), ", expected ", want);
    }
  }
  f.require("src_cache", DType::u8, {c.num_blocks, c.block_size, fp8_row_bytes});
  const TensorRecord& table = f.require("block_table", DType::i32, {c.batch, -1});
  f.require("workspace_starts", DType::i32, {c.batch});
  if (c.seq_starts) f.require("seq_starts", DType::i32, {c.batch});
  f.require("dst", DType::bf16, {c.total_rows, upconverted_row_width});
  try {
    check_fp8_gather_values(table.data<std::int32_t>(), table.shape[1],
                            f.tensor("workspace_starts").data<std::int32_t>(),
                            c.seq_starts ? f.tensor("seq_starts").data<std::int32_t>() : nullptr, c.batch,
                            c.total_rows, c.block_size, c.num_blocks);
  } catch (const Error& e) {
    fail(f.origin(), e.what());
  }
  return c;
}

// The cache format a file's kind holds; --kv-format may only confirm it (a
// cache cannot be read as the other layout).
KvFormat checked_kv_format(const SafetensorsFile& f, const ValidateContext& context, KvFormat own) {
  if (context.kv_format && *context.kv_format != own) {
    fail(f.origin(), "holds ", kv_format_name(own), " caches (kind ", f.meta("kind"), "); --kv-format ",
         kv_format_name(*context.kv_format), " cannot read them");
  }
  return own;
}

std::string show_bf16(std::uint16_t bits) {
  const std::uint32_t wide = std::uint32_t{bits} << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  char text[48];
  std::snprintf(text, sizeof text, "0x%04x (%.9g)", bits, static_cast<double>(value));
  return text;
}

}  // namespace

PreparedCase prepare_fp8_gather_upconvert(std::shared_ptr<const SafetensorsFile> file) {
  const Fp8Case c = read_case(*file);
  return [file, c](const ValidateContext& context) {
    const SafetensorsFile& f = *file;
    checked_kv_format(f, context, KvFormat::fp8_ds_mla);
    CaseResult result{f.origin(), "fp8_gather_upconvert", 0, 0, {}, {}};
    DeviceScratch scratch(context.device);
    const Tensor dst = scratch.filled(DType::bf16, {c.total_rows, upconverted_row_width}, 0xA5);
    Fp8GatherParams params;
    params.format = context.fp8_format.value_or(c.format);
    if (c.seq_starts) params.seq_starts = scratch.upload(f.tensor("seq_starts"));
    gather_upconvert_fp8(scratch.stream(), scratch.upload(f.tensor("src_cache")), dst,
                         scratch.upload(f.tensor("block_table")), scratch.upload(f.tensor("workspace_starts")),
                         c.batch, params);
    const auto got = values_of<std::uint16_t>(scratch.download(dst));
    MismatchLog(result).compare("dst", {c.total_rows, upconverted_row_width}, got.data(),
                                f.tensor("dst").data<std::uint16_t>(), c.total_rows * upconverted_row_width,
                                show_bf16);
    result.details["rows"] = c.total_rows;
    result.details["requests"] = c.batch;
    result.details["block_size"] = c.block_size;
    result.details["fp8_format"] = fp8_format_name(params.format);
    result.details["kv_format"] = kv_format_name(KvFormat::fp8_ds_mla);
    return result;
  };
}

namespace {

struct V4Case {
  std::int64_t block_size, offset, page_stride, num_blocks, requests, blocks_per_request, out_tokens;
};

V4Case read_v4_case(const SafetensorsFile& f) {
  V4Case c{f.meta_int("block_size"),         f.meta_int("offset"),     f.meta_int("page_stride"),
           f.meta_int("num_blocks"),         f.meta_int("num_requests"), f.meta_int("max_blocks_per_seq"),
           f.meta_int("out_tokens")};
  if (c.block_size < 1 || c.block_size > int32_max) {
    fail(f.origin(), "metadata block_size must be in [1, 2^31), got ", c.block_size);
  }
  for (const auto& [key, value] : {std::pair<const char*, std::int64_t>{"num_blocks", c.num_blocks},
                                   std::pair<const char*, std::int64_t>{"num_requests", c.requests},
                                   std::pair<const char*, std::int64_t>{"max_blocks_per_seq", c.blocks_per_request},
                                   std::pair<const char*, std::int64_t>{"out_tokens", c.out_tokens}}) {
    if (value < 0) fail(f.origin(), "metadata ", key, " must not be negative, got ", value);
  }
  for (const auto& [key, want] : {std::pair<const char*, std::int64_t>{"token_bytes", model1_token_bytes},
                                  std::pair<const char*, std::int64_t>{"token_data_bytes", model1_token_data_bytes},
                                  std::pair<const char*, std::int64_t>{"nope_dim", model1_nope_values},
                                  std::pair<const char*, std::int64_t>{"rope_dim", model1_row_width - model1_nope_values},
                                  std::pair<const char*, std::int64_t>{"scale_tile", model1_values_per_scale},
                                  std::pair<const char*, std::int64_t>{"num_scales", model1_scales}}) {
    if (f.has_meta(key) && f.meta_int(key) != want) {
      fail(f.origin(), "metadata ", key, " is ", f.meta_int(key), ", expected ", want);
    }
  }
  if (c.page_stride < model1_page_bytes(c.block_size)) {
    fail(f.origin(), "metadata page_stride ", c.page_stride, " is less than the ", model1_page_bytes(c.block_size),
         " bytes of a model1_fp8 page of ", c.block_size, " tokens");
  }
  if (c.offset < 0 || c.offset > c.out_tokens) {
    fail(f.origin(), "metadata offset ", c.offset, " is not in [0, out_tokens = ", c.out_tokens, "]");
  }
  f.require("k_cache", DType::u8, {c.num_blocks, c.page_stride});
  const TensorRecord& table = f.require("block_table", DType::i32, {c.requests, c.blocks_per_request});
  f.require("seq_lens", DType::i32, {c.requests});
  f.require("gather_lens", DType::i32, {c.requests});
  f.require("out", DType::bf16, {c.requests, c.out_tokens, model1_row_width});
  try {
    check_fp8_range_values(table.data<std::int32_t>(), c.blocks_per_request, f.tensor("seq_lens").data<std::int32_t>(),
                           f.tensor("gather_lens").data<std::int32_t>(), c.requests, c.out_tokens - c.offset,
                           c.block_size, c.num_blocks);
  } catch (const Error& e) {
    fail(f.origin(), e.what());
  }
  return c;
}

}  // namespace

// The output is poisoned first, not zeroed as the file's was: the rows the
// gather writes must equal the file's, every other element must keep the
// poison.
PreparedCase prepare_v4_dequant_gather(std::shared_ptr<const SafetensorsFile> file) {
  const V4Case c = read_v4_case(*file);
  return [file, c](const ValidateContext& context) {
    const SafetensorsFile& f = *file;
    checked_kv_format(f, context, KvFormat::model1_fp8);
    CaseResult result{f.origin(), "v4_dequant_gather", 0, 0, {}, {}};
    DeviceScratch scratch(context.device);
    constexpr std::uint8_t poison = 0xA5;
    const std::vector<std::int64_t> shape{c.requests, c.out_tokens, model1_row_width};
    const Tensor out = scratch.filled(DType::bf16, shape, poison);
    Fp8GatherParams params;
    params.kv_format = KvFormat::model1_fp8;
    params.format = context.fp8_format.value_or(Fp8Format::e4m3fn);
    params.block_size = c.block_size;
    gather_upconvert_fp8_range(scratch.stream(), scratch.upload(f.tensor("k_cache")), out,
                               scratch.upload(f.tensor("seq_lens")), scratch.upload(f.tensor("gather_lens")),
                               scratch.upload(f.tensor("block_table")), c.offset, params);
    const auto got = values_of<std::uint16_t>(scratch.download(out));
    const std::uint16_t* file_out = f.tensor("out").data<std::uint16_t>();
    std::vector<std::uint16_t> want(got.size(), static_cast<std::uint16_t>(poison << 8 | poison));
    const std::int32_t* gather = f.tensor("gather_lens").data<std::int32_t>();
    for (std::int64_t r = 0; r < c.requests; ++r) {
      const auto first = static_cast<std::size_t>((r * c.out_tokens + c.offset) * model1_row_width);
      const auto count = static_cast<std::size_t>(gather[r] * model1_row_width);
      std::copy(file_out + first, file_out + first + count, want.begin() + static_cast<std::ptrdiff_t>(first));
    }
    MismatchLog(result).compare("out", shape, got.data(), want.data(), static_cast<std::int64_t>(got.size()), show_bf16);
    result.details["requests"] = c.requests;
    result.details["block_size"] = c.block_size;
    result.details["offset"] = c.offset;
    result.details["fp8_format"] = fp8_format_name(params.format);
    result.details["kv_format"] = kv_format_name(KvFormat::model1_fp8);
    return result;
  };
}

}  // namespace sparse_mla::validation
