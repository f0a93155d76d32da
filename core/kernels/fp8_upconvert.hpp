// FP8 gather-upconvert of fp8_ds_mla rows to bf16 (SPEC section 3).
//
// Page tasks as the reference engine numbers them: requests in order, each
// split at block boundaries, ceil(T / block_size) + 2 * batch tasks cover
// every page. CPUs take a team per task; GPUs split a task's rows over
// teams of 8 rows (few pages) or 16 rows (many pages), see
// gather_upconvert_fp8. A team works through its rows in units, 40 a row:
// 32 units of 16 fp8 values and 8 units of 16 RoPE bytes. Unit k < 32 holds
// values 8k .. 8k + 7 and 256 + 8k .. 256 + 8k + 7 (two 8-byte loads, two
// 16-byte stores of bf16), so that consecutive threads load consecutive
// 8-byte pieces and store consecutive 16-byte pieces: every store of a warp
// fills whole 32-byte sectors (units of 16 consecutive values stored two
// half sectors per thread, at a 32-byte stride). Four fp8 bytes decode
// together in integer operations on two bytes at a time; the float32
// product is rounded to bf16 by the instruction the reference uses on CUDA,
// by exact integer rounding elsewhere, so host and GPU agree bit for bit.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <type_traits>

#include "space_traits.hpp"
#include "kernels.hpp"

namespace sparse_mla::kernels {

namespace fp8 {

constexpr int units_per_row = 40;  // 32 units of 16 fp8 values, 8 units of 16 RoPE bytes
constexpr int nope_units = 32;
constexpr int half_values = 256;    // a unit's second 8 values are this far from its first
constexpr int units_per_scale = 16;  // 128 values per scale, 8 of them in each half of a unit

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

// The exact float value of one e4m3 byte. The byte's magnitude bits moved
// to a float's exponent and mantissa fields (mag << 20) read as a float that
// is the e4m3 value times 2^-(127 - bias): a normal one with its exponent
// re-biased, a subnormal one (exponent field 0) as a float subnormal. One
// multiply by 2^(127 - bias) makes both exact, provided subnormal floats are
// not flushed to zero (they are not: no fast-math flags; the golden files
// and the differential tests hold subnormal bytes).
KOKKOS_INLINE_FUNCTION float decode(std::uint32_t byte, bool fnuz) {
  const std::uint32_t magnitude = byte & 0x7Fu;
  const float value = from_bits(magnitude << 20) * (fnuz ? 0x1p119f : 0x1p120f);
  const bool nan = fnuz ? byte == 0x80u : magnitude == 0x7Fu;
  return nan ? from_bits(0x7FC00000u) : from_bits(to_bits(value) | ((byte & 0x80u) << 24));
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
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  std::uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
#else
  return bf16_rne(lo) | bf16_rne(hi) << 16;
#endif
}

// The decode of a little-endian word of four e4m3 bytes, two bytes per
// 32-bit operation: the path of every unit without a NaN byte. spread_low
// and spread_high put bytes 0-1 or 2-3 at the top of the word's two 16-bit
// halves; scaled_down_pair keeps each sign bit and moves the 7 magnitude
// bits down 4, into a bf16's exponent and mantissa fields. Each half is
// then a bf16 (a float's top half) whose value is the byte's times
// 2^-(127 - bias), the same float decode() builds a byte at a time.
KOKKOS_INLINE_FUNCTION std::uint32_t spread_low(std::uint32_t w) { return (w & 0xFFu) << 8 | (w & 0xFF00u) << 16; }
KOKKOS_INLINE_FUNCTION std::uint32_t spread_high(std::uint32_t w) { return (w & 0xFF0000u) >> 8 | (w & 0xFF000000u); }
KOKKOS_INLINE_FUNCTION std::uint32_t scaled_down_pair(std::uint32_t x) {
  return (x & 0x80008000u) | ((x >> 4) & 0x07F007F0u);
}

// Non-zero when a byte of `w` is a NaN: 0x7F or 0xFF in e4m3fn (low seven
// bits all set), 0x80 in e4m3fnuz. No byte's sum carries into the next.
KOKKOS_INLINE_FUNCTION std::uint32_t nan_bytes(std::uint32_t w, bool fnuz) {
  const std::uint32_t low7 = w & 0x7F7F7F7Fu;
  return fnuz ? ~(low7 + 0x7F7F7F7Fu) & w & 0x80808080u : (low7 + 0x01010101u) & 0x80808080u;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define SPARSE_MLA_HW_E4M3 1
// Four e4m3fn bytes (a little-endian word) to their exact float values by
// the hardware's conversion (sm_89 and later): two bytes to two f16 (every
// e4m3 value is an f16 value, NaN to NaN), each f16 to a float. Six
// instructions for four values, where the integer decode takes about twenty.
KOKKOS_INLINE_FUNCTION void e4m3fn_x4(std::uint32_t w, float f[4]) {
  std::uint32_t h01, h23;
  asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\t"
      "cvt.rn.f16x2.e4m3x2 %0, lo;\n\tcvt.rn.f16x2.e4m3x2 %1, hi;\n\t}"
      : "=r"(h01), "=r"(h23)
      : "r"(w));
  asm("{\n\t.reg .b16 a, b, c, d;\n\tmov.b32 {a, b}, %4;\n\tmov.b32 {c, d}, %5;\n\t"
      "cvt.f32.f16 %0, a;\n\tcvt.f32.f16 %1, b;\n\tcvt.f32.f16 %2, c;\n\tcvt.f32.f16 %3, d;\n\t}"
      : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3])
      : "r"(h01), "r"(h23));
}
#else
#define SPARSE_MLA_HW_E4M3 0
#endif

// 8 bytes, loaded as one unit on GPUs (ld.global.v2), like Int4.
struct SPARSE_MLA_MAY_ALIAS Int2 {
  alignas(8) std::int32_t x;
  std::int32_t y;
};

// A 4-byte word that may alias the cache's bytes (like Int4).
struct SPARSE_MLA_MAY_ALIAS Word {
  std::uint32_t value;
};

// How a row load fetches (CUDA only; elsewhere every load is plain):
// - wide: the L2 brings the whole 256-byte block the load falls in from
//   DRAM (ld.global.L2::256B), for rows read whole, whose neighbouring bytes
//   other lanes of the team load next;
// - wide_streaming: as wide, and the line is not kept in the L1
//   (L1::no_allocate), for outputs stored streaming. Launches with plain
//   stores keep wide: the hint lost throughput there.
// Each form was measured against the previous one on the H200
// (docs/PERFORMANCE.md).
enum class Fetch { plain, wide, wide_streaming };

#if defined(__CUDA_ARCH__)
#define SPARSE_MLA_FETCH(hint)                                                                                \
  if constexpr (Words == 4) {                                                                                 \
    asm volatile("ld.global" hint ".v4.u32 {%0, %1, %2, %3}, [%4];"                                           \
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])                                             \
                 : "l"(p));                                                                                   \
  } else if constexpr (Words == 2) {                                                                          \
    asm volatile("ld.global" hint ".v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));               \
  } else {                                                                                                    \
    asm volatile("ld.global" hint ".u32 %0, [%1];" : "=r"(w[0]) : "l"(p));                                    \
  }
#endif

// Loads of 1, 2 or 4 little-endian words: one vector access when aligned,
// bytes otherwise.
template <bool Vector, int Words, Fetch How = Fetch::plain>
KOKKOS_INLINE_FUNCTION void load_words(const std::uint8_t* p, std::uint32_t* w) {
#if defined(__CUDA_ARCH__)
  if constexpr (Vector && How == Fetch::wide) {
    SPARSE_MLA_FETCH(".L2::256B")
    return;
  } else if constexpr (Vector && How == Fetch::wide_streaming) {
    SPARSE_MLA_FETCH(".L1::no_allocate.L2::256B")
    return;
  }
#endif
  if constexpr (Vector && Words == 4) {
    const Int4 v = *reinterpret_cast<const Int4*>(p);
    w[0] = static_cast<std::uint32_t>(v.x);
    w[1] = static_cast<std::uint32_t>(v.y);
    w[2] = static_cast<std::uint32_t>(v.z);
    w[3] = static_cast<std::uint32_t>(v.w);
  } else if constexpr (Vector && Words == 2) {
    const Int2 v = *reinterpret_cast<const Int2*>(p);
    w[0] = static_cast<std::uint32_t>(v.x);
    w[1] = static_cast<std::uint32_t>(v.y);
  } else if constexpr (Vector) {
    static_assert(Words == 1, "1, 2 or 4 words");
    w[0] = reinterpret_cast<const Word*>(p)->value;
  } else {
    for (int i = 0; i < Words; ++i) {
      w[i] = std::uint32_t{p[4 * i]} | std::uint32_t{p[4 * i + 1]} << 8 | std::uint32_t{p[4 * i + 2]} << 16 |
             std::uint32_t{p[4 * i + 3]} << 24;
    }
  }
}

#undef SPARSE_MLA_FETCH

template <bool Vector, Fetch How>
KOKKOS_INLINE_FUNCTION void load16(const std::uint8_t* p, std::uint32_t w[4]) {
  load_words<Vector, 4, How>(p, w);
}
template <bool Vector, Fetch How>
KOKKOS_INLINE_FUNCTION void load8(const std::uint8_t* p, std::uint32_t w[2]) {
  load_words<Vector, 2, How>(p, w);
}
template <bool Vector, Fetch How>
KOKKOS_INLINE_FUNCTION std::uint32_t load4(const std::uint8_t* p) {
  std::uint32_t w;
  load_words<Vector, 1, How>(p, &w);
  return w;
}

// A streaming store marks its lines evict-first in the L2 (st.global.cs on
// CUDA): for outputs larger than the L2, which no later read of this kernel
// finds there anyway. Elsewhere a plain store.
template <bool Vector, bool Streaming = false>
KOKKOS_INLINE_FUNCTION void store16(std::uint8_t* p, const std::uint32_t w[4]) {
#if defined(__CUDA_ARCH__)
  if constexpr (Vector && Streaming) {
    __stcs(reinterpret_cast<int4*>(p), make_int4(static_cast<int>(w[0]), static_cast<int>(w[1]), static_cast<int>(w[2]),
                                                 static_cast<int>(w[3])));
    return;
  }
#endif
  if constexpr (Vector) {
    *reinterpret_cast<Int4*>(p) = Int4{static_cast<std::int32_t>(w[0]), static_cast<std::int32_t>(w[1]),
                                       static_cast<std::int32_t>(w[2]), static_cast<std::int32_t>(w[3])};
  } else {
    for (int i = 0; i < 16; ++i) p[i] = static_cast<std::uint8_t>(w[i / 4] >> (8 * (i % 4)));
  }
}

KOKKOS_INLINE_FUNCTION std::int64_t min64(std::int64_t x, std::int64_t y) { return x < y ? x : y; }
KOKKOS_INLINE_FUNCTION std::int64_t max64(std::int64_t x, std::int64_t y) { return x > y ? x : y; }

}  // namespace fp8

// The three GPU launches of the kernel (gather_upconvert_fp8 picks one; CPUs
// take many_pages). In all of them a warp's request loads go out before the
// team works out its task, so that they are in flight during its division.
// They differ (each choice measured on the H200; docs/PERFORMANCE.md):
// - few_pages (teams of 8 rows): plain loads, an unsigned task division;
// - many_pages (160-thread teams of 16 rows): wide fetches (see Fetch) and a
//   signed division, which this launch ran better with than the unsigned one;
// - many_pages_streaming: as many_pages, outputs stored streaming and rows
//   fetched without keeping them in the L1.
enum class UpconvertShape { few_pages, many_pages, many_pages_streaming };

template <class Space, bool Vector, class Split, UpconvertShape Shape>
struct Fp8Upconvert {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  static constexpr bool streaming = Shape == UpconvertShape::many_pages_streaming;
  static constexpr fp8::Fetch fetch = Shape == UpconvertShape::few_pages ? fp8::Fetch::plain
                                      : streaming                       ? fp8::Fetch::wide_streaming
                                                                        : fp8::Fetch::wide;
  // Read first (a team's task), then the arguments in the order read.
  std::int32_t rows_per_task;     // rows of a page one team converts
  std::int32_t chunks_per_page;   // teams per page task (32-bit: a 64-bit division is ~100 instructions)
  Split split;                    // of a.block_size
  Fp8UpconvertArgs a;

  // The rows of one block that one request copies.
  struct Page {
    std::int32_t request;
    std::int64_t block;          // logical block of the request
    std::int64_t first_token;    // in the block
    std::int64_t rows;
    std::int64_t first_output;   // output row of first_token
  };

  // Task -> page: the reference engine's numbering, requests in order.
  // Request r copies output rows [begin, begin + length) from source rows
  // [source, source + length): `pages` pages of its block table, the first
  // one that of block(source).
  struct Request {
    std::int64_t begin, length, source, pages;
  };

  KOKKOS_INLINE_FUNCTION Request request(std::int32_t r, std::int32_t start, std::int32_t next,
                                         std::int32_t source) const {
    const std::int64_t total = a.total_rows;
    const std::int64_t begin = fp8::min64(start, total);
    const std::int64_t end = fp8::min64(r + 1 < a.batch ? next : total, total);
    const std::int64_t length = fp8::max64(end - begin, 0);
    // No valid source rows (source < 0): no pages, its rows stay unwritten.
    const std::int64_t pages =
        source < 0 ? 0 : split.block(source + length + a.block_size - 1) - split.block(std::int64_t{source});
    return Request{begin, length, source, pages};
  }

  // Page `task` (< q.pages) of request r.
  KOKKOS_INLINE_FUNCTION Page page_in(std::int32_t r, const Request& q, std::int64_t task) const {
    const std::int64_t bs = a.block_size;
    const std::int64_t block = split.block(q.source) + task;
    const std::int64_t copy_begin = fp8::max64(q.source, block * bs);
    const std::int64_t copy_end = fp8::min64(q.source + q.length, (block + 1) * bs);
    return Page{r, block, copy_begin - block * bs, copy_end - copy_begin, q.begin + copy_begin - q.source};
  }

  // Every thread of a team looks up the same page. On CUDA (page_of_warp)
  // the 32 lanes of a warp take 32 requests at once (loads, page counts, a
  // shuffle scan of them, a ballot for the one that holds the task), where a
  // loop over the requests had cost each warp about as much as converting
  // its rows. Elsewhere (page_of) a loop, with the starts of 8 requests loaded
  // before any is used (clamped indices, not branches, so that the loads
  // issue together).
  static constexpr std::int32_t loads_together = 8;

  // What a lane loads for request r0 + lane: its start, the next request's
  // start and its first source row (indices clamped to the last request, so
  // the loads need no branch; batch >= 1 by the launch's guard).
  struct RequestLoads {
    std::int32_t start, next, source;
  };
  KOKKOS_INLINE_FUNCTION RequestLoads request_loads(std::int32_t r) const {
    const std::int32_t last = a.batch - 1;
    const std::int32_t at = r < last ? r : last;
    return RequestLoads{a.workspace_starts[at], a.workspace_starts[at + 1 <= last ? at + 1 : last],
                        a.seq_starts != nullptr ? a.seq_starts[at] : 0};
  }

  KOKKOS_INLINE_FUNCTION bool page_of(std::int64_t task, Page& page) const {
    const std::int32_t last = a.batch - 1;
    for (std::int32_t r0 = 0; r0 <= last; r0 += loads_together) {
      std::int32_t start[loads_together + 1], source[loads_together];
      for (int u = 0; u <= loads_together; ++u) start[u] = a.workspace_starts[r0 + u < last ? r0 + u : last];
      for (int u = 0; u < loads_together; ++u) {
        source[u] = a.seq_starts != nullptr ? a.seq_starts[r0 + u < last ? r0 + u : last] : 0;
      }
      for (int u = 0; u < loads_together && r0 + u <= last; ++u) {
        const Request q = request(r0 + u, start[u], start[u + 1], source[u]);
        if (task < q.pages) {
          page = page_in(r0 + u, q, task);
          return true;
        }
        task -= q.pages;
      }
    }
    return false;
  }

#if defined(__CUDA_ARCH__)
  // The lookup by one warp. The kernel has issued the first round's loads
  // (requests 0-31) before anything else: a task's page needs a division
  // first, and the loads nothing.
  KOKKOS_INLINE_FUNCTION bool page_of_warp(int lane, RequestLoads loads, std::int64_t task, Page& page) const {
    const std::int32_t last = a.batch - 1;
    for (std::int32_t r0 = 0; r0 <= last; r0 += 32) {
      const std::int32_t r = r0 + lane;
      if (r0 > 0) loads = request_loads(r);
      const std::int32_t at = r < last ? r : last;
      Request q = request(at, loads.start, loads.next, loads.source);
      // Page counts in 32 bits, each shuffle one instruction (64-bit ones
      // are two): sums saturate at 2^31 - 1, above every task (the league
      // is an int), so a saturated lane never holds the task and the lane
      // that does has exact counts before it.
      constexpr std::uint32_t saturated = 0x7FFFFFFFu;
      const std::uint32_t pages = r > last ? 0u : q.pages < saturated ? static_cast<std::uint32_t>(q.pages) : saturated;
      std::uint32_t inclusive = pages;
      for (int d = 1; d < 32; d <<= 1) {
        const std::uint32_t up = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive = inclusive + up < saturated ? inclusive + up : saturated;
      }
      std::uint32_t before = __shfl_up_sync(0xffffffffu, inclusive, 1);
      if (lane == 0) before = 0;
      const unsigned holder = __ballot_sync(0xffffffffu, task >= before && task < inclusive);
      if (holder != 0) {
        const int h = __ffs(holder) - 1;
        Request held;
        held.begin = __shfl_sync(0xffffffffu, q.begin, h);
        held.length = __shfl_sync(0xffffffffu, q.length, h);
        held.source = __shfl_sync(0xffffffffu, q.source, h);
        page = page_in(r0 + h, held, task - __shfl_sync(0xffffffffu, before, h));
        return true;
      }
      task -= __shfl_sync(0xffffffffu, inclusive, 31);
    }
    return false;
  }
#endif

  // Where token `token` of the page's block is read from; nullptr when the
  // block table, the ids or the cache do not hold it.
  KOKKOS_INLINE_FUNCTION const std::uint8_t* device_row(std::int64_t row) const {
    if (row < 0 || row >= a.cache_blocks * a.cache_block_size) return nullptr;
    return a.cache + (row / a.cache_block_size) * a.cache_block_stride + (row % a.cache_block_size) * a.cache_row_stride;
  }

  // The page's block id in the block table, or -1 (read once per team).
  KOKKOS_INLINE_FUNCTION std::int64_t block_id(const Page& page) const {
    if (page.block >= a.blocks_per_request) return -1;
    return a.block_table[page.request * a.block_table_stride + page.block];
  }

  KOKKOS_INLINE_FUNCTION const std::uint8_t* source_row(std::int64_t id, std::int64_t token) const {
    if (id < 0) return nullptr;
    if (a.host_cache == nullptr) {
      if (id >= a.cache_blocks) return nullptr;
      return a.cache + id * a.cache_block_stride + token * a.cache_row_stride;
    }
    const std::int64_t staged = id * a.block_size + token;
    if (staged >= a.staged_rows) return nullptr;
    if (a.device_row_ids[staged] >= 0) return device_row(a.device_row_ids[staged]);
    const std::int64_t host_row = a.host_row_ids[staged];
    if (host_row < 0 || host_row >= a.host_rows) return nullptr;
    return a.host_cache + host_row * a.host_row_stride;
  }

  // 8 fp8 bytes (2 little-endian words) to 8 bf16 (4 words, two per word):
  // bf16(value * scale), the value scaled down by 2^(127 - bias) (exact, see
  // scaled_down_pair), multiplied back up (exact) and then by the scale, so
  // the product is rounded once, as the reference rounds float(fp8) * scale.
  // 8 bytes with a NaN byte (rare) take decode() a byte at a time.
  KOKKOS_INLINE_FUNCTION void upconvert8(const std::uint32_t in[2], float scale, std::uint32_t out[4]) const {
    const bool fnuz = a.format == Fp8Format::e4m3fnuz;
#if SPARSE_MLA_HW_E4M3
    // e4m3fn on sm_89+: the exact values from the hardware, one rounding in
    // the product, as the reference computes it; NaN bytes need no other
    // path (a NaN product rounds to 0x7FFF like any NaN).
    if (!fnuz) {
      for (int i = 0; i < 2; ++i) {
        float f[4];
        fp8::e4m3fn_x4(in[i], f);
        out[2 * i] = fp8::bf16x2_rne(f[0] * scale, f[1] * scale);
        out[2 * i + 1] = fp8::bf16x2_rne(f[2] * scale, f[3] * scale);
      }
      return;
    }
#endif
    if ((fp8::nan_bytes(in[0], fnuz) | fp8::nan_bytes(in[1], fnuz)) == 0) {
      const float unscale = fnuz ? 0x1p119f : 0x1p120f;
      for (int i = 0; i < 2; ++i) {
        const std::uint32_t low = fp8::scaled_down_pair(fp8::spread_low(in[i]));
        const std::uint32_t high = fp8::scaled_down_pair(fp8::spread_high(in[i]));
        out[2 * i] = fp8::bf16x2_rne(fp8::from_bits(low << 16) * unscale * scale,
                                     fp8::from_bits(low & 0xFFFF0000u) * unscale * scale);
        out[2 * i + 1] = fp8::bf16x2_rne(fp8::from_bits(high << 16) * unscale * scale,
                                         fp8::from_bits(high & 0xFFFF0000u) * unscale * scale);
      }
    } else {
      for (int i = 0; i < 4; ++i) {
        const std::uint32_t pair = in[i / 2] >> (16 * (i % 2));
        out[i] = fp8::bf16x2_rne(fp8::decode(pair & 0xFFu, fnuz) * scale, fp8::decode((pair >> 8) & 0xFFu, fnuz) * scale);
      }
    }
  }

  // One unit of a source row, loaded: two pieces of 8 fp8 values and their
  // two scales (k < 32), or 16 RoPE bytes.
  struct Loaded {
    std::uint32_t in[4];
    std::uint32_t scale_bits[2];
  };

  KOKKOS_INLINE_FUNCTION void load_unit(const std::uint8_t* src, int k, Loaded& l) const {
    if (k < fp8::nope_units) {
      fp8::load8<Vector, fetch>(src + 8 * k, l.in);
      fp8::load8<Vector, fetch>(src + fp8::half_values + 8 * k, l.in + 2);
      const std::uint8_t* scales = src + fp8_scales_offset + 4 * (k / fp8::units_per_scale);
      l.scale_bits[0] = fp8::load4<Vector, fetch>(scales);
      l.scale_bits[1] = fp8::load4<Vector, fetch>(scales + 4 * (fp8::half_values / 128));
    } else {
      fp8::load16<Vector, fetch>(src + fp8_rope_offset + 16 * (k - fp8::nope_units), l.in);
    }
  }

  KOKKOS_INLINE_FUNCTION void store_unit(const Loaded& l, std::uint16_t* dst_row, int k) const {
    auto* out = reinterpret_cast<std::uint8_t*>(dst_row);
    if (k < fp8::nope_units) {
      std::uint32_t converted[8];
      upconvert8(l.in, fp8::from_bits(l.scale_bits[0]), converted);
      upconvert8(l.in + 2, fp8::from_bits(l.scale_bits[1]), converted + 4);
      fp8::store16<Vector, streaming>(out + 16 * k, converted);
      fp8::store16<Vector, streaming>(out + 2 * fp8::half_values + 16 * k, converted + 4);
    } else {
      fp8::store16<Vector, streaming>(out + 2 * fp8_nope_values + 16 * (k - fp8::nope_units), l.in);
    }
  }

  // Loads unit u of the team's rows; returns its output row, or nullptr when
  // the row has no source or no output.
  KOKKOS_INLINE_FUNCTION std::uint16_t* load(const Page& page, std::int64_t id, std::int32_t first, std::int32_t u,
                                             Loaded& l) const {
    const std::int32_t i = first + u / fp8::units_per_row;  // 32-bit: a constant divisor is a multiply
    const std::int64_t output = page.first_output + i;
    const std::uint8_t* src = source_row(id, page.first_token + i);
    if (output < 0 || src == nullptr) return nullptr;
    load_unit(src, u % fp8::units_per_row, l);
    return a.dst + output * a.dst_row_stride;
  }

  // A team converts `rows_per_task` rows of one page, 40 units per row.
  // Team thread `lane` takes units lane, lane + lanes, ..., two at a time:
  // both loads go out before either store (the stores may alias the cache,
  // so the compiler would not hoist the second load over the first store).
  // Two named slots, not an array indexed in a loop, which nvcc put in
  // local memory (seen in the PTX).
  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
#if defined(__CUDA_ARCH__)
    // Kokkos lays a team of vector length 1 out along threadIdx.y, and the
    // GPU teams of this kernel are whole warps: rank & 31 is the warp lane.
    const int warp_lane = team.team_rank() & 31;
    const RequestLoads loads = request_loads(warp_lane);
#endif
    // Few pages: an unsigned division (the league rank and chunks_per_page
    // are positive), a few instructions shorter. Many pages: signed, which
    // that launch ran better with (see UpconvertShape).
    using TaskIndex = std::conditional_t<Shape == UpconvertShape::few_pages, std::uint32_t, std::int32_t>;
    const auto task = static_cast<TaskIndex>(team.league_rank());
    const auto chunks = static_cast<TaskIndex>(chunks_per_page);
    Page page{};
#if defined(__CUDA_ARCH__)
    if (!page_of_warp(warp_lane, loads, task / chunks, page)) return;
#else
    if (!page_of(task / chunks, page)) return;
#endif
    const std::int32_t first = static_cast<std::int32_t>(task % chunks) * rows_per_task;
    const std::int32_t page_rows = static_cast<std::int32_t>(page.rows);
    if (first >= page_rows) return;
    const std::int32_t rows = page_rows - first < rows_per_task ? page_rows - first : rows_per_task;
    const std::int64_t id = block_id(page);
    const std::int32_t units = rows * fp8::units_per_row;
    const std::int32_t lanes = team.team_size();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, lanes), [&](const std::int32_t lane) {
      for (std::int32_t u0 = lane; u0 < units; u0 += 2 * lanes) {
        const std::int32_t u1 = u0 + lanes;
        Loaded l0{}, l1{};
        std::uint16_t* d0 = load(page, id, first, u0, l0);
        std::uint16_t* d1 = u1 < units ? load(page, id, first, u1, l1) : nullptr;
        if (d0 != nullptr) store_unit(l0, d0, u0 % fp8::units_per_row);
        if (d1 != nullptr) store_unit(l1, d1, u1 % fp8::units_per_row);
      }
    });
  }
};

template <class Space>
void gather_upconvert_fp8(const Space& space, const Fp8UpconvertArgs& a) {
  if (a.total_rows == 0 || a.batch == 0) return;
  const bool vector = aligned16(a.cache) && a.cache_block_stride % 16 == 0 && a.cache_row_stride % 16 == 0 &&
                      aligned16(a.dst) && (a.dst_row_stride * 2) % 16 == 0 &&
                      (a.host_cache == nullptr || (aligned16(a.host_cache) && a.host_row_stride % 16 == 0));
  // The reference's grid: every request adds at most two partial pages.
  const std::int64_t tasks = (std::int64_t{a.total_rows} + a.block_size - 1) / a.block_size + 2 * std::int64_t{a.batch};
  // GPUs (team shapes measured on the H200, 8 requests, block size 64;
  // docs/PERFORMANCE.md): with few pages a team per 8 rows of a page (320
  // threads, one unit each) fills the device better than a team per page.
  // With many pages a team of 160 threads per 16 rows of a page, four units
  // a thread (two full rounds of two), ahead of 320 threads per 32 rows, of
  // 512 threads per page (as the reference launches it) and of one round a
  // thread.
  // CPUs: a team (of one) per page. A page holds at most min(block_size,
  // total_rows) rows; where a launch's teams would not fit in an int, a page
  // takes a team.
  const std::int64_t page_rows = std::min<std::int64_t>(a.block_size, a.total_rows);
  auto fits = [&](std::int64_t rows) { return tasks * ((page_rows + rows - 1) / rows) <= 0x7FFFFFFF; };
  const std::int32_t small_task_rows = a.block_size < 8 ? a.block_size : 8;
  const std::int32_t large_task_rows = a.block_size < 16 ? a.block_size : 16;
  const bool few_pages = !is_host_space<Space> && tasks < 1024 && fits(small_task_rows);
  const bool split_pages = !is_host_space<Space> && !few_pages && fits(large_task_rows);
  const std::int32_t rows_per_task = few_pages ? small_task_rows : split_pages ? large_task_rows : a.block_size;
  const std::int64_t chunks = (page_rows + rows_per_task - 1) / rows_per_task;
  const int team = row_team_size<Space>(few_pages ? (rows_per_task * fp8::units_per_row + 31) / 32 * 32 : 160);
  const int teams = static_cast<int>(tasks * chunks);
  using Shape = UpconvertShape;
  auto launch = [&](const auto& policy, auto shape) {
    constexpr Shape vector_shape = decltype(shape)::value;
    // Unaligned rows take no streaming stores (store16 has none for them).
    constexpr Shape scalar_shape = vector_shape == Shape::many_pages_streaming ? Shape::many_pages : vector_shape;
    with_block_split(a.block_size, [&](auto split) {
      using Split = decltype(split);
      const auto chunks32 = static_cast<std::int32_t>(chunks);
      if (vector) {
        Kokkos::parallel_for("sparse_mla::gather_upconvert_fp8", policy,
                             Fp8Upconvert<Space, true, Split, vector_shape>{rows_per_task, chunks32, split, a});
      } else {
        Kokkos::parallel_for("sparse_mla::gather_upconvert_fp8", policy,
                             Fp8Upconvert<Space, false, Split, scalar_shape>{rows_per_task, chunks32, split, a});
      }
    });
  };
  if constexpr (is_host_space<Space>) {
    launch(Kokkos::TeamPolicy<Space>(space, teams, team), std::integral_constant<Shape, Shape::many_pages>{});
  } else if (few_pages) {
    launch(Kokkos::TeamPolicy<Space>(space, teams, team), std::integral_constant<Shape, Shape::few_pages>{});
  } else {
    // Eight 160-thread teams an SM, which the compiler fits without spills
    // (ten teams an SM spill). Outputs several times the size of a GPU's L2
    // (Hopper's is 50 MB) are stored streaming.
    const Kokkos::TeamPolicy<Space, Kokkos::LaunchBounds<160, 8>> policy(space, teams, team);
    constexpr std::int64_t streaming_output_bytes = std::int64_t{256} << 20;
    if (std::int64_t{a.total_rows} * 2 * upconverted_row_width > streaming_output_bytes) {
      launch(policy, std::integral_constant<Shape, Shape::many_pages_streaming>{});
    } else {
      launch(policy, std::integral_constant<Shape, Shape::many_pages>{});
    }
  }
}

#undef SPARSE_MLA_HW_E4M3

}  // namespace sparse_mla::kernels
