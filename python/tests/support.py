"""Helpers the tests share: the backend under test and how its data is made and
read (Arrays), poisoned outputs, an attn_metadata, random conversion inputs, and
a stand-in for a tensor of another device."""

import ctypes
import os
import types

import numpy as np
import pytest

POISON = -9

# The backend the suite runs on (conftest.py): "host" with NumPy arrays, or
# "cuda" with torch CUDA tensors.
BACKEND = os.environ.get("SPARSE_MLA_TEST_BACKEND", "host")
host_only = pytest.mark.skipif(BACKEND != "host", reason="about NumPy arrays and the host backend's own objects")
gpu_only = pytest.mark.skipif(BACKEND == "host", reason="about a GPU backend's native streams, events and tensors")


class Arrays:
    """Puts NumPy data where the backend under test computes and reads results
    back: on the host backend NumPy arrays themselves (the module views them
    in place), on a GPU torch tensors of that device (torch's current stream
    orders them; reading back waits for it). The tests build their inputs and
    scalar models in NumPy and call the module with arrays(...) of them.
    TorchCpuArrays is the host backend's other producer: torch CPU tensors."""

    def __init__(self, device):
        self.device = device
        self.host = device.backend == "host"
        if not self.host:
            import torch  # noqa: F401 (the module then defaults to torch's current stream)

            self.torch = torch
            self.where = torch.device("cuda", device.index)

    @property
    def framework(self):
        return "numpy" if self.host else "torch"

    def __call__(self, array):
        """The backend's copy of a NumPy array (the array itself on the host)."""
        if self.host:
            return array
        array = np.ascontiguousarray(array)
        if array.dtype == np.uint16:  # bf16 bits: torch has no uint16 CUDA tensors to speak of
            return self.torch.from_numpy(array.view(np.int16)).to(self.where)
        return self.torch.from_numpy(array).to(self.where)

    def poisoned(self, shape, dtype=np.int32, value=POISON):
        return self(poisoned(shape, dtype, value))

    def bf16(self, bits):
        """bf16 data held as uint16 bits, as the module takes bfloat16."""
        import sparse_mla

        if self.host:
            return sparse_mla.from_dlpack(bits, dtype="bfloat16")
        return bits.view(self.torch.bfloat16) if isinstance(bits, self.torch.Tensor) else self(bits).view(self.torch.bfloat16)

    def numpy(self, x):
        """A result (a sparse_mla.Tensor, an array of this backend) as NumPy,
        once the work that writes it is done."""
        if self.host:
            return np.asarray(x) if isinstance(x, np.ndarray) else np.from_dlpack(x)
        self.torch.cuda.synchronize(self.where)
        if isinstance(x, np.ndarray) or getattr(x, "kind", None) in ("pinned_host", "host"):
            return np.asarray(x).copy()  # memory the CPU reaches
        t = x if isinstance(x, self.torch.Tensor) else self.torch.from_dlpack(x)
        if t.dtype == self.torch.bfloat16:
            return t.view(self.torch.int16).cpu().numpy().view(np.uint16)
        return t.cpu().numpy()

    def bits(self, x):
        """A bf16 buffer made by poisoned(..., np.uint16) as NumPy uint16 bits."""
        return self.numpy(x).view(np.uint16)

    def set(self, dst, index, values):
        """dst[index] = values (NumPy values), in stream order."""
        if self.host:
            dst[index] = values
        else:
            dst[index] = self.torch.as_tensor(np.asarray(values, dtype=self.numpy_dtype(dst)), device=self.where)

    def fill(self, x, value):
        """Every element of x (an array of this backend or a library tensor) set to value."""
        if self.host:
            (x if isinstance(x, np.ndarray) else np.asarray(x))[...] = value
        else:
            (x if isinstance(x, self.torch.Tensor) else self.torch.from_dlpack(x)).fill_(value)

    def data_ptr(self, x):
        if self.host:
            return x.__array_interface__["data"][0] if isinstance(x, np.ndarray) else x.data_ptr
        return x.data_ptr() if isinstance(x, self.torch.Tensor) else x.data_ptr

    def numpy_dtype(self, x):
        return x.dtype if self.host else self.torch.empty(0, dtype=x.dtype).numpy().dtype

    def foreign(self, array):
        """Data the backend's kernels must refuse: a tensor of another device
        on the host backend, host memory on a GPU; with the message's words."""
        if self.host:
            return OtherDeviceTensor(array)
        return array

    @property
    def foreign_message(self):
        """The refusal, as a regex group: on the host backend a tensor of another
        device, or, where that tensor decides the call's device (the first GPU
        tensor does), why that device cannot open (its backend is not compiled
        in, or the machine has no such GPU); on a GPU host memory."""
        if self.host:
            return "(?:lives on another device|the cuda backend is not compiled into this build|no CUDA device)"
        return "(?:is in host memory, which cuda kernels cannot reach)"


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


class PinnedByDeviceOnly:
    """Host memory whose __dlpack_device__ says kDLCUDAHost (pinned) while its
    capsule's DLTensor says kDLCPU: how torch hands over a pinned tensor."""

    def __init__(self, array):
        self.array = array

    def __dlpack_device__(self):
        return (3, 0)

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()


class TorchCpuArrays(Arrays):
    """The host backend fed torch CPU tensors: views of the NumPy data (so a
    poisoned NumPy buffer and its tensor are one memory), results read back
    through torch."""

    def __init__(self, device):
        import torch

        super().__init__(device)
        self.torch = torch
        self.where = torch.device("cpu")

    @property
    def framework(self):
        return "torch"

    def __call__(self, array):
        array = np.ascontiguousarray(array)
        if array.dtype == np.uint16:  # bf16 bits: torch has no uint16 tensors everywhere
            return self.torch.from_numpy(array.view(np.int16))
        return self.torch.from_numpy(array)

    def bf16(self, bits):
        return (bits if isinstance(bits, self.torch.Tensor) else self(bits)).view(self.torch.bfloat16)

    def numpy(self, x):
        if isinstance(x, np.ndarray):
            return x
        t = x if isinstance(x, self.torch.Tensor) else self.torch.from_dlpack(x)
        if t.dtype == self.torch.bfloat16:
            return t.view(self.torch.int16).numpy().view(np.uint16)
        return t.numpy()

    def set(self, dst, index, values):
        dst[index] = self.torch.as_tensor(np.asarray(values, dtype=self.numpy_dtype(dst)))

    def fill(self, x, value):
        (x if isinstance(x, self.torch.Tensor) else self.torch.from_dlpack(x)).fill_(value)

    def data_ptr(self, x):
        return x.data_ptr() if isinstance(x, self.torch.Tensor) else x.data_ptr

    def numpy_dtype(self, x):
        return self.torch.empty(0, dtype=x.dtype).numpy().dtype


def torch_version():
    """(major, minor) of the importable torch, or None."""
    try:
        import torch
    except ImportError:
        return None
    return tuple(int(part) for part in torch.__version__.split(".")[:2])


TORCH_VERSION = torch_version()
needs_torch = pytest.mark.skipif(TORCH_VERSION is None, reason="needs torch")
needs_torch_2_4 = pytest.mark.skipif(
    TORCH_VERSION is None or TORCH_VERSION < (2, 4),
    reason=f"needs torch >= 2.4 (torch.library.register_fake, opcheck, torch.compile); this torch is "
           f"{'absent' if TORCH_VERSION is None else '.'.join(map(str, TORCH_VERSION))}")
