"""The module as a torch engine uses it on a GPU: torch's current stream as the
default, torch streams and events wrapped, results handed to torch without a
copy, host memory refused, and a whole multi-layer decode step captured by
torch.cuda.graph and replayed with new inputs written in place. Runs with
SPARSE_MLA_TEST_BACKEND=cuda (the rest of the suite runs there too)."""

import gc

import numpy as np
import pytest

import sparse_mla
from models import convert
from support import POISON, gpu_only, metadata, random_conversion_inputs

pytestmark = gpu_only

K, MAX_TOKENS, MAX_DECODE_ROWS, BLOCK_SIZE = 128, 24, 4, 16


@pytest.fixture
def torch():
    import torch

    return torch


def test_the_default_stream_is_torchs_current_stream(device, torch):
    # torch's default stream is the legacy one: handle 0, a None native handle here.
    assert (device.default_stream().native_handle or 0) == torch.cuda.current_stream().cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert device.default_stream().native_handle == side.cuda_stream


def test_calls_run_on_the_current_torch_stream_in_its_order(arrays, torch, rng):
    req_id, table, logical = random_conversion_inputs(rng, T=9, K=K)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Inputs written on the side stream, the call queued behind them there.
        tensors = [torch.from_numpy(a).to("cuda", non_blocking=True) for a in (req_id, table, logical)]
        torch.cuda._sleep(2_000_000)  # the side stream lags: a call not in its order would read too early
        physical = sparse_mla.convert_req_index_to_global_index(*tensors, block_size=16)
    torch.cuda.current_stream().wait_stream(side)
    np.testing.assert_array_equal(torch.from_dlpack(physical).cpu().numpy(), convert(req_id, table, logical, 16)[0])


def test_torch_streams_and_events_are_wrapped_and_never_destroyed(device, torch):
    side = torch.cuda.Stream()
    for native in (side, side.cuda_stream):
        wrapped = device.wrap_stream(native)
        assert wrapped.native_handle == side.cuda_stream and wrapped.device is device
        assert wrapped.is_capturing is False
    event = torch.cuda.Event()
    event.record(side)  # torch creates its CUDA event at the first record
    wrapped_event = device.wrap_event(event)
    assert wrapped_event.native_handle == event.cuda_event
    stream = device.wrap_stream(side)
    wrapped_event.record(stream)
    del wrapped_event, stream
    gc.collect()
    event.synchronize()  # the engine's event and stream outlive their wrappers
    side.synchronize()


def test_results_are_torch_tensors_and_the_librarys_own_stay_alive_in_torch(device, arrays, torch, rng):
    req_id, table, logical = random_conversion_inputs(rng, T=6, K=K)
    inputs = arrays(req_id), arrays(table), arrays(logical)
    want = convert(req_id, table, logical, 16)[0]
    # On torch's current stream: tensors torch allocates (its caching allocator, its graph pools).
    before = torch.cuda.memory_allocated()
    physical, counts = sparse_mla.convert_req_index_to_global_index(*inputs, block_size=16, return_valid_counts=True)
    assert isinstance(physical, torch.Tensor) and physical.is_cuda and physical.device == inputs[2].device
    assert torch.cuda.memory_allocated() > before
    np.testing.assert_array_equal(physical.cpu().numpy(), want)
    # On a library stream: the library's buffer, viewed by torch without a copy and kept alive by the view.
    stream = device.create_stream()
    stream.wait_stream(device.default_stream())
    viewed = sparse_mla.convert_req_index_to_global_index(*inputs, block_size=16, stream=stream)
    assert isinstance(viewed, torch.Tensor) and viewed.is_cuda
    gc.collect()
    for _ in range(4):  # allocations that would reuse freed memory
        sparse_mla.convert_req_index_to_global_index(*inputs, block_size=16, stream=stream)
    np.testing.assert_array_equal(viewed.cpu().numpy(), want)  # torch's stream waited for the library's


def test_host_memory_is_refused_and_pinned_memory_is_taken_where_allowed(device, arrays, torch, rng):
    req_id, table, logical = random_conversion_inputs(rng, T=4, K=K)
    out = arrays.poisoned((4, K))
    with pytest.raises(ValueError, match="is in host memory, which cuda kernels cannot reach"):
        sparse_mla.convert_req_index_to_global_index(arrays(req_id), arrays(table), torch.from_numpy(logical),
                                                     block_size=16, out=out)
    assert (arrays.numpy(out) == POISON).all()
    pinned = torch.from_numpy(logical).pin_memory()
    if pinned.__dlpack_device__()[0] != 3:
        pytest.skip(f"this torch reports pinned memory as DLPack device {pinned.__dlpack_device__()}, not kDLCUDAHost")
    # kDLCUDAHost: read in place over the link.
    physical = sparse_mla.convert_req_index_to_global_index(arrays(req_id), arrays(table), pinned, block_size=16)
    np.testing.assert_array_equal(arrays.numpy(physical), convert(req_id, table, logical, 16)[0])


def test_a_whole_decode_step_captured_by_torch_replays_with_new_inputs(device, arrays, torch, rng):
    """The engine's capture (torch.cuda.graph, on torch's capture stream): every
    layer of two groups, the leader's conversion on each group's side stream,
    forked and joined through events inside the capture."""
    logical = arrays.poisoned((MAX_TOKENS, K))
    builder = sparse_mla.SparseMLAIndexGroupBuilder(logical, MAX_DECODE_ROWS)
    layers = [builder.register_layer(i in (0, 2)) for i in range(5)]
    T = 3
    req_id = arrays(np.zeros(T, np.int32))
    table = arrays(np.zeros((3, 5), np.int32))
    md = metadata(req_id_per_token=req_id, block_table=table, block_size=BLOCK_SIZE, num_decodes=T, num_decode_tokens=T)

    def decode_step():
        results = []
        for group, index in layers:
            group.set_logical_topk_ready(index)
            group.prepare_for_batch(index, md)
            results.append(group.convert_logical_to_physical_topk(index, logical[:T], md, return_valid_counts=True))
        return results

    def write_inputs():
        r, b, rows = random_conversion_inputs(rng, T=T, K=K, block_size=BLOCK_SIZE)
        arrays.set(req_id, slice(None), r)
        arrays.set(table, slice(None), b)
        arrays.set(logical, slice(0, T), rows)
        return convert(r, b, rows, BLOCK_SIZE)

    capture_stream = torch.cuda.Stream()
    with torch.cuda.stream(capture_stream):
        write_inputs()
        decode_step()  # eager: wraps torch's stream before the capture (no wrapping inside one)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture_stream):
        assert device.default_stream().is_capturing
        results = decode_step()
    for _ in range(3):
        want_physical, want_counts = write_inputs()
        for group in builder.groups:
            arrays.fill(group.physical_topk_indices, POISON)
        graph.replay()
        for physical, counts in results:
            np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
            np.testing.assert_array_equal(arrays.numpy(counts), want_counts)


def test_torchs_default_capture_stream_captures_the_ops_after_an_eager_call(arrays, torch, rng):
    """torch.cuda.graph(g) with no stream captures on a stream of torch's own: the
    package binds it at its first GPU call, so warming up on any stream is enough."""
    T = 4
    req_id, table, logical = (arrays(a) for a in random_conversion_inputs(rng, T=T, K=K))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # torch's documented warm-up
        sparse_mla.convert_req_index_to_global_index(req_id, table, logical, block_size=16)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        physical, counts = sparse_mla.convert_req_index_to_global_index(req_id, table, logical, block_size=16,
                                                                        return_valid_counts=True)
    for _ in range(2):
        r, b, rows = random_conversion_inputs(rng, T=T, K=K)
        for tensor, values in ((req_id, r), (table, b), (logical, rows)):
            tensor.copy_(torch.from_numpy(values))
        physical.fill_(POISON)
        graph.replay()
        want_physical, want_counts = convert(r, b, rows, 16)
        np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
        np.testing.assert_array_equal(arrays.numpy(counts), want_counts)


def test_a_capture_on_a_stream_the_library_never_ran_on_is_refused_with_the_reason(arrays, torch, rng):
    req_id, table, logical = (arrays(a) for a in random_conversion_inputs(rng, T=2, K=K))
    torch.cuda.synchronize()
    fresh = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=fresh):
        with pytest.raises(ValueError, match="is capturing a graph and has no kernels bound yet"):
            sparse_mla.convert_req_index_to_global_index(req_id, table, logical, block_size=16)
