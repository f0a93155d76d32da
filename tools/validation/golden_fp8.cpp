// validate --golden, kind fp8_gather_upconvert (golden/README.md): runs the
// gather-upconvert on the file's cache and tables and compares every bf16
// bit of dst with the file's.
#include <cstdio>
#include <cstring>
#include <string>

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
    return result;
  };
}

}  // namespace sparse_mla::validation
