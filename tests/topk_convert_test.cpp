// Top-k conversion (SPEC section 2) against the scalar reference
// (tools/validation/reference/topk_reference.hpp) on fresh random data over many shapes,
// both kernel paths (16-byte vectors and the per-entry path), caller-owned
// outputs, the prefill-workspace variant, and every rejection path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend_test.hpp"
#include "validation/reference/topk_reference.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/topk_convert.hpp"
#include "sparse_mla/fp8_upconvert.hpp"
#include "test_util.hpp"

namespace sparse_mla::testing {
namespace {

constexpr std::int32_t int32_min = std::numeric_limits<std::int32_t>::min();
constexpr std::int32_t int32_max = std::numeric_limits<std::int32_t>::max();

struct Shape {
  std::int64_t T, K, R, B;
  std::int32_t block_size, stride;
  bool prefill;
};

std::string describe(const Shape& s) {
  return "T=" + std::to_string(s.T) + " K=" + std::to_string(s.K) + " R=" + std::to_string(s.R) +
         " B=" + std::to_string(s.B) + " block_size=" + std::to_string(s.block_size) +
         " stride=" + std::to_string(s.stride) + (s.prefill ? " prefill" : "");
}

// A token position drawn to hit every branch: inside the table, at block
// edges, past the table, -1, other negatives and the int32 extremes.
std::int32_t draw_token(std::mt19937_64& rng, const Shape& s) {
  const std::int64_t rows = s.B * s.block_size;
  const auto pick = [&](std::int64_t lo, std::int64_t hi) {  // [lo, hi]
    return static_cast<std::int32_t>(std::uniform_int_distribution<std::int64_t>(lo, hi)(rng));
  };
  const int kind = pick(0, 99);
  if (kind < 60 && rows > 0) return pick(0, rows - 1);
  if (kind < 70) return pick(rows, rows + 3 * s.block_size + 200);
  if (kind < 80) return -1;
  if (kind < 85) return pick(int32_min, -2);
  if (kind < 87) return int32_min;
  if (kind < 89) return int32_max;
  const std::int64_t edges[] = {0, s.block_size - 1, s.block_size, rows - 1, rows};
  return static_cast<std::int32_t>(std::max<std::int64_t>(0, edges[pick(0, 4)]));
}

reference::TopkInputs random_inputs(std::mt19937_64& rng, const Shape& s, std::int64_t physical_blocks) {
  reference::TopkInputs in;
  in.num_tokens = s.T;
  in.num_topk = s.K;
  in.blocks_per_request = s.B;
  in.block_size = s.block_size;
  in.block_stride_rows = s.stride;
  std::uniform_int_distribution<std::int32_t> req(0, static_cast<std::int32_t>(s.R - 1));
  std::uniform_int_distribution<std::int64_t> block(0, physical_blocks - 1);
  for (std::int64_t t = 0; t < s.T; ++t) in.req_id.push_back(req(rng));
  for (std::int64_t i = 0; i < s.R * s.B; ++i) in.block_table.push_back(static_cast<std::int32_t>(block(rng)));
  for (std::int64_t i = 0; i < s.T * s.K; ++i) in.logical.push_back(draw_token(rng, s));
  if (s.prefill) {
    const std::int32_t P = 3;
    std::int32_t start = std::uniform_int_distribution<std::int32_t>(0, 100)(rng);
    for (std::int32_t p = 0; p < P; ++p) {
      in.workspace_starts.push_back(start);
      start += std::uniform_int_distribution<std::int32_t>(0, 5000)(rng);
    }
    std::uniform_int_distribution<std::int32_t> request(-1, P - 1);
    for (std::int64_t t = 0; t < s.T; ++t) in.workspace_request.push_back(request(rng));
  }
  return in;
}

class TopkConvertTest : public BackendTest {
 protected:
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped()) return;
    stream = device->create_stream();
  }

  // The inputs of one case on the device.
  struct OnDevice {
    DeviceTensor req_id, block_table, logical, workspace_request, workspace_starts;
    TopkConvertParams params;
  };

  OnDevice to_device(const reference::TopkInputs& in, std::int64_t R) {
    OnDevice d{device_tensor(*device, *stream, in.req_id, {static_cast<std::int64_t>(in.req_id.size())}),
               device_tensor(*device, *stream, in.block_table, {R, in.blocks_per_request}),
               device_tensor(*device, *stream, in.logical, {in.num_tokens, in.num_topk}),
               {},
               {},
               {}};
    d.params.block_size = in.block_size;
    d.params.block_stride_rows = in.block_stride_rows;
    if (!in.workspace_request.empty()) {
      d.workspace_request = device_tensor(*device, *stream, in.workspace_request, {in.num_tokens});
      d.workspace_starts = device_tensor(*device, *stream, in.workspace_starts,
                                         {static_cast<std::int64_t>(in.workspace_starts.size())});
      d.params.workspace_request = d.workspace_request.tensor;
      d.params.workspace_starts = d.workspace_starts.tensor;
    }
    return d;
  }

  DeviceTensor poisoned(std::vector<std::int64_t> shape) {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return device_tensor(*device, *stream, std::vector<std::int32_t>(static_cast<std::size_t>(n), poison_i32), shape);
  }

  std::vector<std::int32_t> fetch(const Tensor& t) { return download_rows<std::int32_t>(*device, *stream, t); }

  std::unique_ptr<Stream> stream;
};
SPARSE_MLA_INSTANTIATE_BACKENDS(TopkConvertTest);

const Shape shapes[] = {
    {1, 64, 1, 4, 64, 64, false},        // one token
    {1, 1, 1, 3, 16, 16, false},         // K = 1: per-entry path
    {7, 128, 3, 4, 64, 64, false},       // the golden c1 shape
    {33, 384, 5, 40, 16, 16, false},     // K not a power of two (c3)
    {9, 100, 4, 20, 64, 64, false},      // K = 100: vectors of 4, 25 per row
    {11, 3, 2, 5, 64, 64, false},        // K = 3
    {5, 256, 2, 300, 1, 1, false},       // block size 1 (c5, the ROCm layout)
    {6, 2048, 3, 40, 64, 64, false},     // production K: one whole round of a GPU team (512 x 1 unit)
    {3, 4096, 2, 70, 64, 64, false},     // two whole rounds
    {5, 2048, 3, 50, 48, 48, false},     // whole rounds, block size not a power of two
    {17, 128, 4, 10, 64, 192, false},    // stride larger than block size (interleaved layers)
    {13, 64, 3, 7, 1, 5, false},         // block size 1, stride 5
    {12, 2048, 4, 40, 64, 64, true},     // prefill workspace
    {10, 100, 3, 9, 16, 48, true},       // prefill workspace, K not a power of two, stride > size
    {64, 512, 8, 16, 64, 64, false},     // many tokens
    {9, 256, 3, 12, 48, 48, false},      // block size not a power of two: the division path
    {4, 64, 2, 0, 16, 16, false},        // a table with no blocks: nothing is valid
    {4, 64, 2, 0, 16, 16, true},         // same, with prefill-workspace tokens
    {5, 2052, 2, 50, 24, 40, true},      // 513 units: a tail past whole unit batches, prefill, size 24
    {600, 2048, 7, 40, 64, 64, false},   // T >= 512: GPUs take the many-token shape (4 units in flight)
    {520, 516, 4, 30, 32, 32, true},     // same, prefill, 129 units: a partly filled round
    {530, 6, 3, 5, 8, 8, false},         // same, per-entry path
    {2100, 2048, 6, 40, 64, 64, false},  // 2048 <= T < 8192: GPUs take whole rounds of 256 x 1
    {8200, 64, 5, 10, 16, 16, false},    // T >= 8192: GPUs take the large-batch shape (2 units in flight)
};

TEST_P(TopkConvertTest, MatchesTheReferenceOverManyShapes) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(1);
  for (const Shape& s : shapes) {
    SCOPED_TRACE(describe(s));
    const auto in = random_inputs(rng, s, s.R * s.B + 3);
    const auto expected = reference::convert_topk(in);
    OnDevice d = to_device(in, s.R);
    const TopkConversion got = convert_logical_to_physical_topk(*stream, d.req_id.tensor, d.block_table.tensor,
                                                                d.logical.tensor, d.params);
    EXPECT_EQ(fetch(got.physical), expected.physical);
    EXPECT_EQ(fetch(got.valid_counts), expected.valid_counts);
  }
}

// DeepSeek V4's sparse layers select among compressed rows held 64 and 2 a
// page (model1_fp8 pages), top-k 512 and 1024: every launch shape a GPU
// takes for them (one token, few, 512 or more), with and without counts.
TEST_P(TopkConvertTest, DeepSeekV4PageSizesMatchTheReference) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(9);
  for (const std::int32_t block_size : {64, 2}) {
    for (const std::int64_t K : {512, 1024}) {
      for (const std::int64_t T : {1, 40, 600}) {
        const Shape s{T, K, 5, block_size == 64 ? 40 : 1300, block_size, block_size, false};
        SCOPED_TRACE(describe(s));
        const auto in = random_inputs(rng, s, s.R * s.B + 3);
        const auto expected = reference::convert_topk(in);
        OnDevice d = to_device(in, s.R);
        for (const bool counts : {true, false}) {
          d.params.return_valid_counts = counts;
          const TopkConversion got = convert_logical_to_physical_topk(*stream, d.req_id.tensor, d.block_table.tensor,
                                                                      d.logical.tensor, d.params);
          EXPECT_EQ(fetch(got.physical), expected.physical);
          if (counts) {
            EXPECT_EQ(fetch(got.valid_counts), expected.valid_counts);
          }
        }
      }
    }
  }
}

// Block ids near 2^31 / stride: the product wraps like the reference's
// int32, and an entry that wraps to exactly -1 is not counted (SPEC: counts
// are of entries not equal to -1).
TEST_P(TopkConvertTest, ProductsWrapLikeInt32) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(2);
  const Shape s{8, 64, 2, 8, 64, 64, false};
  auto in = random_inputs(rng, s, std::int64_t{1} << 31);
  // (2^26) * 64 + 63 overflows; 0x3FFFFFF * 64 + 63 = 2^32 - 1 wraps to -1.
  in.block_table[0] = 0x4000000;
  in.block_table[1] = 0x3FFFFFF;
  in.req_id[0] = 0;
  in.logical[0] = 63;
  in.logical[1] = 64 + 63;
  const auto expected = reference::convert_topk(in);
  ASSERT_EQ(expected.physical[1], -1);
  OnDevice d = to_device(in, s.R);
  const auto got = convert_logical_to_physical_topk(*stream, d.req_id.tensor, d.block_table.tensor, d.logical.tensor,
                                                    d.params);
  EXPECT_EQ(fetch(got.physical), expected.physical);
  EXPECT_EQ(fetch(got.valid_counts), expected.valid_counts);
}

// The prefill-workspace variant follows the SPEC: only tok < 0 gives -1,
// also for a token whose block would lie past the table.
TEST_P(TopkConvertTest, PrefillTokensIgnoreTheBlockTable) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(3);
  const Shape s{4, 8, 2, 2, 16, 16, true};
  auto in = random_inputs(rng, s, 4);
  in.workspace_request = {1, -1, 0, 2};
  in.workspace_starts = {10, 1000, 5000};
  in.logical = {0, 31, 32, 500, -1, -7, int32_min, 1,  // prefill p=1
                0, 31, 32, 500, -1, -7, int32_min, 1,  // decode: 32 and 500 are past the table
                5, 6, 7, 8, 9, 10, 11, 12,           // prefill p=0
                int32_max, 0, 0, 0, 0, 0, 0, 0};     // prefill p=2, wrapping
  const auto expected = reference::convert_topk(in);
  EXPECT_EQ(expected.physical[3], 1500);
  EXPECT_EQ(expected.physical[11], -1);
  OnDevice d = to_device(in, s.R);
  const auto got = convert_logical_to_physical_topk(*stream, d.req_id.tensor, d.block_table.tensor, d.logical.tensor,
                                                    d.params);
  EXPECT_EQ(fetch(got.physical), expected.physical);
  EXPECT_EQ(fetch(got.valid_counts), expected.valid_counts);
}

TEST_P(TopkConvertTest, CallerOwnedOutputsAreUsedAndRowsPastTAreUntouched) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(4);
  for (const Shape& s : {Shape{5, 128, 2, 6, 64, 64, false}, Shape{6, 100, 3, 9, 16, 32, true}}) {
    SCOPED_TRACE(describe(s));
    const auto in = random_inputs(rng, s, s.R * s.B);
    const auto expected = reference::convert_topk(in);
    OnDevice d = to_device(in, s.R);
    DeviceTensor out = poisoned({s.T + 3, s.K});
    DeviceTensor counts = poisoned({s.T + 5});
    const auto got = convert_logical_to_physical_topk(*stream, d.req_id.tensor, d.block_table.tensor,
                                                      d.logical.tensor, d.params, out.tensor, counts.tensor);
    EXPECT_FALSE(got.physical_storage);
    EXPECT_FALSE(got.valid_counts_storage);
    EXPECT_EQ(got.physical.data(), out.tensor.data());
    EXPECT_EQ(got.valid_counts.data(), counts.tensor.data());
    EXPECT_EQ(got.physical.dim(0), s.T);
    EXPECT_EQ(got.valid_counts.dim(0), s.T);
    auto expected_out = expected.physical;
    expected_out.resize(static_cast<std::size_t>((s.T + 3) * s.K), poison_i32);
    auto expected_counts = expected.valid_counts;
    expected_counts.resize(static_cast<std::size_t>(s.T + 5), poison_i32);
    EXPECT_EQ(fetch(out.tensor), expected_out);
    EXPECT_EQ(fetch(counts.tensor), expected_counts);
  }
}

TEST_P(TopkConvertTest, WithoutValidCountsOnlyPhysicalIsWritten) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(5);
  const Shape s{9, 256, 3, 12, 64, 64, false};
  const auto in = random_inputs(rng, s, s.R * s.B);
  const auto expected = reference::convert_topk(in);
  OnDevice d = to_device(in, s.R);
  d.params.return_valid_counts = false;
  DeviceTensor out = poisoned({s.T, s.K});
  const auto got = convert_logical_to_physical_topk(*stream, d.req_id.tensor, d.block_table.tensor, d.logical.tensor,
                                                    d.params, out.tensor);
  EXPECT_FALSE(got.valid_counts.defined());
  EXPECT_FALSE(got.valid_counts_storage);
  EXPECT_EQ(fetch(out.tensor), expected.physical);
  // The library-allocated form gives the same physical indices.
  const auto own = convert_logical_to_physical_topk(*stream, d.req_id.tensor, d.block_table.tensor, d.logical.tensor,
                                                    d.params);
  EXPECT_FALSE(own.valid_counts.defined());
  EXPECT_EQ(fetch(own.physical), expected.physical);
}

// Rows that are not 16-byte aligned, or strided by a width that is not a
// multiple of 4, take the per-entry path; the results must be the same.
TEST_P(TopkConvertTest, MisalignedAndStridedRowsMatchTheReference) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(6);
  const Shape s{7, 128, 3, 8, 64, 64, false};
  const auto in = random_inputs(rng, s, s.R * s.B);
  const auto expected = reference::convert_topk(in);
  OnDevice d = to_device(in, s.R);

  // logical one element past a 16-byte boundary.
  std::vector<std::int32_t> shifted(1, 0);
  shifted.insert(shifted.end(), in.logical.begin(), in.logical.end());
  DeviceTensor shifted_storage = device_tensor(*device, *stream, shifted, {static_cast<std::int64_t>(shifted.size())});
  const Tensor misaligned(shifted_storage.buffer.as<std::int32_t>() + 1, DType::i32, {s.T, s.K},
                          shifted_storage.buffer.kind(), device.get());
  // out: columns [1, K + 1) of a [T, K + 3] buffer, so rows start misaligned
  // and are K + 3 apart.
  DeviceTensor wide = poisoned({s.T, s.K + 3});
  const Tensor strided_out = wide.tensor.narrow(1, 1, s.K + 1);
  ASSERT_EQ(strided_out.stride(0), s.K + 3);
  const auto got = convert_logical_to_physical_topk(*stream, d.req_id.tensor, d.block_table.tensor, misaligned,
                                                    d.params, strided_out);
  EXPECT_EQ(fetch(strided_out), expected.physical);
  EXPECT_EQ(fetch(got.valid_counts), expected.valid_counts);
  // The columns around the view are untouched.
  const auto all = fetch(wide.tensor);
  for (std::int64_t t = 0; t < s.T; ++t) {
    for (std::int64_t j : {std::int64_t{0}, s.K + 1, s.K + 2}) {
      EXPECT_EQ(all[static_cast<std::size_t>(t * (s.K + 3) + j)], poison_i32) << "row " << t << " column " << j;
    }
  }
}

TEST_P(TopkConvertTest, NoTokensWritesNothing) {
  const reference::TopkInputs in{0, 64, 2, 64, 64, {}, {0, 1, 2, 3}, {}, {}, {}};
  OnDevice d = to_device(in, 2);
  DeviceTensor out = poisoned({2, 64});
  DeviceTensor counts = poisoned({2});
  const auto got = convert_logical_to_physical_topk(*stream, d.req_id.tensor, d.block_table.tensor, d.logical.tensor,
                                                    d.params, out.tensor, counts.tensor);
  EXPECT_EQ(got.physical.dim(0), 0);
  EXPECT_EQ(fetch(out.tensor), std::vector<std::int32_t>(128, poison_i32));
  EXPECT_EQ(fetch(counts.tensor), std::vector<std::int32_t>(2, poison_i32));
}

// Plain pageable host memory: host kernels can read it; GPU kernels cannot,
// and the call must say so.
TEST_P(TopkConvertTest, PlainHostMemoryIsUsableOnlyWhereKernelsReachIt) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(7);
  const Shape s{3, 64, 2, 4, 64, 64, false};
  const auto in = random_inputs(rng, s, s.R * s.B);
  OnDevice d = to_device(in, s.R);
  DeviceTensor host_logical = device_tensor(*device, *stream, in.logical, {s.T, s.K}, MemoryKind::host);
  DeviceTensor out = poisoned({s.T, s.K});
  if (device->kernel_accessible(MemoryKind::host)) {
    // The result owns the library-allocated counts: keep it until the stream has run.
    const auto got = convert_logical_to_physical_topk(*stream, d.req_id.tensor, d.block_table.tensor,
                                                      host_logical.tensor, d.params, out.tensor);
    EXPECT_EQ(fetch(out.tensor), reference::convert_topk(in).physical);
    EXPECT_EQ(fetch(got.valid_counts), reference::convert_topk(in).valid_counts);
  } else {
    EXPECT_THROW(convert_logical_to_physical_topk(*stream, d.req_id.tensor, d.block_table.tensor,
                                                  host_logical.tensor, d.params, out.tensor),
                 Error);
    EXPECT_EQ(fetch(out.tensor), std::vector<std::int32_t>(static_cast<std::size_t>(s.T * s.K), poison_i32));
  }
}

// ---- rejections: each names the argument, and nothing is written ----

struct Call {
  Tensor req_id, block_table, logical, out, counts;
  TopkConvertParams params;
};

struct Rejection {
  const char* name;
  std::function<void(Call&)> spoil;
  const char* message;  // a part of the expected message
};

TEST_P(TopkConvertTest, EveryRejectionNamesTheArgumentAndWritesNothing) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(8);
  const Shape s{6, 64, 3, 5, 16, 16, true};
  const auto in = random_inputs(rng, s, s.R * s.B);
  OnDevice d = to_device(in, s.R);
  DeviceTensor out = poisoned({s.T, s.K});
  DeviceTensor counts = poisoned({s.T});
  const Call good{d.req_id.tensor, d.block_table.tensor, d.logical.tensor, out.tensor, counts.tensor, d.params};

  auto other_device = open_device(GetParam());
  auto other_stream = other_device->create_stream();
  DeviceTensor foreign = device_tensor(*other_device, *other_stream, std::vector<std::int32_t>(1024, 0), {1024});
  const auto foreign_of = [&](const Tensor& like) {
    if (like.rank() == 1) return Tensor(foreign.buffer.data(), like.dtype(), {like.dim(0)}, MemoryKind::device, other_device.get());
    return Tensor(foreign.buffer.data(), like.dtype(), {like.dim(0), like.dim(1)}, MemoryKind::device, other_device.get());
  };
  const auto as = [](const Tensor& t, DType dtype) {
    std::vector<std::int64_t> shape;
    for (int i = 0; i < t.rank(); ++i) shape.push_back(t.dim(i));
    return Tensor(t.data(), dtype, shape, t.kind(), t.device());
  };
  const auto reshaped = [](const Tensor& t, std::vector<std::int64_t> shape) {
    return Tensor(t.data(), t.dtype(), shape, t.kind(), t.device());
  };
  const std::int64_t T = s.T, K = s.K;

  const std::vector<Rejection> rejections = {
      {"logical dtype", [&](Call& c) { c.logical = as(c.logical, DType::i16); }, "logical top-k has dtype I16, expected I32"},
      {"logical rank 1", [&](Call& c) { c.logical = reshaped(c.logical, {T * K}); }, "logical top-k has shape"},
      {"logical rank 3", [&](Call& c) { c.logical = reshaped(c.logical, {T, K / 2, 2}); }, "expected 2 dims"},
      {"K = 0", [&](Call& c) { c.logical = reshaped(c.logical, {T, 0}); }, "top-k width K must be in [1, 2^31), got 0"},
      {"req_id dtype", [&](Call& c) { c.req_id = as(c.req_id, DType::u8); }, "req_id has dtype U8"},
      {"req_id rank", [&](Call& c) { c.req_id = reshaped(c.req_id, {T, 1}); }, "req_id has shape"},
      {"too few req_id", [&](Call& c) { c.req_id = c.req_id.rows(0, T - 1); }, "req_id has shape [5] but dimension 0 must be >= 6"},
      {"block_table dtype", [&](Call& c) { c.block_table = as(c.block_table, DType::f32); }, "block_table has dtype F32"},
      {"block_table rank", [&](Call& c) { c.block_table = reshaped(c.block_table, {s.R * s.B}); }, "block_table has shape"},
      {"block_table without rows", [&](Call& c) { c.block_table = c.block_table.rows(0, 0); }, "block_table has no rows"},
      {"block_size 0", [&](Call& c) { c.params.block_size = 0; }, "block_size must be positive, got 0"},
      {"block_size negative", [&](Call& c) { c.params.block_size = -64; }, "block_size must be positive, got -64"},
      {"stride below block size", [&](Call& c) { c.params.block_stride_rows = 15; }, "block_stride_rows must be in [block_size, 2^31) = [16, 2^31), got 15"},
      {"stride negative", [&](Call& c) { c.params.block_stride_rows = -16; }, "got -16"},
      {"stride past int32", [&](Call& c) { c.params.block_stride_rows = std::int64_t{1} << 31; }, "got 2147483648"},
      {"workspace_request alone", [&](Call& c) { c.params.workspace_starts = Tensor(); }, "workspace_starts is missing"},
      {"workspace_starts alone", [&](Call& c) { c.params.workspace_request = Tensor(); }, "workspace_request is missing"},
      {"workspace_request short", [&](Call& c) { c.params.workspace_request = c.params.workspace_request.rows(0, T - 2); }, "workspace_request has shape [4]"},
      {"workspace_request dtype", [&](Call& c) { c.params.workspace_request = as(c.params.workspace_request, DType::i16); }, "workspace_request has dtype I16"},
      {"workspace_starts dtype", [&](Call& c) { c.params.workspace_starts = as(c.params.workspace_starts, DType::u8); }, "workspace_starts has dtype U8"},
      {"out too few rows", [&](Call& c) { c.out = c.out.rows(0, T - 1); }, "out has shape [5, 64] but dimension 0 must be >= 6"},
      {"out wrong K", [&](Call& c) { c.out = c.out.narrow(1, 0, K - 4); }, "out has shape [6, 60] but dimension 1 must be 64"},
      {"out dtype", [&](Call& c) { c.out = as(c.out, DType::bf16); }, "out has dtype BF16"},
      {"out rank", [&](Call& c) { c.out = reshaped(c.out, {T * K}); }, "out has shape"},
      {"counts too few", [&](Call& c) { c.counts = c.counts.rows(0, T - 1); }, "valid_counts_out has shape [5] but dimension 0 must be >= 6"},
      {"counts dtype", [&](Call& c) { c.counts = as(c.counts, DType::i16); }, "valid_counts_out has dtype I16"},
      {"counts without return_valid_counts", [&](Call& c) { c.params.return_valid_counts = false; }, "valid_counts_out given but return_valid_counts is false"},
      {"logical on another device", [&](Call& c) { c.logical = foreign_of(c.logical); }, "logical top-k lives on another device"},
      {"req_id on another device", [&](Call& c) { c.req_id = foreign_of(c.req_id); }, "req_id lives on another device"},
      {"block_table on another device", [&](Call& c) { c.block_table = foreign_of(c.block_table); }, "block_table lives on another device"},
      {"workspace on another device", [&](Call& c) { c.params.workspace_starts = foreign_of(c.params.workspace_starts); }, "workspace_starts lives on another device"},
      {"out on another device", [&](Call& c) { c.out = foreign_of(c.out); }, "out lives on another device"},
      {"counts on another device", [&](Call& c) { c.counts = foreign_of(c.counts); }, "valid_counts_out lives on another device"},
  };
  for (const Rejection& r : rejections) {
    SCOPED_TRACE(r.name);
    Call c = good;
    r.spoil(c);
    try {
      convert_logical_to_physical_topk(*stream, c.req_id, c.block_table, c.logical, c.params, c.out, c.counts);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(r.message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("convert_logical_to_physical_topk"), std::string::npos) << e.what();
    }
    EXPECT_EQ(fetch(out.tensor), std::vector<std::int32_t>(static_cast<std::size_t>(T * K), poison_i32));
    EXPECT_EQ(fetch(counts.tensor), std::vector<std::int32_t>(static_cast<std::size_t>(T), poison_i32));
  }
  // The unspoilt call works, so each rejection above was the spoilt argument's.
  convert_logical_to_physical_topk(*stream, good.req_id, good.block_table, good.logical, good.params, good.out, good.counts);
  EXPECT_EQ(fetch(out.tensor), reference::convert_topk(in).physical);
}

// The validating entry points' deep check of the table's values.
TEST(TopkTableValues, RejectsRequestsAndBlocksOutsideTheirRanges) {
  const std::vector<std::int32_t> req_id{0, 1, 1};
  const std::vector<std::int32_t> table{0, 3, 2, 1};  // [2, 2]
  check_topk_table_values(req_id.data(), 3, table.data(), 2, 2, 4);
  const std::vector<std::int32_t> bad_req{0, 2, 1};
  try {
    check_topk_table_values(bad_req.data(), 3, table.data(), 2, 2, 4);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("req_id[1] = 2 is not a row of the block table (2 rows)"), std::string::npos) << e.what();
  }
  const std::vector<std::int32_t> bad_table{0, 3, -1, 1};
  try {
    check_topk_table_values(req_id.data(), 3, bad_table.data(), 2, 2, 4);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block_table[1, 0] = -1 is outside the cache's 4 blocks"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_topk_table_values(req_id.data(), 3, table.data(), 2, 2, 3), Error);  // block 3 of 3
}

}  // namespace
}  // namespace sparse_mla::testing
