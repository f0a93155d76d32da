"""convert_req_index_to_global_index against the scalar models (SPEC sections 2
and 2a) on fresh random data, and its rejections: ValueError or TypeError with
the library's message, nothing written."""

import numpy as np
import pytest

import sparse_mla
from models import convert, convert_dcp
from support import POISON, poisoned, random_conversion_inputs


@pytest.mark.parametrize("K,block_size,stride_blocks", [(64, 16, 1), (128, 64, 1), (384, 16, 3), (256, 1, 2)])
def test_the_conversion_matches_the_model(arrays, rng, K, block_size, stride_blocks):
    req_id, table, logical = random_conversion_inputs(rng, T=19, K=K, block_size=block_size)
    stride = block_size * stride_blocks
    want_physical, want_counts = convert(req_id, table, logical, block_size, stride)
    physical, counts = sparse_mla.convert_req_index_to_global_index(
        arrays(req_id), arrays(table), arrays(logical), block_size=block_size, block_stride_rows=stride,
        return_valid_counts=True)
    np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
    np.testing.assert_array_equal(arrays.numpy(counts), want_counts)
    only = sparse_mla.convert_req_index_to_global_index(arrays(req_id), arrays(table), arrays(logical),
                                                        block_size=block_size, block_stride_rows=stride)
    np.testing.assert_array_equal(arrays.numpy(only), want_physical)


def test_caller_buffers_receive_the_first_rows_and_nothing_else(arrays, rng):
    req_id, table, logical = random_conversion_inputs(rng, T=7, K=128)
    out, counts_out = arrays.poisoned((10, 128)), arrays.poisoned(12)
    physical, counts = sparse_mla.convert_req_index_to_global_index(
        arrays(req_id), arrays(table), arrays(logical), block_size=16, return_valid_counts=True, out=out,
        valid_counts_out=counts_out)
    want_physical, want_counts = convert(req_id, table, logical, 16)
    assert tuple(physical.shape) == (7, 128) and arrays.data_ptr(physical) == arrays.data_ptr(out)
    np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
    out, counts_out = arrays.numpy(out), arrays.numpy(counts_out)
    np.testing.assert_array_equal(out[:7], want_physical)
    assert (out[7:] == POISON).all() and (counts_out[7:] == POISON).all()
    np.testing.assert_array_equal(arrays.numpy(counts), want_counts)


@pytest.mark.parametrize("dcp_size,dcp_rank,interleave,compact", [(4, 2, 16, True), (2, 0, 1, False), (3, 1, 4, True)])
def test_the_dcp_conversion_matches_the_model(arrays, rng, dcp_size, dcp_rank, interleave, compact):
    block_size = 64
    req_id, table, logical = random_conversion_inputs(rng, T=9, K=256, B=6, block_size=block_size * dcp_size)
    want_physical, want_counts = convert_dcp(req_id, table, logical, block_size, dcp_size, dcp_rank, interleave, compact)
    physical, counts = sparse_mla.convert_req_index_to_global_index(
        arrays(req_id), arrays(table), arrays(logical), block_size=block_size, return_valid_counts=True,
        dcp_size=dcp_size, dcp_rank=dcp_rank, dcp_interleave=interleave, compact=compact)
    np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
    np.testing.assert_array_equal(arrays.numpy(counts), want_counts)
    # Without return_valid_counts only the physical rows come back (the counts are still written, then freed).
    out = arrays.poisoned((9, 256))
    assert sparse_mla.convert_req_index_to_global_index(
        arrays(req_id), arrays(table), arrays(logical), block_size=block_size, out=out, dcp_size=dcp_size,
        dcp_rank=dcp_rank, dcp_interleave=interleave, compact=compact) is out
    np.testing.assert_array_equal(arrays.numpy(out), want_physical)


def test_the_prefill_workspace_variant_matches_the_model(arrays, rng):
    req_id, table, logical = random_conversion_inputs(rng, T=12, K=64)
    workspace_request = np.where(np.arange(12) < 4, -1, (np.arange(12) - 4) // 3).astype(np.int32)
    workspace_starts = np.array([0, 300, 700], np.int32)
    want_physical, want_counts = convert(req_id, table, logical, 16, None, workspace_request, workspace_starts)
    physical, counts = sparse_mla.convert_req_index_to_global_index(
        arrays(req_id), arrays(table), arrays(logical), block_size=16, return_valid_counts=True,
        prefill_workspace_request_ids=arrays(workspace_request), prefill_workspace_starts=arrays(workspace_starts))
    np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
    np.testing.assert_array_equal(arrays.numpy(counts), want_counts)


def rejections(arrays):
    """Case name: (exception, message fragment, how to break the arguments)."""
    def wrong_dtype(a):
        a["token_indices"] = arrays(a["token_indices"].astype(np.int16))

    def wrong_shape(a):
        a["block_table"] = arrays(a["block_table"].reshape(-1))

    def short_req_id(a):
        a["req_id"] = arrays(a["req_id"][:3])

    def non_contiguous_rows(a):
        a["token_indices"] = arrays(np.repeat(a["token_indices"], 2, axis=1))[:, ::2]

    def wrong_device(a):
        a["out"] = arrays.foreign(poisoned((8, 64)))

    def counts_out_without_counts(a):
        a["return_valid_counts"] = False

    def out_too_small(a):
        a["out"] = a["out"][:4]

    def out_wrong_dtype(a):
        a["out"] = a["out"].view(np.uint32) if arrays.host else a["out"].view(arrays.torch.float32)

    def bad_dcp_rank(a):
        a["dcp_size"], a["dcp_rank"] = 2, 2

    return {
        "wrong dtype": (TypeError, "logical top-k has dtype I16, expected I32", wrong_dtype),
        "wrong shape": (ValueError, "block_table has shape", wrong_shape),
        "short req_id": (ValueError, "req_id has shape", short_req_id),
        "non-contiguous rows": (ValueError, "is not row-contiguous", non_contiguous_rows),
        "wrong device": (ValueError, arrays.foreign_message, wrong_device),
        "counts out without counts": (ValueError, "valid_counts_out given but return_valid_counts is false",
                                      counts_out_without_counts),
        "out too small": (ValueError, "out has shape", out_too_small),
        "out of a dtype no call takes": (TypeError, "out has dtype (uint32|F32)", out_wrong_dtype),
        "bad dcp rank": (ValueError, "rank", bad_dcp_rank),
    }


@pytest.mark.parametrize("name", ["wrong dtype", "wrong shape", "short req_id", "non-contiguous rows", "wrong device",
                                  "counts out without counts", "out too small", "out of a dtype no call takes",
                                  "bad dcp rank"])
def test_a_rejected_conversion_raises_with_the_library_message_and_writes_nothing(arrays, rng, name):
    error, message, breaks = rejections(arrays)[name]
    req_id, table, logical = random_conversion_inputs(rng, T=8, K=64)
    out, counts_out = arrays.poisoned((8, 64)), arrays.poisoned(8)
    args = dict(req_id=req_id, block_table=table, token_indices=logical, out=out, valid_counts_out=counts_out,
                return_valid_counts=True, dcp_size=1, dcp_rank=0)
    breaks(args)
    tensors = {k: arrays(v) if k in ("req_id", "block_table", "token_indices") and isinstance(v, np.ndarray) else v
               for k, v in args.items()}
    with pytest.raises(error, match=message):
        sparse_mla.convert_req_index_to_global_index(
            tensors["req_id"], tensors["block_table"], tensors["token_indices"], block_size=16, out=tensors["out"],
            valid_counts_out=tensors["valid_counts_out"], return_valid_counts=args["return_valid_counts"],
            dcp_size=args["dcp_size"], dcp_rank=args["dcp_rank"])
    assert (arrays.numpy(out) == POISON).all() and (arrays.numpy(counts_out) == POISON).all()


def test_an_explicit_stream_only_queues_the_work(device, arrays, rng):
    req_id, table, logical = random_conversion_inputs(rng, T=8, K=128)
    inputs = arrays(req_id), arrays(table), arrays(logical)
    out, counts_out = arrays.poisoned((8, 128)), arrays.poisoned(8)
    stream = device.create_stream()
    stream.wait_stream(device.default_stream())  # the inputs' copies, queued on the default stream
    before = device.activity()
    sparse_mla.convert_req_index_to_global_index(*inputs, block_size=16, return_valid_counts=True, out=out,
                                                 valid_counts_out=counts_out, stream=stream)
    queued = device.activity()
    stream.synchronize()
    assert queued["allocations"] == before["allocations"]
    assert queued["host_synchronizations"] == before["host_synchronizations"]
    want_physical, want_counts = convert(req_id, table, logical, 16)
    np.testing.assert_array_equal(arrays.numpy(out), want_physical)
    np.testing.assert_array_equal(arrays.numpy(counts_out), want_counts)
