// Number conversions: float32 to bfloat16 with the reference engine's
// rounding, and e4m3 fp8 bytes to their exact float values.
#pragma once

#include <cstdint>

#include "compat.hpp"

namespace sparse_mla::kernels::device {

union FloatBits {
  float f;
  std::uint32_t u;
};
KOKKOS_INLINE_FUNCTION float from_bits(std::uint32_t u) {
  FloatBits b;
  b.u = u;
  return b.f;
}
KOKKOS_INLINE_FUNCTION std::uint32_t to_bits(float f) {
  FloatBits b;
  b.f = f;
  return b.u;
}

// float32 to bfloat16, round to nearest even. Every NaN becomes 0x7FFF, the
// canonical NaN that CUDA's cvt.rn.bf16.f32 gives the reference engine.
KOKKOS_INLINE_FUNCTION std::uint32_t bf16_rne(float value) {
  const std::uint32_t u = to_bits(value);
  const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FFFu : rounded;
}

// Two floats to two bf16 (lo in bits 0-15), each as bf16_rne rounds it. On
// sm_80 and later one cvt.rn.bf16x2.f32 rounds both: the instruction the
// reference engine's kernel rounds with (NaN to 0x7FFF, subnormals kept).
// Elsewhere the integer rounding above.
KOKKOS_INLINE_FUNCTION std::uint32_t bf16x2_rne(float lo, float hi) {
#if SPARSE_MLA_FORM_CUDA && __CUDA_ARCH__ >= 800
  std::uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
#else
  return bf16_rne(lo) | bf16_rne(hi) << 16;
#endif
}

// The exact float value of one e4m3 byte (e4m3fn, or e4m3fnuz with `fnuz`).
// The byte's magnitude bits moved to a float's exponent and mantissa fields
// (mag << 20) read as a float that is the e4m3 value times 2^-(127 - bias):
// a normal one with its exponent re-biased, a subnormal one (exponent field
// 0) as a float subnormal. One multiply by 2^(127 - bias) makes both exact,
// provided subnormal floats are not flushed to zero (they are not: no
// fast-math flags; the golden files and the differential tests hold
// subnormal bytes).
KOKKOS_INLINE_FUNCTION float e4m3_value(std::uint32_t byte, bool fnuz) {
  const std::uint32_t magnitude = byte & 0x7Fu;
  const float value = from_bits(magnitude << 20) * (fnuz ? 0x1p119f : 0x1p120f);
  const bool nan = fnuz ? byte == 0x80u : magnitude == 0x7Fu;
  return nan ? from_bits(0x7FC00000u) : from_bits(to_bits(value) | ((byte & 0x80u) << 24));
}

// Whether e4m3fn_x4() is the hardware's conversion (sm_89 and later), and
// so cheaper than the integer decode of the kernels' fast path.
inline constexpr bool native_e4m3 =
#if SPARSE_MLA_FORM_CUDA && __CUDA_ARCH__ >= 890
    true;
#else
    false;
#endif

// Four e4m3fn bytes (a little-endian word) to their exact float values. On
// sm_89 and later: two bytes to two f16 (every e4m3 value is an f16 value,
// NaN to NaN), each f16 to a float, six instructions for four values.
// Elsewhere e4m3_value() a byte at a time.
KOKKOS_INLINE_FUNCTION void e4m3fn_x4(std::uint32_t w, float f[4]) {
#if SPARSE_MLA_FORM_CUDA && __CUDA_ARCH__ >= 890
  std::uint32_t h01, h23;
  asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\t"
      "cvt.rn.f16x2.e4m3x2 %0, lo;\n\tcvt.rn.f16x2.e4m3x2 %1, hi;\n\t}"
      : "=r"(h01), "=r"(h23)
      : "r"(w));
  asm("{\n\t.reg .b16 a, b, c, d;\n\tmov.b32 {a, b}, %4;\n\tmov.b32 {c, d}, %5;\n\t"
      "cvt.f32.f16 %0, a;\n\tcvt.f32.f16 %1, b;\n\tcvt.f32.f16 %2, c;\n\tcvt.f32.f16 %3, d;\n\t}"
      : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3])
      : "r"(h01), "r"(h23));
#else
  for (int i = 0; i < 4; ++i) f[i] = e4m3_value((w >> (8 * i)) & 0xFFu, false);
#endif
}

}  // namespace sparse_mla::kernels::device
