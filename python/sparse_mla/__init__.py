"""sparse-mla: DeepSeek-V3.2 sparse MLA attention bookkeeping (index groups, top-k
conversion, FP8 gather-upconvert, HiSparse) on host, CUDA and HIP devices, tensors
through DLPack (docs/python.md).

The library's objects come from the extension `sparse_mla._native`. This package adds,
in Python over it:

- torch in, torch out: the two operations given torch tensors return torch tensors
  of the same device, allocated by torch, never a copy;
- the torch ops `torch.ops.sparse_mla.*` (registered when torch is importable;
  `sparse_mla._torch_ops`), which `torch.compile` traces and CUDA graphs capture;
- `sparse_mla.vllm`: the reference engine's functions under their own names and
  arguments (`triton_convert_req_index_to_global_index`, ...).

Without torch the package is the extension as it is.
"""

import importlib.util as _importlib_util
import warnings as _warnings

from . import _native
from ._native import *  # noqa: F401,F403 (the library's objects)
from ._native import __version__  # noqa: F401

# The extension's classes under the name users import them from.
for _value in list(vars(_native).values()):
    if isinstance(_value, type) and _value.__module__ == _native.__name__:
        _value.__module__ = __name__
del _value

if _importlib_util.find_spec("torch") is not None:
    try:
        from . import _torch_ops
    except ImportError as _error:  # a torch that cannot load: the module works without it
        _torch_ops = None
        _warnings.warn(f"sparse_mla: torch is installed but could not be imported ({_error}); "
                       "the torch ops are not registered", RuntimeWarning, stacklevel=2)
else:
    _torch_ops = None


def convert_req_index_to_global_index(req_id, block_table, token_indices, *, block_size, block_stride_rows=None,
                                      return_valid_counts=False, out=None, valid_counts_out=None, stream=None,
                                      dcp_size=1, dcp_rank=0, dcp_interleave=1, compact=True,
                                      prefill_workspace_request_ids=None, prefill_workspace_starts=None, device=None):
    """Logical top-k positions to physical KV-cache rows (SPEC section 2; vLLM's
    triton_convert_req_index_to_global_index). req_id int32 [>= T], block_table int32 [R, B],
    token_indices int32 [T, K]. Returns physical int32 [T, K], or (physical, valid_counts) with
    return_valid_counts. `out` / `valid_counts_out` are written instead of new buffers (and
    returned; a view of their first T rows when they have more). dcp_size > 1 filters to rank
    dcp_rank through its rank-local table (section 2a; triton_filter_and_convert_dcp_index,
    compact = compact_valid_to_front).

    Torch tensors (every tensor argument one) run the torch op
    torch.ops.sparse_mla.convert_req_index_to_global_index on torch's current stream and come
    back as torch tensors that torch allocated; with `stream=` or `device=`, or other tensors
    among them, the call goes to the library directly, and with a torch token_indices its
    results are handed to torch without a copy. Other callers (NumPy, CuPy) get
    sparse_mla.Tensor results."""
    if (_torch_ops is not None and stream is None and device is None
            and _torch_ops.all_torch(token_indices, req_id, block_table, out, valid_counts_out,
                                     prefill_workspace_request_ids, prefill_workspace_starts)):
        return _torch_ops.convert(req_id, block_table, token_indices, block_size, block_stride_rows,
                                  return_valid_counts, out, valid_counts_out, dcp_size, dcp_rank, dcp_interleave,
                                  compact, prefill_workspace_request_ids, prefill_workspace_starts)
    result = _native.convert_req_index_to_global_index(
        req_id, block_table, token_indices, block_size=block_size, block_stride_rows=block_stride_rows,
        return_valid_counts=return_valid_counts, out=out, valid_counts_out=valid_counts_out, stream=stream,
        dcp_size=dcp_size, dcp_rank=dcp_rank, dcp_interleave=dcp_interleave, compact=compact,
        prefill_workspace_request_ids=prefill_workspace_request_ids, prefill_workspace_starts=prefill_workspace_starts,
        device=device)
    if _torch_ops is not None and isinstance(token_indices, _torch_ops.Tensor):
        return _torch_ops.as_torch(result)
    return result


def cp_gather_and_upconvert_fp8_kv_cache(src_cache, dst, block_table, workspace_starts, batch_size, *,
                                         seq_starts=None, host_cache=None, host_row_ids=None, device_row_ids=None,
                                         block_size=0, fp8_format="e4m3fn", kv_format="fp8_ds_mla", stream=None,
                                         device=None):
    """Paged fp8_ds_mla rows (uint8 [blocks, block_size, 656]) gathered and upconverted into dst
    (bf16 [TOT, 576]; NumPy: sparse_mla.from_dlpack(uint16_array, dtype='bfloat16')), SPEC section
    3. The host-backed variant takes host_cache (pinned_host memory), host_row_ids and
    device_row_ids. kv_format='model1_fp8' reads DeepSeek V4's pages instead (uint8 [blocks, B,
    584] with padded pages, or [blocks, bytes] with block_size=B) into dst bf16 [TOT, 512].
    Returns None.

    Torch tensors (every tensor argument one) run the torch op
    torch.ops.sparse_mla.cp_gather_and_upconvert_fp8_kv_cache (which declares that it writes
    dst) on torch's current stream, unless `stream=` or `device=` is given."""
    if (_torch_ops is not None and stream is None and device is None
            and _torch_ops.all_torch(dst, src_cache, block_table, workspace_starts, seq_starts, host_cache,
                                     host_row_ids, device_row_ids)):
        _torch_ops.gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts, host_cache,
                          host_row_ids, device_row_ids, block_size, fp8_format, kv_format)
        return
    _native.cp_gather_and_upconvert_fp8_kv_cache(
        src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=seq_starts, host_cache=host_cache,
        host_row_ids=host_row_ids, device_row_ids=device_row_ids, block_size=block_size, fp8_format=fp8_format,
        kv_format=kv_format, stream=stream, device=device)
