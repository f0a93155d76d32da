// FP8 gather-upconvert (SPEC section 3) against the scalar reference
// (tools/validation/reference/fp8_reference.hpp), in both fp8 formats: every byte value
// under scales that give zeros, subnormal, overflowing and NaN products;
// random gathers over many shapes (seq_starts, empty requests, the last
// request ending at the output's end, block sizes 1 and 64); the
// host-backed variant reading a mix of resident device rows and pinned host
// rows; strided and misaligned layouts; rows with no valid source; and
// every rejection path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend_test.hpp"
#include "validation/reference/fp8_reference.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/topk_convert.hpp"
#include "sparse_mla/fp8_upconvert.hpp"
#include "test_util.hpp"

namespace sparse_mla::testing {
namespace {

using reference::Fp8GatherInputs;
constexpr std::uint16_t poison_bf16 = 0xA5A5;
constexpr std::size_t row_bytes = reference::row_bytes;

const Fp8Format formats[] = {Fp8Format::e4m3fn, Fp8Format::e4m3fnuz};

// Scales that make every kind of product: exact, rounded, subnormal,
// underflowing to zero, overflowing to infinity, signed zeros and NaN.
const float special_scales[] = {1.0f,
                                0.5f,
                                1.0f / 448.0f,
                                0.0123f,
                                -0.75f,
                                0.0f,
                                -0.0f,
                                1e-38f,
                                0x1p-140f,
                                std::numeric_limits<float>::denorm_min(),
                                1e36f,
                                std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(),
                                3.0f,
                                255.99998f,  // the largest scale whose product with 2^120 stays finite
                                256.0f,
                                -256.0f};

float draw_scale(std::mt19937_64& rng) {
  const auto pick = std::uniform_int_distribution<int>(0, 99)(rng);
  if (pick < 20) return special_scales[static_cast<std::size_t>(pick) % std::size(special_scales)];
  if (pick < 30) {  // any bit pattern at all
    const auto bits = static_cast<std::uint32_t>(rng());
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  return std::uniform_real_distribution<float>(1e-4f, 0.05f)(rng);  // amax / 448 of real data
}

void set_scale(std::uint8_t* row, int group, float scale) { std::memcpy(row + 512 + 4 * group, &scale, sizeof scale); }

// Random rows: every fp8 byte value (NaN codes included), random scales,
// random RoPE bits.
std::vector<std::uint8_t> random_rows(std::mt19937_64& rng, std::int64_t rows) {
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(rows) * row_bytes);
  for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int g = 0; g < 4; ++g) set_scale(bytes.data() + static_cast<std::size_t>(r) * row_bytes, g, draw_scale(rng));
  }
  return bytes;
}

struct GatherShape {
  std::vector<std::int32_t> lengths;  // rows of each request
  std::int64_t block_size;
  bool seq_starts;
  std::int64_t total_delta;  // T = sum(lengths) + total_delta (negative: clamped ends)
};

std::string describe(const GatherShape& s) {
  std::string out = "lengths=[";
  for (auto l : s.lengths) out += std::to_string(l) + ",";
  return out + "] block_size=" + std::to_string(s.block_size) + (s.seq_starts ? " seq_starts" : "") +
         " total_delta=" + std::to_string(s.total_delta);
}

// Each request reads its tokens from shuffled blocks; block-table entries it
// never reads hold valid ids of other blocks.
Fp8GatherInputs random_gather(std::mt19937_64& rng, const GatherShape& s, bool fnuz) {
  Fp8GatherInputs in;
  in.batch = static_cast<std::int64_t>(s.lengths.size());
  in.block_size = in.cache_block_size = s.block_size;
  in.fnuz = fnuz;
  std::int64_t start = 0, blocks_needed = 0;
  for (std::size_t r = 0; r < s.lengths.size(); ++r) {
    in.workspace_starts.push_back(static_cast<std::int32_t>(start));
    start += s.lengths[r];
    const std::int32_t first = s.seq_starts ? std::uniform_int_distribution<std::int32_t>(0, 150)(rng) : 0;
    if (s.seq_starts) in.seq_starts.push_back(first);
    blocks_needed = std::max(blocks_needed, (first + s.lengths[r] + s.block_size - 1) / s.block_size);
  }
  in.total_rows = start + s.total_delta;
  in.blocks_per_request = blocks_needed + 1;
  in.num_blocks = in.batch * in.blocks_per_request + 3;
  std::vector<std::int32_t> pool(static_cast<std::size_t>(in.num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  in.block_table.assign(pool.begin(), pool.begin() + in.batch * in.blocks_per_request);
  in.cache = random_rows(rng, in.num_blocks * in.cache_block_size);
  return in;
}

class Fp8UpconvertTest : public BackendTest {
 protected:
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped()) return;
    stream = device->create_stream();
  }

  // The inputs on the device, a poisoned dst, and the parameters.
  struct OnDevice {
    DeviceTensor cache, block_table, workspace_starts, seq_starts, host_cache, host_row_ids, device_row_ids;
    Buffer dst_buffer;
    Tensor dst;
    Fp8GatherParams params;
  };

  OnDevice to_device(const Fp8GatherInputs& in) {
    OnDevice d;
    d.cache = device_tensor(*device, *stream, in.cache, {in.num_blocks, in.cache_block_size, 656});
    d.block_table = device_tensor(*device, *stream, in.block_table,
                                  {static_cast<std::int64_t>(in.block_table.size()) / in.blocks_per_request,
                                   in.blocks_per_request});
    d.workspace_starts = device_tensor(*device, *stream, in.workspace_starts, {in.batch});
    d.dst_buffer = upload(*device, *stream, poisoned_rows(in.total_rows));
    d.dst = Tensor::of(d.dst_buffer, DType::bf16, {in.total_rows, 576});
    d.params.format = in.fnuz ? Fp8Format::e4m3fnuz : Fp8Format::e4m3fn;
    if (!in.seq_starts.empty()) {
      d.seq_starts = device_tensor(*device, *stream, in.seq_starts, {in.batch});
      d.params.seq_starts = d.seq_starts.tensor;
    }
    if (!in.host_row_ids.empty()) {
      const auto n = static_cast<std::int64_t>(in.host_row_ids.size());
      d.host_cache = device_tensor(*device, *stream, in.host_cache,
                                   {static_cast<std::int64_t>(in.host_cache.size() / row_bytes), 656},
                                   MemoryKind::pinned_host);
      d.host_row_ids = device_tensor(*device, *stream, in.host_row_ids, {1, n});
      d.device_row_ids = device_tensor(*device, *stream, in.device_row_ids, {n});
      d.params.host_cache = d.host_cache.tensor;
      d.params.host_row_ids = d.host_row_ids.tensor;
      d.params.device_row_ids = d.device_row_ids.tensor;
      d.params.block_size = in.block_size;
    }
    return d;
  }

  static std::vector<std::uint16_t> poisoned_rows(std::int64_t rows) {
    return std::vector<std::uint16_t>(static_cast<std::size_t>(rows) * 576, poison_bf16);
  }

  std::vector<std::uint16_t> run(const Fp8GatherInputs& in) {
    OnDevice d = to_device(in);
    gather_upconvert_fp8(*stream, d.cache.tensor, d.dst, d.block_table.tensor, d.workspace_starts.tensor, in.batch,
                         d.params);
    return download_rows<std::uint16_t>(*device, *stream, d.dst);
  }

  static std::vector<std::uint16_t> expected(const Fp8GatherInputs& in) {
    auto dst = poisoned_rows(in.total_rows);
    reference::gather_upconvert(in, dst);
    return dst;
  }

  std::unique_ptr<Stream> stream;
};
SPARSE_MLA_INSTANTIATE_BACKENDS(Fp8UpconvertTest);

// Compares whole outputs; on a mismatch names the first few positions.
::testing::AssertionResult same_rows(const std::vector<std::uint16_t>& got, const std::vector<std::uint16_t>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes " << got.size() << " and " << want.size();
  int shown = 0;
  ::testing::AssertionResult failure = ::testing::AssertionFailure();
  for (std::size_t i = 0; i < got.size() && shown < 5; ++i) {
    if (got[i] != want[i]) {
      failure << "row " << i / 576 << " element " << i % 576 << ": got 0x" << std::hex << got[i] << ", expected 0x"
              << want[i] << std::dec << "\n";
      ++shown;
    }
  }
  return shown ? failure : ::testing::AssertionSuccess();
}

TEST_P(Fp8UpconvertTest, EveryByteUnderEveryKindOfScale) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(11);
  for (Fp8Format format : formats) {
    SCOPED_TRACE(fp8_format_name(format));
    // Rows 8p .. 8p + 7 are under scale p. Each pair of them holds all 256
    // byte values in each 128-value group, as four variants, so that every
    // byte goes through both decode paths (units of 16 values without a NaN
    // byte decode four bytes at a time, units with one a byte at a time):
    // 0 as is, 1 with the NaN bytes made 0 (every unit fast), 2 and 3 with
    // a NaN forced into each unit's first or last byte (every unit slow).
    // A row's NaN bytes are those of values 0x7F, 0xFF (e4m3fn) or 0x80.
    Fp8GatherInputs in;
    const auto scales = std::size(special_scales) + 8;
    in.cache_block_size = in.block_size = 64;
    const std::int64_t rows = 8 * static_cast<std::int64_t>(scales);
    in.num_blocks = (rows + 63) / 64;
    in.cache = random_rows(rng, in.num_blocks * 64);
    const bool fnuz = format == Fp8Format::e4m3fnuz;
    const auto is_nan = [fnuz](std::uint8_t b) { return fnuz ? b == 0x80 : (b & 0x7F) == 0x7F; };
    const std::uint8_t nan = fnuz ? 0x80 : 0x7F;
    for (std::int64_t r = 0; r < rows; ++r) {
      std::uint8_t* row = in.cache.data() + static_cast<std::size_t>(r) * row_bytes;
      const auto variant = r % 8 / 2;
      for (int e = 0; e < 512; ++e) {
        // A different permutation of the 128 values in each row, so that a
        // byte value does not always sit at the same place in its word.
        auto b = static_cast<std::uint8_t>((e % 128 * 77 + 29 * (r / 2)) % 128 + 128 * (r % 2));
        if (variant == 1 && is_nan(b)) b = 0;
        if ((variant == 2 && e % 16 == 0) || (variant == 3 && e % 16 == 15)) b = nan;
        row[e] = b;
      }
      const auto p = static_cast<std::size_t>(r / 8);
      for (int g = 0; g < 4; ++g) set_scale(row, g, p < std::size(special_scales) ? special_scales[p] : draw_scale(rng));
    }
    in.blocks_per_request = in.num_blocks;
    in.block_table.resize(static_cast<std::size_t>(in.num_blocks));
    std::iota(in.block_table.begin(), in.block_table.end(), 0);
    in.workspace_starts = {0};
    in.batch = 1;
    in.total_rows = rows;
    in.fnuz = fnuz;
    EXPECT_TRUE(same_rows(run(in), expected(in)));
  }
}

// n requests of 0 to 22 rows (every 23rd empty): more requests than one
// round of the page lookup takes (8 a round on CPUs, a warp's 32 on CUDA).
std::vector<std::int32_t> many_requests(int n) {
  std::vector<std::int32_t> lengths;
  for (int r = 0; r < n; ++r) lengths.push_back(r * 7 % 23);
  return lengths;
}

const GatherShape gather_shapes[] = {
    {{1}, 64, false, 0},                  // one row
    {{1, 65, 200}, 64, false, 0},         // the golden u1 shape
    {{70, 3, 100, 64}, 64, true, 0},      // u3: starts off block boundaries
    {{1, 17, 40}, 1, false, 0},           // u4: block size 1
    {{9, 0, 30, 0, 5}, 16, true, 0},      // empty requests in the middle
    {{12, 20, 0}, 64, true, 0},           // an empty last request
    {{40, 40, 40}, 64, true, -50},        // T cuts the last requests short (ends clamped)
    {{30, 30}, 64, false, 17},            // the last request runs to T past its length
    {{300}, 64, true, 0},                 // one long request across many pages
    {{5, 6, 7, 8, 9, 10, 11}, 1, true, 0},  // many requests, block size 1
    {{33, 1, 64, 65}, 32, false, 0},
    {many_requests(41), 16, true, 0},     // two rounds of 32 requests (CUDA), six of 8
    {many_requests(70), 64, false, -30},  // three rounds, T cuts the last requests short
    {many_requests(33), 1, true, 0},      // one request past the first round, block size 1
};

TEST_P(Fp8UpconvertTest, RandomGathersMatchTheReference) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(12);
  for (Fp8Format format : formats) {
    SCOPED_TRACE(fp8_format_name(format));
    for (const GatherShape& s : gather_shapes) {
      SCOPED_TRACE(describe(s));
      const auto in = random_gather(rng, s, format == Fp8Format::e4m3fnuz);
      EXPECT_TRUE(same_rows(run(in), expected(in)));
    }
  }
}

// GPUs launch many pages (1024 page tasks or more) differently from few: a
// team of 160 threads per 16 rows of a page (a page of 40 rows is three
// teams, of 16, 16 and 8 rows), and stores that stream past the L2 when the
// output is over 256 MiB (240,000 rows of 1152 bytes). Block size 1 with
// starts off boundaries makes every request's pages partial.
// The 40-row and streaming shapes run on GPUs only: the host backend takes
// a team per page and has no streaming path, and their 108 and 434 MB of
// rows and caches would cost CI minutes under the sanitizers.
TEST_P(Fp8UpconvertTest, ManyPagesMatchTheReference) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(20);
  std::vector<GatherShape> shapes = {GatherShape{{1000, 1, 1999}, 1, true, 0},
                                     GatherShape{many_requests(200), 1, false, 5}};
  if (GetParam() != "host") {
    shapes.push_back(GatherShape{std::vector<std::int32_t>(12, 5000), 40, true, 0});
    shapes.push_back(GatherShape{std::vector<std::int32_t>(8, 30000), 64, true, 0});
  }
  for (const GatherShape& s : shapes) {
    SCOPED_TRACE(describe(s).substr(0, 80));
    const auto in = random_gather(rng, s, false);
    EXPECT_TRUE(same_rows(run(in), expected(in)));
  }
}

// Every request touches two pages: the launch must cover 2 * batch partial
// pages on top of the full ones.
TEST_P(Fp8UpconvertTest, RequestsStraddlingBlockBoundariesAreAllCopied) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(18);
  for (std::int64_t bs : {64, 16}) {
    auto in = random_gather(rng, GatherShape{std::vector<std::int32_t>(12, 2), bs, true, 0}, false);
    for (auto& start : in.seq_starts) start = static_cast<std::int32_t>(bs - 1);  // blocks 0 and 1
    EXPECT_TRUE(same_rows(run(in), expected(in)));
  }
}

// Host-backed: a staging plan of `staged_blocks` blocks (0 is the null
// block); each staged row comes from the resident device cache when it has
// a device row, else from the pinned host pool.
Fp8GatherInputs random_host_backed(std::mt19937_64& rng, const GatherShape& s, std::int64_t cache_block_size, bool fnuz) {
  Fp8GatherInputs in = random_gather(rng, s, fnuz);
  in.cache_block_size = cache_block_size;
  in.num_blocks = 7;
  in.cache = random_rows(rng, in.num_blocks * cache_block_size);
  const std::int64_t host_rows = 500;
  in.host_cache = random_rows(rng, host_rows);
  const std::int64_t staged_blocks = static_cast<std::int64_t>(in.block_table.size()) + 1;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(staged_blocks - 1));
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  in.block_table = ids;
  const std::int64_t staged_rows = staged_blocks * in.block_size;
  std::uniform_int_distribution<std::int32_t> host_row(0, static_cast<std::int32_t>(host_rows - 1));
  std::uniform_int_distribution<std::int32_t> device_row(0, static_cast<std::int32_t>(in.num_blocks * cache_block_size - 1));
  for (std::int64_t n = 0; n < staged_rows; ++n) {
    const bool resident = std::uniform_int_distribution<int>(0, 9)(rng) < 4;
    in.device_row_ids.push_back(resident ? device_row(rng) : -1);
    in.host_row_ids.push_back(host_row(rng));
  }
  return in;
}

TEST_P(Fp8UpconvertTest, HostBackedRowsComeFromTheResidentCacheOrThePinnedPool) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(13);
  for (Fp8Format format : formats) {
    SCOPED_TRACE(fp8_format_name(format));
    for (const GatherShape& s : {GatherShape{{1, 65, 200}, 64, false, 0}, GatherShape{{70, 3, 100}, 64, true, 0},
                                 GatherShape{{9, 0, 31}, 1, true, 0}, GatherShape{{50, 20}, 32, false, -5}}) {
      for (std::int64_t cache_block_size : {s.block_size, std::int64_t{16}}) {
        SCOPED_TRACE(describe(s) + " cache_block_size=" + std::to_string(cache_block_size));
        const auto in = random_host_backed(rng, s, cache_block_size, format == Fp8Format::e4m3fnuz);
        EXPECT_TRUE(same_rows(run(in), expected(in)));
      }
    }
  }
}

// Staged pages far larger than the rows: the host-backed block size is the
// staging plan's, up to 2^31 - 1. GPUs split few pages into teams of 8 rows,
// and must count those teams by the rows a page can hold, not by its block
// size (2^28 / 8 teams for each of 801 pages would overflow an int).
TEST_P(Fp8UpconvertTest, HugeStagedPagesAreAllCopied) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(19);
  Fp8GatherInputs in = random_host_backed(rng, GatherShape{many_requests(400), 1, false, 0}, 16, false);
  in.block_size = std::int64_t{1} << 28;
  in.blocks_per_request = 1;
  in.block_table.assign(static_cast<std::size_t>(in.batch), 0);  // every request's page is staged block 0
  // Staged rows 0 .. 22 (a request's tokens), half resident, half in the pool.
  in.host_row_ids.resize(23);
  in.device_row_ids.resize(23);
  for (std::size_t n = 0; n < 23; ++n) {
    in.host_row_ids[n] = static_cast<std::int32_t>(n * 13 % 500);
    in.device_row_ids[n] = n % 2 ? static_cast<std::int32_t>(n * 3 % (in.num_blocks * 16)) : -1;
  }
  EXPECT_TRUE(same_rows(run(in), expected(in)));
}

// A row without a valid source is not written; the others are.
TEST_P(Fp8UpconvertTest, RowsWithoutAValidSourceAreNotWritten) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(14);
  auto in = random_gather(rng, GatherShape{{20, 20, 20, 20, 20}, 8, true, 0}, false);
  in.block_table[0 * in.blocks_per_request + static_cast<std::size_t>(in.seq_starts[0] / 8)] = -1;
  in.block_table[1 * in.blocks_per_request + static_cast<std::size_t>(in.seq_starts[1] / 8 + 1)] =
      static_cast<std::int32_t>(in.num_blocks);  // past the cache
  in.seq_starts[2] = static_cast<std::int32_t>((in.blocks_per_request - 1) * 8);  // runs past the table
  in.seq_starts[3] = -5;
  const auto want = expected(in);
  EXPECT_TRUE(same_rows(run(in), want));
  EXPECT_GE(std::count(want.begin(), want.end(), poison_bf16), 41 * 576);  // the reference left those rows alone

  auto hb = random_host_backed(rng, GatherShape{{30, 30}, 16, false, 0}, 16, true);
  hb.device_row_ids[static_cast<std::size_t>(hb.block_table[0] * 16 + 3)] = 7 * 16;  // past the device cache
  hb.device_row_ids[static_cast<std::size_t>(hb.block_table[0] * 16 + 4)] = -1;
  hb.host_row_ids[static_cast<std::size_t>(hb.block_table[0] * 16 + 4)] = 500;  // past the host pool
  hb.device_row_ids[static_cast<std::size_t>(hb.block_table[0] * 16 + 5)] = -1;
  hb.host_row_ids[static_cast<std::size_t>(hb.block_table[0] * 16 + 5)] = -1;
  hb.block_table[1] = static_cast<std::int32_t>(hb.host_row_ids.size() / 16);  // past the staged rows
  EXPECT_TRUE(same_rows(run(hb), expected(hb)));
}

// Blocks further apart than block_size rows (interleaved layers) keep the
// 16-byte path; a misaligned cache or output takes the byte path.
TEST_P(Fp8UpconvertTest, StridedAndMisalignedLayoutsMatchTheReference) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(15);
  const auto in = random_gather(rng, GatherShape{{10, 70, 33}, 16, true, 0}, false);
  const auto want = expected(in);
  const std::int64_t nb = in.num_blocks, bs = in.cache_block_size;
  DeviceTensor bt = device_tensor(*device, *stream, in.block_table, {in.batch, in.blocks_per_request});
  DeviceTensor ws = device_tensor(*device, *stream, in.workspace_starts, {in.batch});
  DeviceTensor ss = device_tensor(*device, *stream, in.seq_starts, {in.batch});
  Fp8GatherParams params;
  params.seq_starts = ss.tensor;

  // Caches: blocks of bs + 3 rows (interleaved), and the packed cache one byte off alignment.
  std::vector<std::uint8_t> wide(static_cast<std::size_t>(nb * (bs + 3)) * row_bytes, 0xEE);
  for (std::int64_t b = 0; b < nb; ++b) {
    std::memcpy(wide.data() + static_cast<std::size_t>(b * (bs + 3)) * row_bytes,
                in.cache.data() + static_cast<std::size_t>(b * bs) * row_bytes, static_cast<std::size_t>(bs) * row_bytes);
  }
  DeviceTensor wide_cache = device_tensor(*device, *stream, wide, {nb, bs + 3, 656});
  std::vector<std::uint8_t> shifted(in.cache.size() + 1, 0);
  std::memcpy(shifted.data() + 1, in.cache.data(), in.cache.size());
  DeviceTensor shifted_cache = device_tensor(*device, *stream, shifted, {static_cast<std::int64_t>(shifted.size())});
  const Tensor caches[] = {
      wide_cache.tensor.narrow(1, 0, bs),
      Tensor(shifted_cache.buffer.as<std::uint8_t>() + 1, DType::u8, {nb, bs, 656}, MemoryKind::device, device.get())};

  for (const Tensor& cache : caches) {
    for (int layout = 0; layout < 3; ++layout) {
      SCOPED_TRACE("cache block stride " + std::to_string(cache.stride(0)) + ", dst layout " + std::to_string(layout));
      // dst: packed; rows 577 apart; packed but one element off alignment.
      const std::int64_t T = in.total_rows, width = layout == 1 ? 577 : 576, offset = layout == 2 ? 1 : 0;
      Buffer storage = upload(*device, *stream, poisoned_rows(T + 1));
      const Tensor base(storage.as<std::uint16_t>() + offset, DType::bf16, {T, width}, MemoryKind::device, device.get());
      const Tensor dst = base.narrow(1, 0, 576);
      gather_upconvert_fp8(*stream, cache, dst, bt.tensor, ws.tensor, in.batch, params);
      EXPECT_TRUE(same_rows(download_rows<std::uint16_t>(*device, *stream, dst), want));
      if (layout == 1) {  // the column past each row is untouched
        const auto all = download_rows<std::uint16_t>(*device, *stream, base);
        for (std::int64_t t = 0; t < T; ++t) ASSERT_EQ(all[static_cast<std::size_t>(t * 577 + 576)], poison_bf16);
      }
    }
  }
}

TEST_P(Fp8UpconvertTest, NoRowsOrNoRequestsWriteNothing) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(16);
  auto in = random_gather(rng, GatherShape{{4, 4}, 4, false, 0}, false);
  OnDevice d = to_device(in);
  gather_upconvert_fp8(*stream, d.cache.tensor, d.dst, d.block_table.tensor, d.workspace_starts.tensor, 0, d.params);
  EXPECT_EQ(download_rows<std::uint16_t>(*device, *stream, d.dst), poisoned_rows(8));
  gather_upconvert_fp8(*stream, d.cache.tensor, d.dst.rows(0, 0), d.block_table.tensor, d.workspace_starts.tensor, 2,
                       d.params);
  EXPECT_EQ(download_rows<std::uint16_t>(*device, *stream, d.dst), poisoned_rows(8));
}

// ---- rejections ----

struct Call {
  Tensor cache, dst, block_table, workspace_starts;
  std::int64_t batch;
  Fp8GatherParams params;
};

TEST_P(Fp8UpconvertTest, EveryRejectionNamesTheArgumentAndWritesNothing) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(17);
  const auto in = random_host_backed(rng, GatherShape{{5, 9}, 8, true, 0}, 8, false);
  OnDevice d = to_device(in);
  const Call plain{d.cache.tensor, d.dst, d.block_table.tensor, d.workspace_starts.tensor, in.batch,
                   Fp8GatherParams{Fp8Format::e4m3fn, d.seq_starts.tensor, {}, {}, {}, 0, KvFormat::fp8_ds_mla}};
  const Call host_backed{d.cache.tensor, d.dst, d.block_table.tensor, d.workspace_starts.tensor, in.batch, d.params};

  auto other = open_device(GetParam());
  auto other_stream = other->create_stream();
  DeviceTensor foreign = device_tensor(*other, *other_stream, std::vector<std::uint8_t>(1 << 16, 0), {1 << 16});
  const auto foreign_like = [&](const Tensor& t) {
    std::vector<std::int64_t> shape;
    for (int i = 0; i < t.rank(); ++i) shape.push_back(t.dim(i));
    return Tensor(foreign.buffer.data(), t.dtype(), shape, MemoryKind::device, other.get());
  };
  const auto retyped = [](const Tensor& t, DType dtype, std::vector<std::int64_t> shape) {
    return Tensor(t.data(), dtype, shape, t.kind(), t.device());
  };
  DeviceTensor device_pool = device_tensor(*device, *stream, in.host_cache,
                                           {static_cast<std::int64_t>(in.host_cache.size() / row_bytes), 656});
  const std::int64_t T = in.total_rows;

  struct Rejection {
    const char* name;
    bool host;  // spoils the host-backed call
    std::function<void(Call&)> spoil;
    const char* message;
  };
  const std::vector<Rejection> rejections = {
      {"cache dtype", false, [&](Call& c) { c.cache = retyped(c.cache, DType::i16, {in.num_blocks, 8, 328}); }, "src_cache has dtype I16, expected U8"},
      {"cache rank", false, [&](Call& c) { c.cache = retyped(c.cache, DType::u8, {in.num_blocks * 8, 656}); }, "src_cache has shape"},
      {"cache row width", false, [&](Call& c) { c.cache = retyped(c.cache, DType::u8, {in.num_blocks, 16, 328}); }, "dimension 2 must be 656"},
      {"cache block size 0", false, [&](Call& c) { c.cache = c.cache.narrow(1, 0, 0); }, "src_cache has block size 0"},
      {"dst dtype", false, [&](Call& c) { c.dst = retyped(c.dst, DType::i16, {T, 576}); }, "dst has dtype I16, expected BF16"},
      {"dst width", false, [&](Call& c) { c.dst = c.dst.narrow(1, 0, 512); }, "dst has shape [14, 512] but dimension 1 must be 576"},
      {"dst rank", false, [&](Call& c) { c.dst = retyped(c.dst, DType::bf16, {T * 576}); }, "dst has shape"},
      {"negative batch", false, [&](Call& c) { c.batch = -1; }, "batch_size must be in [0, 2^31), got -1"},
      {"block_table short", false, [&](Call& c) { c.block_table = c.block_table.rows(0, 1); }, "block_table has shape [1, "},
      {"block_table dtype", false, [&](Call& c) { c.block_table = retyped(c.block_table, DType::f32, {c.block_table.dim(0), c.block_table.dim(1)}); }, "block_table has dtype F32"},
      {"workspace_starts short", false, [&](Call& c) { c.workspace_starts = c.workspace_starts.rows(0, 1); }, "workspace_starts has shape [1] but dimension 0 must be >= 2"},
      {"workspace_starts dtype", false, [&](Call& c) { c.workspace_starts = retyped(c.workspace_starts, DType::i64, {1}); }, "workspace_starts has dtype I64"},
      {"seq_starts short", false, [&](Call& c) { c.params.seq_starts = c.params.seq_starts.rows(0, 1); }, "seq_starts has shape [1]"},
      {"block size differs", false, [&](Call& c) { c.params.block_size = 4; }, "block_size 4 differs from src_cache's block size 8"},
      {"negative block size", true, [&](Call& c) { c.params.block_size = -8; }, "block_size must be in [1, 2^31), got -8"},
      {"host pool in device memory", true, [&](Call& c) { c.params.host_cache = device_pool.tensor; }, "host_cache is in device memory, expected pinned_host"},
      {"host pool row width", true, [&](Call& c) { c.params.host_cache = retyped(c.params.host_cache, DType::u8, {2, 328}); }, "host_cache has shape [2, 328] but dimension 1 must be 656"},
      {"host ids missing", true, [&](Call& c) { c.params.host_row_ids = Tensor(); }, "host_row_ids is missing"},
      {"device ids missing", true, [&](Call& c) { c.params.device_row_ids = Tensor(); }, "device_row_ids is missing"},
      {"id counts differ", true, [&](Call& c) { c.params.device_row_ids = c.params.device_row_ids.rows(0, 3); }, "but device_row_ids has 3"},
      {"ids dtype", true, [&](Call& c) { c.params.host_row_ids = retyped(c.params.host_row_ids, DType::i16, {1, 2}); }, "host_row_ids has dtype I16"},
      {"cache on another device", false, [&](Call& c) { c.cache = foreign_like(c.cache); }, "src_cache lives on another device"},
      {"dst on another device", false, [&](Call& c) { c.dst = foreign_like(c.dst); }, "dst lives on another device"},
      {"table on another device", false, [&](Call& c) { c.block_table = foreign_like(c.block_table); }, "block_table lives on another device"},
      {"starts on another device", false, [&](Call& c) { c.workspace_starts = foreign_like(c.workspace_starts); }, "workspace_starts lives on another device"},
      {"ids on another device", true, [&](Call& c) { c.params.device_row_ids = foreign_like(c.params.device_row_ids); }, "device_row_ids lives on another device"},
  };
  for (const Rejection& r : rejections) {
    SCOPED_TRACE(r.name);
    Call c = r.host ? host_backed : plain;
    r.spoil(c);
    try {
      gather_upconvert_fp8(*stream, c.cache, c.dst, c.block_table, c.workspace_starts, c.batch, c.params);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(r.message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("gather_upconvert_fp8"), std::string::npos) << e.what();
    }
    EXPECT_EQ(download_rows<std::uint16_t>(*device, *stream, d.dst), poisoned_rows(T));
  }
  // The unspoilt calls work, so each rejection above was the spoilt argument's.
  for (const Call* c : {&plain, &host_backed}) {
    gather_upconvert_fp8(*stream, c->cache, c->dst, c->block_table, c->workspace_starts, c->batch, c->params);
  }
  EXPECT_TRUE(same_rows(download_rows<std::uint16_t>(*device, *stream, d.dst), expected(in)));
}

// ---- the validating entry points' deep check ----

TEST(Fp8GatherValues, RejectsStartsAndBlocksOutsideTheirRanges) {
  const std::vector<std::int32_t> table{0, 3, 2, 1};  // [2 requests, 2 blocks]
  const std::vector<std::int32_t> ws{0, 5};
  const std::vector<std::int32_t> ss{0, 2};
  check_fp8_gather_values(table.data(), 2, ws.data(), ss.data(), 2, 10, 4, 4);
  const auto message = [&](const std::vector<std::int32_t>& t, const std::vector<std::int32_t>& w,
                           const std::vector<std::int32_t>& s, std::int64_t total, std::int64_t blocks) {
    try {
      check_fp8_gather_values(t.data(), 2, w.data(), s.data(), 2, total, 4, blocks);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(table, {3, 2}, ss, 10, 4).find("workspace_starts[1] = 2 is not in [3, 10]"), std::string::npos);
  EXPECT_NE(message(table, {0, 13}, ss, 10, 4).find("workspace_starts[1] = 13"), std::string::npos);
  EXPECT_NE(message(table, ws, {-1, 0}, 10, 4).find("seq_starts[0] = -1 is negative"), std::string::npos);
  EXPECT_NE(message(table, ws, {4, 2}, 10, 4).find("request 0 reads tokens [4, 9) but its block table holds 2 blocks of 4"),
            std::string::npos);
  EXPECT_NE(message(table, ws, ss, 10, 3).find("block_table[0, 1] = 3 is outside the cache's 3 blocks"),
            std::string::npos);
  EXPECT_EQ(message(table, {0, 8}, ss, 8, 4), "accepted");  // an empty last request reads nothing
}

// ---- the reference itself, against the formats' defining values ----

TEST(Fp8Reference, TablesHoldTheFormatsDefiningValues) {
  const auto fn = reference::fp8_table(false), fnuz = reference::fp8_table(true);
  EXPECT_EQ(fn[0x7E], 448.0f);
  EXPECT_EQ(fn[0x38], 1.0f);
  EXPECT_EQ(fn[0x08], std::ldexp(1.0f, -6));
  EXPECT_EQ(fn[0x01], std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::signbit(fn[0x80]) && fn[0x80] == 0.0f);
  EXPECT_EQ(std::count_if(fn.begin(), fn.end(), [](float v) { return std::isnan(v); }), 2);
  EXPECT_TRUE(std::isnan(fn[0x7F]) && std::isnan(fn[0xFF]));
  EXPECT_EQ(fnuz[0x7F], 240.0f);
  EXPECT_EQ(fnuz[0x40], 1.0f);
  EXPECT_EQ(fnuz[0x01], std::ldexp(1.0f, -10));
  EXPECT_EQ(fnuz[0xFF], -240.0f);
  EXPECT_EQ(std::count_if(fnuz.begin(), fnuz.end(), [](float v) { return std::isnan(v); }), 1);
  EXPECT_TRUE(std::isnan(fnuz[0x80]));
}

TEST(Fp8Reference, Bf16RoundsToNearestEven) {
  EXPECT_EQ(reference::bf16_nearest_even(1.0f), 0x3F80);
  EXPECT_EQ(reference::bf16_nearest_even(1.0f + 0x1p-8f), 0x3F80);          // tie, down to even
  EXPECT_EQ(reference::bf16_nearest_even(1.0f + 3 * 0x1p-8f), 0x3F82);      // tie, up to even
  EXPECT_EQ(reference::bf16_nearest_even(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_EQ(reference::bf16_nearest_even(-0.0f), 0x8000);
  EXPECT_EQ(reference::bf16_nearest_even(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the largest
  EXPECT_EQ(reference::bf16_nearest_even(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(reference::bf16_nearest_even(-std::numeric_limits<float>::quiet_NaN()), 0x7FFF);
}

}  // namespace
}  // namespace sparse_mla::testing
