// FP8 gather-upconvert of paged cache tokens to bf16 (SPEC section 3), one
// kernel source for both cache formats (KvFormat, see Layout below) and both
// ways of naming the tokens (Gather).
//
// Page tasks as the reference engine numbers them: requests in order, each
// split at block boundaries. ceil(T / block_size) + 2 * batch tasks cover
// every page of a workspace gather of T rows, batch * (ceil(W / block_size)
// + 1) every page of a position-range gather of W rows a request. CPUs take
// a team per task; GPUs split a task's rows over teams of 8 rows (few
// pages) or 16 rows (many pages), see gather_upconvert_fp8. A team works
// through its rows in units (Layout::units_per_row a row): NoPE unit k holds
// values 8k .. 8k + 7 and H + 8k .. H + 8k + 7, H half of the row's fp8
// values (two 8-byte loads, two 16-byte stores of bf16), so that
// consecutive threads load consecutive 8-byte pieces and store consecutive
// 16-byte pieces: every store of a warp fills whole 32-byte sectors (units
// of 16 consecutive values stored two half sectors per thread, at a 32-byte
// stride). The other units copy 16 RoPE bytes each. Four fp8 bytes decode
// together in integer operations on two bytes at a time; the float32
// product is rounded to bf16 by the instruction the reference uses on CUDA,
// by exact integer rounding elsewhere, so host and GPU agree bit for bit.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <type_traits>

#include "components/fp8_bf16.hpp"
#include "components/memory.hpp"
#include "components/warp.hpp"
#include "space_traits.hpp"
#include "kernels.hpp"

namespace sparse_mla::kernels {

namespace fp8 {

// The decode of a little-endian word of four e4m3 bytes, two bytes per
// 32-bit operation: the path of every unit without a NaN byte. spread_low
// and spread_high put bytes 0-1 or 2-3 at the top of the word's two 16-bit
// halves; scaled_down_pair keeps each sign bit and moves the 7 magnitude
// bits down 4, into a bf16's exponent and mantissa fields. Each half is
// then a bf16 (a float's top half) whose value is the byte's times
// 2^-(127 - bias), the same float device::e4m3_value() builds a byte at a
// time.
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

// Row loads (device::load_words): wide fetches where the device has them
// (see UpconvertShape).
template <bool Vector, device::Fetch How>
KOKKOS_INLINE_FUNCTION void load16(const std::uint8_t* p, std::uint32_t w[4]) {
  device::load_words<Vector, 4, How>(p, w);
}
template <bool Vector, device::Fetch How>
KOKKOS_INLINE_FUNCTION void load8(const std::uint8_t* p, std::uint32_t w[2]) {
  device::load_words<Vector, 2, How>(p, w);
}
template <bool Vector, device::Fetch How>
KOKKOS_INLINE_FUNCTION std::uint32_t load4(const std::uint8_t* p) {
  std::uint32_t w;
  device::load_words<Vector, 1, How>(p, &w);
  return w;
}

KOKKOS_INLINE_FUNCTION std::int64_t min64(std::int64_t x, std::int64_t y) { return x < y ? x : y; }
KOKKOS_INLINE_FUNCTION std::int64_t max64(std::int64_t x, std::int64_t y) { return x > y ? x : y; }

// The float bits of a ue8m0 scale byte b, 2^(b - 127): b in the exponent
// field; b = 0 is the subnormal 2^-127, b = 255 infinity (as exp2 gives it).
KOKKOS_INLINE_FUNCTION std::uint32_t ue8m0_float_bits(std::uint32_t b) { return b == 0 ? 0x00400000u : b << 23; }

// The two cache formats (KvFormat), as the kernel reads a token: where its
// scales lie, how its units split, how wide its output is.
//
// fp8_ds_mla: a 656-byte row a token: 512 fp8 values, 4 float32 scales (128
// values each), 64 bf16 RoPE values. 40 units a row: 32 of 16 fp8 values,
// 8 of 16 RoPE bytes; 576 bf16 out.
struct DsMlaRows {
  static constexpr int units_per_row = 40;
  static constexpr int nope_units = 32;
  static constexpr int half_values = 256;  // a unit's second 8 values are this far from its first
  static constexpr int out_width = 576;
  static constexpr int rope_offset = 528;  // of the RoPE bytes in the token
  static constexpr bool host_backed = true;  // the host-backed variant reads these rows
  static constexpr bool scales_in_row = true;  // at fp8_scales_offset
  // The scales of unit k's halves (values 8k.. and 256 + 8k..: scales k / 16
  // and k / 16 + 2), as float bits: two 4-byte loads.
  template <bool Vector, device::Fetch How>
  KOKKOS_INLINE_FUNCTION static void scale_bits(const std::uint8_t* scales, int k, std::uint32_t bits[2]) {
    const std::uint8_t* first = scales + 4 * (k / 16);
    bits[0] = load4<Vector, How>(first);
    bits[1] = load4<Vector, How>(first + 4 * (half_values / 128));
  }
};

// model1_fp8 (DeepSeek V4): a token's 576 data bytes (448 fp8 values, 64
// bf16 RoPE values) and, elsewhere in its page, its 8-byte scale group (7
// ue8m0 scales of 64 values, a pad byte). 36 units a row: 28 of 16 fp8
// values, 8 of 16 RoPE bytes; 512 bf16 out.
struct Model1Pages {
  static constexpr int units_per_row = 36;
  static constexpr int nope_units = 28;
  static constexpr int half_values = 224;
  static constexpr int out_width = 512;
  static constexpr int rope_offset = 448;
  static constexpr bool host_backed = false;
  static constexpr bool scales_in_row = false;  // in the page's scale groups
  // Unit k's halves lie in tiles k / 8 and (k + 28) / 8 (224 = 3.5 tiles):
  // bytes of the token's scale group, read in one 8-byte load.
  template <bool Vector, device::Fetch How>
  KOKKOS_INLINE_FUNCTION static void scale_bits(const std::uint8_t* scales, int k, std::uint32_t bits[2]) {
    std::uint32_t group[2];
    load8<Vector, How>(scales, group);
    const int tiles[2] = {k / 8, (k + nope_units) / 8};
    for (int h = 0; h < 2; ++h) {
      const std::uint32_t word = tiles[h] < 4 ? group[0] : group[1];
      bits[h] = ue8m0_float_bits((word >> (8 * (tiles[h] % 4))) & 0xFFu);
    }
  }
};

}  // namespace fp8

// How the requests name their tokens (Fp8UpconvertArgs):
// - workspace: request r fills the output rows [ws[r], ws[r + 1]) from
//   token seq_starts[r] (or 0) on;
// - positions: request r fills rows offset + i of its own output slice
//   from its last gather_lens[r] positions (DeepSeek V4's prefill gather).
enum class Gather { workspace, positions };

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

template <class Space, class Layout, Gather Requests, bool Vector, class Split, UpconvertShape Shape>
struct Fp8Upconvert {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  static constexpr bool streaming = Shape == UpconvertShape::many_pages_streaming;
  static constexpr device::Fetch fetch = Shape == UpconvertShape::few_pages ? device::Fetch::plain
                                      : streaming                       ? device::Fetch::wide_streaming
                                                                        : device::Fetch::wide;
  static constexpr int units_per_row = Layout::units_per_row;
  static constexpr int nope_units = Layout::nope_units;
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
    std::int64_t first_output;   // output row of first_token (in the request's output slice)
  };

  // Task -> page: the reference engine's numbering, requests in order.
  // Request r copies output rows [begin, begin + length) from source rows
  // [source, source + length): `pages` pages of its block table, the first
  // one that of block(source).
  struct Request {
    std::int64_t begin, length, source, pages;
  };

  // What a request's lookup loads (request_loads): a workspace request's
  // start, the next request's start and its first source token; a position
  // request's length and how many of its last positions it gathers.
  struct RequestLoads {
    std::int32_t first, second, third;
  };

  // Loads for request r (indices clamped to the last request, so the loads
  // need no branch; batch >= 1 by the launch's guard).
  KOKKOS_INLINE_FUNCTION RequestLoads request_loads(std::int32_t r) const {
    const std::int32_t last = a.batch - 1;
    const std::int32_t at = r < last ? r : last;
    if constexpr (Requests == Gather::workspace) {
      return RequestLoads{a.workspace_starts[at], a.workspace_starts[at + 1 <= last ? at + 1 : last],
                          a.seq_starts != nullptr ? a.seq_starts[at] : 0};
    } else {
      const std::int32_t length = a.seq_lens[at];
      return RequestLoads{length, a.gather_lens != nullptr ? a.gather_lens[at] : length, 0};
    }
  }

  KOKKOS_INLINE_FUNCTION Request request(std::int32_t r, const RequestLoads& l) const {
    std::int64_t begin, length, source;
    if constexpr (Requests == Gather::workspace) {
      const std::int64_t total = a.total_rows;
      begin = fp8::min64(l.first, total);
      const std::int64_t end = fp8::min64(r + 1 < a.batch ? l.second : total, total);
      length = fp8::max64(end - begin, 0);
      source = l.third;
    } else {
      // Positions seq_len - gather .. seq_len - 1 to rows offset .., as many
      // as the request's slice holds.
      begin = a.first_output;
      length = fp8::max64(fp8::min64(l.second, std::int64_t{a.request_rows} - a.first_output), 0);
      source = std::int64_t{l.first} - l.second;
    }
    // No valid source rows (source < 0): no pages, its rows stay unwritten.
    const std::int64_t pages =
        source < 0 ? 0 : split.block(source + length + a.block_size - 1) - split.block(source);
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

  // Every thread of a team looks up the same page. On GPUs (page_of_group)
  // the 32 lanes of a lane group take 32 requests at once (loads, page counts, a
  // shuffle scan of them, a ballot for the one that holds the task), where a
  // loop over the requests had cost each warp about as much as converting
  // its rows. Elsewhere (page_of) a loop, with the loads of 8 requests
  // issued before any is used (clamped indices, not branches, so that the
  // loads issue together).
  static constexpr std::int32_t loads_together = 8;

  KOKKOS_INLINE_FUNCTION bool page_of(std::int64_t task, Page& page) const {
    const std::int32_t last = a.batch - 1;
    for (std::int32_t r0 = 0; r0 <= last; r0 += loads_together) {
      RequestLoads loads[loads_together];
      for (int u = 0; u < loads_together; ++u) loads[u] = request_loads(r0 + u);
      for (int u = 0; u < loads_together && r0 + u <= last; ++u) {
        const Request q = request(r0 + u, loads[u]);
        if (task < q.pages) {
          page = page_in(r0 + u, q, task);
          return true;
        }
        task -= q.pages;
      }
    }
    return false;
  }

  // The lookup by one lane group (device::group_lanes > 1). The kernel has
  // issued the first round's loads (requests 0-31) before anything else: a
  // task's page needs a division first, and the loads nothing.
  KOKKOS_INLINE_FUNCTION bool page_of_group(int lane, RequestLoads loads, std::int64_t task, Page& page) const {
    constexpr int lanes = device::group_lanes;
    const std::int32_t last = a.batch - 1;
    for (std::int32_t r0 = 0; r0 <= last; r0 += lanes) {
      const std::int32_t r = r0 + lane;
      if (r0 > 0) loads = request_loads(r);
      const std::int32_t at = r < last ? r : last;
      Request q = request(at, loads);
      // Page counts in 32 bits, each shuffle one instruction (64-bit ones
      // are two): sums saturate at 2^31 - 1, above every task (the league
      // is an int), so a saturated lane never holds the task and the lane
      // that does has exact counts before it.
      constexpr std::uint32_t saturated = 0x7FFFFFFFu;
      const std::uint32_t pages = r > last ? 0u : q.pages < saturated ? static_cast<std::uint32_t>(q.pages) : saturated;
      std::uint32_t inclusive = pages;
      for (int d = 1; d < lanes; d <<= 1) {
        const std::uint32_t up = device::shuffle_up(inclusive, d);
        if (lane >= d) inclusive = inclusive + up < saturated ? inclusive + up : saturated;
      }
      std::uint32_t before = device::shuffle_up(inclusive, 1);
      if (lane == 0) before = 0;
      const device::LaneMask holder = device::ballot(task >= before && task < inclusive);
      if (holder != 0) {
        const int h = device::first_lane(holder);
        Request held;
        held.begin = device::shuffle(q.begin, h);
        held.length = device::shuffle(q.length, h);
        held.source = device::shuffle(q.source, h);
        page = page_in(r0 + h, held, task - device::shuffle(before, h));
        return true;
      }
      task -= device::shuffle(inclusive, lanes - 1);
    }
    return false;
  }

  // Where a token's data and scales are read from: rows that hold their
  // scales (Layout::scales_in_row) need no second pointer, which would cost
  // the many-page launch a register over its bound.
  struct Token {
    const std::uint8_t* data;    // the token's fp8 values and RoPE bytes; nullptr: no source
    const std::uint8_t* scales;  // model1_fp8: its scale group
  };
  KOKKOS_INLINE_FUNCTION static Token row_token(const std::uint8_t* row) { return Token{row, nullptr}; }

  // Flat device row `row` of the host-backed variant's staged rows, or
  // nullptr when the cache does not hold it.
  KOKKOS_INLINE_FUNCTION const std::uint8_t* device_row(std::int64_t row) const {
    if (row < 0 || row >= a.cache_blocks * a.cache_block_size) return nullptr;
    return a.cache + (row / a.cache_block_size) * a.cache_block_stride + (row % a.cache_block_size) * a.cache_row_stride;
  }

  // The page's block id in the block table, or -1 (read once per team).
  KOKKOS_INLINE_FUNCTION std::int64_t block_id(const Page& page) const {
    if (page.block >= a.blocks_per_request) return -1;
    return a.block_table[page.request * a.block_table_stride + page.block];
  }

  // Token `token` of block `id`; data nullptr when the block table, the
  // ids or the cache do not hold it.
  KOKKOS_INLINE_FUNCTION Token source_token(std::int64_t id, std::int64_t token) const {
    if (id < 0) return Token{nullptr, nullptr};
    if (!Layout::host_backed || a.host_cache == nullptr) {
      if (id >= a.cache_blocks) return Token{nullptr, nullptr};
      const std::uint8_t* page = a.cache + id * a.cache_block_stride;
      if constexpr (Layout::host_backed) {
        return row_token(page + token * a.cache_row_stride);
      } else {
        return Token{page + token * a.cache_row_stride,
                     page + a.cache_scale_offset + token * model1_scale_group_bytes};
      }
    }
    const std::int64_t staged = id * a.block_size + token;
    if (staged >= a.staged_rows) return Token{nullptr, nullptr};
    if (a.device_row_ids[staged] >= 0) return row_token(device_row(a.device_row_ids[staged]));
    const std::int64_t host_row = a.host_row_ids[staged];
    if (host_row < 0 || host_row >= a.host_rows) return Token{nullptr, nullptr};
    return row_token(a.host_cache + host_row * a.host_row_stride);
  }

  // 8 fp8 bytes (2 little-endian words) to 8 bf16 (4 words, two per word):
  // bf16(value * scale), the value scaled down by 2^(127 - bias) (exact, see
  // scaled_down_pair), multiplied back up (exact) and then by the scale, so
  // the product is rounded once, as the reference rounds float(fp8) * scale.
  // 8 bytes with a NaN byte (rare) take device::e4m3_value() a byte at a
  // time.
  KOKKOS_INLINE_FUNCTION void upconvert8(const std::uint32_t in[2], float scale, std::uint32_t out[4]) const {
    const bool fnuz = a.format == Fp8Format::e4m3fnuz;
    // e4m3fn where the device converts it (device::native_e4m3): the exact
    // values from the hardware, one rounding in the product, as the
    // reference computes it; NaN bytes need no other path (a NaN product
    // rounds to 0x7FFF like any NaN).
    if (device::native_e4m3 && !fnuz) {
      for (int i = 0; i < 2; ++i) {
        float f[4];
        device::e4m3fn_x4(in[i], f);
        out[2 * i] = device::bf16x2_rne(f[0] * scale, f[1] * scale);
        out[2 * i + 1] = device::bf16x2_rne(f[2] * scale, f[3] * scale);
      }
      return;
    }
    if ((fp8::nan_bytes(in[0], fnuz) | fp8::nan_bytes(in[1], fnuz)) == 0) {
      const float unscale = fnuz ? 0x1p119f : 0x1p120f;
      for (int i = 0; i < 2; ++i) {
        const std::uint32_t low = fp8::scaled_down_pair(fp8::spread_low(in[i]));
        const std::uint32_t high = fp8::scaled_down_pair(fp8::spread_high(in[i]));
        out[2 * i] = device::bf16x2_rne(device::from_bits(low << 16) * unscale * scale,
                                     device::from_bits(low & 0xFFFF0000u) * unscale * scale);
        out[2 * i + 1] = device::bf16x2_rne(device::from_bits(high << 16) * unscale * scale,
                                         device::from_bits(high & 0xFFFF0000u) * unscale * scale);
      }
    } else {
      for (int i = 0; i < 4; ++i) {
        const std::uint32_t pair = in[i / 2] >> (16 * (i % 2));
        out[i] = device::bf16x2_rne(device::e4m3_value(pair & 0xFFu, fnuz) * scale, device::e4m3_value((pair >> 8) & 0xFFu, fnuz) * scale);
      }
    }
  }

  // One unit of a source row, loaded: two pieces of 8 fp8 values and their
  // two scales (k < nope_units), or 16 RoPE bytes.
  struct Loaded {
    std::uint32_t in[4];
    std::uint32_t scale_bits[2];
  };

  KOKKOS_INLINE_FUNCTION void load_unit(const Token& src, int k, Loaded& l) const {
    if (k < nope_units) {
      fp8::load8<Vector, fetch>(src.data + 8 * k, l.in);
      fp8::load8<Vector, fetch>(src.data + Layout::half_values + 8 * k, l.in + 2);
      const std::uint8_t* scales = Layout::scales_in_row ? src.data + fp8_scales_offset : src.scales;
      Layout::template scale_bits<Vector, fetch>(scales, k, l.scale_bits);
    } else {
      fp8::load16<Vector, fetch>(src.data + Layout::rope_offset + 16 * (k - nope_units), l.in);
    }
  }

  KOKKOS_INLINE_FUNCTION void store_unit(const Loaded& l, std::uint16_t* dst_row, int k) const {
    auto* out = reinterpret_cast<std::uint8_t*>(dst_row);
    if (k < nope_units) {
      std::uint32_t converted[8];
      upconvert8(l.in, device::from_bits(l.scale_bits[0]), converted);
      upconvert8(l.in + 2, device::from_bits(l.scale_bits[1]), converted + 4);
      device::store16<Vector, streaming>(out + 16 * k, converted);
      device::store16<Vector, streaming>(out + 2 * Layout::half_values + 16 * k, converted + 4);
    } else {
      device::store16<Vector, streaming>(out + 4 * Layout::half_values + 16 * (k - nope_units), l.in);
    }
  }

  // Loads unit u of the team's rows (token0 the first row's token in block
  // id, out0 its output row); returns the unit's output row, or nullptr when
  // the row has no source.
  KOKKOS_INLINE_FUNCTION std::uint16_t* load(std::int64_t id, std::int64_t token0, std::uint16_t* out0, std::int32_t u,
                                             Loaded& l) const {
    const std::int32_t i = u / units_per_row;  // 32-bit: a constant divisor is a multiply
    const Token src = source_token(id, token0 + i);
    if (src.data == nullptr) return nullptr;
    load_unit(src, u % units_per_row, l);
    return out0 + i * a.dst_row_stride;
  }

  // A team converts `rows_per_task` rows of one page, units_per_row units
  // per row. Team thread `lane` takes units lane, lane + lanes, ..., two at
  // a time: both loads go out before either store (the stores may alias the
  // cache, so the compiler would not hoist the second load over the first
  // store). Two named slots, not an array indexed in a loop, which nvcc put
  // in local memory (seen in the PTX).
  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    // Lane groups (device::group_lanes > 1) look a page up together: the
    // GPU teams of this kernel are whole groups, so rank & 31 is the lane.
    constexpr bool by_group = device::group_lanes > 1;
    const int group_lane = team.team_rank() & (device::group_lanes - 1);
    RequestLoads loads{};
    if constexpr (by_group) loads = request_loads(group_lane);
    // Few pages: an unsigned division (the league rank and chunks_per_page
    // are positive), a few instructions shorter. Many pages: signed, which
    // that launch ran better with (see UpconvertShape).
    using TaskIndex = std::conditional_t<Shape == UpconvertShape::few_pages, std::uint32_t, std::int32_t>;
    const auto task = static_cast<TaskIndex>(team.league_rank());
    const auto chunks = static_cast<TaskIndex>(chunks_per_page);
    Page page{};
    if (!(by_group ? page_of_group(group_lane, loads, task / chunks, page) : page_of(task / chunks, page))) return;
    std::int32_t first = static_cast<std::int32_t>(task % chunks) * rows_per_task;
    const std::int32_t page_rows = static_cast<std::int32_t>(page.rows);
    if (first >= page_rows) return;
    std::int32_t rows = page_rows - first < rows_per_task ? page_rows - first : rows_per_task;
    // Rows before output row 0 (from workspace starts the call does not read
    // on the host) are not written.
    if (page.first_output + first < 0) {
      const std::int64_t skipped = -(page.first_output + first);
      if (skipped >= rows) return;
      first += static_cast<std::int32_t>(skipped);
      rows -= static_cast<std::int32_t>(skipped);
    }
    // The first row's token and output row, once a team: its units need only
    // their row within the team.
    const std::int64_t id = block_id(page);
    const std::int64_t token0 = page.first_token + first;
    std::uint16_t* out0 = a.dst + (page.first_output + first) * a.dst_row_stride;
    if constexpr (Requests == Gather::positions) out0 += page.request * a.dst_request_stride;
    const std::int32_t units = rows * units_per_row;
    const std::int32_t lanes = team.team_size();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, lanes), [&](const std::int32_t lane) {
      for (std::int32_t u0 = lane; u0 < units; u0 += 2 * lanes) {
        const std::int32_t u1 = u0 + lanes;
        Loaded l0{}, l1{};
        std::uint16_t* d0 = load(id, token0, out0, u0, l0);
        std::uint16_t* d1 = u1 < units ? load(id, token0, out0, u1, l1) : nullptr;
        if (d0 != nullptr) store_unit(l0, d0, u0 % units_per_row);
        if (d1 != nullptr) store_unit(l1, d1, u1 % units_per_row);
      }
    });
  }
};

// One launch of Fp8Upconvert for a layout and a way of naming requests.
template <class Space, class Layout, Gather Requests>
void launch_upconvert(const Space& space, const Fp8UpconvertArgs& a) {
  // The output rows a request may fill, the page tasks that cover them, and
  // the rows a page holds at most.
  const bool workspace = Requests == Gather::workspace;
  const std::int64_t request_rows = workspace ? a.total_rows : std::int64_t{a.request_rows} - a.first_output;
  if (request_rows <= 0 || a.batch == 0) return;
  const std::int64_t output_rows = workspace ? request_rows : request_rows * a.batch;
  // The reference's grid for a workspace gather: every request adds at most
  // two partial pages. A request of W rows spans at most ceil(W / bs) + 1
  // pages.
  const std::int64_t tasks = workspace ? (request_rows + a.block_size - 1) / a.block_size + 2 * std::int64_t{a.batch}
                                       : ((request_rows + a.block_size - 1) / a.block_size + 1) * a.batch;
  const bool vector = aligned16(a.cache) && a.cache_block_stride % 16 == 0 && a.cache_row_stride % 16 == 0 &&
                      a.cache_scale_offset % 16 == 0 && aligned16(a.dst) && (a.dst_row_stride * 2) % 16 == 0 &&
                      (a.dst_request_stride * 2) % 16 == 0 &&
                      (a.host_cache == nullptr || (aligned16(a.host_cache) && a.host_row_stride % 16 == 0));
  // GPUs (team shapes measured on the H200 with fp8_ds_mla rows, 8
  // requests, block size 64; docs/PERFORMANCE.md): with few pages a team
  // per 8 rows of a page (one unit a thread) fills the device better than a
  // team per page. With many pages a team per 16 rows of a page, four units
  // a thread (two full rounds of two; 160 threads for fp8_ds_mla's 640
  // units, model1_fp8's 576 take the same teams), ahead of 320 threads per
  // 32 rows, of 512 threads per page (as the reference launches it) and of
  // one round a thread; pages of fewer rows take teams as small as whole
  // lane groups allow.
  // CPUs: a team (of one) per page. A page holds at most min(block_size,
  // request_rows) rows; where a launch's teams would not fit in an int, a
  // page takes a team.
  const std::int64_t page_rows = std::min<std::int64_t>(a.block_size, request_rows);
  auto fits = [&](std::int64_t rows) { return tasks * ((page_rows + rows - 1) / rows) <= 0x7FFFFFFF; };
  const std::int32_t small_task_rows = a.block_size < 8 ? a.block_size : 8;
  const std::int32_t large_task_rows = a.block_size < 16 ? a.block_size : 16;
  const bool few_pages = !is_host_space<Space> && tasks < 1024 && fits(small_task_rows);
  const bool split_pages = !is_host_space<Space> && !few_pages && fits(large_task_rows);
  const std::int32_t rows_per_task = few_pages ? small_task_rows : split_pages ? large_task_rows : a.block_size;
  const std::int64_t chunks = (page_rows + rows_per_task - 1) / rows_per_task;
  constexpr int many_pages_threads = 160;
  const std::int64_t task_units = std::int64_t{rows_per_task} * Layout::units_per_row;
  const auto whole_groups = [](std::int64_t threads) { return static_cast<int>((threads + 31) / 32 * 32); };
  const int team = row_team_size<Space>(
      few_pages ? whole_groups(task_units)
                : static_cast<int>(std::min<std::int64_t>(many_pages_threads, whole_groups((task_units + 3) / 4))));
  const int teams = static_cast<int>(tasks * chunks);
  using Shape = UpconvertShape;
  // The aligned kernels under `policy`; the unaligned ones (byte loads and
  // stores, a fallback) under `unaligned_policy`, which bounds no registers.
  auto launch = [&](const auto& policy, const auto& unaligned_policy, auto shape) {
    constexpr Shape vector_shape = decltype(shape)::value;
    // Unaligned rows take no streaming stores (store16 has none for them).
    constexpr Shape scalar_shape = vector_shape == Shape::many_pages_streaming ? Shape::many_pages : vector_shape;
    with_block_split(a.block_size, [&](auto split) {
      using Split = decltype(split);
      const auto chunks32 = static_cast<std::int32_t>(chunks);
      if (vector) {
        Kokkos::parallel_for("sparse_mla::gather_upconvert_fp8", policy,
                             Fp8Upconvert<Space, Layout, Requests, true, Split, vector_shape>{rows_per_task, chunks32,
                                                                                               split, a});
      } else {
        Kokkos::parallel_for("sparse_mla::gather_upconvert_fp8", unaligned_policy,
                             Fp8Upconvert<Space, Layout, Requests, false, Split, scalar_shape>{rows_per_task, chunks32,
                                                                                                split, a});
      }
    });
  };
  const Kokkos::TeamPolicy<Space> plain_policy(space, teams, team);
  if constexpr (is_host_space<Space>) {
    launch(plain_policy, plain_policy, std::integral_constant<Shape, Shape::many_pages>{});
  } else if (few_pages) {
    launch(plain_policy, plain_policy, std::integral_constant<Shape, Shape::few_pages>{});
  } else {
    // Eight 160-thread teams an SM, which the compiler fits without spills
    // (ten teams an SM spill). Outputs several times the size of a GPU's L2
    // (Hopper's is 50 MB) are stored streaming.
    const Kokkos::TeamPolicy<Space, MeasuredLaunchBounds<Space, many_pages_threads, 8>> policy(space, teams, team);
    constexpr std::int64_t streaming_output_bytes = std::int64_t{256} << 20;
    if (output_rows * 2 * Layout::out_width > streaming_output_bytes) {
      launch(policy, plain_policy, std::integral_constant<Shape, Shape::many_pages_streaming>{});
    } else {
      launch(policy, plain_policy, std::integral_constant<Shape, Shape::many_pages>{});
    }
  }
}

template <class Space>
void gather_upconvert_fp8(const Space& space, const Fp8UpconvertArgs& a) {
  const bool positions = a.seq_lens != nullptr;
  if (a.kv_format == KvFormat::model1_fp8) {
    if (positions) {
      launch_upconvert<Space, fp8::Model1Pages, Gather::positions>(space, a);
    } else {
      launch_upconvert<Space, fp8::Model1Pages, Gather::workspace>(space, a);
    }
  } else if (positions) {
    launch_upconvert<Space, fp8::DsMlaRows, Gather::positions>(space, a);
  } else {
    launch_upconvert<Space, fp8::DsMlaRows, Gather::workspace>(space, a);
  }
}

}  // namespace sparse_mla::kernels
