// The DCP filter-and-convert (SPEC section 2a) on every backend: against the
// scalar model (tools/validation/reference/topk_reference.hpp) over shapes
// that take every kernel path, ranks and interleaves, with and without
// compaction; the split's ranks together reconstruct the whole conversion
// (read through a KV cache laid out as the ranks store it, which the model
// cannot fake); rows that own nothing; dcp_size 1 is the plain conversion;
// and every rejection writes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend_test.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/topk_convert.hpp"
#include "test_util.hpp"
#include "validation/reference/topk_reference.hpp"

namespace sparse_mla::testing {
namespace {

struct DcpShape {
  std::int64_t T, K, R, B;  // B: blocks per request in a rank's local table
  std::int32_t block_size;
};

std::string describe(const DcpShape& s, const DcpConfig& d) {
  return "T=" + std::to_string(s.T) + " K=" + std::to_string(s.K) + " B=" + std::to_string(s.B) +
         " block_size=" + std::to_string(s.block_size) + " dcp " + std::to_string(d.rank) + "/" +
         std::to_string(d.size) + " interleave " + std::to_string(d.interleave) + (d.compact ? " compact" : "");
}

// Shapes that take each launch of the conversion kernel on GPUs: whole
// rounds (K = 2048 below 512 tokens and from 2048; compacted, staged from
// 512 tokens, two units in flight from 8192), the general kernel with 2 and
// 4 units in flight, 16-byte units and single entries.
const DcpShape shapes[] = {
    {1, 2048, 1, 40, 64},    // decode: one whole round
    {9, 256, 3, 6, 64},      // the golden d1 shape
    {5, 128, 2, 8, 16},      // the golden d3 shape
    {7, 100, 3, 9, 16},      // K not a power of two, 16-byte units
    {6, 3, 2, 5, 8},         // K = 3: single entries
    {600, 2048, 5, 30, 64},  // 512 <= T < 2048: 4 units in flight
    {2100, 2048, 3, 20, 64}, // whole rounds of 256 x 1
    {8200, 64, 4, 10, 16},   // T >= 8192: 2 units in flight
    {8192, 2048, 3, 20, 64}, // T >= 8192, whole rounds of 256 x 2 (compacted: staged)
    {3, 4096, 2, 70, 64},    // two whole rounds
    {4, 384, 2, 12, 48},     // block size not a power of two
    {5, 16, 2, 4, 8},        // K = 16: one whole round on host spaces
    {3, 12, 2, 4, 8},        // K = 12: 16-byte units, not a whole round
    {20, 4100, 2, 70, 64},   // rounds of the general kernel on GPUs
    {5, 1001, 2, 40, 64},    // single entries over several rounds
};

// The shape, the split, random request ids and a random block table; no
// positions yet.
reference::TopkInputs random_tables(std::mt19937_64& rng, const DcpShape& s, const DcpConfig& d) {
  reference::TopkInputs in;
  in.num_tokens = s.T;
  in.num_topk = s.K;
  in.blocks_per_request = s.B;
  in.block_size = s.block_size;
  in.block_stride_rows = s.block_size;
  in.set_dcp(d);
  std::uniform_int_distribution<std::int32_t> req(0, static_cast<std::int32_t>(s.R - 1));
  for (std::int64_t t = 0; t < s.T; ++t) in.req_id.push_back(req(rng));
  for (std::int64_t i = 0; i < s.R * s.B; ++i) in.block_table.push_back(static_cast<std::int32_t>(rng() % 5000));
  return in;
}

// Positions of the whole (global) context: most inside some rank's share,
// some past every table, -1 and other negatives.
reference::TopkInputs random_inputs(std::mt19937_64& rng, const DcpShape& s, const DcpConfig& d) {
  reference::TopkInputs in = random_tables(rng, s, d);
  const std::int64_t global = s.B * s.block_size * d.size;  // positions the ranks' tables hold together
  std::uniform_int_distribution<std::int64_t> inside(0, global - 1), past(global, global + 500);
  std::uniform_int_distribution<int> kind(0, 99);
  for (std::int64_t i = 0; i < s.T * s.K; ++i) {
    const int k = kind(rng);
    const std::int64_t extreme = k % 2 ? std::numeric_limits<std::int32_t>::max() - k : std::numeric_limits<std::int32_t>::min() + k;
    in.logical.push_back(static_cast<std::int32_t>(k < 75 ? inside(rng) : k < 85 ? past(rng) : k < 93 ? -1 : k < 95 ? -7 : extreme));
  }
  return in;
}

class TopkConvertDcpTest : public BackendTest {
 protected:
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped()) return;
    stream = device->create_stream();
  }

  struct Result {
    std::vector<std::int32_t> physical, counts;
  };

  // One conversion into poisoned caller-owned outputs.
  Result convert(const reference::TopkInputs& in, std::int64_t R, const DcpConfig& d) {
    const auto req_id = device_tensor(*device, *stream, in.req_id, {in.num_tokens});
    const auto table = device_tensor(*device, *stream, in.block_table, {R, in.blocks_per_request});
    const auto logical = device_tensor(*device, *stream, in.logical, {in.num_tokens, in.num_topk});
    const auto out = poisoned(in.num_tokens * in.num_topk, {in.num_tokens, in.num_topk});
    const auto counts = poisoned(in.num_tokens, {in.num_tokens});
    TopkConvertParams params;
    params.block_size = in.block_size;
    params.return_valid_counts = !d.enabled();  // DCP counts whatever this says
    params.dcp = d;
    const TopkConversion got = convert_logical_to_physical_topk(*stream, req_id.tensor, table.tensor, logical.tensor,
                                                                params, out.tensor, counts.tensor);
    EXPECT_EQ(got.valid_counts.data(), counts.tensor.data());
    return {download_rows<std::int32_t>(*device, *stream, out.tensor),
            download_rows<std::int32_t>(*device, *stream, counts.tensor)};
  }

  DeviceTensor poisoned(std::int64_t n, std::vector<std::int64_t> shape) {
    return device_tensor(*device, *stream, std::vector<std::int32_t>(static_cast<std::size_t>(n), poison_i32), shape);
  }

  std::unique_ptr<Stream> stream;
};
SPARSE_MLA_INSTANTIATE_BACKENDS(TopkConvertDcpTest);

TEST_P(TopkConvertDcpTest, MatchesTheModelOverShapesRanksAndInterleaves) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(41);
  for (const DcpShape& s : shapes) {
    for (const DcpConfig base : {DcpConfig{8, 0, 1, true}, DcpConfig{4, 3, 16, true}, DcpConfig{2, 1, 8, false},
                                 DcpConfig{3, 2, 1, true}, DcpConfig{8, 5, 1, false}, DcpConfig{3, 1, 6, true},
                                 DcpConfig{5, 4, 3, false}, DcpConfig{7, 2, 16, true}}) {
      if (s.block_size % base.interleave != 0) continue;
      DcpConfig d = base;
      d.rank = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(d.size));
      SCOPED_TRACE(describe(s, d));
      const auto in = random_inputs(rng, s, d);
      const auto want = reference::convert_topk_dcp(in);
      const Result got = convert(in, s.R, d);
      EXPECT_EQ(got.physical, want.physical);
      EXPECT_EQ(got.counts, want.valid_counts);
    }
  }
}

// A table entry the kernel does not check can map a position inside the
// table to -1 (entry -1, offset block_size - 1): that entry is not valid, so
// a compacted row leaves it out and does not count it, like the model.
TEST_P(TopkConvertDcpTest, ATableEntryThatMapsToMinusOneIsNotCounted) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(45);
  for (const DcpShape& s : shapes) {
    const DcpConfig d{2, 1, 1, true};
    SCOPED_TRACE(describe(s, d));
    auto in = random_inputs(rng, s, d);
    for (std::int32_t& block : in.block_table) block = rng() % 2 ? -1 : block;
    // Positions with the last offset of a block, so that most rows hit one;
    // and in every row, entry 0 at this rank's local position
    // block_size - 1, whose block is -1 in every request's table.
    for (std::int32_t& tok : in.logical) {
      if (tok >= 0 && rng() % 4 == 0) tok |= s.block_size * d.size - 1;
    }
    const std::int64_t last = s.block_size - 1;
    for (std::int64_t r = 0; r < s.R; ++r) in.block_table[std::size_t(r * s.B)] = -1;
    for (std::int64_t t = 0; t < s.T; ++t) {
      in.logical[std::size_t(t * s.K)] =
          static_cast<std::int32_t>(last / d.interleave * d.size * d.interleave + d.rank * d.interleave + last % d.interleave);
    }
    const auto want = reference::convert_topk_dcp(in);
    // Entries inside the table that map to -1: the valid entries the model
    // finds once block -1 is block 0 (every offset then maps to a row), less
    // those it finds with the table as it is.
    auto without_minus_one = in;
    for (std::int32_t& block : without_minus_one.block_table) block = block == -1 ? 0 : block;
    const auto counts = reference::convert_topk_dcp(without_minus_one).valid_counts;
    const std::int64_t hits = std::accumulate(counts.begin(), counts.end(), std::int64_t{0}) -
                              std::accumulate(want.valid_counts.begin(), want.valid_counts.end(), std::int64_t{0});
    const Result got = convert(in, s.R, d);
    EXPECT_EQ(got.physical, want.physical);
    EXPECT_EQ(got.counts, want.valid_counts);
    EXPECT_GE(hits, s.T);  // the case is there to be taken, in every row
  }
}

// Each rank's KV cache holds, at the row its table gives a local position,
// a tag naming the (request, global position) stored there, as the engine
// lays the split out. Reading every rank's output through its own cache
// gives back, for every valid input entry, exactly one rank with that
// entry's tag: uncompacted in the entry's column, compacted in input order.
TEST_P(TopkConvertDcpTest, TheRanksOfASplitTogetherReconstructTheWholeConversion) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(42);
  for (const bool compact : {false, true}) {
    for (const DcpConfig split : {DcpConfig{4, 0, 16, compact}, DcpConfig{8, 0, 1, compact}, DcpConfig{3, 0, 2, compact}}) {
      const DcpShape s{37, 512, 4, 12, 64};
      SCOPED_TRACE(describe(s, split));
      const std::int64_t S = split.size, I = split.interleave, bs = s.block_size;
      const std::int64_t positions = s.B * bs * S;  // the context the ranks hold together, per request
      // Rank-local tables: distinct physical blocks per rank.
      std::vector<std::vector<std::int32_t>> tables(static_cast<std::size_t>(S));
      for (auto& table : tables) {
        std::vector<std::int32_t> blocks(static_cast<std::size_t>(s.R * s.B));
        for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<std::int32_t>(i);
        std::shuffle(blocks.begin(), blocks.end(), rng);
        table = blocks;
      }
      // Where the engine stores (request, position): rank and physical row.
      const auto tag = [&](std::int64_t r, std::int64_t p) { return static_cast<std::int32_t>(r * positions + p); };
      std::vector<std::map<std::int32_t, std::int32_t>> cache(static_cast<std::size_t>(S));  // row -> tag
      for (std::int64_t r = 0; r < s.R; ++r) {
        for (std::int64_t p = 0; p < positions; ++p) {
          const std::int64_t owner = (p / I) % S, local = (p / (S * I)) * I + p % I;
          const std::int32_t block = tables[std::size_t(owner)][std::size_t(r * s.B + local / bs)];
          cache[std::size_t(owner)][static_cast<std::int32_t>(block * bs + local % bs)] = tag(r, p);
        }
      }
      DcpConfig d = split;
      auto in = random_inputs(rng, s, d);
      std::vector<Result> outputs;
      for (std::int32_t rank = 0; rank < S; ++rank) {
        d.rank = rank;
        in.block_table = tables[std::size_t(rank)];
        outputs.push_back(convert(in, s.R, d));
      }
      std::int64_t wrong = 0;
      for (std::int64_t t = 0; t < s.T; ++t) {
        std::vector<std::vector<std::int32_t>> owned(static_cast<std::size_t>(S));  // tags each rank must give, in order
        std::int64_t valid = 0;
        for (std::int64_t j = 0; j < s.K; ++j) {
          const std::int64_t p = in.logical[std::size_t(t * s.K + j)];
          const bool held = p >= 0 && p < positions;
          valid += held;
          for (std::int64_t rank = 0; rank < S; ++rank) {
            const std::int32_t got = outputs[std::size_t(rank)].physical[std::size_t(t * s.K + j)];
            const bool mine = held && (p / I) % S == rank;
            if (mine) owned[std::size_t(rank)].push_back(tag(in.req_id[std::size_t(t)], p));
            if (compact) continue;
            if (!mine) {
              wrong += got != -1;
            } else {
              const auto at = cache[std::size_t(rank)].find(got);
              wrong += at == cache[std::size_t(rank)].end() || at->second != tag(in.req_id[std::size_t(t)], p);
            }
          }
        }
        std::int64_t counted = 0;
        for (std::int64_t rank = 0; rank < S; ++rank) {
          const Result& o = outputs[std::size_t(rank)];
          const auto& mine = owned[std::size_t(rank)];
          counted += o.counts[std::size_t(t)];
          wrong += o.counts[std::size_t(t)] != static_cast<std::int32_t>(mine.size());
          if (!compact) continue;
          for (std::int64_t j = 0; j < s.K; ++j) {
            const std::int32_t got = o.physical[std::size_t(t * s.K + j)];
            if (j >= static_cast<std::int64_t>(mine.size())) {
              wrong += got != -1;  // the compacted row's tail
              continue;
            }
            const auto at = cache[std::size_t(rank)].find(got);
            wrong += at == cache[std::size_t(rank)].end() || at->second != mine[std::size_t(j)];
          }
        }
        wrong += counted != valid;  // every valid entry is some rank's, once
      }
      EXPECT_EQ(wrong, 0);
    }
  }
}

// A split whose cycle (size x interleave) is 2^31 or more: every position is
// in the first cycle, so rank r owns [r x interleave, (r + 1) x interleave)
// at local positions from 0, and a rank that starts past 2^31 - 1 owns
// nothing; against the model, on shapes of each kernel path.
TEST_P(TopkConvertDcpTest, ASplitWiderThanEveryPositionOwnsOneRunARank) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(46);
  const std::int32_t huge = std::int32_t{1} << 26;  // x interleave 64: a cycle of 2^32
  for (const DcpShape& s : {DcpShape{1, 2048, 2, 4, 64}, DcpShape{600, 2048, 2, 4, 64}, DcpShape{7, 100, 2, 4, 64}}) {
    for (const std::int32_t rank : {0, 1, 5, huge / 2 - 1, huge / 2, huge - 1}) {
      const DcpConfig d{huge, rank, 64, true};
      SCOPED_TRACE(describe(s, d));
      reference::TopkInputs in = random_tables(rng, s, d);
      // Positions of ranks 0 to 7, and near the top of the range (the
      // last ranks' runs), and negatives.
      const std::int64_t top = std::numeric_limits<std::int32_t>::max();
      for (std::int64_t i = 0; i < s.T * s.K; ++i) {
        const std::uint64_t k = rng() % 10;
        in.logical.push_back(static_cast<std::int32_t>(k < 6 ? static_cast<std::int64_t>(rng() % 512)
                                                       : k < 8 ? top - static_cast<std::int64_t>(rng() % 200)
                                                       : k < 9 ? -1
                                                               : -static_cast<std::int64_t>(rng() % 100) - 2));
      }
      const auto want = reference::convert_topk_dcp(in);
      const Result got = convert(in, s.R, d);
      EXPECT_EQ(got.physical, want.physical);
      EXPECT_EQ(got.counts, want.valid_counts);
    }
  }
}

// The widest split whose size and interleave are powers of two that the
// kernels compute with masks (a cycle of 2^30, below 2^31): positions in
// cycles 0 and 1, inside and outside the rank's runs, near the top of the
// range, and negative; against the model, on shapes of each kernel path.
TEST_P(TopkConvertDcpTest, APowerOfTwoSplitOfTheWidestCycleMatchesTheModel) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(47);
  const std::int32_t size = std::int32_t{1} << 24, interleave = 64;  // a cycle of 2^30
  const std::int64_t cycle = std::int64_t{size} * interleave;
  for (const DcpShape& s : {DcpShape{1, 2048, 2, 4, 64}, DcpShape{600, 2048, 2, 4, 64}, DcpShape{7, 100, 2, 4, 64}}) {
    for (const std::int32_t rank : {0, 1, size / 2, size - 1}) {
      const DcpConfig d{size, rank, interleave, true};
      SCOPED_TRACE(describe(s, d));
      reference::TopkInputs in = random_tables(rng, s, d);
      const std::int64_t run = std::int64_t{rank} * interleave;  // the rank's run in each cycle
      const std::int64_t top = std::numeric_limits<std::int32_t>::max();
      for (std::int64_t i = 0; i < s.T * s.K; ++i) {
        const std::uint64_t k = rng() % 10;
        const std::int64_t near = static_cast<std::int64_t>(rng() % (3 * interleave)) - interleave;  // around the run
        const std::int64_t p = k < 3   ? run + near
                               : k < 6 ? cycle + run + near
                               : k < 7 ? static_cast<std::int64_t>(rng() % 512)
                               : k < 8 ? top - static_cast<std::int64_t>(rng() % 200)
                               : k < 9 ? -1
                                       : -static_cast<std::int64_t>(rng() % 100) - 2;
        in.logical.push_back(static_cast<std::int32_t>(p));
      }
      const auto want = reference::convert_topk_dcp(in);
      const Result got = convert(in, s.R, d);
      EXPECT_EQ(got.physical, want.physical);
      EXPECT_EQ(got.counts, want.valid_counts);
    }
  }
}

// Rows of which the rank owns every entry, all but one in every 128, three
// quarters, half, the first 33 and the first 32 of every 128, none, and
// runs of 64: the whole-round kernels' lane groups (128 entries each on
// GPUs) then own from none to all of their positions, which the gather
// compaction takes in up to four turns of 32. A tenth of the owned
// positions are past the rank's table, so that every turn drops some.
// Against the model, with the shift and the division forms of ownership,
// on shapes of the gather (one and two rounds) and of the staged compaction.
TEST_P(TopkConvertDcpTest, RowsOwnedFromNoneToEveryEntryMatchTheModel) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(48);
  for (const DcpConfig d : {DcpConfig{2, 1, 1, true}, DcpConfig{3, 1, 1, true}}) {
    for (const DcpShape& s : {DcpShape{8, 2048, 2, 40, 64}, DcpShape{16, 4096, 2, 70, 64}, DcpShape{600, 2048, 2, 40, 64}}) {
      SCOPED_TRACE(describe(s, d));
      reference::TopkInputs in = random_tables(rng, s, d);
      const std::int64_t inside = s.B * s.block_size;  // cycles of the split inside the rank's table
      for (std::int64_t t = 0; t < s.T; ++t) {
        for (std::int64_t k = 0; k < s.K; ++k) {
          const std::int64_t in_group = k % 128;
          bool owned = false;
          switch (t % 8) {
            case 0: owned = true; break;
            case 1: owned = in_group != 127; break;
            case 2: owned = rng() % 4 != 0; break;
            case 3: owned = rng() % 2 != 0; break;
            case 4: owned = in_group < 33; break;
            case 5: owned = in_group < 32; break;
            case 6: owned = false; break;
            default: owned = (k / 64) % 2 == 0; break;
          }
          const std::int64_t cycle = owned && rng() % 10 == 0 ? inside + static_cast<std::int64_t>(rng() % 100)
                                                              : static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(inside));
          const std::int64_t other = (d.rank + 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(d.size - 1))) % d.size;
          in.logical.push_back(static_cast<std::int32_t>(cycle * d.size + (owned ? d.rank : other)));
        }
      }
      const auto want = reference::convert_topk_dcp(in);
      const Result got = convert(in, s.R, d);
      EXPECT_EQ(got.physical, want.physical);
      EXPECT_EQ(got.counts, want.valid_counts);
    }
  }
}

// Rows this rank owns nothing of, rows past its table and a row of -1: all
// -1 and count 0, compacted or not; a rank's owned tokens past its table
// are -1 too.
TEST_P(TopkConvertDcpTest, RowsThatOwnNothingAreAllMinusOne) {
  SCOPED_TRACE(seed_trace());
  const DcpShape s{4, 8, 1, 2, 16};
  for (const bool compact : {false, true}) {
    const DcpConfig d{4, 1, 4, compact};  // rank 1 owns positions 4-7, 20-23, 36-39, ... ; local 0-3, 4-7, ...
    reference::TopkInputs in;
    in.num_tokens = s.T;
    in.num_topk = s.K;
    in.blocks_per_request = s.B;
    in.block_size = s.block_size;
    in.block_stride_rows = s.block_size;
    in.req_id = {0, 0, 0, 0};
    in.block_table = {7, 3};  // local positions 0-15 in block 7, 16-31 in block 3
    in.logical = {0, 1, 2, 3, 8, 9, 10, 11,           // rank 0 and 2: nothing of rank 1
                  -1, -1, -1, -1, -1, -1, -1, -1,     // all unused
                  132, 133, 148, 255, 260, 0, 4, -1,  // 132, 133, 148: local 32+ (past the table); 4: local 0
                  5, 0, 21, 0, 6, -2, 39, 7};         // 5 -> 7*16+1, 21 -> 7*16+5, 6 -> 7*16+2, 39 -> 7*16+11, 7 -> 7*16+3
    const Result got = convert(in, s.R, d);
    const std::vector<std::int32_t> row0(8, -1);
    EXPECT_EQ(std::vector<std::int32_t>(got.physical.begin(), got.physical.begin() + 8), row0);
    EXPECT_EQ(std::vector<std::int32_t>(got.physical.begin() + 8, got.physical.begin() + 16), row0);
    const std::vector<std::int32_t> row2 = compact ? std::vector<std::int32_t>{112, -1, -1, -1, -1, -1, -1, -1}
                                                   : std::vector<std::int32_t>{-1, -1, -1, -1, -1, -1, 112, -1};
    EXPECT_EQ(std::vector<std::int32_t>(got.physical.begin() + 16, got.physical.begin() + 24), row2);
    const std::vector<std::int32_t> row3 = compact ? std::vector<std::int32_t>{113, 117, 114, 123, 115, -1, -1, -1}
                                                   : std::vector<std::int32_t>{113, -1, 117, -1, 114, -1, 123, 115};
    EXPECT_EQ(std::vector<std::int32_t>(got.physical.begin() + 24, got.physical.end()), row3);
    EXPECT_EQ(got.counts, (std::vector<std::int32_t>{0, 0, 1, 5}));
    in.set_dcp(d);
    EXPECT_EQ(got.physical, reference::convert_topk_dcp(in).physical);
  }
}

// dcp_size 1 is the plain conversion exactly: no filter and no compaction.
TEST_P(TopkConvertDcpTest, OneRankIsThePlainConversion) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(43);
  for (const DcpShape& s : {shapes[0], shapes[3], shapes[4]}) {
    const DcpConfig d{1, 0, 1, true};
    SCOPED_TRACE(describe(s, d));
    auto in = random_inputs(rng, s, DcpConfig{2, 0, 1, true});
    in.dcp_size = 1;
    const auto want = reference::convert_topk(in);
    const Result got = convert(in, s.R, d);
    EXPECT_EQ(got.physical, want.physical);
    EXPECT_EQ(got.counts, want.valid_counts);
  }
}

TEST_P(TopkConvertDcpTest, BadSplitsAreRefusedAndNothingIsWritten) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(44);
  const DcpShape s{3, 64, 2, 4, 16};
  const auto in = random_inputs(rng, s, DcpConfig{2, 0, 1, true});
  const auto req_id = device_tensor(*device, *stream, in.req_id, {s.T});
  const auto table = device_tensor(*device, *stream, in.block_table, {s.R, s.B});
  const auto logical = device_tensor(*device, *stream, in.logical, {s.T, s.K});
  const auto starts = device_tensor(*device, *stream, std::vector<std::int32_t>{0}, {1});
  const auto out = poisoned(s.T * s.K, {s.T, s.K});
  const auto counts = poisoned(s.T, {s.T});
  struct Bad {
    DcpConfig dcp;
    bool workspace;
    const char* message;
  };
  for (const Bad& bad : {Bad{{0, 0, 1, true}, false, "dcp.size must be at least 1, got 0"},
                         Bad{{4, 4, 1, true}, false, "dcp.rank must be in [0, dcp.size) = [0, 4), got 4"},
                         Bad{{4, -1, 1, true}, false, "dcp.rank must be in [0, dcp.size) = [0, 4), got -1"},
                         Bad{{4, 1, 3, true}, false, "dcp.interleave must be positive and divide block_size 16, got 3"},
                         Bad{{4, 1, 0, false}, false, "dcp.interleave must be positive and divide block_size 16, got 0"},
                         Bad{{2, 1, 1, true}, true, "the prefill-workspace variant has no DCP form (dcp.size is 2)"}}) {
    SCOPED_TRACE(bad.message);
    TopkConvertParams params;
    params.block_size = s.block_size;
    params.dcp = bad.dcp;
    if (bad.workspace) {
      params.workspace_request = req_id.tensor;
      params.workspace_starts = starts.tensor;
    }
    const std::string message = error_of([&] {
      (void)convert_logical_to_physical_topk(*stream, req_id.tensor, table.tensor, logical.tensor, params, out.tensor,
                                             counts.tensor);
    });
    EXPECT_NE(message.find(bad.message), std::string::npos) << message;
    EXPECT_NE(message.find("convert_logical_to_physical_topk"), std::string::npos) << message;
    EXPECT_EQ(download_rows<std::int32_t>(*device, *stream, out.tensor),
              std::vector<std::int32_t>(static_cast<std::size_t>(s.T * s.K), poison_i32));
    EXPECT_EQ(download_rows<std::int32_t>(*device, *stream, counts.tensor),
              std::vector<std::int32_t>(static_cast<std::size_t>(s.T), poison_i32));
  }
}

}  // namespace
}  // namespace sparse_mla::testing
