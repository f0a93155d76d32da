// The HiSparse row movers on every backend, against plain loops: the host
// mirror (rows written in a step reach the host pool), the invalidation of
// hot slots that cache a rewritten row (the next resolve reloads the new
// bytes), and the prefill staging copy (resident rows from the device, the
// rest from the host pool, the tail zeroed).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "backend_test.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "test_util.hpp"
#include "validation/hisparse_rig.hpp"

namespace sparse_mla::testing {
namespace {

class HiSparseRowsTest : public BackendTest {};
SPARSE_MLA_INSTANTIATE_BACKENDS(HiSparseRowsTest);

std::vector<std::uint8_t> random_bytes(std::size_t n, std::mt19937_64& rng) {
  std::vector<std::uint8_t> v(n);
  for (auto& b : v) b = static_cast<std::uint8_t>(rng());
  return v;
}

TEST_P(HiSparseRowsTest, WrittenRowsReachTheHostPool) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(21);
  auto stream = device->create_stream();
  const std::int64_t row_bytes = 656, host_rows = 300, n = 40;
  std::vector<std::uint8_t> pool = random_bytes(std::size_t(host_rows * row_bytes), rng);
  const auto host = device_tensor(*device, *stream, pool, {host_rows, row_bytes}, MemoryKind::pinned_host);
  const std::vector<std::uint8_t> rows = random_bytes(std::size_t(n * row_bytes), rng);
  const auto rows_t = device_tensor(*device, *stream, rows, {n, row_bytes});
  // Distinct host rows, a few of them -1 or past the pool (skipped).
  std::vector<std::int32_t> ids(static_cast<std::size_t>(host_rows));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(std::size_t(n));
  ids[3] = -1;
  ids[7] = static_cast<std::int32_t>(host_rows + 2);
  const auto ids_t = device_tensor(*device, *stream, ids, {n});
  write_hisparse_rows(*stream, rows_t.tensor, ids_t.tensor, host.tensor);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t g = ids[std::size_t(i)];
    if (g < 0 || g >= host_rows) continue;
    std::copy(rows.begin() + i * row_bytes, rows.begin() + (i + 1) * row_bytes, pool.begin() + g * row_bytes);
  }
  EXPECT_EQ(download<std::uint8_t>(*device, *stream, host.buffer, pool.size()), pool);
}

TEST_P(HiSparseRowsTest, InvalidationEmptiesTheSlotsOfRewrittenRows) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(22);
  auto stream = device->create_stream();
  const std::int32_t states = 5, H = 96;
  std::vector<std::int32_t> slot_rows(std::size_t(states * H));
  for (auto& g : slot_rows) g = static_cast<std::int32_t>(rng() % 400) - 20;  // some -1 .. -20, some repeats
  std::vector<std::int16_t> lru(std::size_t(states * H));
  const auto slots_t = device_tensor(*device, *stream, slot_rows, {states, H});
  const auto lru_t = device_tensor(*device, *stream, lru, {states, H});
  std::vector<std::int32_t> hosts, owners;
  for (int i = 0; i < 60; ++i) {
    hosts.push_back(i % 7 == 0 ? -1 : static_cast<std::int32_t>(rng() % 400));
    owners.push_back(i % 11 == 0 ? states + 1 : (i % 13 == 0 ? -1 : static_cast<std::int32_t>(rng() % states)));
  }
  // Make sure some entries really hit a cached row.
  for (int i = 0; i < 10; ++i) {
    hosts[std::size_t(i + 20)] = slot_rows[std::size_t(i * 37 % (states * H))];
    owners[std::size_t(i + 20)] = i * 37 % (states * H) / H;
  }
  const auto hosts_t = device_tensor(*device, *stream, hosts, {60});
  const auto owners_t = device_tensor(*device, *stream, owners, {60});
  invalidate_hisparse_slots(*stream, HiSparseSlotState{slots_t.tensor, lru_t.tensor}, H, hosts_t.tensor, owners_t.tensor);
  std::int32_t emptied = 0;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    if (hosts[i] < 0 || owners[i] < 0 || owners[i] >= states) continue;
    for (std::int32_t s = 0; s < H; ++s) {
      std::int32_t& g = slot_rows[std::size_t(owners[i] * H + s)];
      if (g == hosts[i]) {
        g = -1;
        ++emptied;
      }
    }
  }
  EXPECT_GT(emptied, 0);
  EXPECT_EQ(download<std::int32_t>(*device, *stream, slots_t.buffer, slot_rows.size()), slot_rows);
}

// After a step, rows of the selection are rewritten (mirror + invalidate);
// replaying the selection reloads exactly those rows with their new bytes.
TEST_P(HiSparseRowsTest, RewrittenRowsAreReloadedNotServedStale) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(23);
  auto stream = device->create_stream();
  reference::HiSparseTables t;
  t.top_k = 64;
  t.hot_slots = 128;
  t.source_rows = 2;
  t.source_blocks = 8;
  t.source_block_size = 16;
  t.host_rows = 2 * 8 * 16;
  for (std::int32_t b = 0; b < 16; ++b) t.source_table.push_back(15 - b);
  t.hot_block_size = 32;
  t.hot_blocks_per_row = 4;
  t.attention_block_stride = 32;
  reference::HiSparseState state(2, t.hot_slots);
  validation::HiSparseRig rig(*stream, t, state, 2, 64, 9, rng());
  reference::HiSparseStep step;
  step.request_ids = {0, 1};
  step.state_indices = {0, 1};
  step.hot_block_table = {1, 2, 3, 4, 5, 6, 7, 8};
  for (std::int32_t b = 0; b < 2; ++b)
    for (std::int32_t j = 0; j < t.top_k; ++j) step.logical.push_back(j * 2 + b);
  rig.run(step);
  reference::resolve_model(t, step, state);

  // Rewrite 5 rows of request 1's selection (token 2j + 1 -> its host row).
  std::vector<std::int32_t> hosts, owners;
  for (std::int32_t j : {0, 9, 17, 40, 63}) {
    hosts.push_back(reference::model_host_row(t, 1, 2 * j + 1));
    owners.push_back(1);
  }
  const std::vector<std::uint8_t> fresh = random_bytes(hosts.size() * 64, rng);
  const auto fresh_t = device_tensor(*device, *stream, fresh, {std::int64_t(hosts.size()), 64});
  const auto hosts_t = device_tensor(*device, *stream, hosts, {std::int64_t(hosts.size())});
  const auto owners_t = device_tensor(*device, *stream, owners, {std::int64_t(hosts.size())});
  write_hisparse_rows(*stream, fresh_t.tensor, hosts_t.tensor, rig.host_pool());
  invalidate_hisparse_slots(*stream, rig.slot_state(), t.hot_slots, hosts_t.tensor, owners_t.tensor);
  std::map<std::int32_t, std::vector<std::uint8_t>> rewritten;  // host row -> its new bytes
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    rewritten[hosts[i]].assign(fresh.begin() + std::ptrdiff_t(i * 64), fresh.begin() + std::ptrdiff_t((i + 1) * 64));
    for (std::int32_t slot = 0; slot < t.hot_slots; ++slot) {
      std::int32_t& g = state.slot_rows[std::size_t(t.hot_slots + slot)];  // state row 1
      if (g == hosts[i]) g = -1;
    }
  }
  const reference::HiSparseResult got = rig.run(step);
  const reference::HiSparseResult want = reference::resolve_model(t, step, state);
  EXPECT_EQ(got.swap_counts, (std::vector<std::int32_t>{0, 5}));
  EXPECT_EQ(got.hot_indices, want.hot_indices);
  EXPECT_EQ(rig.state().slot_rows, state.slot_rows);
  EXPECT_EQ(rig.state().lru, state.lru);
  // Every cached row, the five reloaded ones included, holds the host pool's bytes.
  const auto cache = rig.hot_cache_bytes();
  for (std::int32_t s = 0; s < 2; ++s) {
    for (std::int32_t slot = 0; slot < t.hot_slots; ++slot) {
      const std::int32_t g = state.slot_rows[std::size_t(s * t.hot_slots + slot)];
      if (g < 0) continue;
      const std::int32_t x = step.hot_block_table[std::size_t(s * 4 + slot / 32)] * 32 + slot % 32;
      const std::vector<std::uint8_t> pool_row = rewritten.count(g) ? rewritten[g] : rig.pool_row(g);
      EXPECT_TRUE(std::equal(cache.begin() + x * 64, cache.begin() + (x + 1) * 64, pool_row.begin()))
          << "state " << s << " slot " << slot;
    }
  }
}

TEST_P(HiSparseRowsTest, StagingReadsResidentRowsFromTheDeviceAndTheRestFromTheHost) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(24);
  auto stream = device->create_stream();
  const std::int64_t row_bytes = 656, host_rows = 200, n = 70;
  const std::int64_t resident_blocks = 4, resident_block_size = 8;
  const std::vector<std::uint8_t> pool = random_bytes(std::size_t(host_rows * row_bytes), rng);
  const std::vector<std::uint8_t> resident = random_bytes(std::size_t(resident_blocks * resident_block_size * row_bytes), rng);
  const auto pool_t = device_tensor(*device, *stream, pool, {host_rows, row_bytes}, MemoryKind::pinned_host);
  const auto resident_t = device_tensor(*device, *stream, resident, {resident_blocks, resident_block_size, row_bytes});
  std::vector<std::int32_t> host_ids(static_cast<std::size_t>(n)), device_ids(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    host_ids[std::size_t(i)] = i >= 60 ? -1 : (i == 5 ? std::int32_t(host_rows + 1) : static_cast<std::int32_t>(rng() % host_rows));
    device_ids[std::size_t(i)] = i % 3 == 0 ? static_cast<std::int32_t>(rng() % (resident_blocks * resident_block_size)) : -1;
  }
  const auto host_ids_t = device_tensor(*device, *stream, host_ids, {n});
  const auto device_ids_t = device_tensor(*device, *stream, device_ids, {n});
  const auto staged = device_tensor(*device, *stream, std::vector<std::uint8_t>(std::size_t(n * row_bytes), poison_byte), {n, row_bytes});
  stage_hisparse_rows(*stream, pool_t.tensor, host_ids_t.tensor, resident_t.tensor, device_ids_t.tensor, staged.tensor);
  std::vector<std::uint8_t> want(std::size_t(n * row_bytes), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t x = device_ids[std::size_t(i)], g = host_ids[std::size_t(i)];
    if (x >= 0) {
      std::copy(resident.begin() + x * row_bytes, resident.begin() + (x + 1) * row_bytes, want.begin() + i * row_bytes);
    } else if (g >= 0 && g < host_rows) {
      std::copy(pool.begin() + g * row_bytes, pool.begin() + (g + 1) * row_bytes, want.begin() + i * row_bytes);
    }
  }
  EXPECT_EQ(download<std::uint8_t>(*device, *stream, staged.buffer, want.size()), want);

  // Without a resident cache every row comes from the host pool.
  const auto staged2 = device_tensor(*device, *stream, std::vector<std::uint8_t>(std::size_t(n * row_bytes), poison_byte), {n, row_bytes});
  stage_hisparse_rows(*stream, pool_t.tensor, host_ids_t.tensor, Tensor(), Tensor(), staged2.tensor);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t g = host_ids[std::size_t(i)];
    if (g >= 0 && g < host_rows) {
      std::copy(pool.begin() + g * row_bytes, pool.begin() + (g + 1) * row_bytes, want.begin() + i * row_bytes);
    } else {
      std::fill(want.begin() + i * row_bytes, want.begin() + (i + 1) * row_bytes, 0);
    }
  }
  EXPECT_EQ(download<std::uint8_t>(*device, *stream, staged2.buffer, want.size()), want);
  try {
    stage_hisparse_rows(*stream, pool_t.tensor, host_ids_t.tensor, resident_t.tensor, Tensor(), staged2.tensor);
    ADD_FAILURE() << "a resident cache without device_row_ids was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device_row_ids and resident_cache"), std::string::npos) << e.what();
  }
}

// The layers' copy of one swap list: pair j < count of row r copies host row
// swap_host[r, j] of each layer's own pool into hot row swap_device[r, j] of
// its own cache (a host row past the pool zero-fills, a negative one or a hot
// row past the cache is skipped), in as many launches as runs of up to eight
// layers of one geometry.
struct GatherLayer {
  std::vector<std::uint8_t> pool, cache;
  DeviceTensor pool_t, cache_t;
};

TEST_P(HiSparseRowsTest, AGatherOfSeveralLayersFillsEachFromItsOwnPool) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(24);
  auto stream = device->create_stream();
  const std::int64_t row_bytes = 96, host_rows = 50, rows = 3, K = 12;
  const std::int32_t blocks = 4, block_size = 8;  // 32 hot rows
  // Eleven layers; layer 5's cache has one block more, so it runs alone:
  // layers 0-4, 5, 6-10 (launches: 1 + 1 + 1).
  std::vector<GatherLayer> layers(11);
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const std::int32_t b = l == 5 ? blocks + 1 : blocks;
    layers[l].pool = random_bytes(std::size_t(host_rows * row_bytes), rng);
    layers[l].cache.assign(std::size_t(b * block_size * row_bytes), 0xEE);
    layers[l].pool_t = device_tensor(*device, *stream, layers[l].pool, {host_rows, row_bytes}, MemoryKind::pinned_host);
    layers[l].cache_t = device_tensor(*device, *stream, layers[l].cache, {b, block_size, row_bytes});
  }
  std::vector<std::int32_t> host(std::size_t(rows * K)), hot(std::size_t(rows * K));
  for (std::size_t i = 0; i < host.size(); ++i) {
    const std::uint64_t kind = rng() % 10;
    host[i] = kind == 0 ? -1 : kind == 1 ? static_cast<std::int32_t>(host_rows + rng() % 5) : static_cast<std::int32_t>(rng() % host_rows);
    hot[i] = kind == 2 ? static_cast<std::int32_t>(blocks * block_size + rng() % 3) : static_cast<std::int32_t>(i % (blocks * block_size));
  }
  const std::vector<std::int32_t> counts{7, K + 5, -2};  // clamped to K; a negative count copies nothing
  const auto host_t = device_tensor(*device, *stream, host, {rows, K});
  const auto hot_t = device_tensor(*device, *stream, hot, {rows, K});
  const auto counts_t = device_tensor(*device, *stream, counts, {rows});
  std::vector<HiSparseLayerRows> views;
  for (const GatherLayer& l : layers) views.push_back({l.pool_t.tensor, l.cache_t.tensor});
  EXPECT_EQ(gather_hisparse_layers(*stream, views, host_t.tensor, hot_t.tensor, counts_t.tensor, rows), 3);
  for (std::size_t l = 0; l < layers.size(); ++l) {
    std::vector<std::uint8_t> want = layers[l].cache;
    const std::int64_t hot_rows = std::int64_t(want.size()) / row_bytes;
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < std::clamp<std::int64_t>(counts[std::size_t(r)], 0, K); ++j) {
        const std::int32_t g = host[std::size_t(r * K + j)], x = hot[std::size_t(r * K + j)];
        if (g < 0 || x < 0 || x >= hot_rows) continue;
        auto dst = want.begin() + x * row_bytes;
        if (g >= host_rows) {
          std::fill(dst, dst + row_bytes, 0);
        } else {
          std::copy(layers[l].pool.begin() + g * row_bytes, layers[l].pool.begin() + (g + 1) * row_bytes, dst);
        }
      }
    }
    EXPECT_EQ(download<std::uint8_t>(*device, *stream, layers[l].cache_t.buffer, want.size()), want) << "layer " << l;
  }
}

TEST_P(HiSparseRowsTest, AGatherOfSeveralLayersRefusesAWrongLayerAndWritesNothing) {
  SCOPED_TRACE(seed_trace());
  auto rng = seeded_rng(25);
  auto stream = device->create_stream();
  const std::int64_t row_bytes = 64, host_rows = 20;
  std::vector<GatherLayer> layers(3);
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const std::int64_t bytes = l == 2 ? row_bytes + 16 : row_bytes;  // layer 2's cache rows do not match its pool
    layers[l].pool = random_bytes(std::size_t(host_rows * row_bytes), rng);
    layers[l].cache.assign(std::size_t(2 * 4 * bytes), 0xEE);
    layers[l].pool_t = device_tensor(*device, *stream, layers[l].pool, {host_rows, row_bytes}, MemoryKind::pinned_host);
    layers[l].cache_t = device_tensor(*device, *stream, layers[l].cache, {2, 4, bytes});
  }
  const auto host_t = device_tensor(*device, *stream, std::vector<std::int32_t>{1, 2}, {1, 2});
  const auto hot_t = device_tensor(*device, *stream, std::vector<std::int32_t>{0, 1}, {1, 2});
  const auto counts_t = device_tensor(*device, *stream, std::vector<std::int32_t>{2}, {1});
  std::vector<HiSparseLayerRows> views;
  for (const GatherLayer& l : layers) views.push_back({l.pool_t.tensor, l.cache_t.tensor});
  try {
    gather_hisparse_layers(*stream, views, host_t.tensor, hot_t.tensor, counts_t.tensor, 1);
    FAIL() << "a layer whose hot cache rows differ from its pool's was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers[2].hot_cache"), std::string::npos) << e.what();
  }
  for (std::size_t l = 0; l < layers.size(); ++l) {
    EXPECT_EQ(download<std::uint8_t>(*device, *stream, layers[l].cache_t.buffer, layers[l].cache.size()), layers[l].cache)
        << "layer " << l << " was written";
  }
}

}  // namespace
}  // namespace sparse_mla::testing
