"""Helpers the tests share: poisoned outputs, an attn_metadata, random conversion
inputs, and a stand-in for a tensor of another device."""

import ctypes
import types

import numpy as np

POISON = -9


def poisoned(shape, dtype=np.int32, value=POISON):
    return np.full(shape, value, dtype)


def metadata(**fields):
    """An attn_metadata: any object with the reference's attribute names."""
    defaults = dict(num_decodes=0, num_decode_tokens=0, num_prefills=0, query_start_loc=None)
    defaults.update(fields)
    return types.SimpleNamespace(**defaults)


def random_conversion_inputs(rng, T, K, R=3, B=5, physical_blocks=40, block_size=16, invalid=0.2):
    """req_id [T], a block table [R, B] of distinct physical blocks, and logical [T, K]
    with -1 entries and tokens past the table."""
    req_id = rng.integers(0, R, size=T, dtype=np.int32)
    block_table = rng.permutation(physical_blocks)[: R * B].reshape(R, B).astype(np.int32)
    logical = rng.integers(0, (B + 1) * block_size, size=(T, K), dtype=np.int32)
    logical[rng.random((T, K)) < invalid] = -1
    return req_id, block_table, logical


class OtherDeviceTensor:
    """Host memory that says it lives on CUDA device 0 (DLPack kDLCUDA, in
    __dlpack_device__ and in the capsule's DLTensor): how a tensor of another
    device reaches the module on a machine without a GPU."""

    def __init__(self, array):
        self.array = array

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        capsule = self.array.__dlpack__()
        get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        get_pointer.restype = ctypes.c_void_p
        get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        dltensor = get_pointer(capsule, b"dltensor")
        # DLTensor: void* data, then DLDevice {int32 device_type, int32 device_id}.
        ctypes.c_int32.from_address(dltensor + ctypes.sizeof(ctypes.c_void_p)).value = 2
        return capsule
