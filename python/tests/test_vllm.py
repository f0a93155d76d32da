"""sparse_mla.vllm: the reference engine's call lines, unchanged (vLLM's
sparse_utils.py conversions and ops.cp_gather_and_upconvert_fp8_kv_cache, their
positional and keyword arguments and defaults), checked against the scalar
models on fresh random data, with NumPy and torch tensors on the host backend
and torch CUDA tensors on a GPU; the reference's checks raise the reference's
kind of error and write nothing."""

import numpy as np
import pytest

import sparse_mla
from models import convert, convert_dcp, gather_upconvert, random_fp8_rows
from sparse_mla import vllm as ops
from sparse_mla.vllm import triton_convert_req_index_to_global_index, triton_filter_and_convert_dcp_index
from support import BACKEND, TORCH_VERSION, random_conversion_inputs

BF16_POISON = 0xDEAD


def assert_result_of(arrays, result, like):
    """A torch caller gets torch tensors of its inputs' device; others the library's tensors."""
    if arrays.framework == "torch":
        assert isinstance(result, arrays.torch.Tensor) and result.device == like.device
        assert result.dtype == arrays.torch.int32 and result.is_contiguous()
    else:
        assert isinstance(result, sparse_mla.Tensor)


@pytest.mark.parametrize("K,block_size,stride_blocks", [(128, 16, 1), (256, 64, 2), (384, 1, 3)])
def test_the_engines_call_line_converts_as_the_model(producer_arrays, rng, K, block_size, stride_blocks):
    arrays = producer_arrays
    req_id, block_table, logical = random_conversion_inputs(rng, T=11, K=K, block_size=block_size)
    stride = block_size * stride_blocks
    want_physical, want_counts = convert(req_id, block_table, logical, block_size, stride)
    req_id_per_token, table, token_indices = arrays(req_id), arrays(block_table), arrays(logical)
    # vLLM's call, as the engine writes it.
    topk_indices, valid_counts = triton_convert_req_index_to_global_index(
        req_id_per_token, table, token_indices, BLOCK_SIZE=block_size, BLOCK_STRIDE_ROWS=stride, NUM_TOPK_TOKENS=K,
        return_valid_counts=True)
    np.testing.assert_array_equal(arrays.numpy(topk_indices), want_physical)
    np.testing.assert_array_equal(arrays.numpy(valid_counts), want_counts)
    assert_result_of(arrays, topk_indices, token_indices)
    assert tuple(topk_indices.shape) == (11, K) and tuple(valid_counts.shape) == (11,)
    # Positional tile sizes, accepted and ignored; no counts by default.
    only = triton_convert_req_index_to_global_index(req_id_per_token, table, token_indices, block_size, stride, K, 64)
    np.testing.assert_array_equal(arrays.numpy(only), want_physical)


def test_one_decode_token_converts(producer_arrays, rng):
    """token_indices [1, K]: torch's DLPack gives a size-1 dimension stride 1, which is no layout error."""
    arrays = producer_arrays
    req_id, block_table, logical = random_conversion_inputs(rng, T=1, K=256)
    physical, counts = triton_convert_req_index_to_global_index(arrays(req_id), arrays(block_table), arrays(logical),
                                                                BLOCK_SIZE=16, NUM_TOPK_TOKENS=256,
                                                                return_valid_counts=True)
    want_physical, want_counts = convert(req_id, block_table, logical, 16)
    np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
    np.testing.assert_array_equal(arrays.numpy(counts), want_counts)


def test_the_defaults_are_the_references(producer_arrays, rng):
    """BLOCK_SIZE 64, BLOCK_STRIDE_ROWS = BLOCK_SIZE, NUM_TOPK_TOKENS 2048."""
    arrays = producer_arrays
    req_id, block_table, logical = random_conversion_inputs(rng, T=3, K=2048, B=40, physical_blocks=400,
                                                             block_size=64)
    result = triton_convert_req_index_to_global_index(arrays(req_id), arrays(block_table), arrays(logical))
    np.testing.assert_array_equal(arrays.numpy(result), convert(req_id, block_table, logical, 64)[0])


def test_the_prefill_workspace_variant_converts_as_the_model(producer_arrays, rng):
    arrays = producer_arrays
    req_id, block_table, logical = random_conversion_inputs(rng, T=12, K=128)
    workspace_request = np.where(np.arange(12) < 4, -1, (np.arange(12) - 4) // 3).astype(np.int32)
    workspace_starts = np.array([0, 300, 700], np.int32)
    # Tokens of prefill rows within the request's table, as an engine's are.
    logical[4:] = np.where(logical[4:] >= 5 * 16, -1, logical[4:])
    want_physical, want_counts = convert(req_id, block_table, logical, 16, None, workspace_request, workspace_starts)
    physical, counts = triton_convert_req_index_to_global_index(
        arrays(req_id), arrays(block_table), arrays(logical), BLOCK_SIZE=16, NUM_TOPK_TOKENS=128,
        HAS_PREFILL_WORKSPACE=True, prefill_workspace_request_ids=arrays(workspace_request),
        prefill_workspace_starts=arrays(workspace_starts), return_valid_counts=True)
    np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
    np.testing.assert_array_equal(arrays.numpy(counts), want_counts)
    # Without HAS_PREFILL_WORKSPACE the reference reads neither tensor.
    plain = triton_convert_req_index_to_global_index(
        arrays(req_id), arrays(block_table), arrays(logical), BLOCK_SIZE=16, NUM_TOPK_TOKENS=128,
        prefill_workspace_request_ids=arrays(workspace_request), prefill_workspace_starts=arrays(workspace_starts))
    np.testing.assert_array_equal(arrays.numpy(plain), convert(req_id, block_table, logical, 16)[0])


def test_strided_inputs_are_taken_as_the_reference_takes_them(producer_arrays, rng):
    """The reference copies its inputs with .contiguous(): a column-strided token_indices works."""
    arrays = producer_arrays
    req_id, block_table, logical = random_conversion_inputs(rng, T=5, K=128)
    wide = arrays(np.repeat(logical, 2, axis=1))
    physical = triton_convert_req_index_to_global_index(arrays(req_id), arrays(block_table), wide[:, ::2],
                                                        BLOCK_SIZE=16, NUM_TOPK_TOKENS=128)
    np.testing.assert_array_equal(arrays.numpy(physical), convert(req_id, block_table, logical, 16)[0])


@pytest.mark.parametrize("dcp_size,dcp_rank,interleave,compact", [(4, 2, 16, True), (2, 0, 1, False), (8, 7, 4, True)])
@pytest.mark.parametrize("with_counts", [True, False])
def test_the_dcp_call_line_filters_and_converts_as_the_model(producer_arrays, rng, dcp_size, dcp_rank, interleave,
                                                             compact, with_counts):
    arrays = producer_arrays
    block_size, K = 64, 256
    req_id, block_table, logical = random_conversion_inputs(rng, T=9, K=K, B=6, block_size=block_size * dcp_size)
    want_physical, want_counts = convert_dcp(req_id, block_table, logical, block_size, dcp_size, dcp_rank,
                                             interleave, compact)
    result = triton_filter_and_convert_dcp_index(
        arrays(req_id), arrays(block_table), arrays(logical), dcp_size, dcp_rank, interleave, BLOCK_SIZE=block_size,
        NUM_TOPK_TOKENS=K, return_valid_counts=with_counts, compact_valid_to_front=compact)
    physical = result[0] if with_counts else result
    np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
    if with_counts:
        np.testing.assert_array_equal(arrays.numpy(result[1]), want_counts)


def test_one_dcp_rank_is_the_plain_conversion(producer_arrays, rng):
    """dcp_size == 1 falls back to the plain conversion, uncompacted even when compaction is asked for."""
    arrays = producer_arrays
    req_id, block_table, logical = random_conversion_inputs(rng, T=6, K=128, block_size=64)
    physical, counts = triton_filter_and_convert_dcp_index(arrays(req_id), arrays(block_table), arrays(logical), 1, 0,
                                                           BLOCK_SIZE=64, NUM_TOPK_TOKENS=128,
                                                           return_valid_counts=True)
    want_physical, want_counts = convert(req_id, block_table, logical, 64)
    np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
    np.testing.assert_array_equal(arrays.numpy(counts), want_counts)


def conversion_rejections(arrays):
    """Case: (exception, message, call). The reference asserts: AssertionError."""
    def call(**changes):
        def run(req_id, table, logical):
            args = dict(BLOCK_SIZE=16, NUM_TOPK_TOKENS=128)
            args.update(changes)
            return triton_convert_req_index_to_global_index(req_id, table, logical, **args)
        return run

    def dcp(**changes):
        def run(req_id, table, logical):
            args = dict(dcp_size=2, dcp_rank=0, BLOCK_SIZE=16, NUM_TOPK_TOKENS=128)
            args.update(changes)
            return triton_filter_and_convert_dcp_index(req_id, table, logical, **args)
        return run

    def wrong_dtype(req_id, table, logical):
        return triton_convert_req_index_to_global_index(req_id, table, arrays(arrays.numpy(logical).astype(np.int64)),
                                                        BLOCK_SIZE=16, NUM_TOPK_TOKENS=128)

    def long_req_id(req_id, table, logical):
        longer = arrays(np.concatenate([arrays.numpy(req_id), [0]]).astype(np.int32))
        return triton_convert_req_index_to_global_index(longer, table, logical, BLOCK_SIZE=16, NUM_TOPK_TOKENS=128)

    return {
        "wrong dtype": (AssertionError, "token_indices has dtype .*int64, expected int32", wrong_dtype),
        "req_id longer than token_indices": (AssertionError, "must cover the same tokens", long_req_id),
        "NUM_TOPK_TOKENS default against K = 128": (AssertionError, "NUM_TOPK_TOKENS is 2048", call(NUM_TOPK_TOKENS=2048)),
        "BLOCK_N not dividing": (AssertionError, r"NUM_TOPK_TOKENS \(128\) must be divisible by BLOCK_N \(48\)",
                                 call(BLOCK_N=48)),
        "prefill workspace missing": (AssertionError, "HAS_PREFILL_WORKSPACE needs", call(HAS_PREFILL_WORKSPACE=True)),
        "unknown keyword": (TypeError, "block_size", call(block_size=16)),
        "dcp rank out of range": (AssertionError, r"dcp_rank is 2, expected 0 <= dcp_rank < dcp_size \(2\)",
                                  dcp(dcp_rank=2)),
        "interleave not dividing": (AssertionError, r"BLOCK_SIZE \(16\) must be divisible by "
                                    r"cp_kv_cache_interleave_size \(3\)", dcp(cp_kv_cache_interleave_size=3)),
        "dcp NUM_TOPK_TOKENS": (AssertionError, "NUM_TOPK_TOKENS is 256", dcp(NUM_TOPK_TOKENS=256)),
    }


@pytest.mark.parametrize("name", ["wrong dtype", "req_id longer than token_indices",
                                  "NUM_TOPK_TOKENS default against K = 128", "BLOCK_N not dividing",
                                  "prefill workspace missing", "unknown keyword", "dcp rank out of range",
                                  "interleave not dividing", "dcp NUM_TOPK_TOKENS"])
def test_a_rejected_conversion_raises_the_references_kind_of_error(producer_arrays, rng, name):
    arrays = producer_arrays
    error, message, call = conversion_rejections(arrays)[name]
    req_id, table, logical = random_conversion_inputs(rng, T=8, K=128)
    with pytest.raises(error, match=message):
        call(arrays(req_id), arrays(table), arrays(logical))


def random_gather(rng, seq_lens, block_size=16, num_blocks=12):
    cache = random_fp8_rows(rng, num_blocks * block_size).reshape(num_blocks, block_size, 656)
    table = rng.integers(0, num_blocks, size=(len(seq_lens), max(seq_lens) // block_size + 2), dtype=np.int32)
    starts = np.concatenate([[0], np.cumsum(seq_lens)[:-1]]).astype(np.int32)
    return cache, table, starts, int(np.sum(seq_lens))


def test_the_engines_gather_call_line_upconverts_as_the_model(producer_arrays, rng):
    arrays = producer_arrays
    seq_lens = [17, 40, 5]
    cache, table, starts, total = random_gather(rng, seq_lens)
    seq_starts = np.array([0, 3, 11], np.int32)
    bits = arrays.poisoned((total, 576), np.uint16, BF16_POISON)
    # vllm/_custom_ops.py's signature: seq_starts is the sixth positional argument.
    assert ops.cp_gather_and_upconvert_fp8_kv_cache(arrays(cache), arrays.bf16(bits), arrays(table), arrays(starts),
                                                    len(seq_lens), arrays(seq_starts)) is None
    want = gather_upconvert(cache, table, starts, len(seq_lens), np.full((total, 576), BF16_POISON, np.uint16),
                            seq_starts=seq_starts)
    np.testing.assert_array_equal(arrays.bits(bits), want)


@pytest.mark.skipif(TORCH_VERSION is None or TORCH_VERSION < (2, 1),
                    reason="needs torch >= 2.1 (torch.float8_e4m3fn)")
def test_a_cache_of_torch_fp8_dtype_is_taken_as_its_bytes(device, rng):
    import torch

    from support import Arrays, TorchCpuArrays

    arrays = TorchCpuArrays(device) if BACKEND == "host" else Arrays(device)
    cache, table, starts, total = random_gather(rng, [20, 9])
    bits = arrays.poisoned((total, 576), np.uint16, BF16_POISON)
    ops.cp_gather_and_upconvert_fp8_kv_cache(arrays(cache).view(torch.float8_e4m3fn), arrays.bf16(bits), arrays(table),
                                             arrays(starts), 2)
    np.testing.assert_array_equal(arrays.bits(bits), gather_upconvert(cache, table, starts, 2,
                                                                      np.full((total, 576), BF16_POISON, np.uint16)))


def gather_rejections(arrays):
    """Case: (exception, message, how to break the arguments). The reference's TORCH_CHECKs: RuntimeError."""
    def table_int64(a):
        a["block_table"] = arrays(arrays.numpy(a["block_table"]).astype(np.int64))

    def starts_int64(a):
        a["workspace_starts"] = arrays(arrays.numpy(a["workspace_starts"]).astype(np.int64))

    def seq_starts_int64(a):
        a["seq_starts"] = arrays(np.zeros(2, np.int64))

    def dst_not_bf16(a):
        a["dst"] = a["bits"]

    def dst_narrow(a):
        a["dst"] = arrays.bf16(a["bits"][:, :512])

    def rows_too_short(a):
        a["src_cache"] = a["src_cache"][:, :, :640]

    return {
        "block_table int64": (RuntimeError, "block_table has dtype .*int64, expected int32", table_int64),
        "workspace_starts int64": (RuntimeError, "workspace_starts has dtype .*int64, expected int32", starts_int64),
        "seq_starts int64": (RuntimeError, "seq_starts has dtype .*int64, expected int32", seq_starts_int64),
        "dst not bf16": (RuntimeError, "dst has dtype .*, expected bfloat16", dst_not_bf16),
        "dst not 576 wide": (RuntimeError, r"dst has shape \[20, 512\], expected \[total_tokens, 576\]", dst_narrow),
        "rows of 640 bytes": (ValueError, "bytes per fp8_ds_mla row", rows_too_short),  # the library's own check
    }


@pytest.mark.parametrize("name", ["block_table int64", "workspace_starts int64", "seq_starts int64", "dst not bf16",
                                  "dst not 576 wide", "rows of 640 bytes"])
def test_a_rejected_gather_raises_the_references_kind_of_error_and_writes_nothing(producer_arrays, rng, name):
    arrays = producer_arrays
    error, message, breaks = gather_rejections(arrays)[name]
    cache, table, starts, _ = random_gather(rng, [10, 10])
    bits = arrays.poisoned((20, 576), np.uint16, BF16_POISON)
    args = dict(src_cache=arrays(cache), bits=bits, dst=arrays.bf16(bits), block_table=arrays(table),
                workspace_starts=arrays(starts), seq_starts=None)
    breaks(args)
    with pytest.raises(error, match=message):
        ops.cp_gather_and_upconvert_fp8_kv_cache(args["src_cache"], args["dst"], args["block_table"],
                                                 args["workspace_starts"], 2, args["seq_starts"])
    assert (arrays.bits(bits) == BF16_POISON).all()
