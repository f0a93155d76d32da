// The paged FP8 KV-cache formats the gather-upconvert reads (SPEC section 3;
// docs/kernels.md has their byte layouts) and the two fp8 encodings their
// latent values may use.
#pragma once

#include <cstdint>
#include <string>

namespace sparse_mla {

// e4m3fn (OCP): bias 7, 0x7F and 0xFF are NaN, no infinities, largest 448;
// CUDA GPUs and gfx950. e4m3fnuz: bias 8, 0x80 is the only NaN, no negative
// zero, largest 240; MI300-class GPUs (gfx942).
enum class Fp8Format : std::uint8_t { e4m3fn, e4m3fnuz };

// "e4m3fn", "e4m3fnuz".
const char* fp8_format_name(Fp8Format format);
// Parses the names above; returns false for anything else.
bool parse_fp8_format(const std::string& name, Fp8Format& out);

// The cache formats:
// - fp8_ds_mla: DeepSeek-V3.2's 656-byte rows (vLLM's kv-cache dtype of that
//   name), upconverted to 576 bf16;
// - model1_fp8: DeepSeek V4's pages (FlashMLA's MODEL1 FP8 layout, as vLLM's
//   and SGLang's V4 backends store it), upconverted to 512 bf16.
enum class KvFormat : std::uint8_t { fp8_ds_mla, model1_fp8 };

// "fp8_ds_mla", "model1_fp8".
const char* kv_format_name(KvFormat format);
// Parses the names above; returns false for anything else.
bool parse_kv_format(const std::string& name, KvFormat& out);

// One cache row: 512 fp8 values, 4 float32 scales (scale i covers values
// 128i .. 128i+127), 64 bfloat16 RoPE values.
constexpr std::int64_t fp8_row_bytes = 656;
constexpr std::int64_t fp8_nope_values = 512;
constexpr std::int64_t fp8_scales_offset = 512;
constexpr std::int64_t fp8_rope_offset = 528;
constexpr std::int64_t fp8_values_per_scale = 128;
// The upconverted row: 576 bfloat16 (512 scaled values, then the RoPE part).
constexpr std::int64_t upconverted_row_width = 576;

// model1_fp8. A token is 448 fp8 "NoPE" values in 7 tiles of 64, 64 bf16 RoPE
// values, 7 ue8m0 scales (byte b is 2^(b - 127), tile j's scale in byte j)
// and a pad byte. A page of B tokens holds every token's 576 data bytes
// (NoPE, then RoPE), token t's at 576 t, then every token's 8-byte scale
// group, token t's at 576 B + 8 t, then padding up to model1_page_bytes(B).
constexpr std::int64_t model1_token_data_bytes = 576;
constexpr std::int64_t model1_scale_group_bytes = 8;
constexpr std::int64_t model1_token_bytes = 584;  // data and scale group
constexpr std::int64_t model1_nope_values = 448;
constexpr std::int64_t model1_rope_offset = 448;  // in a token's data
constexpr std::int64_t model1_values_per_scale = 64;
constexpr std::int64_t model1_scales = 7;
// The upconverted token: 512 bfloat16 (448 scaled values, then the RoPE part).
constexpr std::int64_t model1_row_width = 512;
// The page stride every writer allocates: a page's 584 B bytes rounded up to
// a multiple of 576 (37,440 bytes for B = 64, 1,728 for B = 2).
constexpr std::int64_t model1_page_bytes(std::int64_t tokens) {
  return (model1_token_bytes * tokens + model1_token_data_bytes - 1) / model1_token_data_bytes * model1_token_data_bytes;
}

// bf16 values of an upconverted token of `format`: 576 or 512.
constexpr std::int64_t upconverted_width(KvFormat format) {
  return format == KvFormat::model1_fp8 ? model1_row_width : upconverted_row_width;
}

}  // namespace sparse_mla
