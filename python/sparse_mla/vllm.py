"""The reference engine's functions under their own names and arguments, run by
sparse_mla: an engine's call lines work unchanged once these names are imported
from here (docs/python.md, "Drop-in").

    from sparse_mla.vllm import (triton_convert_req_index_to_global_index,
                                 triton_filter_and_convert_dcp_index)
    from sparse_mla import vllm as ops   # ops.cp_gather_and_upconvert_fp8_kv_cache(...)

The signatures are vLLM's (vllm/v1/attention/backends/mla/sparse_utils.py and
vllm/_custom_ops.py): the same positional and keyword arguments, defaults and
return shapes. The tile-size arguments (BLOCK_N) are checked as the reference
checks them and otherwise ignored (the library has no tile size); NUM_TOPK_TOKENS
must be token_indices' width. A rejected argument raises the reference's kind of
error with a message that names it: AssertionError for the conversions (the
reference asserts), RuntimeError for the gather (the reference's TORCH_CHECK);
what the reference does not check, the library does (ValueError, TypeError).
Nothing is written when a call is rejected.

Torch tensors run the torch ops (torch.ops.sparse_mla.*) and return torch
tensors allocated by torch; NumPy arrays run on the host backend and return
sparse_mla.Tensor. Inputs need not be contiguous (the reference copies them
with .contiguous(), so does this).
"""

import sparse_mla

__all__ = [
    "triton_convert_req_index_to_global_index",
    "triton_filter_and_convert_dcp_index",
    "cp_gather_and_upconvert_fp8_kv_cache",
]


def _torch_tensor(x):
    ops = sparse_mla._torch_ops
    return ops is not None and isinstance(x, ops.Tensor)


def _dtype_is(x, name):
    """Whether x (a torch tensor, a NumPy array, a sparse_mla.Tensor) has the dtype `name`."""
    if _torch_tensor(x):
        return x.dtype == getattr(sparse_mla._torch_ops.torch, name, None)
    return str(x.dtype) == name


def _contiguous(x):
    if x is None:
        return None
    if _torch_tensor(x):
        return x.contiguous()
    if type(x).__module__ == "numpy":
        import numpy

        return numpy.ascontiguousarray(x)
    return x


def _fail(error, where, message):
    raise error(f"{where}: {message}")


def _check_int32(where, error, **tensors):
    for name, x in tensors.items():
        if not _dtype_is(x, "int32"):
            _fail(error, where, f"{name} has dtype {x.dtype}, expected int32")


def _check_topk(where, token_indices, NUM_TOPK_TOKENS, BLOCK_N):
    shape = token_indices.shape
    if len(shape) != 2:
        _fail(AssertionError, where, f"token_indices has shape {list(shape)}, expected [num_tokens, NUM_TOPK_TOKENS]")
    if shape[1] != NUM_TOPK_TOKENS:
        _fail(AssertionError, where,
              f"token_indices has shape {list(shape)} but NUM_TOPK_TOKENS is {NUM_TOPK_TOKENS}: they must agree")
    if BLOCK_N <= 0 or NUM_TOPK_TOKENS % BLOCK_N != 0:
        _fail(AssertionError, where, f"NUM_TOPK_TOKENS ({NUM_TOPK_TOKENS}) must be divisible by BLOCK_N ({BLOCK_N})")


def _check_rows(where, req_id, token_indices):
    if len(req_id.shape) != 1 or req_id.shape[0] != token_indices.shape[0]:
        _fail(AssertionError, where, f"req_id has shape {list(req_id.shape)} and token_indices "
              f"{list(token_indices.shape)}: they must cover the same tokens")


def triton_convert_req_index_to_global_index(req_id, block_table, token_indices, BLOCK_SIZE=64,
                                             BLOCK_STRIDE_ROWS=None, NUM_TOPK_TOKENS=2048, BLOCK_N=128,
                                             HAS_PREFILL_WORKSPACE=False, prefill_workspace_request_ids=None,
                                             prefill_workspace_starts=None, return_valid_counts=False):
    """vLLM's triton_convert_req_index_to_global_index: token_indices int32 [T, NUM_TOPK_TOKENS]
    (positions in each token's request, -1 unused) to physical rows
    block_table[req_id[t], tok // BLOCK_SIZE] * BLOCK_STRIDE_ROWS + tok % BLOCK_SIZE (-1 where
    tok < 0 or past the table); with HAS_PREFILL_WORKSPACE, a token whose
    prefill_workspace_request_ids entry p >= 0 maps to prefill_workspace_starts[p] + tok.
    Returns out int32 [T, NUM_TOPK_TOKENS], or (out, valid_counts int32 [T]) with
    return_valid_counts. SPEC section 2."""
    where = "triton_convert_req_index_to_global_index"
    _check_int32(where, AssertionError, req_id=req_id, block_table=block_table, token_indices=token_indices)
    _check_topk(where, token_indices, NUM_TOPK_TOKENS, BLOCK_N)
    _check_rows(where, req_id, token_indices)
    if HAS_PREFILL_WORKSPACE:
        if prefill_workspace_request_ids is None or prefill_workspace_starts is None:
            _fail(AssertionError, where, "HAS_PREFILL_WORKSPACE needs prefill_workspace_request_ids and "
                  "prefill_workspace_starts")
        _check_int32(where, AssertionError, prefill_workspace_request_ids=prefill_workspace_request_ids,
                     prefill_workspace_starts=prefill_workspace_starts)
    else:  # the reference's kernel reads them only with HAS_PREFILL_WORKSPACE
        prefill_workspace_request_ids = prefill_workspace_starts = None
    return sparse_mla.convert_req_index_to_global_index(
        _contiguous(req_id), _contiguous(block_table), _contiguous(token_indices), block_size=BLOCK_SIZE,
        block_stride_rows=BLOCK_STRIDE_ROWS, return_valid_counts=return_valid_counts,
        prefill_workspace_request_ids=_contiguous(prefill_workspace_request_ids),
        prefill_workspace_starts=_contiguous(prefill_workspace_starts))


def triton_filter_and_convert_dcp_index(req_id, block_table, token_indices, dcp_size, dcp_rank,
                                        cp_kv_cache_interleave_size=1, BLOCK_SIZE=64, NUM_TOPK_TOKENS=2048,
                                        BLOCK_N=128, return_valid_counts=False, compact_valid_to_front=True):
    """vLLM's triton_filter_and_convert_dcp_index: the conversion for decode context parallel
    rank dcp_rank of dcp_size, the cache spread over the ranks in groups of
    cp_kv_cache_interleave_size tokens; block_table is the rank's. Tokens of other ranks give -1;
    compact_valid_to_front moves each row's valid entries to its front (in input order, where the
    reference leaves the order unspecified) and fills the rest with -1. dcp_size == 1 is
    triton_convert_req_index_to_global_index. Returns out, or (out, valid_counts) with
    return_valid_counts. SPEC section 2a."""
    where = "triton_filter_and_convert_dcp_index"
    if dcp_size < 1:
        _fail(AssertionError, where, f"dcp_size is {dcp_size}, expected >= 1")
    if not 0 <= dcp_rank < dcp_size:
        _fail(AssertionError, where, f"dcp_rank is {dcp_rank}, expected 0 <= dcp_rank < dcp_size ({dcp_size})")
    if cp_kv_cache_interleave_size <= 0 or BLOCK_SIZE % cp_kv_cache_interleave_size != 0:
        _fail(AssertionError, where, f"BLOCK_SIZE ({BLOCK_SIZE}) must be divisible by cp_kv_cache_interleave_size "
              f"({cp_kv_cache_interleave_size})")
    _check_int32(where, AssertionError, req_id=req_id, block_table=block_table, token_indices=token_indices)
    _check_topk(where, token_indices, NUM_TOPK_TOKENS, BLOCK_N)
    if dcp_size == 1:
        return triton_convert_req_index_to_global_index(req_id, block_table, token_indices, BLOCK_SIZE=BLOCK_SIZE,
                                                        NUM_TOPK_TOKENS=NUM_TOPK_TOKENS, BLOCK_N=BLOCK_N,
                                                        return_valid_counts=return_valid_counts)
    # The reference sizes its grid by req_id and its output by token_indices: a
    # longer req_id writes past the output there, a clear error here.
    _check_rows(where, req_id, token_indices)
    return sparse_mla.convert_req_index_to_global_index(
        _contiguous(req_id), _contiguous(block_table), _contiguous(token_indices), block_size=BLOCK_SIZE,
        return_valid_counts=return_valid_counts, dcp_size=dcp_size, dcp_rank=dcp_rank,
        dcp_interleave=cp_kv_cache_interleave_size, compact=compact_valid_to_front)


def _source_bytes(src_cache):
    """The cache as bytes: vLLM takes uint8 or one of torch's fp8 dtypes holding the same rows."""
    if _torch_tensor(src_cache) and src_cache.dtype != sparse_mla._torch_ops.torch.uint8:
        torch = sparse_mla._torch_ops.torch
        fp8 = [getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)]
        if src_cache.dtype not in fp8:
            _fail(RuntimeError, "cp_gather_and_upconvert_fp8_kv_cache",
                  f"src_cache has dtype {src_cache.dtype}, expected uint8, float8_e4m3fn or float8_e5m2")
        return src_cache.view(torch.uint8)
    return src_cache


def cp_gather_and_upconvert_fp8_kv_cache(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None,
                                         host_cache=None, host_row_ids=None, device_row_ids=None):
    """vLLM's ops.cp_gather_and_upconvert_fp8_kv_cache: the fp8_ds_mla cache rows
    (src_cache [num_blocks, block_size, 656]) of batch_size requests gathered through
    block_table and upconverted to bf16 into dst [total_tokens, 576]; request r fills rows
    workspace_starts[r] up to the next request's start (the last one to total_tokens), from its
    source token seq_starts[r] (or 0) on. The host-backed variant of the reference's HiSparse
    engine reads the rows staged in host_cache (pinned memory) where device_row_ids is -1. Writes
    dst, returns None. SPEC section 3."""
    where = "cp_gather_and_upconvert_fp8_kv_cache"
    _check_int32(where, RuntimeError, block_table=block_table, workspace_starts=workspace_starts)
    if seq_starts is not None:
        _check_int32(where, RuntimeError, seq_starts=seq_starts)
    if _torch_tensor(src_cache):
        for name, x in (("dst", dst), ("block_table", block_table), ("workspace_starts", workspace_starts),
                        ("seq_starts", seq_starts)):
            if x is not None and _torch_tensor(x) and x.device != src_cache.device:
                _fail(RuntimeError, where, f"src_cache and {name} must be on the same device ({src_cache.device}, "
                      f"{x.device})")
    if not _dtype_is(dst, "bfloat16"):
        _fail(RuntimeError, where, f"dst has dtype {dst.dtype}, expected bfloat16")
    if len(dst.shape) != 2 or dst.shape[1] != 576:
        _fail(RuntimeError, where, f"dst has shape {list(dst.shape)}, expected [total_tokens, 576] (head_dim 576 for "
              "MLA)")
    sparse_mla.cp_gather_and_upconvert_fp8_kv_cache(
        _source_bytes(src_cache), dst, _contiguous(block_table), _contiguous(workspace_starts), batch_size,
        seq_starts=_contiguous(seq_starts), host_cache=host_cache, host_row_ids=_contiguous(host_row_ids),
        device_row_ids=_contiguous(device_row_ids))
