// The FP8 gather-upconvert of DeepSeek V4's model1_fp8 pages against the
// scalar model (tools/validation/reference/fp8_reference.hpp), both ways of
// naming tokens: the position-range gather of vLLM's V4 prefill
// (gather_upconvert_fp8_range) and the workspace gather. Fresh random data:
// pages of 64 and of 2 tokens, last pages partly filled, every scale byte
// (the writers use 105 to 247) under every fp8 byte, padding requests,
// -1 block-table entries, requests whose gather does not fit their slice;
// the cache shapes engines hold (FlashMLA's, vLLM's and SGLang's views of
// padded pages), misaligned caches, strided outputs; every rejection; and
// the model itself against the format's defining values and the golden
// files vLLM's own kernels wrote.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend_test.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/fp8_upconvert.hpp"
#include "test_util.hpp"
#include "validation/reference/fp8_reference.hpp"
#include "validation/safetensors.hpp"

namespace sparse_mla::testing {
namespace {

using reference::Fp8GatherInputs;
constexpr std::uint16_t poison_bf16 = 0xA5A5;
constexpr std::int64_t width = model1_row_width;
const Fp8Format formats[] = {Fp8Format::e4m3fn, Fp8Format::e4m3fnuz};

// A scale byte: mostly one the writers produce (amax clamped to 1e-4, so
// 2^-22 and up, to bf16's largest over 448), sometimes any byte at all.
std::uint8_t draw_scale(std::mt19937_64& rng) {
  if (std::uniform_int_distribution<int>(0, 9)(rng) == 0) return static_cast<std::uint8_t>(rng());
  return static_cast<std::uint8_t>(std::uniform_int_distribution<int>(105, 247)(rng));
}

// num_blocks pages of `tokens` tokens, page_stride bytes apart: random
// bytes everywhere (fp8 NaN codes, pad bytes and page padding included),
// then a drawn scale byte for every tile.
std::vector<std::uint8_t> random_pages(std::mt19937_64& rng, std::int64_t num_blocks, std::int64_t tokens,
                                       std::int64_t page_stride) {
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(num_blocks * page_stride));
  for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
  for (std::int64_t p = 0; p < num_blocks; ++p) {
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::uint8_t* scales = bytes.data() + p * page_stride + model1_token_data_bytes * tokens + 8 * t;
      for (int j = 0; j < 7; ++j) scales[j] = draw_scale(rng);
    }
  }
  return bytes;
}

// Each request reads its pages from a shuffled pool; the table entries it
// never reads hold valid ids of other pages. `reads` tokens of request r
// start at `first[r]`.
void random_table(std::mt19937_64& rng, Fp8GatherInputs& in, const std::vector<std::int64_t>& reads_end) {
  std::int64_t blocks = 1;
  for (std::int64_t end : reads_end) blocks = std::max(blocks, (end + in.block_size - 1) / in.block_size);
  in.blocks_per_request = blocks + 1;
  in.num_blocks = in.batch * in.blocks_per_request + 3;
  std::vector<std::int32_t> pool(static_cast<std::size_t>(in.num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  in.block_table.assign(pool.begin(), pool.begin() + in.batch * in.blocks_per_request);
  in.page_stride = model1_page_bytes(in.block_size);
  in.cache = random_pages(rng, in.num_blocks, in.block_size, in.page_stride);
}

struct RangeShape {
  std::vector<std::int32_t> seq_lens;
  std::vector<std::int32_t> gather_lens;  // empty: every token
  std::int64_t block_size;
  std::int64_t offset;
  std::int64_t extra_rows;  // slice rows past offset + the largest gather (negative: too few)
};

std::string describe(const RangeShape& s) {
  std::string out = "seq_lens=[";
  for (auto l : s.seq_lens) out += std::to_string(l) + ",";
  out += "] gather_lens=[";
  for (auto l : s.gather_lens) out += std::to_string(l) + ",";
  return out.substr(0, 200) + "] block_size=" + std::to_string(s.block_size) + " offset=" + std::to_string(s.offset) +
         " extra_rows=" + std::to_string(s.extra_rows);
}

Fp8GatherInputs random_range(std::mt19937_64& rng, const RangeShape& s, bool fnuz) {
  Fp8GatherInputs in;
  in.model1 = true;
  in.fnuz = fnuz;
  in.block_size = in.cache_block_size = s.block_size;
  in.batch = static_cast<std::int64_t>(s.seq_lens.size());
  in.seq_lens = s.seq_lens;
  in.gather_lens = s.gather_lens;
  in.offset = s.offset;
  std::int64_t largest = 0;
  std::vector<std::int64_t> ends;
  for (std::size_t r = 0; r < s.seq_lens.size(); ++r) {
    largest = std::max<std::int64_t>(largest, s.gather_lens.empty() ? s.seq_lens[r] : s.gather_lens[r]);
    ends.push_back(s.seq_lens[r]);
  }
  in.slice_rows = std::max<std::int64_t>(s.offset, s.offset + largest + s.extra_rows);
  random_table(rng, in, ends);
  return in;
}

struct WorkspaceShape {
  std::vector<std::int32_t> lengths;
  std::int64_t block_size;
  bool seq_starts;
};

Fp8GatherInputs random_workspace(std::mt19937_64& rng, const WorkspaceShape& s, bool fnuz) {
  Fp8GatherInputs in;
  in.model1 = true;
  in.fnuz = fnuz;
  in.block_size = in.cache_block_size = s.block_size;
  in.batch = static_cast<std::int64_t>(s.lengths.size());
  std::int64_t start = 0;
  std::vector<std::int64_t> ends;
  for (std::int32_t length : s.lengths) {
    in.workspace_starts.push_back(static_cast<std::int32_t>(start));
    start += length;
    const std::int32_t first = s.seq_starts ? std::uniform_int_distribution<std::int32_t>(0, 150)(rng) : 0;
    if (s.seq_starts) in.seq_starts.push_back(first);
    ends.push_back(first + length);
  }
  in.total_rows = start;
  random_table(rng, in, ends);
  return in;
}

// Compares whole outputs; on a mismatch names the first few positions.
::testing::AssertionResult same_rows(const std::vector<std::uint16_t>& got, const std::vector<std::uint16_t>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes " << got.size() << " and " << want.size();
  int shown = 0;
  ::testing::AssertionResult failure = ::testing::AssertionFailure();
  for (std::size_t i = 0; i < got.size() && shown < 5; ++i) {
    if (got[i] != want[i]) {
      failure << "row " << i / width << " element " << i % width << ": got 0x" << std::hex << got[i] << ", expected 0x"
              << want[i] << std::dec << "\n";
      ++shown;
    }
  }
  return shown ? failure : ::testing::AssertionSuccess();
}

std::vector<std::uint16_t> poisoned(std::int64_t rows) {
  return std::vector<std::uint16_t>(static_cast<std::size_t>(rows * width), poison_bf16);
}

// The shapes a model1_fp8 cache may be given in (fp8_upconvert.hpp).
enum class CacheShape { tokens, heads, page_bytes, payload_bytes };

class Model1GatherTest : public BackendTest {
 protected:
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped()) return;
    stream = device->create_stream();
  }

  // The cache's bytes on the device (`shift` bytes past an aligned
  // allocation) and a view of them of `shape`, pages `stride` bytes apart
  // (the cache's own page stride when 0).
  struct Cache {
    Buffer buffer;
    Tensor view;
  };
  Cache cache_on_device(const Fp8GatherInputs& in, CacheShape shape = CacheShape::tokens, std::int64_t stride = 0,
                        std::int64_t shift = 0) {
    if (stride == 0) stride = in.page_stride;
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(shift + in.num_blocks * stride), 0x5A);
    for (std::int64_t p = 0; p < in.num_blocks; ++p) {
      std::memcpy(bytes.data() + shift + p * stride, in.cache.data() + p * in.page_stride,
                  static_cast<std::size_t>(in.page_stride));
    }
    Cache c;
    c.buffer = upload(*device, *stream, bytes);
    auto* base = c.buffer.as<std::uint8_t>() + shift;
    const std::int64_t B = in.block_size;
    switch (shape) {
      case CacheShape::tokens:
        c.view = Tensor(base, DType::u8, {in.num_blocks, B, 584}, {stride, 584, 1}, MemoryKind::device, device.get());
        break;
      case CacheShape::heads:
        c.view = Tensor(base, DType::u8, {in.num_blocks, B, 1, 584}, {stride, 584, 584, 1}, MemoryKind::device,
                        device.get());
        break;
      case CacheShape::page_bytes:
        c.view = Tensor(base, DType::u8, {in.num_blocks, in.page_stride}, {stride, 1}, MemoryKind::device, device.get());
        break;
      case CacheShape::payload_bytes:
        c.view = Tensor(base, DType::u8, {in.num_blocks, 584 * B}, {stride, 1}, MemoryKind::device, device.get());
        break;
    }
    return c;
  }

  static Fp8GatherParams params_of(const Fp8GatherInputs& in, CacheShape shape = CacheShape::tokens) {
    Fp8GatherParams p;
    p.kv_format = KvFormat::model1_fp8;
    p.format = in.fnuz ? Fp8Format::e4m3fnuz : Fp8Format::e4m3fn;
    if (shape == CacheShape::page_bytes || shape == CacheShape::payload_bytes) p.block_size = in.block_size;
    return p;
  }

  // The range gather's other inputs on the device.
  struct RangeArgs {
    DeviceTensor seq_lens, gather_lens, block_table;
  };
  RangeArgs range_args(const Fp8GatherInputs& in) {
    RangeArgs a{device_tensor(*device, *stream, in.seq_lens, {in.batch}), {},
                device_tensor(*device, *stream, in.block_table, {in.batch, in.blocks_per_request})};
    if (!in.gather_lens.empty()) a.gather_lens = device_tensor(*device, *stream, in.gather_lens, {in.batch});
    return a;
  }

  // The range gather into a poisoned out [batch, slice_rows, 512] (of
  // [batch, slice_rows + spare, 512] when `spare` rows follow each slice,
  // which must stay poisoned), `shift` elements past alignment.
  std::vector<std::uint16_t> run_range(const Fp8GatherInputs& in, const Cache& cache, const Fp8GatherParams& params,
                                       std::int64_t spare = 0, std::int64_t shift = 0) {
    const RangeArgs a = range_args(in);
    const std::int64_t rows = in.slice_rows + spare;
    Buffer storage = upload(*device, *stream, poisoned(in.batch * rows + 1));
    const Tensor all(storage.as<std::uint16_t>() + shift, DType::bf16, {in.batch, rows, width}, MemoryKind::device,
                     device.get());
    const Tensor out = all.narrow(1, 0, in.slice_rows);
    gather_upconvert_fp8_range(*stream, cache.view, out, a.seq_lens.tensor, a.gather_lens.tensor, a.block_table.tensor,
                               in.offset, params);
    const auto whole = download_rows<std::uint16_t>(*device, *stream, all);
    for (std::int64_t r = 0; r < in.batch; ++r) {
      for (std::int64_t i = in.slice_rows; i < rows; ++i) {
        for (std::int64_t e = 0; e < width; ++e) {
          EXPECT_EQ(whole[static_cast<std::size_t>((r * rows + i) * width + e)], poison_bf16) << "past a slice";
        }
      }
    }
    return download_rows<std::uint16_t>(*device, *stream, out);
  }
  std::vector<std::uint16_t> run_range(const Fp8GatherInputs& in) { return run_range(in, cache_on_device(in), params_of(in)); }

  static std::vector<std::uint16_t> expected_range(const Fp8GatherInputs& in) {
    auto out = poisoned(in.batch * in.slice_rows);
    reference::gather_range(in, out);
    return out;
  }

  std::vector<std::uint16_t> run_workspace(const Fp8GatherInputs& in) {
    const Cache cache = cache_on_device(in);
    DeviceTensor table = device_tensor(*device, *stream, in.block_table, {in.batch, in.blocks_per_request});
    DeviceTensor starts = device_tensor(*device, *stream, in.workspace_starts, {in.batch});
    DeviceTensor seq_starts;
    Fp8GatherParams params = params_of(in);
    if (!in.seq_starts.empty()) {
      seq_starts = device_tensor(*device, *stream, in.seq_starts, {in.batch});
      params.seq_starts = seq_starts.tensor;
    }
    Buffer storage = upload(*device, *stream, poisoned(in.total_rows));
    const Tensor dst = Tensor::of(storage, DType::bf16, {in.total_rows, width});
    gather_upconvert_fp8(*stream, cache.view, dst, table.tensor, starts.tensor, in.batch, params);
    return download_rows<std::uint16_t>(*device, *stream, dst);
  }

  static std::vector<std::uint16_t> expected_workspace(const Fp8GatherInputs& in) {
    auto dst = poisoned(in.total_rows);
    reference::gather_upconvert(in, dst);
    return dst;
  }

  std::unique_ptr<Stream> stream;
};
SPARSE_MLA_INSTANTIATE_BACKENDS(Model1GatherTest);

// Every scale byte (0: the subnormal 2^-127, 255: infinity) with every fp8
// byte in every tile: token t's tiles j have scale byte (t / 4 + 11 j) % 256
// and fp8 bytes v + 64 ((t + j) % 4), v < 64, so the four tokens sharing a
// scale hold all 256 bytes under it in each tile. Units without a NaN byte
// take the kernels' four-at-a-time decode, units with one a byte at a
// time: both here.
TEST_P(Model1GatherTest, EveryScaleByteUnderEveryFp8Byte) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(31);
  for (Fp8Format format : formats) {
    SCOPED_TRACE(fp8_format_name(format));
    Fp8GatherInputs in = random_range(rng, RangeShape{{1024}, {1024}, 64, 0, 0}, format == Fp8Format::e4m3fnuz);
    std::vector<std::int32_t> order(in.block_table.begin(), in.block_table.begin() + 16);
    for (std::int64_t t = 0; t < 1024; ++t) {
      std::uint8_t* page = in.cache.data() + order[static_cast<std::size_t>(t / 64)] * in.page_stride;
      std::uint8_t* data = page + 576 * (t % 64);
      std::uint8_t* scales = page + 576 * 64 + 8 * (t % 64);
      for (int j = 0; j < 7; ++j) {
        scales[j] = static_cast<std::uint8_t>((t / 4 + 11 * j) % 256);
        for (int v = 0; v < 64; ++v) data[64 * j + v] = static_cast<std::uint8_t>(v + 64 * ((t + j) % 4));
      }
    }
    EXPECT_TRUE(same_rows(run_range(in), expected_range(in)));
  }
}

// n requests of r * 7 % 23 tokens (every 23rd empty): more than one round
// of the page lookup (8 a round on CPUs, 32 on GPUs).
std::vector<std::int32_t> many_lengths(int n) {
  std::vector<std::int32_t> lengths;
  for (int r = 0; r < n; ++r) lengths.push_back(r * 7 % 23);
  return lengths;
}

// Gather lengths of 0 to each request's length.
std::vector<std::int32_t> some_of(const std::vector<std::int32_t>& lengths) {
  std::vector<std::int32_t> out;
  for (std::size_t r = 0; r < lengths.size(); ++r) out.push_back(static_cast<std::int32_t>(lengths[r] * (r % 4) / 3));
  return out;
}

const RangeShape range_shapes[] = {
    {{1, 65, 200}, {1, 30, 200}, 64, 3, 0},     // the golden v4a shape
    {{3, 17, 40}, {3, 16, 1}, 2, 0, 0},          // v4b: pages of 2 tokens
    {{100, 130, 64}, {100, 130, 64}, 64, 0, 5},  // last pages partly filled; rows after each gather stay poisoned
    {{5, 70}, {}, 64, 2, 3},                     // no gather_lens: every token
    {{0, 12, 0}, {0, 12, 0}, 64, 1, 0},          // padding requests
    {{0, 12, 0}, {0, 5, 0}, 2, 0, 2},
    {{31, 9, 64}, {31, 0, 64}, 2, 4, 0},         // an empty gather in the middle
    {{50, 20}, {50, 20}, 64, 10, -25},           // slices too short: their first rows only
    {{50, 20}, {50, 20}, 2, 7, -33},
    {{40, 41}, {40, 41}, 64, 9, -50},            // offset at the slice's end: nothing
    {many_lengths(70), some_of(many_lengths(70)), 2, 1, 0},
    {many_lengths(41), {}, 64, 0, 0},
    {{300}, {257}, 2, 0, 0},                     // one long request, pages of 2
    {{129, 1, 2, 63}, {65, 1, 1, 63}, 64, 5, 1},
};

TEST_P(Model1GatherTest, RandomRangeGathersMatchTheModel) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(32);
  for (Fp8Format format : formats) {
    SCOPED_TRACE(fp8_format_name(format));
    for (const RangeShape& s : range_shapes) {
      SCOPED_TRACE(describe(s));
      const auto in = random_range(rng, s, format == Fp8Format::e4m3fnuz);
      EXPECT_TRUE(same_rows(run_range(in), expected_range(in)));
    }
  }
}

// Values the checked call does not read on the host: a gather longer than
// its request, a negative gather, and -1 (padding) or out-of-range ids in
// the pages a request reads. Their rows are left unwritten.
TEST_P(Model1GatherTest, BadValuesOnTheDeviceLeaveTheirRowsUnwritten) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(33);
  for (const std::int64_t bs : {64, 2}) {
    SCOPED_TRACE("block_size " + std::to_string(bs));
    Fp8GatherInputs in = random_range(rng, RangeShape{{90, 10, 70, 130}, {90, 10, 70, 130}, bs, 0, 0}, false);
    in.gather_lens[1] = 11;  // more than its 10 tokens
    in.gather_lens[2] = -3;
    const auto bpr = static_cast<std::size_t>(in.blocks_per_request);
    in.block_table[0 * bpr + 1] = -1;
    in.block_table[3 * bpr + 0] = static_cast<std::int32_t>(in.num_blocks);
    in.block_table[3 * bpr + 2] = -1;
    const auto want = expected_range(in);
    EXPECT_NE(want, poisoned(in.batch * in.slice_rows));
    EXPECT_TRUE(same_rows(run_range(in), want));
  }
}

TEST_P(Model1GatherTest, RandomWorkspaceGathersMatchTheModel) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(34);
  const WorkspaceShape shapes[] = {{{1, 65, 200}, 64, false}, {{70, 3, 100, 64}, 64, true}, {{1, 17, 40}, 2, false},
                                   {{9, 0, 30, 0, 5}, 2, true}, {many_lengths(41), 64, true}};
  for (Fp8Format format : formats) {
    SCOPED_TRACE(fp8_format_name(format));
    for (const WorkspaceShape& s : shapes) {
      const auto in = random_workspace(rng, s, format == Fp8Format::e4m3fnuz);
      EXPECT_TRUE(same_rows(run_workspace(in), expected_workspace(in)));
    }
  }
}

// The cache as engines hold it: [blocks, B, 584] (vLLM), [blocks, B, 1, 584]
// (FlashMLA, SGLang), whole pages [blocks, page bytes] (the golden files),
// the payload [blocks, 584 B] sliced from padded pages; pages further apart
// than the padded stride; a cache one byte off alignment and pages an odd 8
// bytes further apart (the kernels' unaligned path); outputs one element
// off alignment and slices further apart.
TEST_P(Model1GatherTest, EveryCacheShapeAndLayoutMatchesTheModel) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(35);
  for (const std::int64_t bs : {64, 2}) {
    const auto in = random_range(rng, RangeShape{{70, 33, 129}, {70, 20, 100}, bs, 2, 0}, false);
    const auto want = expected_range(in);
    const std::int64_t padded = in.page_stride;
    struct Layout {
      CacheShape shape;
      std::int64_t stride, cache_shift, out_spare, out_shift;
      const char* name;
    };
    const Layout layouts[] = {
        {CacheShape::tokens, padded, 0, 0, 0, "[blocks, B, 584]"},
        {CacheShape::heads, padded, 0, 0, 0, "[blocks, B, 1, 584]"},
        {CacheShape::page_bytes, padded, 0, 0, 0, "[blocks, page bytes]"},
        {CacheShape::payload_bytes, padded, 0, 0, 0, "[blocks, 584 B]"},
        {CacheShape::tokens, padded + 3 * 576, 0, 0, 0, "pages further apart"},
        {CacheShape::tokens, padded, 1, 0, 0, "cache one byte off"},
        {CacheShape::heads, padded + 8, 0, 0, 0, "pages 8 bytes further apart"},
        {CacheShape::tokens, padded, 0, 3, 0, "slices 3 rows further apart"},
        {CacheShape::page_bytes, padded, 0, 1, 1, "out one element off"},
    };
    for (const Layout& l : layouts) {
      SCOPED_TRACE(std::string(l.name) + ", block_size " + std::to_string(bs));
      const Cache cache = cache_on_device(in, l.shape, l.stride, l.cache_shift);
      EXPECT_TRUE(same_rows(run_range(in, cache, params_of(in, l.shape), l.out_spare, l.out_shift), want));
    }
  }
}

// GPUs launch many pages (1024 page tasks or more) in teams of 16 rows, and
// store outputs over 256 MiB streaming (262,144 rows of 1024 bytes). The
// pages of 64 in many pages and the streaming shape run on GPUs only: the
// host backend takes a team per page whatever their number and has no
// streaming path, and their 72 and 330 MB of rows would cost CI minutes
// under the sanitizers.
TEST_P(Model1GatherTest, ManyPagesMatchTheModel) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(36);
  std::vector<RangeShape> shapes = {RangeShape{{3000, 2500, 17}, {3000, 2401, 17}, 2, 0, 0},
                                    RangeShape{many_lengths(200), {}, 64, 1, 0}};
  if (GetParam() != "host") {
    shapes.push_back(RangeShape{std::vector<std::int32_t>(64, 1100), {}, 64, 1, 0});
    shapes.push_back(RangeShape{std::vector<std::int32_t>(8, 40000), {}, 64, 0, 0});
  }
  for (const RangeShape& s : shapes) {
    SCOPED_TRACE(describe(s));
    const auto in = random_range(rng, s, false);
    EXPECT_TRUE(same_rows(run_range(in), expected_range(in)));
  }
}

TEST_P(Model1GatherTest, NoRowsOrNoRequestsWriteNothing) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(37);
  const auto in = random_range(rng, RangeShape{{4, 4}, {4, 4}, 2, 0, 0}, false);
  const Cache cache = cache_on_device(in);
  const RangeArgs a = range_args(in);
  Buffer storage = upload(*device, *stream, poisoned(in.batch * in.slice_rows));
  const Tensor out = Tensor::of(storage, DType::bf16, {in.batch, in.slice_rows, width});
  gather_upconvert_fp8_range(*stream, cache.view, out, a.seq_lens.tensor.rows(0, 0), a.gather_lens.tensor,
                             a.block_table.tensor, 0, params_of(in));
  gather_upconvert_fp8_range(*stream, cache.view, out.narrow(1, 0, 0), a.seq_lens.tensor, a.gather_lens.tensor,
                             a.block_table.tensor, 0, params_of(in));
  EXPECT_EQ(download_rows<std::uint16_t>(*device, *stream, out), poisoned(in.batch * in.slice_rows));
}

// ---- rejections ----

struct RangeCall {
  Tensor cache, out, seq_lens, gather_lens, block_table;
  std::int64_t offset;
  Fp8GatherParams params;
};

struct Rejection {
  const char* name;
  std::function<void(RangeCall&)> spoil;
  const char* message;
};

TEST_P(Model1GatherTest, EveryRangeRejectionNamesTheArgumentAndWritesNothing) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(38);
  const auto in = random_range(rng, RangeShape{{70, 9}, {60, 9}, 64, 2, 0}, false);
  const Cache cache = cache_on_device(in);
  const RangeArgs a = range_args(in);
  Buffer storage = upload(*device, *stream, poisoned(in.batch * in.slice_rows));
  const Tensor out = Tensor::of(storage, DType::bf16, {in.batch, in.slice_rows, width});
  const RangeCall good{cache.view, out, a.seq_lens.tensor, a.gather_lens.tensor, a.block_table.tensor, in.offset,
                       params_of(in)};
  const std::int64_t nb = in.num_blocks, N = in.slice_rows;
  auto* bytes = cache.buffer.as<std::uint8_t>();
  const auto u8 = [&](std::vector<std::int64_t> shape, std::vector<std::int64_t> strides) {
    return Tensor(bytes, DType::u8, shape, strides, MemoryKind::device, device.get());
  };
  const auto retyped = [](const Tensor& t, DType dtype, std::vector<std::int64_t> shape) {
    return Tensor(t.data(), dtype, shape, t.kind(), t.device());
  };
  Buffer seq_starts = upload(*device, *stream, std::vector<std::int32_t>{0, 0});

  const std::vector<Rejection> rejections = {
      {"packed pages", [&](RangeCall& c) { c.cache = u8({nb, 64, 584}, {64 * 584, 584, 1}); },
       "src_cache's pages are 37376 bytes apart (stride(0) of shape [" },
      {"packed pages (message)", [&](RangeCall& c) { c.cache = u8({nb, 64, 584}, {64 * 584, 584, 1}); },
       "less than the 37440 bytes of a model1_fp8 page of 64 tokens"},
      {"fp8_ds_mla row width", [&](RangeCall& c) { c.cache = u8({nb, 64, 656}, {37440, 656, 1}); },
       "src_cache has shape [" },
      {"token bytes", [&](RangeCall& c) { c.cache = u8({nb, 64, 576}, {37440, 576, 1}); },
       "but dimension 2 must be 584 (bytes per model1_fp8 token)"},
      {"heads", [&](RangeCall& c) { c.cache = u8({nb, 32, 2, 584}, {37440, 1168, 584, 1}); },
       "dimension 2 must be 1 (one KV head)"},
      {"rank 1", [&](RangeCall& c) { c.cache = u8({nb * 37440}, {1}); },
       "a model1_fp8 cache is [num_blocks, tokens, 584], [num_blocks, tokens, 1, 584] or [num_blocks, bytes]"},
      {"bytes without block_size", [&](RangeCall& c) { c.cache = u8({nb, 37440}, {37440, 1}); },
       "block_size must say how many tokens a page holds, got 0"},
      {"bytes too few", [&](RangeCall& c) {
         c.cache = u8({nb, 37000}, {37440, 1});
         c.params.block_size = 64;
       }, "src_cache has shape [" },
      {"block_size differs", [&](RangeCall& c) { c.params.block_size = 32; },
       "block_size 32 differs from src_cache's 64 tokens a page"},
      {"cache dtype", [&](RangeCall& c) { c.cache = retyped(c.cache, DType::i16, {nb, 64, 292}); },
       "src_cache has dtype I16, expected U8"},
      {"out width", [&](RangeCall& c) { c.out = retyped(c.out, DType::bf16, {in.batch, N * 512 / 576, 576}); },
       "dimension 2 must be 512 (bf16 per upconverted model1_fp8 token)"},
      {"out rank", [&](RangeCall& c) { c.out = retyped(c.out, DType::bf16, {in.batch * N, 512}); }, "out has shape"},
      {"out dtype", [&](RangeCall& c) { c.out = retyped(c.out, DType::i16, {in.batch, N, 512}); },
       "out has dtype I16, expected BF16"},
      {"out requests", [&](RangeCall& c) { c.out = c.out.rows(0, 1); },
       "dimension 0 must be >= 2 (one slice per request)"},
      {"seq_lens dtype", [&](RangeCall& c) { c.seq_lens = retyped(c.seq_lens, DType::i64, {1}); },
       "seq_lens has dtype I64"},
      {"gather_lens short", [&](RangeCall& c) { c.gather_lens = c.gather_lens.rows(0, 1); },
       "gather_lens has shape [1] but dimension 0 must be >= 2"},
      {"block_table short", [&](RangeCall& c) { c.block_table = c.block_table.rows(0, 1); },
       "block_table has shape [1, "},
      {"negative offset", [&](RangeCall& c) { c.offset = -1; }, "offset must be in [0, "},
      {"offset past the slice", [&](RangeCall& c) { c.offset = N + 1; }, "), got " },
      {"seq_starts", [&](RangeCall& c) {
         c.params.seq_starts = Tensor::of(seq_starts, DType::i32, {2});
       }, "seq_starts and the host-backed tensors belong to the workspace gather"},
      {"fp8_ds_mla rows read as model1", [&](RangeCall& c) { c.params.kv_format = KvFormat::fp8_ds_mla; },
       "dimension 2 must be 656 (bytes per fp8_ds_mla row)"},
  };
  for (const Rejection& r : rejections) {
    SCOPED_TRACE(r.name);
    RangeCall c = good;
    r.spoil(c);
    try {
      gather_upconvert_fp8_range(*stream, c.cache, c.out, c.seq_lens, c.gather_lens, c.block_table, c.offset, c.params);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(r.message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("gather_upconvert_fp8_range"), std::string::npos) << e.what();
    }
    EXPECT_EQ(download_rows<std::uint16_t>(*device, *stream, out), poisoned(in.batch * N));
  }
  // The unspoilt call works, so each rejection above was the spoilt argument's.
  gather_upconvert_fp8_range(*stream, good.cache, good.out, good.seq_lens, good.gather_lens, good.block_table,
                             good.offset, good.params);
  EXPECT_TRUE(same_rows(download_rows<std::uint16_t>(*device, *stream, out), expected_range(in)));
}

TEST_P(Model1GatherTest, WorkspaceRejectionsNameTheArgumentAndWriteNothing) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(39);
  const auto in = random_workspace(rng, WorkspaceShape{{5, 9}, 2, false}, false);
  const Cache cache = cache_on_device(in);
  DeviceTensor table = device_tensor(*device, *stream, in.block_table, {in.batch, in.blocks_per_request});
  DeviceTensor starts = device_tensor(*device, *stream, in.workspace_starts, {in.batch});
  Buffer storage = upload(*device, *stream, poisoned(in.total_rows));
  const Tensor dst = Tensor::of(storage, DType::bf16, {in.total_rows, width});
  DeviceTensor host_rows = device_tensor(*device, *stream, std::vector<std::uint8_t>(2 * 656, 0), {2, 656},
                                         MemoryKind::pinned_host);
  DeviceTensor ids = device_tensor(*device, *stream, std::vector<std::int32_t>(4, 0), {4});
  const auto call = [&](const Tensor& c, const Tensor& d, const Fp8GatherParams& p) {
    return error_of([&] { gather_upconvert_fp8(*stream, c, d, table.tensor, starts.tensor, in.batch, p); });
  };
  Fp8GatherParams host_backed = params_of(in);
  host_backed.host_cache = host_rows.tensor;
  host_backed.host_row_ids = ids.tensor;
  host_backed.device_row_ids = ids.tensor;
  EXPECT_NE(call(cache.view, dst, host_backed).find("reads fp8_ds_mla rows, not model1_fp8 pages"), std::string::npos);
  const Tensor wide(storage.data(), DType::bf16, {in.total_rows / 2, 576}, MemoryKind::device, device.get());
  EXPECT_NE(call(cache.view, wide, params_of(in)).find("dst has shape [7, 576] but dimension 1 must be 512"),
            std::string::npos);
  const Tensor packed(cache.buffer.data(), DType::u8, {in.num_blocks, 2, 584}, MemoryKind::device, device.get());
  EXPECT_NE(call(packed, dst, params_of(in)).find("src_cache's pages are 1168 bytes apart"), std::string::npos);
  EXPECT_NE(call(packed, dst, params_of(in)).find("the 1728 bytes of a model1_fp8 page of 2 tokens"),
            std::string::npos);
  EXPECT_EQ(download_rows<std::uint16_t>(*device, *stream, dst), poisoned(in.total_rows));
  // A single page needs no stride: torch gives one page a packed one.
  Fp8GatherInputs one = in;
  one.num_blocks = 1;
  one.block_table.assign(one.block_table.size(), 0);
  one.cache.resize(static_cast<std::size_t>(one.page_stride));
  DeviceTensor one_table = device_tensor(*device, *stream, one.block_table, {one.batch, one.blocks_per_request});
  const Cache kept = cache_on_device(one);
  const Tensor single_page(kept.buffer.data(), DType::u8, {1, 2, 584}, MemoryKind::device, device.get());
  gather_upconvert_fp8(*stream, single_page, dst, one_table.tensor, starts.tensor, one.batch, params_of(one));
  EXPECT_TRUE(same_rows(download_rows<std::uint16_t>(*device, *stream, dst), expected_workspace(one)));
}

// ---- the validating entry points' deep check ----

TEST(Fp8RangeValues, RejectsGathersAndBlocksOutsideTheirRanges) {
  const std::vector<std::int32_t> table{0, 3, 2, 1};  // [2 requests, 2 blocks of 4]
  const std::vector<std::int32_t> seq{5, 8};
  const std::vector<std::int32_t> gather{5, 2};
  const auto message = [&](const std::vector<std::int32_t>& t, const std::vector<std::int32_t>& s,
                           const std::vector<std::int32_t>* g, std::int64_t slice, std::int64_t blocks) {
    return error_of([&] { check_fp8_range_values(t.data(), 2, s.data(), g ? g->data() : nullptr, 2, slice, 4, blocks); });
  };
  EXPECT_EQ(message(table, seq, &gather, 5, 4), "no error");
  EXPECT_EQ(message(table, seq, nullptr, 8, 4), "no error");
  const std::vector<std::int32_t> too_many{6, 2}, negative{5, -1};
  EXPECT_NE(message(table, seq, &too_many, 8, 4).find("gather_lens[0] = 6 is not in [0, seq_lens[0] = 5]"),
            std::string::npos);
  EXPECT_NE(message(table, seq, &negative, 8, 4).find("gather_lens[1] = -1"), std::string::npos);
  EXPECT_NE(message(table, seq, &gather, 4, 4).find("request 0 gathers 5 tokens but its output slice holds 4 rows"),
            std::string::npos);
  EXPECT_NE(message(table, {5, 9}, nullptr, 9, 4).find("request 1 reads tokens [0, 9) but its block table holds 2"),
            std::string::npos);
  EXPECT_NE(message(table, seq, &gather, 5, 3).find("block_table[0, 1] = 3 is outside the cache's 3 blocks"),
            std::string::npos);
  // Request 1 gathers tokens 6 and 7 only: block 0 of its row is not read.
  EXPECT_EQ(message({0, 3, 9, 1}, seq, &gather, 5, 4), "no error");
}

// ---- the model itself ----

TEST(Model1Reference, ScalesAndTheByteOffsetsOfAPage) {
  EXPECT_EQ(reference::ue8m0_value(127), 1.0f);
  EXPECT_EQ(reference::ue8m0_value(128), 2.0f);
  EXPECT_EQ(reference::ue8m0_value(105), std::ldexp(1.0f, -22));
  EXPECT_EQ(reference::ue8m0_value(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isinf(reference::ue8m0_value(255)));
  EXPECT_EQ(reference::model1_page_bytes(64), 37440u);
  EXPECT_EQ(reference::model1_page_bytes(2), 1728u);
  EXPECT_EQ(model1_page_bytes(64), 37440);
  EXPECT_EQ(model1_page_bytes(72), 72 * 584);  // 584 * 72 is a multiple of 576
  // A page of 2 tokens, token 1: value 70 (tile 1) is 1.0 (0x38) under
  // scale byte 129 (4.0), value 447 (tile 6) is -0.5 (0xB0) under 120
  // (2^-7), RoPE value 3 is bf16 0x1234.
  std::vector<std::uint8_t> page(1728, 0);
  page[576 + 70] = 0x38;
  page[576 + 447] = 0xB0;
  page[576 * 2 + 8 + 1] = 129;
  page[576 * 2 + 8 + 6] = 120;
  page[576 + 448 + 6] = 0x34;
  page[576 + 448 + 7] = 0x12;
  std::vector<std::uint16_t> out(512, 0xFFFF);
  reference::upconvert_model1_token(page.data(), 2, 1, false, out.data());
  EXPECT_EQ(out[70], 0x4080);   // 4.0
  EXPECT_EQ(out[447], 0xBB80);  // -2^-8
  EXPECT_EQ(out[448 + 3], 0x1234);
  EXPECT_EQ(out[0], 0x0000);  // 0 under scale byte 0 (2^-127)
}

std::string golden_path(const std::string& stem) {
  const char* env = std::getenv("SPARSE_MLA_GOLDEN_DIR");
  const bool usable = env != nullptr && *env != '\0' && std::filesystem::exists(env);
  const std::string dir = usable ? env : SPARSE_MLA_SOURCE_DIR "/tests/data/golden";
  return dir + "/" + stem + ".safetensors";
}

// The model reproduces the files vLLM's own Triton kernels wrote (its output
// buffer was zero-filled before the gather): the model and the kernels agree
// with the reference engine independently of each other.
TEST(Model1Reference, ReproducesTheGoldenFiles) {
  for (const char* stem : {"v4a_gather_small", "v4b_gather_bs2"}) {
    SCOPED_TRACE(stem);
    const std::string path = golden_path(stem);
    ASSERT_TRUE(std::filesystem::exists(path)) << "golden file missing: " << path << " (set SPARSE_MLA_GOLDEN_DIR)";
    const SafetensorsFile f = SafetensorsFile::read(path);
    Fp8GatherInputs in;
    in.model1 = true;
    in.block_size = in.cache_block_size = f.meta_int("block_size");
    in.page_stride = f.meta_int("page_stride");
    in.num_blocks = f.meta_int("num_blocks");
    in.batch = f.meta_int("num_requests");
    in.blocks_per_request = f.meta_int("max_blocks_per_seq");
    in.offset = f.meta_int("offset");
    in.slice_rows = f.meta_int("out_tokens");
    in.cache = f.require("k_cache", DType::u8, {in.num_blocks, in.page_stride}).bytes;
    const auto ints = [&](const char* name, std::vector<std::int64_t> shape) {
      const TensorRecord& t = f.require(name, DType::i32, shape);
      return std::vector<std::int32_t>(t.data<std::int32_t>(), t.data<std::int32_t>() + t.numel());
    };
    in.block_table = ints("block_table", {in.batch, in.blocks_per_request});
    in.seq_lens = ints("seq_lens", {in.batch});
    in.gather_lens = ints("gather_lens", {in.batch});
    const TensorRecord& want = f.require("out", DType::bf16, {in.batch, in.slice_rows, 512});
    std::vector<std::uint16_t> out(static_cast<std::size_t>(want.numel()), 0);
    reference::gather_range(in, out);
    EXPECT_TRUE(same_rows(out, std::vector<std::uint16_t>(want.data<std::uint16_t>(),
                                                          want.data<std::uint16_t>() + want.numel())));
  }
}

}  // namespace
}  // namespace sparse_mla::testing
