"""HiSparse groups through the module (SPEC section 5): a first decode step on
fresh state loads every miss into the slots in LRU order, the same selection
again only hits, the host mirror and invalidation, the counters, engine-owned
storage and the FP8 prefill through a staging plan."""

import numpy as np
import pytest

import sparse_mla
from models import upconvert_rows, random_fp8_rows
from support import metadata

K, H, BLOCK, REQUESTS, BLOCKS_PER_REQUEST, LAYERS = 64, 128, 64, 4, 4, 2
POOL_ROWS = REQUESTS * BLOCKS_PER_REQUEST * BLOCK


def hisparse_config(**extra):
    config = dict(hot_slots=H, host_pool_rows=POOL_ROWS, max_requests=REQUESTS,
                  max_tokens_per_request=BLOCKS_PER_REQUEST * BLOCK, block_size=BLOCK)
    config.update(extra)
    return config


def build_group(logical, layers=LAYERS, **extra):
    builder = sparse_mla.SparseMLAIndexGroupBuilder(logical, REQUESTS)
    registrations = [builder.register_layer(i == 0, kv_cache_dtype="fp8_ds_mla", hisparse=hisparse_config(**extra))
                     for i in range(layers)]
    group = registrations[0][0]
    assert all(g is group for g, _ in registrations)
    return builder, group


def fill_pools(rng, group):
    pools = []
    for layer in range(group.num_layers):
        rows = random_fp8_rows(rng, POOL_ROWS)
        np.asarray(group.cache(layer).host_pool)[:] = rows
        pools.append(rows)
    return pools


def random_step(rng, batch_rows=3):
    """Source block table [R, B] of distinct pool blocks, each batch row's request
    and state row, and a selection of distinct positions with -1s and tokens past
    the table."""
    table = rng.permutation(POOL_ROWS // BLOCK)[: REQUESTS * BLOCKS_PER_REQUEST].reshape(REQUESTS, -1).astype(np.int32)
    requests = rng.permutation(REQUESTS)[:batch_rows].astype(np.int32)
    states = rng.permutation(REQUESTS)[:batch_rows].astype(np.int32)
    logical = np.stack([rng.permutation((BLOCKS_PER_REQUEST + 1) * BLOCK)[:K] for _ in range(batch_rows)]).astype(np.int32)
    logical[rng.random(logical.shape) < 0.1] = -1
    return table, requests, states, logical


def first_step_model(table, requests, states, logical):
    """Fresh state: the m-th distinct host row of a batch row takes slot m (LRU
    order 0..H-1); the state row s owns hot blocks 2s, 2s+1, so slot m is hot row
    s * H + m, which attention reads at that row (attention_block_stride = block size)."""
    physical = np.full(logical.shape, -1, np.int32)
    slots = {}
    for b, (r, s) in enumerate(zip(requests, states)):
        seen = {}
        for j, tok in enumerate(logical[b]):
            if tok < 0 or tok // BLOCK >= table.shape[1]:
                continue
            g = int(table[r, tok // BLOCK]) * BLOCK + tok % BLOCK
            m = seen.setdefault(g, len(seen))
            physical[b, j] = s * H + m
        slots[int(s)] = list(seen)
    return physical, slots


def test_a_first_step_loads_every_miss_in_lru_order_and_a_second_one_only_hits(arrays, rng):
    logical_buffer = arrays.poisoned((REQUESTS, K))
    _, group = build_group(logical_buffer)
    assert isinstance(group, sparse_mla.HiSparseMLAIndexGroup)
    pools = fill_pools(rng, group)
    table, requests, states, logical = random_step(rng)
    arrays.set(logical_buffer, slice(0, 3), logical)
    md = metadata(req_id_per_token=arrays(requests), block_table=arrays(table), block_size=BLOCK,
                  request_state_indices=arrays(states), num_decodes=3, num_decode_tokens=3)
    want_physical, want_slots = first_step_model(table, requests, states, logical)
    misses = sum(len(rows) for rows in want_slots.values())
    for expected_hits, expected_misses in ((0, misses), (misses, misses)):
        for layer in range(LAYERS):
            group.set_logical_topk_ready(layer)
            group.prepare_for_batch(layer, md)
            physical, counts = group.convert_logical_to_physical_topk(layer, logical_buffer[:3], md, return_valid_counts=True)
            np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
            np.testing.assert_array_equal(arrays.numpy(counts), (want_physical != -1).sum(axis=1))
        counters = group.counters()
        assert (counters["hits"], counters["misses"]) == (expected_hits, expected_misses)
        assert counters["bytes_moved"] == expected_misses * group.bytes_per_miss == expected_misses * 656 * LAYERS
    slot_rows, lru = arrays.numpy(group.slot_rows), arrays.numpy(group.lru)
    for s in range(REQUESTS):
        loaded = want_slots.get(s, [])
        np.testing.assert_array_equal(slot_rows[s, :len(loaded)], loaded)
        assert (slot_rows[s, len(loaded):] == -1).all()
        n = len(loaded)
        np.testing.assert_array_equal(lru[s], np.r_[np.arange(n, H), np.arange(n)] if n else np.arange(H))
    for layer in range(LAYERS):
        hot = arrays.numpy(group.cache(layer).hot_cache)
        for s, loaded in want_slots.items():
            for m, g in enumerate(loaded):
                row = s * H + m
                np.testing.assert_array_equal(hot[row // BLOCK, row % BLOCK], pools[layer][g])
    assert group.resolves == 2 and group.gathers == 2 * LAYERS


def test_a_padding_row_outputs_nothing_and_leaves_its_state(arrays, rng):
    logical_buffer = arrays.poisoned((REQUESTS, K))
    _, group = build_group(logical_buffer, layers=1)
    fill_pools(rng, group)
    table, requests, states, logical = random_step(rng)
    states[1] = -1
    arrays.set(logical_buffer, slice(0, 3), logical)
    md = metadata(req_id_per_token=arrays(requests), block_table=arrays(table), block_size=BLOCK,
                  request_state_indices=arrays(states))
    physical, counts = group.convert_logical_to_physical_topk(0, logical_buffer[:3], md, return_valid_counts=True)
    assert (arrays.numpy(physical)[1] == -1).all() and arrays.numpy(counts)[1] == 0


def test_the_host_mirror_writes_rows_and_invalidation_empties_their_slots(arrays, rng):
    logical_buffer = arrays.poisoned((REQUESTS, K))
    _, group = build_group(logical_buffer)
    fill_pools(rng, group)
    table, requests, states, logical = random_step(rng, batch_rows=1)
    arrays.set(logical_buffer, slice(0, 1), logical)
    md = metadata(req_id_per_token=arrays(requests), block_table=arrays(table), block_size=BLOCK,
                  request_state_indices=arrays(states))
    group.convert_logical_to_physical_topk(0, logical_buffer[:1], md)
    held = arrays.numpy(group.slot_rows)[states[0]].copy()  # the live state changes below
    cached = held[held >= 0][:5].astype(np.int32)
    new_rows = random_fp8_rows(rng, 5)
    group.write_rows(1, arrays(new_rows), arrays(cached))
    np.testing.assert_array_equal(arrays.numpy(group.cache(1).host_pool)[cached], new_rows)
    group.invalidate_rows(arrays(cached), arrays(np.full(5, states[0], np.int32)))
    after = arrays.numpy(group.slot_rows)[states[0]]
    assert not np.isin(cached, after).any()
    assert (after >= 0).sum() == (held >= 0).sum() - 5


def test_counters_are_snapshotted_into_the_engines_memory_without_waiting(device, arrays, rng):
    logical_buffer = arrays.poisoned((REQUESTS, K))
    _, group = build_group(logical_buffer)
    fill_pools(rng, group)
    table, requests, states, logical = random_step(rng)
    arrays.set(logical_buffer, slice(0, 3), logical)
    md = metadata(req_id_per_token=arrays(requests), block_table=arrays(table), block_size=BLOCK,
                  request_state_indices=arrays(states))
    stream = device.create_stream()
    pinned = device.empty((2,), "int64", kind="pinned_host")
    stream.wait_stream(device.default_stream())  # the inputs, written in the default stream's order
    before = device.activity()
    for layer in range(LAYERS):
        group.set_logical_topk_ready(layer, stream=stream)
        group.prepare_for_batch(layer, md, stream=stream)
        group.convert_logical_to_physical_topk(layer, logical_buffer[:3], md, stream=stream)
    group.snapshot_counters(pinned, stream=stream)
    during = device.activity()
    assert during["allocations"] == before["allocations"]
    assert during["host_synchronizations"] == before["host_synchronizations"]
    stream.synchronize()
    counters = group.counters()
    np.testing.assert_array_equal(np.asarray(pinned), [counters["hits"], counters["misses"]])
    engine_out = arrays(np.full(2, -1, np.int64))  # NumPy memory on the host, device memory on a GPU
    group.snapshot_counters(engine_out)
    np.testing.assert_array_equal(arrays.numpy(engine_out), [counters["hits"], counters["misses"]])
    with pytest.raises(TypeError, match="out has dtype I32, expected I64"):
        group.snapshot_counters(arrays(np.zeros(2, np.int32)))


def test_layers_bind_engine_owned_storage(device, arrays):
    pool = device.empty((POOL_ROWS, 656), "uint8", kind="pinned_host")
    hot = device.empty((REQUESTS * H // BLOCK, BLOCK, 656), "uint8", kind="device")
    builder = sparse_mla.SparseMLAIndexGroupBuilder(arrays.poisoned((REQUESTS, K)), REQUESTS)
    group, layer = builder.register_layer(True, kv_cache_dtype="fp8_ds_mla", hisparse=hisparse_config(),
                                          hisparse_storage=dict(host_pool=pool, hot_cache=hot))
    cache = group.cache(layer)
    assert cache.engine_owned and cache.row_bytes == 656
    assert cache.host_pool.data_ptr == pool.data_ptr and cache.hot_cache.data_ptr == hot.data_ptr
    assert group.physical_kv_cache(layer).data_ptr == hot.data_ptr
    with pytest.raises(ValueError, match="storage.host_pool is in host memory, expected pinned_host"):
        builder.register_layer(False, kv_cache_dtype="fp8_ds_mla",
                               hisparse_storage=dict(host_pool=np.zeros((POOL_ROWS, 656), np.uint8), hot_cache=hot))
    with pytest.raises(ValueError, match="hisparse has no field 'hot_size'"):
        builder.register_layer(True, hisparse=dict(hot_size=128))
    with pytest.raises(ValueError, match="max_rows_per_request"):  # a field that reaches the library's checks
        builder.register_layer(True, kv_cache_dtype="fp8_ds_mla", hisparse=hisparse_config(max_rows_per_request=0))


def test_fp8_prefill_reads_the_staging_plan_and_returns_the_layers_event(device, arrays, rng):
    logical_buffer = arrays.poisoned((REQUESTS, K))
    _, group = build_group(logical_buffer)
    pools = fill_pools(rng, group)
    table = rng.permutation(POOL_ROWS // BLOCK)[:6].reshape(2, 3).astype(np.int32)
    lengths = np.array([150, 70], np.int64)
    plan = sparse_mla.build_hisparse_prefill_staging_plan(table, lengths, block_size=BLOCK, device=device)
    assert isinstance(plan, sparse_mla.HiSparsePrefillStagingPlan)
    assert plan.num_blocks == 1 + 5 and tuple(plan.block_table.shape) == (2, 3)  # 3 + 2 blocks used, and the null block
    starts = arrays(np.array([0, 150], np.int32))
    for layer in range(LAYERS):
        dst = arrays.poisoned((220, 576), np.uint16, 0xDEAD)
        md = metadata(prefill=metadata(host_staging_plan=plan))
        ready = group.gather_fp8_prefill(layer, None, arrays.bf16(dst), None, starts, 2, md, 0)
        assert isinstance(ready, sparse_mla.Event)
        ready.synchronize()
        result = arrays.bits(dst)
        for r, (begin, length) in enumerate(zip([0, 150], lengths)):
            host_rows = [table[r, i // BLOCK] * BLOCK + i % BLOCK for i in range(length)]
            np.testing.assert_array_equal(result[begin:begin + length], upconvert_rows(pools[layer][host_rows]))
    with pytest.raises(ValueError, match="prefill_staging_plan is null"):
        group.gather_fp8_prefill(0, None, arrays.bf16(dst), None, starts, 2, metadata(), 0)
