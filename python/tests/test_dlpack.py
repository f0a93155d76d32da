"""DLPack in both directions with NumPy on the host backend: arrays viewed in
place, results handed back without a copy and kept alive by the objects that
hold them (test_torch.py does the same with torch CUDA tensors)."""

import ctypes
import gc

import numpy as np
import pytest

import sparse_mla
from models import convert, random_fp8_rows, upconvert_rows
from support import OtherDeviceTensor, PinnedByDeviceOnly, host_only, poisoned, random_conversion_inputs

pytestmark = host_only


def data_pointer(array):
    return array.__array_interface__["data"][0]


def capsule_name(capsule):
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    return get_name(capsule).decode()


def test_numpy_outputs_are_written_in_place(rng):
    req_id, table, logical = random_conversion_inputs(rng, T=6, K=64)
    out = poisoned((6, 64))
    address = data_pointer(out)
    result = sparse_mla.convert_req_index_to_global_index(req_id, table, logical, block_size=16, out=out)
    assert result is out and data_pointer(out) == address
    np.testing.assert_array_equal(out, convert(req_id, table, logical, 16)[0])


def test_strided_numpy_inputs_are_read_where_they_lie(rng):
    req_id, table, logical = random_conversion_inputs(rng, T=5, K=64)
    wide = poisoned((5, 192))
    wide[:, 64:128] = logical
    rows = wide[:, 64:128]  # rows 192 apart: row-contiguous, not contiguous
    physical = sparse_mla.convert_req_index_to_global_index(req_id, table, rows, block_size=16)
    np.testing.assert_array_equal(np.from_dlpack(physical), convert(req_id, table, logical, 16)[0])


def test_results_are_handed_to_numpy_without_a_copy(rng):
    req_id, table, logical = random_conversion_inputs(rng, T=4, K=64)
    physical = sparse_mla.convert_req_index_to_global_index(req_id, table, logical, block_size=16)
    assert isinstance(physical, sparse_mla.Tensor)
    assert physical.shape == (4, 64) and physical.dtype == "int32" and physical.strides == (64, 1)
    assert physical.__dlpack_device__() == (1, 0)
    first, writable = np.from_dlpack(physical), np.asarray(physical)
    assert data_pointer(first) == physical.data_ptr == data_pointer(writable)
    writable[0, 0] = 12345
    assert first[0, 0] == 12345


def test_results_keep_their_storage_alive(rng):
    req_id, table, logical = random_conversion_inputs(rng, T=8, K=128)
    physical, counts = sparse_mla.convert_req_index_to_global_index(
        req_id, table, logical, block_size=16, return_valid_counts=True)
    viewed = np.from_dlpack(physical)
    del physical, counts
    gc.collect()
    for _ in range(4):  # allocations that would reuse freed memory
        sparse_mla.convert_req_index_to_global_index(req_id, table, logical, block_size=16)
    np.testing.assert_array_equal(viewed, convert(req_id, table, logical, 16)[0])


def test_a_versioned_capsule_is_handed_out_when_asked_and_read_back(rng):
    req_id, table, logical = random_conversion_inputs(rng, T=3, K=64)
    physical = sparse_mla.convert_req_index_to_global_index(req_id, table, logical, block_size=16)
    assert capsule_name(physical.__dlpack__()) == "dltensor"
    assert capsule_name(physical.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"

    class Versioned:  # a DLPack 1.0 producer
        def __dlpack_device__(self):
            return physical.__dlpack_device__()

        def __dlpack__(self, stream=None):
            return physical.__dlpack__(max_version=(1, 0))

    again = sparse_mla.from_dlpack(Versioned())
    np.testing.assert_array_equal(np.from_dlpack(again), np.from_dlpack(physical))


def test_dlpack_refuses_a_copy_or_another_device(device):
    tensor = device.empty((2, 2), "int32")
    with pytest.raises(BufferError, match="copy"):
        tensor.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="another device"):
        tensor.__dlpack__(dl_device=(2, 0))
    tensor.__dlpack__(dl_device=(1, 0))  # unconsumed: its destructor frees it


def test_from_dlpack_views_uint16_bits_as_bfloat16():
    bits = np.arange(12, dtype=np.uint16).reshape(3, 4)
    view = sparse_mla.from_dlpack(bits, dtype="bfloat16")
    assert view.dtype == "bfloat16" and view.shape == (3, 4) and view.kind is None
    assert view.data_ptr == data_pointer(bits)
    with pytest.raises(TypeError, match="element sizes differ"):
        sparse_mla.from_dlpack(np.zeros(4, np.float32), dtype="bfloat16")
    same = sparse_mla.from_dlpack(np.zeros(4, np.int32))
    assert same.dtype == "int32"


def test_a_dtype_no_operation_takes_is_a_type_error_naming_the_argument(rng):
    req_id, table, logical = random_conversion_inputs(rng, T=2, K=64)
    with pytest.raises(TypeError, match="token_indices has dtype float64"):
        sparse_mla.convert_req_index_to_global_index(req_id, table, logical.astype(np.float64), block_size=16)


def test_an_object_without_dlpack_is_a_type_error(rng):
    req_id, table, logical = random_conversion_inputs(rng, T=2, K=64)
    with pytest.raises(TypeError, match="block_table is a list, not a tensor"):
        sparse_mla.convert_req_index_to_global_index(req_id, table.tolist(), logical, block_size=16)


def test_a_tensor_of_a_backend_that_is_not_compiled_in_is_refused(rng):
    if "cuda" in sparse_mla.compiled_backends():
        pytest.skip("this build has the CUDA backend")
    req_id, table, logical = random_conversion_inputs(rng, T=2, K=64)
    with pytest.raises(ValueError, match="cuda backend is not compiled"):
        sparse_mla.convert_req_index_to_global_index(req_id, table, OtherDeviceTensor(logical), block_size=16)


def test_memory_that_dlpack_device_calls_pinned_is_pinned_whatever_its_capsule_says(rng):
    # The host-backed gather-upconvert reads its host_cache only from pinned memory.
    cache = random_fp8_rows(rng, 16).reshape(1, 16, 656)
    host_rows = random_fp8_rows(rng, 8)
    host_row_ids = rng.integers(0, 8, size=16, dtype=np.int32)
    device_row_ids = np.full(16, -1, np.int32)
    table, starts = np.array([[0]], np.int32), np.array([0], np.int32)
    dst = poisoned((16, 576), np.uint16, 0xDEAD)
    sparse_mla.cp_gather_and_upconvert_fp8_kv_cache(cache, sparse_mla.from_dlpack(dst, dtype="bfloat16"), table, starts, 1,
                                                    host_cache=PinnedByDeviceOnly(host_rows), host_row_ids=host_row_ids,
                                                    device_row_ids=device_row_ids)
    np.testing.assert_array_equal(dst, upconvert_rows(host_rows[host_row_ids]))
    before = dst.copy()
    with pytest.raises(ValueError, match="host_cache is in host memory, expected pinned_host"):
        sparse_mla.cp_gather_and_upconvert_fp8_kv_cache(cache, sparse_mla.from_dlpack(dst, dtype="bfloat16"), table, starts,
                                                        1, host_cache=host_rows, host_row_ids=host_row_ids,
                                                        device_row_ids=device_row_ids)
    np.testing.assert_array_equal(dst, before)
