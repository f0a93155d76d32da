"""The seed's index-group protocol through the module (SPEC section 4): a
multi-layer decode step converts once per group, prefill-sized calls go into the
caller's buffers, and the groups keep what they read alive."""

import gc

import numpy as np
import pytest

import sparse_mla
from models import convert, convert_dcp, gather_upconvert, random_fp8_rows
from support import POISON, host_only, metadata, poisoned, random_conversion_inputs

K, MAX_TOKENS, MAX_DECODE_ROWS, BLOCK_SIZE = 128, 24, 4, 16


def build_model(logical_buffer, layers_per_group=(2, 3)):
    """Layers in model order; each group starts at an index-producing layer."""
    builder = sparse_mla.SparseMLAIndexGroupBuilder(logical_buffer, MAX_DECODE_ROWS)
    layers = []
    for size in layers_per_group:
        for i in range(size):
            layers.append(builder.register_layer(i == 0))
    return builder, layers


def step(layers, logical_rows, md, stream=None, return_valid_counts=True):
    results = []
    for group, index in layers:
        group.set_logical_topk_ready(index, stream=stream)
        group.prepare_for_batch(index, md, stream=stream)
        results.append(group.convert_logical_to_physical_topk(index, logical_rows, md, return_valid_counts=return_valid_counts,
                                                              stream=stream))
    return results


def test_the_builder_groups_layers_at_every_index_producing_layer(arrays):
    logical = arrays.poisoned((MAX_TOKENS, K))
    builder, layers = build_model(logical, (2, 3))
    groups = builder.groups
    assert len(groups) == 2 and builder.current_group is groups[1]
    assert [index for _, index in layers] == [0, 1, 0, 1, 2]
    assert all(g is groups[0] for g, _ in layers[:2]) and all(g is groups[1] for g, _ in layers[2:])
    assert isinstance(groups[0], sparse_mla.SparseMLAIndexGroup)
    assert not isinstance(groups[0], sparse_mla.HiSparseMLAIndexGroup)
    group = groups[0]
    assert group.has_indexer and group.num_layers == 2 and group.top_k == K
    assert group.logical_topk_indices is logical and builder.logical_topk_indices is logical
    assert tuple(group.physical_topk_indices.shape) == (MAX_DECODE_ROWS + 1, K)
    assert tuple(group.valid_topk_counts.shape) == (MAX_DECODE_ROWS + 1,)
    assert group.side_stream.device is builder.device
    assert group.logical_topk_ready is not None and group.physical_topk_ready is not None
    # No index-producing layer yet: a group without an indexer.
    first = sparse_mla.SparseMLAIndexGroupBuilder(logical).register_layer(False)[0]
    assert not first.has_indexer and first.max_decode_rows == MAX_TOKENS


def test_a_multi_layer_decode_step_converts_once_per_group(producer_arrays, rng):
    arrays = producer_arrays
    logical = arrays.poisoned((MAX_TOKENS, K))
    builder, layers = build_model(logical)
    for step_number in range(3):
        T = MAX_DECODE_ROWS - step_number % 2  # decode-sized: T <= max_decode_rows + 1
        req_id, table, rows = random_conversion_inputs(rng, T=T, K=K, block_size=BLOCK_SIZE)
        arrays.set(logical, slice(0, T), rows)
        md = metadata(req_id_per_token=arrays(req_id), block_table=arrays(table), block_size=BLOCK_SIZE, num_decodes=T,
                      num_decode_tokens=T)
        for group in builder.groups:  # poison the workspaces: every row read must have been written this step
            arrays.fill(group.physical_topk_indices, POISON)
        results = step(layers, logical[:T], md)
        want_physical, want_counts = convert(req_id, table, rows, BLOCK_SIZE)
        for physical, counts in results:
            np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
            np.testing.assert_array_equal(arrays.numpy(counts), want_counts)
        # Every layer of a group reads the group's workspace rows, as the caller's kind of tensor.
        pointers = [arrays.data_ptr(physical) for physical, _ in results]
        assert pointers[0] == pointers[1] == arrays.data_ptr(builder.groups[0].physical_topk_indices)
        assert pointers[2] == pointers[4] != pointers[0]
        kind = arrays.torch.Tensor if arrays.framework == "torch" else sparse_mla.Tensor
        assert all(isinstance(physical, kind) and isinstance(counts, kind) for physical, counts in results)
    for group in builder.groups:
        assert group.conversion_counts == {"decode": 3, "prefill": 0}


def test_the_decode_step_allocates_nothing_and_never_waits_on_an_explicit_stream(device, arrays, rng):
    logical = arrays.poisoned((MAX_TOKENS, K))
    _, layers = build_model(logical)
    stream = device.create_stream()
    req_id, table, rows = random_conversion_inputs(rng, T=3, K=K, block_size=BLOCK_SIZE)
    arrays.set(logical, slice(0, 3), rows)
    md = metadata(req_id_per_token=arrays(req_id), block_table=arrays(table), block_size=BLOCK_SIZE, num_decodes=3,
                  num_decode_tokens=3)
    stream.wait_stream(device.default_stream())  # the inputs, written in the default stream's order
    before = device.activity()
    results = step(layers, logical[:3], md, stream=stream)
    during = device.activity()
    stream.synchronize()
    assert during["allocations"] == before["allocations"] and during["frees"] == before["frees"]
    assert during["host_synchronizations"] == before["host_synchronizations"]
    want_physical, _ = convert(req_id, table, rows, BLOCK_SIZE)
    for physical, _ in results:
        np.testing.assert_array_equal(arrays.numpy(physical), want_physical)


def test_a_prefill_sized_call_writes_into_out_and_allocates_nothing(device, arrays, rng):
    logical = arrays.poisoned((MAX_TOKENS, K))
    _, layers = build_model(logical)
    T = MAX_TOKENS  # > max_decode_rows + 1: prefill-sized
    req_id, table, rows = random_conversion_inputs(rng, T=T, K=K, block_size=BLOCK_SIZE)
    arrays.set(logical, slice(None), rows)
    md = metadata(req_id_per_token=arrays(req_id), block_table=arrays(table), block_size=BLOCK_SIZE, num_prefills=3)
    out, counts_out = arrays.poisoned((T, K)), arrays.poisoned(T)
    stream = device.create_stream()
    want_physical, want_counts = convert(req_id, table, rows, BLOCK_SIZE, 2 * BLOCK_SIZE)
    for group, index in layers:
        arrays.fill(out, POISON)
        arrays.fill(counts_out, POISON)
        stream.wait_stream(device.default_stream())
        before = device.activity()
        physical, counts = group.convert_logical_to_physical_topk(
            index, logical, md, block_stride_rows=2 * BLOCK_SIZE, return_valid_counts=True, out=out,
            valid_counts_out=counts_out, stream=stream)
        assert device.activity()["allocations"] == before["allocations"]
        stream.synchronize()
        assert physical is out and counts is counts_out
        np.testing.assert_array_equal(arrays.numpy(out), want_physical)
        np.testing.assert_array_equal(arrays.numpy(counts_out), want_counts)
    assert layers[0][0].conversion_counts == {"decode": 0, "prefill": 2}
    # Without out: fresh buffers the results own.
    group, index = layers[0]
    physical = group.convert_logical_to_physical_topk(index, logical, md)
    assert isinstance(physical, arrays.torch.Tensor if arrays.framework == "torch" else sparse_mla.Tensor)
    np.testing.assert_array_equal(arrays.numpy(physical), convert(req_id, table, rows, BLOCK_SIZE)[0])


def test_a_follower_is_refused_rows_the_leader_did_not_convert(arrays, rng):
    logical = arrays.poisoned((MAX_TOKENS, K))
    _, layers = build_model(logical)
    req_id, table, rows = random_conversion_inputs(rng, T=3, K=K, block_size=BLOCK_SIZE)
    arrays.set(logical, slice(0, 3), rows)
    md = metadata(req_id_per_token=arrays(req_id), block_table=arrays(table), block_size=BLOCK_SIZE)
    group, _ = layers[0]
    with pytest.raises(ValueError, match="before the leader"):
        group.convert_logical_to_physical_topk(1, logical[:3], md)
    group.convert_logical_to_physical_topk(0, logical[:3], md)
    with pytest.raises(ValueError, match="leader converted 3 rows"):
        group.convert_logical_to_physical_topk(1, logical[:2], md)
    with pytest.raises(ValueError, match="asks for valid counts but the leader converted without them"):
        group.convert_logical_to_physical_topk(1, logical[:3], md, return_valid_counts=True)
    with pytest.raises(ValueError, match="not a registered layer"):
        group.set_logical_topk_ready(7)


def test_rejected_group_calls_raise_with_the_library_message(arrays, rng):
    logical = arrays.poisoned((MAX_TOKENS, K))
    _, layers = build_model(logical)
    group, _ = layers[0]
    req_id, table, rows = random_conversion_inputs(rng, T=3, K=K, block_size=BLOCK_SIZE)
    md = metadata(req_id_per_token=arrays(req_id), block_table=arrays(table), block_size=BLOCK_SIZE)
    with pytest.raises(ValueError, match="K of the group's logical top-k buffer"):
        group.convert_logical_to_physical_topk(0, arrays(rows[:, :64]), md)
    with pytest.raises(TypeError, match="has dtype I16, expected I32"):
        group.convert_logical_to_physical_topk(0, arrays(rows.astype(np.int16)), md)
    with pytest.raises(ValueError, match=arrays.foreign_message):
        group.convert_logical_to_physical_topk(0, arrays.foreign(rows), md)
    with pytest.raises(ValueError, match="block_table"):
        group.convert_logical_to_physical_topk(0, arrays(rows), metadata(req_id_per_token=arrays(req_id),
                                                                         block_size=BLOCK_SIZE))
    with pytest.raises(TypeError, match="logical_topk_buffer has dtype I64, expected I32"):
        sparse_mla.SparseMLAIndexGroupBuilder(arrays(np.zeros((4, K), np.int64)))
    assert group.conversion_counts == {"decode": 0, "prefill": 0}


@host_only
def test_groups_keep_their_logical_buffer_and_workspace_alive(rng):
    builder, layers = build_model(poisoned((MAX_TOKENS, K)))
    group, index = layers[0]
    del builder, layers
    gc.collect()
    logical = np.asarray(group.logical_topk_indices)
    req_id, table, rows = random_conversion_inputs(rng, T=2, K=K, block_size=BLOCK_SIZE)
    logical[:2] = rows
    md = metadata(req_id_per_token=req_id, block_table=table, block_size=BLOCK_SIZE)
    group.set_logical_topk_ready(index)
    physical = group.convert_logical_to_physical_topk(index, logical[:2], md)
    viewed = np.from_dlpack(physical)
    del group, physical
    gc.collect()
    np.testing.assert_array_equal(viewed, convert(req_id, table, rows, BLOCK_SIZE)[0])


def test_a_plain_group_gathers_fp8_prefill_on_the_stream(arrays, rng):
    _, layers = build_model(arrays.poisoned((MAX_TOKENS, K)))
    cache = random_fp8_rows(rng, 8 * 16).reshape(8, 16, 656)
    table = np.array([[3, 1, 0], [5, 2, 7]], np.int32)
    starts = np.array([0, 20], np.int32)
    dst = arrays.poisoned((45, 576), np.uint16, 0xDEAD)
    group, index = layers[1]
    assert group.gather_fp8_prefill(index, arrays(cache), arrays.bf16(dst), arrays(table), arrays(starts), 2,
                                    metadata(), 0) is None
    want = gather_upconvert(cache, table, starts, 2, np.full((45, 576), 0xDEAD, np.uint16))
    np.testing.assert_array_equal(arrays.bits(dst), want)


def test_piecewise_capture_and_dcp_settings_reach_every_group(arrays, rng):
    builder, layers = build_model(arrays.poisoned((MAX_TOKENS, K)))
    builder.set_piecewise_capture(True)
    assert all(g.piecewise_capture for g in builder.groups)
    layers[0][0].piecewise_capture = False
    assert not layers[0][0].piecewise_capture
    builder.set_dcp(dcp_size=2, dcp_rank=1, dcp_interleave=1)
    req_id, table, rows = random_conversion_inputs(rng, T=3, K=K, block_size=2 * BLOCK_SIZE)
    group, index = layers[0]
    md = metadata(req_id_per_token=arrays(req_id), block_table=arrays(table), block_size=BLOCK_SIZE)
    physical, counts = group.convert_logical_to_physical_topk(index, arrays(rows), md, return_valid_counts=True)
    want_physical, want_counts = convert_dcp(req_id, table, rows, BLOCK_SIZE, 2, 1, 1, True)
    np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
    np.testing.assert_array_equal(arrays.numpy(counts), want_counts)
    with pytest.raises(ValueError, match="dcp"):
        group.set_dcp(dcp_size=2, dcp_rank=5)
