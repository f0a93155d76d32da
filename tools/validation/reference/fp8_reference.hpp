// Scalar reference for the FP8 gather-upconvert (SPEC section 3), written
// from the formats' definitions and the SPEC's text, independent of
// core/kernels: fp8 bytes decode through 256-entry tables built from the
// textbook formula, bf16 rounding compares the two neighbouring bf16
// values in double precision, and a model1_fp8 token is read from its page
// by the byte offsets of the format (docs/kernels.md), a byte at a time.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace sparse_mla::reference {

constexpr std::size_t row_bytes = 656;
constexpr std::size_t out_width = 576;

// model1_fp8 (DeepSeek V4): per token 448 fp8 values in 7 tiles of 64, 64
// bf16 RoPE values, 7 ue8m0 scales and a pad byte. A page of B tokens:
// token t's 576 data bytes (fp8 values, then RoPE) at 576 t, its scale
// group (scale of tile j in byte j) at 576 B + 8 t, padding up to a
// multiple of 576.
constexpr std::size_t model1_data_bytes = 576;
constexpr std::size_t model1_nope = 448;
constexpr std::size_t model1_tile = 64;
constexpr std::size_t model1_out_width = 512;
inline std::size_t model1_page_bytes(std::size_t tokens) { return (584 * tokens + 575) / 576 * 576; }

// value = (-1)^sign * 2^(exponent - bias) * (1 + mantissa / 8), or
// 2^(1 - bias) * mantissa / 8 when the exponent field is 0.
// e4m3fn: bias 7, S.1111.111 is NaN. e4m3fnuz: bias 8, 1.0000.000 is NaN.
inline std::array<float, 256> fp8_table(bool fnuz) {
  std::array<float, 256> table{};
  const int bias = fnuz ? 8 : 7;
  for (int byte = 0; byte < 256; ++byte) {
    const int sign = byte >> 7, exponent = (byte >> 3) & 15, mantissa = byte & 7;
    const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, 1 - bias)
                                           : std::ldexp(1.0 + mantissa / 8.0, exponent - bias);
    const bool nan = fnuz ? byte == 0x80 : (exponent == 15 && mantissa == 7);
    table[static_cast<std::size_t>(byte)] =
        nan ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(sign ? -magnitude : magnitude);
  }
  return table;
}

// The value of a bf16 bit pattern as a double; 0x7F80 (and 0xFF80) count as
// +-2^128, the first value past the largest finite bf16, for rounding.
inline double bf16_value(std::uint32_t bits) {
  const int exponent = static_cast<int>((bits >> 7) & 0xFF);
  const int mantissa = static_cast<int>(bits & 0x7F);
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 128.0, -126)
                                         : std::ldexp(1.0 + mantissa / 128.0, exponent - 127);
  return (bits & 0x8000) ? -magnitude : magnitude;
}

// Round to nearest, ties to even; every NaN gives 0x7FFF (CUDA's canonical
// NaN, which the reference engine's conversion produces).
inline std::uint16_t bf16_nearest_even(float x) {
  if (std::isnan(x)) return 0x7FFF;
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  if (std::isinf(x)) return static_cast<std::uint16_t>(bits >> 16);
  const std::uint32_t toward_zero = bits >> 16;
  const std::uint32_t away = toward_zero + 1;
  const double below = std::fabs(static_cast<double>(x) - bf16_value(toward_zero));
  const double above = std::fabs(bf16_value(away) - static_cast<double>(x));
  if (below < above) return static_cast<std::uint16_t>(toward_zero);
  if (above < below) return static_cast<std::uint16_t>(away);
  return static_cast<std::uint16_t>((toward_zero & 1) ? away : toward_zero);
}

// A ue8m0 scale byte's value, 2^(byte - 127): exact in float down to the
// subnormal 2^-127; 2^128 (byte 255) lies past float's range and is
// infinity, as exp2 gives it.
inline float ue8m0_value(std::uint8_t byte) {
  if (byte == 255) return std::numeric_limits<float>::infinity();
  return static_cast<float>(std::ldexp(1.0, static_cast<int>(byte) - 127));
}

// Token t of a model1_fp8 page of `tokens` tokens to 512 bf16: value e <
// 448 times its tile's scale, rounded (exact but where the product leaves
// bf16's range), then the RoPE values' bits.
inline void upconvert_model1_token(const std::uint8_t* page, std::size_t tokens, std::size_t t, bool fnuz,
                                   std::uint16_t* out) {
  static const std::array<float, 256> fn = fp8_table(false), fnuz_table = fp8_table(true);
  const std::array<float, 256>& table = fnuz ? fnuz_table : fn;
  const std::uint8_t* data = page + model1_data_bytes * t;
  const std::uint8_t* scales = page + model1_data_bytes * tokens + 8 * t;
  for (std::size_t e = 0; e < model1_nope; ++e) {
    out[e] = bf16_nearest_even(table[data[e]] * ue8m0_value(scales[e / model1_tile]));
  }
  for (std::size_t e = 0; e < 64; ++e) {
    out[model1_nope + e] = static_cast<std::uint16_t>(data[model1_nope + 2 * e] | (data[model1_nope + 2 * e + 1] << 8));
  }
}

// One 656-byte row to 576 bf16.
inline void upconvert_row(const std::uint8_t* row, bool fnuz, std::uint16_t* out) {
  static const std::array<float, 256> fn = fp8_table(false), fnuz_table = fp8_table(true);
  const std::array<float, 256>& table = fnuz ? fnuz_table : fn;
  for (std::size_t e = 0; e < 512; ++e) {
    float scale = 0;
    std::memcpy(&scale, row + 512 + 4 * (e / 128), sizeof scale);
    out[e] = bf16_nearest_even(table[row[e]] * scale);
  }
  for (std::size_t e = 0; e < 64; ++e) {
    out[512 + e] = static_cast<std::uint16_t>(row[528 + 2 * e] | (row[528 + 2 * e + 1] << 8));
  }
}

struct Fp8GatherInputs {
  // fp8_ds_mla: [num_blocks, cache_block_size, 656], packed. model1:
  // num_blocks pages of page_stride bytes.
  std::vector<std::uint8_t> cache;
  std::int64_t num_blocks = 0;
  std::int64_t cache_block_size = 1;
  bool model1 = false;           // model1_fp8 pages instead of fp8_ds_mla rows
  std::int64_t page_stride = 0;  // model1: bytes from a page to the next
  std::vector<std::int32_t> block_table;  // [>= batch, blocks_per_request], packed
  std::int64_t blocks_per_request = 0;
  std::vector<std::int32_t> workspace_starts;  // [batch]
  std::vector<std::int32_t> seq_starts;        // [batch], or empty
  std::int64_t batch = 0;
  std::int64_t total_rows = 0;  // T
  std::int64_t block_size = 1;  // of the block table's pages
  bool fnuz = false;
  // Host-backed variant, when host_row_ids is not empty.
  std::vector<std::uint8_t> host_cache;  // [host_rows, 656]
  std::vector<std::int32_t> host_row_ids;
  std::vector<std::int32_t> device_row_ids;
  // Position-range gather (gather_range): request r < batch gathers its
  // last gather_lens[r] (or seq_lens[r]) tokens into rows offset + i of its
  // slice of slice_rows rows.
  std::vector<std::int32_t> seq_lens;
  std::vector<std::int32_t> gather_lens;  // or empty
  std::int64_t offset = 0;
  std::int64_t slice_rows = 0;
};

inline std::size_t width(const Fp8GatherInputs& in) { return in.model1 ? model1_out_width : out_width; }

// The source row of token s of request r (fp8_ds_mla), or nullptr when
// nothing holds it.
inline const std::uint8_t* source_row(const Fp8GatherInputs& in, std::int64_t r, std::int64_t s) {
  if (s < 0 || s / in.block_size >= in.blocks_per_request) return nullptr;
  const std::int64_t id = in.block_table[static_cast<std::size_t>(r * in.blocks_per_request + s / in.block_size)];
  const std::int64_t device_rows = in.num_blocks * in.cache_block_size;
  if (in.host_row_ids.empty()) {
    if (id < 0 || id >= in.num_blocks) return nullptr;
    return in.cache.data() + static_cast<std::size_t>(id * in.cache_block_size + s % in.block_size) * row_bytes;
  }
  const std::int64_t staged = id * in.block_size + s % in.block_size;
  if (id < 0 || staged >= static_cast<std::int64_t>(in.host_row_ids.size())) return nullptr;
  const std::int64_t device_row = in.device_row_ids[static_cast<std::size_t>(staged)];
  if (device_row >= 0) {
    return device_row < device_rows ? in.cache.data() + static_cast<std::size_t>(device_row) * row_bytes : nullptr;
  }
  const std::int64_t host_row = in.host_row_ids[static_cast<std::size_t>(staged)];
  const std::int64_t host_rows = static_cast<std::int64_t>(in.host_cache.size() / row_bytes);
  if (host_row < 0 || host_row >= host_rows) return nullptr;
  return in.host_cache.data() + static_cast<std::size_t>(host_row) * row_bytes;
}

// Token s of request r upconverted into `out` (width(in) values); false,
// and nothing written, when nothing holds it.
inline bool upconvert_token(const Fp8GatherInputs& in, std::int64_t r, std::int64_t s, std::uint16_t* out) {
  if (!in.model1) {
    const std::uint8_t* src = source_row(in, r, s);
    if (src) upconvert_row(src, in.fnuz, out);
    return src != nullptr;
  }
  if (s < 0 || s / in.block_size >= in.blocks_per_request) return false;
  const std::int64_t id = in.block_table[static_cast<std::size_t>(r * in.blocks_per_request + s / in.block_size)];
  if (id < 0 || id >= in.num_blocks) return false;
  upconvert_model1_token(in.cache.data() + static_cast<std::size_t>(id * in.page_stride),
                         static_cast<std::size_t>(in.block_size), static_cast<std::size_t>(s % in.block_size), in.fnuz,
                         out);
  return true;
}

// Request r fills rows [ws[r], ws[r+1]) (the last one up to T), ends
// clamped to T; row ws[r] + i is token seq_starts[r] + i. dst [T, width]
// starts as the caller's contents (poison); rows no request writes keep
// them.
inline void gather_upconvert(const Fp8GatherInputs& in, std::vector<std::uint16_t>& dst) {
  for (std::int64_t r = 0; r < in.batch; ++r) {
    const std::int64_t begin = std::min<std::int64_t>(in.workspace_starts[static_cast<std::size_t>(r)], in.total_rows);
    const std::int64_t next = r + 1 < in.batch ? in.workspace_starts[static_cast<std::size_t>(r + 1)] : in.total_rows;
    const std::int64_t end = std::min(next, in.total_rows);
    const std::int64_t first = in.seq_starts.empty() ? 0 : in.seq_starts[static_cast<std::size_t>(r)];
    if (first < 0) continue;  // an invalid start: the request writes nothing
    for (std::int64_t row = std::max<std::int64_t>(begin, 0); row < end; ++row) {
      upconvert_token(in, r, first + (row - begin), dst.data() + static_cast<std::size_t>(row) * width(in));
    }
  }
}

// The position-range gather: request r with g = gather_lens[r] (or
// seq_lens[r]) writes its tokens seq_lens[r] - g + i, i < g, to row offset
// + i of its slice, as far as the slice reaches; a request with g < 0 or g
// > seq_lens[r] writes nothing. out [batch, slice_rows, width] starts as the
// caller's contents.
inline void gather_range(const Fp8GatherInputs& in, std::vector<std::uint16_t>& out) {
  for (std::int64_t r = 0; r < in.batch; ++r) {
    const std::int64_t length = in.seq_lens[static_cast<std::size_t>(r)];
    const std::int64_t g = in.gather_lens.empty() ? length : in.gather_lens[static_cast<std::size_t>(r)];
    if (g < 0 || g > length) continue;
    for (std::int64_t i = 0; i < g && in.offset + i < in.slice_rows; ++i) {
      const std::size_t row = static_cast<std::size_t>(r * in.slice_rows + in.offset + i);
      upconvert_token(in, r, length - g + i, out.data() + row * width(in));
    }
  }
}

}  // namespace sparse_mla::reference
