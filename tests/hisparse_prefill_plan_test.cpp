// The HiSparse prefill staging plan built on the device (SPEC section 5;
// plan_hisparse_prefill_staging) on every backend, against the host builder
// (build_hisparse_prefill_staging_plan): the same plan for the blocks in use
// on fresh random requests, bad entries staged as the null block and
// reported by check_hisparse_prefill_plan with the host builder's words,
// argument errors refused before anything is queued, and the same staged
// rows and FP8 prefill rows as through a host plan, queued without a host
// synchronisation.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend_test.hpp"
#include "host/host_device.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/fill.hpp"
#include "sparse_mla/fp8_upconvert.hpp"
#include "sparse_mla/hisparse_group.hpp"
#include "sparse_mla/hisparse_prefill.hpp"
#include "sparse_mla/index_group_builder.hpp"
#include "host_gate.hpp"
#include "hisparse_engine.hpp"
#include "test_util.hpp"

namespace sparse_mla::testing {
namespace {

class HiSparsePrefillPlanTest : public BackendTest {};
SPARSE_MLA_INSTANTIATE_BACKENDS(HiSparsePrefillPlanTest);
class HiSparsePrefillPlanGraphTest : public GraphBackendTest {};
SPARSE_MLA_INSTANTIATE_BACKENDS(HiSparsePrefillPlanGraphTest);

// The prefill requests' tables as the host builder takes them.
struct PlanInputs {
  std::int64_t P = 0, B = 0;
  std::vector<std::int32_t> table;  // [P, B]
  std::vector<std::int64_t> lengths;
  std::int64_t resident_B = 0;
  std::vector<std::int32_t> resident;  // [P, resident_B], or empty
  std::int32_t resident_null = 0;

  std::vector<std::int32_t> lengths_i32() const { return std::vector<std::int32_t>(lengths.begin(), lengths.end()); }
  HiSparsePrefillStagingPlan host_plan(Device& device, Stream& stream, std::int32_t block_size) const {
    return build_hisparse_prefill_staging_plan(device, stream, table, P, B, lengths, block_size, resident, resident_B,
                                               resident_null);
  }
};

// Random requests over a pool of pool_blocks blocks: half of the entries
// come from a few popular blocks (shared between requests and repeated
// inside one), some requests are empty or full, most end in a partial block;
// entries past a context are garbage (negative, past the pool) that must not
// be read; resident tables are shorter or longer than B, with null and
// negative pages.
PlanInputs random_inputs(std::mt19937_64& rng, std::int64_t max_P, std::int64_t max_B, std::int64_t pool_blocks,
                         std::int32_t block_size, bool with_resident) {
  PlanInputs in;
  in.P = 1 + static_cast<std::int64_t>(rng() % std::uint64_t(max_P));
  in.B = 1 + static_cast<std::int64_t>(rng() % std::uint64_t(max_B));
  std::vector<std::int32_t> popular(8);
  for (auto& id : popular) id = static_cast<std::int32_t>(rng() % std::uint64_t(pool_blocks));
  for (std::int64_t p = 0; p < in.P; ++p) {
    const std::uint64_t kind = rng() % 6;
    const std::int64_t full = in.B * block_size;
    const std::int64_t length = kind == 0 ? 0 : kind == 1 ? full : 1 + static_cast<std::int64_t>(rng() % std::uint64_t(full));
    in.lengths.push_back(length);
    const std::int64_t used = (length + block_size - 1) / block_size;
    for (std::int64_t b = 0; b < in.B; ++b) {
      std::int32_t id;
      if (b >= used) {
        const std::uint64_t garbage = rng() % 3;
        id = garbage == 0 ? -1 : garbage == 1 ? static_cast<std::int32_t>(pool_blocks + 5) : static_cast<std::int32_t>(rng() % std::uint64_t(pool_blocks));
      } else {
        id = rng() % 2 == 0 ? popular[rng() % popular.size()] : static_cast<std::int32_t>(rng() % std::uint64_t(pool_blocks));
      }
      in.table.push_back(id);
    }
  }
  if (with_resident) {
    in.resident_B = static_cast<std::int64_t>(rng() % std::uint64_t(in.B + 3));
    const std::int32_t nulls[] = {0, 3, -1};
    in.resident_null = nulls[rng() % 3];
    for (std::int64_t i = 0; i < in.P * in.resident_B; ++i) {
      const std::uint64_t kind = rng() % 4;
      in.resident.push_back(kind == 0 ? in.resident_null : kind == 1 ? -2 : static_cast<std::int32_t>(rng() % 500));
    }
  }
  return in;
}

// The inputs on the device: the block table as columns of a wider table
// (rows further apart than B), the lengths as int32.
struct DeviceInputs {
  DeviceTensor wide_table, lengths, resident;
  Tensor table;

  DeviceInputs(Device& device, Stream& stream, const PlanInputs& in) {
    const std::int64_t pad = 3;
    std::vector<std::int32_t> wide;
    for (std::int64_t p = 0; p < in.P; ++p) {
      wide.insert(wide.end(), in.table.begin() + p * in.B, in.table.begin() + (p + 1) * in.B);
      wide.insert(wide.end(), std::size_t(pad), -77);
    }
    wide_table = device_tensor(device, stream, wide, {in.P, in.B + pad});
    table = wide_table.tensor.narrow(1, 0, in.B);
    lengths = device_tensor(device, stream, in.lengths_i32(), {in.P});
    if (!in.resident.empty() || in.resident_B > 0) {
      resident = device_tensor(device, stream, in.resident, {in.P, in.resident_B});
    }
  }
  HiSparsePrefillStagingPlan plan(Stream& stream, const PlanInputs& in, HiSparsePrefillPlanStorage& storage) const {
    return plan_hisparse_prefill_staging(stream, table, lengths.tensor, resident.tensor, in.resident_null, storage);
  }
};

void poison(Stream& stream, const HiSparsePrefillPlanStorage& storage) {
  for (const Tensor* t : {&storage.block_table(), &storage.row_ids(), &storage.gpu_row_ids(), &storage.error_record(),
                          &storage.scratch()}) {
    fill_i32(stream, *t, poison_i32);
  }
}

// Everything the storage holds, packed (to see that a refused call wrote nothing).
std::vector<std::int32_t> storage_contents(Stream& stream, const HiSparsePrefillPlanStorage& storage) {
  std::vector<std::int32_t> all;
  for (const Tensor* t : {&storage.block_table(), &storage.row_ids(), &storage.gpu_row_ids(), &storage.error_record(),
                          &storage.scratch()}) {
    if (t->numel() == 0) continue;
    const std::vector<std::int32_t> part = download<std::int32_t>(stream, *t);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

// The device plan is the host plan for the blocks in use, -1 beyond them.
void expect_same_plan(Stream& stream, const HiSparsePrefillStagingPlan& device_plan, const HiSparsePrefillStagingPlan& host_plan,
                      const HiSparsePrefillPlanStorage& storage) {
  ASSERT_TRUE(device_plan.built_on_device());
  EXPECT_EQ(device_plan.built_in, &storage);
  EXPECT_EQ(device_plan.num_blocks, storage.num_blocks());
  EXPECT_EQ(device_plan.block_size, host_plan.block_size);
  EXPECT_EQ(device_plan.has_resident_table, host_plan.has_resident_table);
  EXPECT_TRUE(device_plan.host_block_table.empty() && device_plan.host_row_ids.empty() && device_plan.host_gpu_row_ids.empty());
  ASSERT_LE(host_plan.num_blocks, device_plan.num_blocks);
  EXPECT_EQ(download<std::int32_t>(stream, device_plan.block_table), host_plan.host_block_table) << "block table";
  const std::size_t used = host_plan.host_row_ids.size();
  for (const auto& [name, got_t, want] : {std::make_tuple("row_ids", &device_plan.row_ids, &host_plan.host_row_ids),
                                          std::make_tuple("gpu_row_ids", &device_plan.gpu_row_ids, &host_plan.host_gpu_row_ids)}) {
    const std::vector<std::int32_t> got = download<std::int32_t>(stream, *got_t);
    ASSERT_EQ(got.size(), std::size_t(device_plan.num_blocks * device_plan.block_size)) << name;
    EXPECT_TRUE(std::equal(want->begin(), want->end(), got.begin())) << name << ": the used prefix differs";
    EXPECT_EQ(std::count(got.begin() + std::ptrdiff_t(used), got.end(), -1), std::ptrdiff_t(got.size() - used))
        << name << ": the tail past the last used block is not all -1";
  }
  EXPECT_NO_THROW(check_hisparse_prefill_plan(stream, device_plan));
}

TEST_P(HiSparsePrefillPlanTest, DevicePlanEqualsTheHostPlanOnRandomRequests) {
  SCOPED_TRACE(seed_trace());
  auto stream = device->create_stream();
  const std::int32_t block_sizes[] = {16, 64, 1, 5};
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto rng = seeded_rng(100 + std::uint64_t(round));
    const std::int32_t block_size = block_sizes[round % 4];
    const std::int64_t pool_blocks = round == 7 ? 40000 : 1000 + static_cast<std::int64_t>(rng() % 4000);
    const std::int64_t max_P = 8, max_B = 48;
    // Two plans into one storage: the second one overwrites the first
    // without a poison in between.
    const PlanInputs first = random_inputs(rng, max_P, max_B, pool_blocks, block_size, round % 2 == 0);
    const PlanInputs second = random_inputs(rng, max_P, max_B, pool_blocks, block_size, round % 3 != 0);
    const HiSparsePrefillStagingPlan first_host = first.host_plan(*device, *stream, block_size);
    const HiSparsePrefillStagingPlan second_host = second.host_plan(*device, *stream, block_size);
    // Exactly as many staged blocks as the larger plan needs, or more.
    const std::int64_t needed = std::max(first_host.num_blocks, second_host.num_blocks) - 1;
    const std::int64_t max_staged = round % 4 == 1 ? needed : needed + 1 + static_cast<std::int64_t>(rng() % 50);
    HiSparsePrefillPlanStorage storage(*device, max_P, max_B, max_staged, pool_blocks, block_size);
    poison(*stream, storage);
    const DeviceInputs first_d(*device, *stream, first);
    expect_same_plan(*stream, first_d.plan(*stream, first, storage), first_host, storage);
    const DeviceInputs second_d(*device, *stream, second);
    expect_same_plan(*stream, second_d.plan(*stream, second, storage), second_host, storage);
  }
}

// The part of an Error's message after "where: ".
std::string why(const std::string& message) { return message.substr(message.find(": ") + 2); }

TEST_P(HiSparsePrefillPlanTest, EveryBadEntryIsStagedAsTheNullBlockAndReportedByTheCheck) {
  SCOPED_TRACE(seed_trace());
  auto stream = device->create_stream();
  const std::int32_t block_size = 16;
  const std::int64_t pool_blocks = 3000;
  HiSparsePrefillPlanStorage storage(*device, 4, 8, 20, pool_blocks, block_size);
  PlanInputs good;
  good.P = 3;
  good.B = 6;
  good.lengths = {40, 96, 17};  // 3, 6 and 2 blocks
  good.table = {7, 11, 7, 900, 901, 902,  //
                11, 12, 13, 14, 15, 16,   //
                2999, 0, 5, 5, 5, 5};
  struct Case {
    const char* name;
    void (*spoil)(PlanInputs&);
    const char* message;  // after "plan_hisparse_prefill_staging: "
    bool host_says_the_same;  // the host builder refuses it with the same words
    std::int64_t request, block;  // the entry staged as the null block (block -1: the whole request)
  };
  const Case cases[] = {
      {"negative block", [](PlanInputs& in) { in.table[1 * 6 + 2] = -5; },
       "block_table[1, 2] = -5 lies inside the context of request 1", true, 1, 2},
      {"block past the pool", [](PlanInputs& in) { in.table[0 * 6 + 1] = 3000; },
       "block_table[0, 1] = 3000 lies inside the context of request 0 but outside the host pool's 3000 blocks", false, 0, 1},
      {"negative context length", [](PlanInputs& in) { in.lengths[2] = -3; },
       "context length -3 of prefill request 2 needs 0 blocks but the block table has 6", true, 2, -1},
      {"context longer than the table", [](PlanInputs& in) { in.lengths[0] = 6 * 16 + 1; },
       "context length 97 of prefill request 0 needs 7 blocks but the block table has 6", true, 0, -1},
      {"the first of several in request order", [](PlanInputs& in) {
         in.table[2 * 6 + 1] = -1;
         in.table[1 * 6 + 4] = 9999;
       },
       "block_table[1, 4] = 9999 lies inside the context of request 1 but outside the host pool's 3000 blocks", false, 1, 4},
      {"a request's length before its blocks", [](PlanInputs& in) {
         in.lengths[1] = -1;
         in.table[1 * 6 + 0] = -7;
       },
       "context length -1 of prefill request 1 needs 0 blocks but the block table has 6", true, 1, -1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PlanInputs in = good;
    c.spoil(in);
    poison(*stream, storage);
    const DeviceInputs d(*device, *stream, in);
    const HiSparsePrefillStagingPlan plan = d.plan(*stream, in, storage);
    const std::string message = error_of([&] { check_hisparse_prefill_plan(*stream, plan); });
    EXPECT_EQ(message, std::string("plan_hisparse_prefill_staging: ") + c.message);
    if (c.host_says_the_same) {
      EXPECT_EQ(why(message), why(error_of([&] { in.host_plan(*device, *stream, block_size); })));
    }
    // The bad entry (or request) is the null block; every other entry of a
    // context is staged from its own host block.
    const std::vector<std::int32_t> table = download<std::int32_t>(*stream, plan.block_table);
    const std::vector<std::int32_t> rows = download<std::int32_t>(*stream, plan.row_ids);
    for (std::int64_t p = 0; p < in.P; ++p) {
      for (std::int64_t b = 0; b < in.B; ++b) {
        const std::int32_t compact = table[std::size_t(p * in.B + b)];
        const bool inside = b * block_size < std::max<std::int64_t>(in.lengths[std::size_t(p)], 0);
        const std::int32_t id = in.table[std::size_t(p * in.B + b)];
        if (p == c.request && (c.block < 0 || b == c.block)) {
          EXPECT_EQ(compact, 0) << "bad entry [" << p << ", " << b << "]";
        } else if (!inside || id < 0 || id >= pool_blocks) {
          EXPECT_EQ(compact, 0) << "entry [" << p << ", " << b << "]";
        } else {
          ASSERT_GT(compact, 0) << "entry [" << p << ", " << b << "]";
          EXPECT_EQ(rows[std::size_t(compact * block_size)], id * block_size) << "entry [" << p << ", " << b << "]";
        }
      }
    }
  }
  // A block past a context is not read, and a good plan into the same
  // storage clears the record.
  PlanInputs past = good;
  past.table[0 * 6 + 5] = -9;
  const DeviceInputs d(*device, *stream, past);
  expect_same_plan(*stream, d.plan(*stream, past, storage), past.host_plan(*device, *stream, block_size), storage);
  // A host plan was checked when it was built.
  EXPECT_NO_THROW(check_hisparse_prefill_plan(*stream, good.host_plan(*device, *stream, block_size)));
}

TEST_P(HiSparsePrefillPlanTest, MoreDistinctBlocksThanTheStorageHoldsKeepsTheSmallestAndReportsTheFirstThatDoesNotFit) {
  SCOPED_TRACE(seed_trace());
  auto stream = device->create_stream();
  const std::int32_t block_size = 4;
  HiSparsePrefillPlanStorage storage(*device, 2, 4, 4, 100, block_size);
  poison(*stream, storage);
  PlanInputs in;
  in.P = 2;
  in.B = 4;
  in.lengths = {16, 15};
  in.table = {50, 10, 40, 20,  //
              30, 60, 10, 50};
  const DeviceInputs d(*device, *stream, in);
  const HiSparsePrefillStagingPlan plan = d.plan(*stream, in, storage);
  EXPECT_EQ(error_of([&] { check_hisparse_prefill_plan(*stream, plan); }),
            "plan_hisparse_prefill_staging: the prefill requests use 6 distinct blocks but the plan storage holds 4 "
            "(block_table[0, 0] is the first that does not fit)");
  // Blocks 10, 20, 30, 40 fit (compact 1 .. 4); 50 and 60 are the null block.
  EXPECT_EQ(download<std::int32_t>(*stream, plan.block_table), (std::vector<std::int32_t>{0, 1, 4, 2, 3, 0, 1, 0}));
  const std::vector<std::int32_t> rows = download<std::int32_t>(*stream, plan.row_ids);
  std::vector<std::int32_t> want(std::size_t(block_size), -1);
  for (std::int32_t id : {10, 20, 30, 40}) {
    for (std::int32_t off = 0; off < block_size; ++off) want.push_back(id * block_size + off);
  }
  EXPECT_EQ(rows, want);
}

TEST_P(HiSparsePrefillPlanTest, ArgumentErrorsAreRefusedBeforeAnythingIsQueued) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(7);
  auto stream = device->create_stream();
  HiSparsePrefillPlanStorage storage(*device, 4, 8, 16, 1000, 16);
  poison(*stream, storage);
  const std::vector<std::int32_t> poisoned = storage_contents(*stream, storage);
  const PlanInputs in = [&] {
    PlanInputs r = random_inputs(rng, 3, 8, 1000, 16, true);
    while (r.P < 3 || r.B < 8 || r.resident_B == 0) r = random_inputs(rng, 3, 8, 1000, 16, true);
    return r;
  }();
  const DeviceInputs good(*device, *stream, in);
  auto other_device = open_device(GetParam());
  auto other_stream = other_device->create_stream();
  const DeviceTensor foreign = device_tensor(*other_device, *other_stream, std::vector<std::int32_t>(256, 0), {256});
  const auto foreign_like = [&](const Tensor& like) {
    std::vector<std::int64_t> shape;
    for (int i = 0; i < like.rank(); ++i) shape.push_back(like.dim(i));
    return Tensor(foreign.buffer.data(), like.dtype(), shape, MemoryKind::device, other_device.get());
  };
  const auto as = [](const Tensor& t, DType dtype, std::vector<std::int64_t> shape) {
    return Tensor(t.data(), dtype, shape, t.kind(), t.device());
  };
  const DeviceTensor lengths_i64 = device_tensor(*device, *stream, in.lengths, {in.P});
  const DeviceTensor big_table = device_tensor(*device, *stream, std::vector<std::int32_t>(5 * 9, 1), {5, 9});
  struct Call {
    Tensor table, lengths, resident;
  };
  const Call ok{good.table, good.lengths.tensor, good.resident.tensor};
  struct Rejection {
    const char* name;
    Call call;
    std::string message;  // after "plan_hisparse_prefill_staging: "
  };
  const Rejection rejections[] = {
      {"table dtype", {as(ok.table, DType::i16, {3, 8}), ok.lengths, ok.resident}, "block_table has dtype I16, expected I32"},
      {"table rank", {as(ok.table, DType::i32, {24}), ok.lengths, ok.resident}, "block_table has shape [24] (1 dims), expected 2 dims"},
      {"lengths dtype", {ok.table, lengths_i64.tensor, ok.resident}, "context_lengths has dtype I64, expected I32"},
      {"resident dtype", {ok.table, ok.lengths, as(ok.resident, DType::u8, {3, ok.resident.dim(1)})},
       "resident_block_table has dtype U8, expected I32"},
      {"table on another device", {foreign_like(ok.table), ok.lengths, ok.resident}, "block_table lives on another device"},
      {"lengths on another device", {ok.table, foreign_like(ok.lengths), ok.resident}, "context_lengths lives on another device"},
      {"resident on another device", {ok.table, ok.lengths, foreign_like(ok.resident)},
       "resident_block_table lives on another device"},
      {"more requests than the storage holds", {big_table.tensor.narrow(1, 0, 8), ok.lengths, ok.resident},
       "block_table has shape [5, 8] but dimension 0 must be <= 4 (max_requests of the plan storage)"},
      {"more blocks than the storage holds", {big_table.tensor.rows(0, 3), ok.lengths, ok.resident},
       "block_table has shape [3, 9] but dimension 1 must be <= 8 (blocks_per_request of the plan storage)"},
      {"too few lengths", {ok.table, ok.lengths.rows(0, 2), ok.resident},
       "context_lengths has shape [2] but dimension 0 must be >= 3 (one per row of block_table)"},
      {"too few resident rows", {ok.table, ok.lengths, ok.resident.rows(0, 1)},
       "resident_block_table has shape [1, " + std::to_string(ok.resident.dim(1)) +
           "] but dimension 0 must be >= 3 (one per row of block_table)"},
  };
  for (const Rejection& r : rejections) {
    SCOPED_TRACE(r.name);
    const std::string message =
        error_of([&] { plan_hisparse_prefill_staging(*stream, r.call.table, r.call.lengths, r.call.resident, 0, storage); });
    const std::string want = "plan_hisparse_prefill_staging: " + r.message;
    EXPECT_EQ(message.substr(0, want.size()), want);
  }
  EXPECT_EQ(error_of([&] { plan_hisparse_prefill_staging(*other_stream, ok.table, ok.lengths, ok.resident, 0, storage); }),
            "plan_hisparse_prefill_staging: the stream belongs to another device than the plan storage");
  EXPECT_EQ(storage_contents(*stream, storage), poisoned) << "a refused call wrote into the storage";

  // Sizes the kernel cannot number are refused at construction.
  EXPECT_NE(error_of([&] { HiSparsePrefillPlanStorage(*device, 4, 8, 16, 1000, 0); }).find("block_size >= 1"), std::string::npos);
  EXPECT_NE(error_of([&] { HiSparsePrefillPlanStorage(*device, 70000, 70000, 16, 1000, 16); })
                .find("max_requests 70000 * (blocks_per_request 70000 + 1) must be below 2^31 - 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { HiSparsePrefillPlanStorage(*device, 4, 8, 16, 1 << 28, 64); })
                .find("pool_blocks 268435456 * block_size 64 host rows do not fit int32 row ids"),
            std::string::npos);
}

// The engine captures the plan's kernels once and replays them with new
// requests written in place (GPU backends; the host has no graphs).
TEST_P(HiSparsePrefillPlanGraphTest, ACapturedPlanReplaysWithNewRequestsInPlace) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(43);
  auto stream = device->create_stream();
  const std::int32_t block_size = 64;
  const std::int64_t pool_blocks = 3000, P = 6, B = 32;
  HiSparsePrefillPlanStorage storage(*device, P, B, P * B, pool_blocks, block_size);
  const auto fresh = [&] {
    PlanInputs in = random_inputs(rng, P, B, pool_blocks, block_size, true);
    while (in.P != P || in.B != B || in.resident_B != B) in = random_inputs(rng, P, B, pool_blocks, block_size, true);
    in.resident_null = 0;
    return in;
  };
  PlanInputs in = fresh();
  const DeviceInputs d(*device, *stream, in);
  // Warm-up outside the capture: Kokkos sizes its launch resources on the
  // first launch, which a capture would refuse.
  expect_same_plan(*stream, d.plan(*stream, in, storage), in.host_plan(*device, *stream, block_size), storage);
  stream->begin_capture();
  const HiSparsePrefillStagingPlan plan = d.plan(*stream, in, storage);
  std::unique_ptr<Graph> graph = stream->end_capture();
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    in = fresh();
    std::vector<std::int32_t> wide;
    for (std::int64_t p = 0; p < P; ++p) {
      wide.insert(wide.end(), in.table.begin() + p * B, in.table.begin() + (p + 1) * B);
      wide.insert(wide.end(), 3, -77);
    }
    upload_bytes(*stream, wide.data(), wide.size() * 4, d.wide_table.tensor);
    const std::vector<std::int32_t> lengths = in.lengths_i32();
    upload_bytes(*stream, lengths.data(), lengths.size() * 4, d.lengths.tensor);
    upload_bytes(*stream, in.resident.data(), in.resident.size() * 4, d.resident.tensor);
    poison(*stream, storage);
    graph->replay(*stream);
    expect_same_plan(*stream, plan, in.host_plan(*device, *stream, block_size), storage);
  }
}

// ---- Through a HiSparse group ----

constexpr std::int32_t K = 64, H = 128, requests = 4, blocks = 16, block_size = 16;

HiSparseConfig small_config() {
  HiSparseConfig c;
  c.hot_slots = H;
  c.max_requests = requests;
  c.max_tokens_per_request = blocks * block_size;
  c.host_pool_rows = (requests * blocks + 4) * block_size;
  c.block_size = block_size;
  c.attention_block_stride = 2 * block_size;
  return c;
}

LayerConfig hisparse_layer(const char* dtype, std::int64_t head_size) {
  LayerConfig c;
  c.kv_cache_dtype = dtype;
  c.head_size = head_size;
  c.hisparse = small_config();
  return c;
}

// One HiSparse group of two layers with random host pools and a source
// table of distinct blocks (the model of tests/hisparse_group_test.cpp).
struct GroupRig : HiSparseEngine {
  GroupRig(std::shared_ptr<Device> d, const std::vector<LayerConfig>& configs, std::mt19937_64& rng)
      : HiSparseEngine(std::move(d), HiSparseShape{K, H, requests, blocks, block_size, 8}, small_config(),
                       first_produces(configs.size()), configs, rng) {}

  static std::vector<bool> first_produces(std::size_t layers) {
    std::vector<bool> producing(layers, false);
    if (layers > 0) producing[0] = true;
    return producing;
  }
  std::int64_t pool_blocks() const { return tables.host_rows / block_size; }

  // The source rows of `rows` as one prefill table [rows.size(), blocks].
  std::vector<std::int32_t> table_of(const std::vector<std::int32_t>& rows) const {
    std::vector<std::int32_t> table;
    for (std::int32_t r : rows) {
      table.insert(table.end(), tables.source_table.begin() + r * blocks, tables.source_table.begin() + (r + 1) * blocks);
    }
    return table;
  }
};

TEST_P(HiSparsePrefillPlanTest, StagingIntoACallerTensorThroughADevicePlanGivesTheHostPlansRows) {
  SCOPED_TRACE(seed_trace());
  DelayScope delay(200);
  auto rng = seeded_rng(41);
  GroupRig rig(device, {hisparse_layer("fp8_ds_mla", 576), hisparse_layer("bfloat16", 576)}, rng);
  Stream& compute = *rig.compute;
  // Prefill requests 1, 3, 0 and 2 (plan rows 0 .. 3): rows 0 and 1 share
  // two blocks, row 2 is empty, the others end in a partial block. The
  // shared block rows[0] is first used by (0, 0), which is not resident, so
  // its later resident page at (1, 2) is not used.
  PlanInputs in;
  in.P = 4;
  in.B = blocks;
  in.table = rig.table_of({1, 3, 0, 2});
  in.table[std::size_t(blocks + 2)] = in.table[0];
  in.table[std::size_t(blocks + 3)] = in.table[1];
  in.lengths = {70, 100, 0, 33};
  in.resident_B = blocks;
  in.resident.assign(std::size_t(in.P * blocks), 0);
  in.resident[1] = 3;
  in.resident[std::size_t(blocks + 4)] = 5;
  in.resident[std::size_t(blocks + 2)] = 6;
  in.resident[std::size_t(3 * blocks + 1)] = 7;
  const HiSparsePrefillStagingPlan host_plan = in.host_plan(*device, compute, block_size);
  HiSparsePrefillPlanStorage storage(*device, requests, blocks, 24, rig.pool_blocks(), block_size);
  poison(compute, storage);
  const DeviceInputs d(*device, compute, in);

  for (std::size_t layer = 0; layer < 2; ++layer) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    HiSparseMLAIndexGroup& g = rig.group(layer);
    const int index = rig.layers[layer].index_in_group;
    const std::int64_t rb = rig.row_bytes(layer);
    std::vector<std::uint8_t> resident_bytes(std::size_t(8 * block_size * rb));
    for (auto& b : resident_bytes) b = static_cast<std::uint8_t>(rng());
    const auto resident_cache = device_tensor(*device, compute, resident_bytes, {8, block_size, rb});
    const auto want_t = g.stage_prefill_rows(index, compute, host_plan, resident_cache.tensor);
    const std::vector<std::uint8_t> want = download<std::uint8_t>(compute, want_t);
    // Layer 0 stages into a flat [rows + 3, row_bytes] tensor, layer 1 into
    // [num_blocks, block_size, row_bytes]; both poisoned.
    const std::int64_t rows = storage.num_blocks() * block_size;
    OwnedTensor staged = layer == 0 ? OwnedTensor(*device, DType::u8, {rows + 3, rb})
                                    : OwnedTensor(*device, DType::u8, {storage.num_blocks(), block_size, rb});
    compute.fill(staged.buffer(), 0, poison_byte, staged.bytes());
    {
      // Planning and staging are queued without waiting for the host.
      HostGate gate(compute);
      const HiSparsePrefillStagingPlan plan = d.plan(compute, in, storage);
      g.stage_prefill_rows(index, compute, plan, resident_cache.tensor, staged);
      EXPECT_TRUE(gate.still_closed()) << "planning or staging waited for the held stream: a host synchronisation";
      gate.open();
      const std::vector<std::uint8_t> got = download<std::uint8_t>(compute, staged);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin())) << "the rows of the blocks in use differ";
      const auto tail_end = got.begin() + rows * rb;
      EXPECT_EQ(std::count(got.begin() + std::ptrdiff_t(want.size()), tail_end, std::uint8_t{0}),
                std::ptrdiff_t(rows * rb) - std::ptrdiff_t(want.size()))
          << "the unused tail is not zero-filled";
      EXPECT_EQ(std::count(tail_end, got.end(), poison_byte), got.end() - tail_end) << "staging wrote past the plan's rows";

      const auto staged_view = [&](DType dtype, std::vector<std::int64_t> shape) {
        return Tensor(staged.data(), dtype, shape, staged.tensor().kind(), staged.tensor().device());
      };
      EXPECT_NE(error_of([&] { g.stage_prefill_rows(index, compute, plan, resident_cache.tensor, staged_view(DType::u8, {storage.num_blocks() - 1, block_size, rb})); })
                    .find("staged has shape [" + std::to_string(storage.num_blocks() - 1) + ", 16, " + std::to_string(rb) +
                          "] but dimension 0 must be >= " + std::to_string(storage.num_blocks()) + " (the plan's staged blocks)"),
                std::string::npos);
      EXPECT_NE(error_of([&] { g.stage_prefill_rows(index, compute, plan, resident_cache.tensor, staged_view(DType::u8, {rows - 1, rb})); })
                    .find("(the plan's staged rows)"),
                std::string::npos);
      EXPECT_NE(error_of([&] { g.stage_prefill_rows(index, compute, plan, resident_cache.tensor, staged_view(DType::u8, {rows, rb - 16})); })
                    .find("(row bytes of the layer)"),
                std::string::npos);
      EXPECT_NE(error_of([&] { g.stage_prefill_rows(index, compute, plan, resident_cache.tensor, staged_view(DType::i32, {rows, rb / 4})); })
                    .find("staged has dtype I32, expected U8"),
                std::string::npos);
    }
  }
}

// A device tensor of bf16 values (bit patterns), [rows, 576].
DeviceTensor bf16_tensor(Device& device, Stream& stream, const std::vector<std::uint16_t>& bits, std::int64_t rows) {
  DeviceTensor t{upload(device, stream, bits), Tensor()};
  t.tensor = Tensor::of(t.buffer, DType::bf16, {rows, 576});
  return t;
}

// FP8 prefill (the host-backed gather-upconvert) reads the same rows
// through a device plan as through the host plan: resident pages from the
// device (their host copies cleared, so reading them from the host would
// show), the rest straight from the host pool.
TEST_P(HiSparsePrefillPlanTest, Fp8PrefillThroughADevicePlanGivesTheHostPlansRows) {
  SCOPED_TRACE(seed_trace());
  DelayScope delay(200);
  auto rng = seeded_rng(42);
  GroupRig rig(device, {hisparse_layer("fp8_ds_mla", 576), hisparse_layer("fp8_ds_mla", 576)}, rng);
  Stream& compute = *rig.compute;
  HiSparseMLAIndexGroup& g = rig.group(1);
  const int layer = rig.layers[1].index_in_group;
  const std::int64_t rb = 656;
  PlanInputs in;
  in.P = 3;
  in.B = blocks;
  in.table = rig.table_of({2, 0, 3});
  in.table[std::size_t(2 * blocks)] = in.table[1];  // shared with (0, 1), whose page is resident
  in.lengths = {40, 129, 7};
  in.resident_B = blocks - 4;
  in.resident.assign(std::size_t(in.P * in.resident_B), 0);
  in.resident[1] = 2;
  in.resident[std::size_t(in.resident_B + 0)] = 5;
  in.resident[std::size_t(in.resident_B + 8)] = 7;
  std::vector<std::int32_t> starts;
  std::int32_t total = 0;
  for (std::int64_t length : in.lengths) {
    starts.push_back(total);
    total += static_cast<std::int32_t>(length);
  }
  const auto starts_t = device_tensor(*device, compute, starts, {in.P});
  // The resident pages' rows move to a device cache and leave the host pool.
  std::vector<std::uint8_t> resident_bytes(std::size_t(8 * block_size * rb), 0);
  std::vector<std::int32_t> cleared;
  for (std::int64_t p = 0; p < in.P; ++p) {
    for (std::int64_t b = 0; b < in.resident_B; ++b) {
      const std::int32_t page = in.resident[std::size_t(p * in.resident_B + b)];
      if (page == 0) continue;
      for (std::int32_t off = 0; off < block_size; ++off) {
        const std::int32_t h = in.table[std::size_t(p * in.B + b)] * block_size + off;
        std::copy(rig.pools[1].begin() + h * rb, rig.pools[1].begin() + (h + 1) * rb,
                  resident_bytes.begin() + (page * block_size + off) * rb);
        cleared.push_back(h);
      }
    }
  }
  const auto resident_cache = device_tensor(*device, compute, resident_bytes, {8, block_size, rb});
  const auto zeros = device_tensor(*device, compute, std::vector<std::uint8_t>(cleared.size() * std::size_t(rb), 0),
                                   {std::int64_t(cleared.size()), rb});
  const auto cleared_t = device_tensor(*device, compute, cleared, {std::int64_t(cleared.size())});
  g.write_rows(layer, compute, zeros.tensor, cleared_t.tensor);

  const std::vector<std::uint16_t> poison_bits(std::size_t(total) * 576, 0xA5A5);
  const auto gather = [&](HiSparsePrefillStagingPlan& plan, const Tensor& source_cache) {
    BatchMetadata batch;
    batch.prefill_staging_plan = &plan;
    const auto dst = bf16_tensor(*device, compute, poison_bits, total);
    compute.wait(*g.gather_fp8_prefill(layer, compute, source_cache, dst.tensor, Tensor(), starts_t.tensor, in.P, batch, 0));
    return download<std::uint16_t>(compute, dst.tensor);
  };
  HiSparsePrefillPlanStorage storage(*device, requests, blocks, 40, rig.pool_blocks(), block_size);
  poison(compute, storage);
  const DeviceInputs d(*device, compute, in);
  HiSparsePrefillStagingPlan host_plan = in.host_plan(*device, compute, block_size);
  const std::vector<std::uint16_t> want = gather(host_plan, resident_cache.tensor);
  ASSERT_LT(std::count(want.begin(), want.end(), std::uint16_t{0xA5A5}), std::ptrdiff_t(want.size() / 100)) << "the host plan's gather wrote the rows";
  HiSparsePrefillStagingPlan device_plan = d.plan(compute, in, storage);
  EXPECT_EQ(gather(device_plan, resident_cache.tensor), want);
  // Without the resident cache a device plan with a resident table is refused.
  BatchMetadata batch;
  batch.prefill_staging_plan = &device_plan;
  const auto dst = bf16_tensor(*device, compute, poison_bits, total);
  EXPECT_NE(error_of([&] { g.gather_fp8_prefill(layer, compute, Tensor(), dst.tensor, Tensor(), starts_t.tensor, in.P, batch, 0); })
                .find("the plan was built with a resident table but source_cache (the resident device cache) is undefined"),
            std::string::npos);

  // Without a resident table every row comes from the host pool, through
  // either plan, and no source cache is needed.
  PlanInputs host_only = in;
  host_only.resident.clear();
  host_only.resident_B = 0;
  const DeviceInputs d_host_only(*device, compute, host_only);
  HiSparsePrefillStagingPlan host_only_plan = host_only.host_plan(*device, compute, block_size);
  HiSparsePrefillStagingPlan device_only_plan = d_host_only.plan(compute, host_only, storage);
  EXPECT_EQ(gather(device_only_plan, Tensor()), gather(host_only_plan, Tensor()));
}

}  // namespace
}  // namespace sparse_mla::testing
