// The fp8_ds_mla row format (SPEC section 3) and the two fp8 encodings its
// 512 latent values may use.
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

// One cache row: 512 fp8 values, 4 float32 scales (scale i covers values
// 128i .. 128i+127), 64 bfloat16 RoPE values.
constexpr std::int64_t fp8_row_bytes = 656;
constexpr std::int64_t fp8_nope_values = 512;
constexpr std::int64_t fp8_scales_offset = 512;
constexpr std::int64_t fp8_rope_offset = 528;
constexpr std::int64_t fp8_values_per_scale = 128;
// The upconverted row: 576 bfloat16 (512 scaled values, then the RoPE part).
constexpr std::int64_t upconverted_row_width = 576;

}  // namespace sparse_mla
