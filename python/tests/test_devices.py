"""Devices, streams and events as the module exposes them on the host backend
(test_torch.py has the GPU backends' native streams and events)."""

import types

import numpy as np
import pytest

import sparse_mla
from support import host_only


def test_compiled_backends_list_host_first():
    backends = sparse_mla.compiled_backends()
    assert backends[0] == "host"
    assert set(backends) <= {"host", "cuda", "hip"}


@host_only
def test_open_device_gives_one_device_per_backend_and_index(device):
    assert sparse_mla.open_device() is device
    assert sparse_mla.open_device("host", 0) is device
    assert device.backend == "host" and device.index == 0
    assert device.info["backend"] == "host"
    assert device.has_kernels and device.execution_space


def test_open_device_says_why_a_backend_cannot_open():
    with pytest.raises(ValueError, match="one device"):
        sparse_mla.open_device("host", 1)
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        sparse_mla.open_device("tpu")
    if "cuda" not in sparse_mla.compiled_backends():
        with pytest.raises(ValueError, match="not compiled into this build"):
            sparse_mla.open_device("cuda")
        assert "not compiled" in sparse_mla.backend_unavailable_reason("cuda")


@host_only
def test_host_streams_run_queued_work_and_have_no_native_handle(device):
    stream = device.create_stream()
    assert stream.native_handle is None
    assert stream.is_capturing is False
    assert stream.device is device
    stream.synchronize()


@host_only
def test_the_host_backend_refuses_to_wrap_native_streams_and_events(device):
    with pytest.raises(ValueError, match="host"):
        device.wrap_stream(0x1234)
    with pytest.raises(ValueError, match="host"):
        device.wrap_stream(types.SimpleNamespace(cuda_stream=0x1234))  # as torch.cuda.Stream carries it
    with pytest.raises(ValueError, match="host"):
        device.wrap_event(types.SimpleNamespace(cuda_event=0x1234))
    with pytest.raises(TypeError, match="cuda_stream"):
        device.wrap_stream("not a stream")


@host_only
def test_events_order_one_stream_after_another(device):
    first, second = device.create_stream(), device.create_stream()
    event = first.record_event()
    second.wait_event(event)
    second.wait_stream(first)
    second.synchronize()
    assert event.query()
    event.synchronize()
    assert event.native_handle is None
    again = device.create_event()
    again.record(first)
    assert first.record_event(again) is again
    first.synchronize()
    assert again.query()


def test_activity_counts_allocations_frees_and_host_synchronizations(device):
    before = device.activity()
    tensor = device.empty((4, 8), "int32")
    stream = device.create_stream()
    stream.synchronize()
    del tensor
    after = device.activity()
    assert after["allocations"] - before["allocations"] == 1
    assert after["frees"] - before["frees"] == 1
    assert after["host_synchronizations"] - before["host_synchronizations"] >= 1


@host_only
def test_device_empty_allocates_library_memory_of_each_kind(device):
    for kind in ("device", "pinned_host", "host"):
        tensor = device.empty((3, 5), "int16", kind=kind)
        assert tensor.kind == kind and tensor.dtype == "int16" and tensor.shape == (3, 5)
        assert tensor.__dlpack_device__() == (1, 0)  # all host memory on the host backend
        np.asarray(tensor)[:] = 7  # a writable view (numpy.from_dlpack views are read-only before NumPy 2)
        assert np.from_dlpack(tensor).sum() == 7 * 15
    with pytest.raises(ValueError, match="memory kind"):
        device.empty((2,), "int32", kind="unified")
    with pytest.raises(TypeError, match="unknown dtype"):
        device.empty((2,), "float64")


@host_only
def test_the_default_stream_of_the_host_device_is_its_library_stream(device):
    stream = device.default_stream()
    assert stream.native_handle is None and stream.device is device
    stream.synchronize()
