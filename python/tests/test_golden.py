"""The golden files (tests/data/golden, produced by the reference engine's own
kernels on an H200) through the module, bit for bit: the conversions and the
gather-upconvert as plain operations (DeepSeek V4's pages too) and through groups, and the six HiSparse
steps of h1 through a HiSparse group."""

import numpy as np
import pytest

import sparse_mla
from golden import read_case
from support import POISON, metadata

TOPK_CASES = ["c1_convert_tiny_edges", "c3_convert_tiled_k384_bs16", "c5_convert_bs1"]
DCP_CASES = ["d1_convert_dcp_small", "d3_convert_dcp_gaps"]
FP8_CASES = ["u1_upconvert_small", "u3_upconvert_seq_starts", "u4_upconvert_bs1"]
V4_CASES = ["v4a_gather_small", "v4b_gather_bs2"]


@pytest.mark.parametrize("stem", TOPK_CASES)
def test_topk_golden_cases_convert_exactly(arrays, stem):
    t, meta = read_case(stem)
    out, counts_out = arrays.poisoned(t["physical"].shape), arrays.poisoned(t["valid_counts"].shape)
    sparse_mla.convert_req_index_to_global_index(
        arrays(t["req_id"]), arrays(t["block_table"]), arrays(t["logical"]), block_size=meta["block_size"],
        block_stride_rows=meta["block_stride_rows"], return_valid_counts=True, out=out, valid_counts_out=counts_out)
    np.testing.assert_array_equal(arrays.numpy(out), t["physical"])
    np.testing.assert_array_equal(arrays.numpy(counts_out), t["valid_counts"])


@pytest.mark.parametrize("stem", TOPK_CASES)
def test_topk_golden_cases_convert_exactly_through_a_group_decode_step(arrays, stem):
    t, meta = read_case(stem)
    T = t["logical"].shape[0]
    logical = arrays(t["logical"].copy())
    builder = sparse_mla.SparseMLAIndexGroupBuilder(logical, T - 1)  # T rows fill the workspace: decode-sized
    layers = [builder.register_layer(i == 0) for i in range(3)]
    md = metadata(req_id_per_token=arrays(t["req_id"]), block_table=arrays(t["block_table"]),
                  block_size=meta["block_size"], num_decodes=T, num_decode_tokens=T)
    for group, index in layers:
        group.set_logical_topk_ready(index)
        physical, counts = group.convert_logical_to_physical_topk(
            index, logical, md, block_stride_rows=meta["block_stride_rows"], return_valid_counts=True)
        np.testing.assert_array_equal(arrays.numpy(physical), t["physical"])
        np.testing.assert_array_equal(arrays.numpy(counts), t["valid_counts"])
    assert layers[0][0].conversion_counts == {"decode": 1, "prefill": 0}


@pytest.mark.parametrize("stem", DCP_CASES)
def test_dcp_golden_cases_filter_and_convert_exactly(arrays, stem):
    t, meta = read_case(stem)
    physical, counts = sparse_mla.convert_req_index_to_global_index(
        arrays(t["req_id"]), arrays(t["block_table"]), arrays(t["logical"]), block_size=meta["block_size"],
        return_valid_counts=True, dcp_size=meta["dcp_size"], dcp_rank=meta["dcp_rank"], dcp_interleave=meta["dcp_interleave"],
        compact=meta["compact_to_front"])
    np.testing.assert_array_equal(arrays.numpy(physical), t["physical"])
    np.testing.assert_array_equal(arrays.numpy(counts), t["valid_counts"])


@pytest.mark.parametrize("stem", FP8_CASES)
def test_fp8_golden_cases_upconvert_exactly(arrays, stem):
    t, meta = read_case(stem)
    dst = arrays.poisoned(t["dst"].shape, np.uint16, 0xDEAD)
    seq_starts = t.get("seq_starts")
    sparse_mla.cp_gather_and_upconvert_fp8_kv_cache(
        arrays(t["src_cache"]), arrays.bf16(dst), arrays(t["block_table"]), arrays(t["workspace_starts"]),
        meta["batch_size"], seq_starts=None if seq_starts is None else arrays(seq_starts))
    np.testing.assert_array_equal(arrays.bits(dst), t["dst"])


@pytest.mark.parametrize("stem", [c for c in FP8_CASES if "seq_starts" not in c])  # the group call has none
def test_fp8_golden_cases_upconvert_exactly_through_a_plain_group(arrays, stem):
    t, meta = read_case(stem)
    group, layer = sparse_mla.SparseMLAIndexGroupBuilder(arrays.poisoned((8, 64))).register_layer(True)
    dst = arrays.poisoned(t["dst"].shape, np.uint16, 0xDEAD)
    assert group.gather_fp8_prefill(layer, arrays(t["src_cache"]), arrays.bf16(dst), arrays(t["block_table"]),
                                    arrays(t["workspace_starts"]), meta["batch_size"], metadata(), 0) is None
    np.testing.assert_array_equal(arrays.bits(dst), t["dst"])


@pytest.mark.parametrize("stem", V4_CASES)
def test_v4_golden_cases_upconvert_exactly_as_a_workspace_gather(producer_arrays, stem):
    """Each request's last gather_lens tokens (from seq_starts = seq_lens - gather_lens) into consecutive rows of
    dst give the rows the file's position-range gather wrote (torch tensors: through the torch op)."""
    arrays = producer_arrays
    t, meta = read_case(stem)
    seq_lens, gather_lens = t["seq_lens"], t["gather_lens"]
    starts = np.concatenate([[0], np.cumsum(gather_lens)[:-1]]).astype(np.int32)
    dst = arrays.poisoned((int(gather_lens.sum()), 512), np.uint16, 0xDEAD)
    sparse_mla.cp_gather_and_upconvert_fp8_kv_cache(
        arrays(t["k_cache"]), arrays.bf16(dst), arrays(t["block_table"]), arrays(starts), len(seq_lens),
        seq_starts=arrays((seq_lens - gather_lens).astype(np.int32)), block_size=meta["block_size"],
        kv_format="model1_fp8")
    offset = meta["offset"]
    want = np.concatenate([t["out"][r, offset:offset + g] for r, g in enumerate(gather_lens)])
    np.testing.assert_array_equal(arrays.bits(dst), want)


# state: the slot state the group keeps ("group"), or the engine's own
# slot_rows and lru ("engine"), which the group resets.
@pytest.mark.parametrize("state_owner", ["group", "engine"])
def test_the_hisparse_golden_sequence_replays_exactly_through_a_group(arrays, state_owner):
    t, meta = read_case("h1_hisparse_6steps")
    B, K, H, bs = meta["batch_rows"], meta["top_k"], meta["hot_size"], meta["hot_block_size"]
    states = meta["num_state_rows"]
    # The reference's placement of each state row's hot blocks (blocks 1..8 of a
    # 9-block cache whose block 0 is never used) as engine-owned state; one more
    # state row, never used, makes the group's hot cache hold block 8.
    hot_by_state = arrays(np.vstack([t["hot_block_table_by_state"], [[0, 9]]]).astype(np.int32))
    state = dict(hot_block_table=hot_by_state)
    if state_owner == "engine":
        if arrays.host:
            pytest.skip("engine-owned slot state must be device memory; NumPy arrays are host memory "
                        "(tests/engine_test.cpp gives the host backend's group engine-owned slot state)")
        state.update(slot_rows=arrays(np.full((states + 1, H), 7, np.int32)),
                     lru=arrays(np.zeros((states + 1, H), np.int16)))
    logical = arrays.poisoned((B, K))
    builder = sparse_mla.SparseMLAIndexGroupBuilder(logical, B)
    group, layer = builder.register_layer(True, kv_cache_dtype="fp8_ds_mla", hisparse=dict(
        top_k=K, hot_slots=H, host_pool_rows=meta["host_rows"], max_requests=states + 1, block_size=bs,
        attention_block_stride=meta["attention_block_stride"], state=state))
    np.asarray(group.cache(layer).host_pool)[:] = t["host_cache"]
    hot = group.cache(layer).hot_cache  # [blocks, 64, 656], blocks attention_block_stride rows apart
    arrays.fill(hot, 0xEE)
    np.testing.assert_array_equal(arrays.numpy(group.slot_rows)[:states], t["initial.device_global_indices"])
    np.testing.assert_array_equal(arrays.numpy(group.lru)[:states], t["initial.lru_slots"])
    for s in range(meta["num_steps"]):
        step = {name.split(".", 1)[1]: value for name, value in t.items() if name.startswith(f"step{s}.")}
        arrays.set(logical, slice(None), step["logical"])
        md = metadata(req_id_per_token=arrays(step["request_ids"]), block_table=arrays(t["source_block_table"]),
                      block_size=bs, request_state_indices=arrays(step["request_state_indices"]),
                      resident_block_table=arrays(t["resident_block_table"]),
                      resident_null_block=meta["resident_null_block"], num_decodes=B, num_decode_tokens=B)
        group.set_logical_topk_ready(layer)
        group.prepare_for_batch(layer, md)
        physical, counts = group.convert_logical_to_physical_topk(layer, logical, md, return_valid_counts=True)
        where = f"step {s}"
        np.testing.assert_array_equal(arrays.numpy(physical), step["attention_indices"], err_msg=where)
        np.testing.assert_array_equal(arrays.numpy(counts), step["valid_counts"], err_msg=where)
        np.testing.assert_array_equal(arrays.numpy(group.hot_indices)[:B], step["hot_indices"], err_msg=where)
        swap_counts = arrays.numpy(group.swap_counts)[:B]
        np.testing.assert_array_equal(swap_counts, step["swap_counts"], err_msg=where)
        padding = step["request_state_indices"] < 0
        np.testing.assert_array_equal(arrays.numpy(group.miss_mask)[:B][~padding], step["miss_mask"][~padding],
                                      err_msg=where)
        for row in range(B):  # only the first swap_counts[row] swap entries are defined
            n = swap_counts[row]
            for name in ("swap_host_rows", "swap_device_rows"):
                np.testing.assert_array_equal(arrays.numpy(getattr(group, name))[row, :n], step[name][row, :n],
                                              err_msg=f"{where} {name} row {row}")
        np.testing.assert_array_equal(arrays.numpy(group.slot_rows)[:states], step["device_global_indices"], err_msg=where)
        np.testing.assert_array_equal(arrays.numpy(group.lru)[:states], step["lru_slots"], err_msg=where)
        np.testing.assert_array_equal(arrays.numpy(hot)[:step["hot_cache"].shape[0]], step["hot_cache"], err_msg=where)
    counters = group.counters()
    totals = meta["totals"]
    assert (counters["hits"], counters["misses"]) == (totals["hits"], totals["misses"])
    assert POISON not in arrays.numpy(group.physical_topk_indices)[:B]
