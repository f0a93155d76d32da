"""The library's operations as torch ops, registered through torch.library when
the package is imported with torch importable (docs/python.md, "torch ops"):

    torch.ops.sparse_mla.convert_req_index_to_global_index       -> Tensor[]: [physical] or [physical, valid_counts]
    torch.ops.sparse_mla.convert_req_index_to_global_index_out   -> (), writes out and valid_counts_out
    torch.ops.sparse_mla.cp_gather_and_upconvert_fp8_kv_cache    -> (), writes dst

Each has a CPU and a CUDA kernel (the same Python function: torch allocates the
outputs, the library writes them on torch's current stream, as vLLM's own ops
run) and a fake implementation that gives the outputs' shapes without running
anything, so torch.compile(fullgraph=True) traces callers without a graph break
and torch.cuda.graph captures them. The schemas declare the tensors an op
writes (Tensor(a!)), so functionalisation keeps the writes. Registered as vLLM
registers its own ops (Library.define with a schema, Library.impl per dispatch
key; the fake through torch.library.register_fake where torch has it, else the
older impl_abstract, else a Meta kernel).
"""

import torch

from . import _native

Tensor = torch.Tensor

_LIBRARY = torch.library.Library("sparse_mla", "DEF")

_CONVERT_ARGS = ("Tensor req_id, Tensor block_table, Tensor token_indices, int block_size, int? block_stride_rows, "
                 "bool return_valid_counts, int dcp_size, int dcp_rank, int dcp_interleave, bool compact, "
                 "Tensor? prefill_workspace_request_ids, Tensor? prefill_workspace_starts")
_SCHEMAS = {
    "convert_req_index_to_global_index": f"({_CONVERT_ARGS}) -> Tensor[]",
    "convert_req_index_to_global_index_out":
        f"({_CONVERT_ARGS}, *, Tensor(a!) out, Tensor(b!) valid_counts_out) -> ()",
    "cp_gather_and_upconvert_fp8_kv_cache":
        "(Tensor src_cache, Tensor(a!) dst, Tensor block_table, Tensor workspace_starts, int batch_size, "
        "Tensor? seq_starts, Tensor? host_cache, Tensor? host_row_ids, Tensor? device_row_ids, int block_size, "
        "str fp8_format, str kv_format) -> ()",
}


def _counts_like(token_indices):
    """An int32 tensor of token_indices' first dimension, on its device (no
    dimension for a 0-d tensor, which the library then rejects by name)."""
    return torch.empty(token_indices.shape[:1], dtype=torch.int32, device=token_indices.device)


# GPUs whose torch.cuda.graph default capture stream the library has bound.
_capture_stream_bound = set()


def _bind_default_capture_stream(index):
    """torch.cuda.graph(g) without a stream captures on a stream of its own,
    one per process, made at the first capture; the library cannot bind a
    stream that is capturing (binding allocates). So at the first call on GPU
    `index` the library binds that stream ahead, making it as torch would at
    its first capture (on the current device only, where torch would make it):
    an engine may then warm up on any stream and capture with torch's default."""
    _capture_stream_bound.add(index)
    graph = torch.cuda.graph
    if torch.cuda.current_device() != index or torch.cuda.is_current_stream_capturing():
        return
    if getattr(graph, "default_capture_stream", "absent") is None:
        graph.default_capture_stream = torch.cuda.Stream()
    stream = getattr(graph, "default_capture_stream", None)
    if stream is not None and stream.device_index == index:
        with torch.cuda.stream(stream):
            _native.open_device("cuda", index).default_stream()


def _prepare(tensor):
    index = tensor.get_device()
    if index >= 0 and index not in _capture_stream_bound:
        _bind_default_capture_stream(index)


def _convert_kernel(req_id, block_table, token_indices, block_size, block_stride_rows, return_valid_counts, dcp_size,
                    dcp_rank, dcp_interleave, compact, prefill_workspace_request_ids, prefill_workspace_starts):
    _prepare(token_indices)
    physical = torch.empty(token_indices.shape, dtype=torch.int32, device=token_indices.device)
    # A DCP conversion counts its rows whether or not they are asked for: here
    # into torch's memory, not the library's.
    counts = _counts_like(token_indices) if return_valid_counts or dcp_size != 1 else None
    _native.convert_req_index_to_global_index(
        req_id, block_table, token_indices, block_size=block_size, block_stride_rows=block_stride_rows,
        return_valid_counts=counts is not None, out=physical, valid_counts_out=counts, dcp_size=dcp_size,
        dcp_rank=dcp_rank, dcp_interleave=dcp_interleave, compact=compact,
        prefill_workspace_request_ids=prefill_workspace_request_ids, prefill_workspace_starts=prefill_workspace_starts)
    return [physical, counts] if return_valid_counts else [physical]


def _convert_fake(req_id, block_table, token_indices, block_size, block_stride_rows, return_valid_counts, dcp_size,
                  dcp_rank, dcp_interleave, compact, prefill_workspace_request_ids, prefill_workspace_starts):
    physical = token_indices.new_empty(token_indices.shape, dtype=torch.int32)
    if return_valid_counts:
        return [physical, token_indices.new_empty(token_indices.shape[:1], dtype=torch.int32)]
    return [physical]


def _convert_out_kernel(req_id, block_table, token_indices, block_size, block_stride_rows, return_valid_counts,
                        dcp_size, dcp_rank, dcp_interleave, compact, prefill_workspace_request_ids,
                        prefill_workspace_starts, *, out, valid_counts_out):
    _prepare(token_indices)
    _native.convert_req_index_to_global_index(
        req_id, block_table, token_indices, block_size=block_size, block_stride_rows=block_stride_rows,
        return_valid_counts=return_valid_counts, out=out, valid_counts_out=valid_counts_out, dcp_size=dcp_size,
        dcp_rank=dcp_rank, dcp_interleave=dcp_interleave, compact=compact,
        prefill_workspace_request_ids=prefill_workspace_request_ids, prefill_workspace_starts=prefill_workspace_starts)


def _convert_out_fake(req_id, block_table, token_indices, block_size, block_stride_rows, return_valid_counts,
                      dcp_size, dcp_rank, dcp_interleave, compact, prefill_workspace_request_ids,
                      prefill_workspace_starts, *, out, valid_counts_out):
    return None


def _gather_kernel(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts, host_cache, host_row_ids,
                   device_row_ids, block_size, fp8_format, kv_format):
    _prepare(dst)
    _native.cp_gather_and_upconvert_fp8_kv_cache(
        src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=seq_starts, host_cache=host_cache,
        host_row_ids=host_row_ids, device_row_ids=device_row_ids, block_size=block_size, fp8_format=fp8_format,
        kv_format=kv_format)


def _gather_fake(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts, host_cache, host_row_ids,
                 device_row_ids, block_size, fp8_format, kv_format):
    return None


def _register_fake(name, fake):
    qualified = f"sparse_mla::{name}"
    if hasattr(torch.library, "register_fake"):  # torch >= 2.4
        torch.library.register_fake(qualified, fake, lib=_LIBRARY)
    elif hasattr(torch.library, "impl_abstract"):  # torch 2.2, 2.3
        torch.library.impl_abstract(qualified, fake, lib=_LIBRARY)
    else:
        _LIBRARY.impl(name, fake, "Meta")


for _name, _kernel, _fake in (("convert_req_index_to_global_index", _convert_kernel, _convert_fake),
                              ("convert_req_index_to_global_index_out", _convert_out_kernel, _convert_out_fake),
                              ("cp_gather_and_upconvert_fp8_kv_cache", _gather_kernel, _gather_fake)):
    _LIBRARY.define(_name + _SCHEMAS[_name])
    for _key in ("CPU", "CUDA"):  # torch on ROCm dispatches its GPU tensors as CUDA too
        _LIBRARY.impl(_name, _kernel, _key)
    _register_fake(_name, _fake)

_convert_op = torch.ops.sparse_mla.convert_req_index_to_global_index.default
_convert_out_op = torch.ops.sparse_mla.convert_req_index_to_global_index_out.default
_gather_op = torch.ops.sparse_mla.cp_gather_and_upconvert_fp8_kv_cache.default


def all_torch(*values):
    """Whether every one of values is a torch tensor or None (the ops take nothing else)."""
    for value in values:
        if value is not None and not isinstance(value, Tensor):
            return False
    return True


def convert(req_id, block_table, token_indices, block_size, block_stride_rows, return_valid_counts, out,
            valid_counts_out, dcp_size, dcp_rank, dcp_interleave, compact, prefill_workspace_request_ids,
            prefill_workspace_starts):
    """sparse_mla.convert_req_index_to_global_index for torch tensors, through the ops."""
    if out is None and valid_counts_out is None:
        results = _convert_op(req_id, block_table, token_indices, block_size, block_stride_rows, return_valid_counts,
                              dcp_size, dcp_rank, dcp_interleave, compact, prefill_workspace_request_ids,
                              prefill_workspace_starts)
        return (results[0], results[1]) if return_valid_counts else results[0]
    physical = out if out is not None else torch.empty(token_indices.shape, dtype=torch.int32,
                                                       device=token_indices.device)
    # Counts nobody passed a buffer for go to a scratch tensor (a DCP conversion
    # writes them whether asked or not); counts passed without
    # return_valid_counts are the library's error.
    counts, count = valid_counts_out, return_valid_counts
    if counts is None:
        counts, count = _counts_like(token_indices), True
    _convert_out_op(req_id, block_table, token_indices, block_size, block_stride_rows, count, dcp_size, dcp_rank,
                    dcp_interleave, compact, prefill_workspace_request_ids, prefill_workspace_starts, out=physical,
                    valid_counts_out=counts)
    rows = token_indices.shape[0]
    physical = physical if physical.shape[0] == rows else physical[:rows]
    if not return_valid_counts:
        return physical
    return physical, counts if counts.shape[0] == rows else counts[:rows]


def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts, host_cache, host_row_ids,
           device_row_ids, block_size, fp8_format, kv_format):
    """sparse_mla.cp_gather_and_upconvert_fp8_kv_cache for a torch dst, through the op."""
    _gather_op(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts, host_cache, host_row_ids,
               device_row_ids, block_size, fp8_format, kv_format)


def as_torch(result):
    """A library call's result (a sparse_mla.Tensor, a tuple of them, or the
    caller's own torch tensors) as torch tensors viewing the same memory; the
    view keeps the library's storage alive and, on a GPU, torch's current
    stream waits for the stream that writes it (DLPack)."""
    if isinstance(result, tuple):
        return tuple(as_torch(r) for r in result)
    if isinstance(result, _native.Tensor):
        return torch.from_dlpack(result) if hasattr(torch, "from_dlpack") else torch.utils.dlpack.from_dlpack(result)
    return result
