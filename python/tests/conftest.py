"""Fixtures of the Python suite: the backend under test, its device, how the
tests put data there and read it back, and a fresh random seed per test
(printed, so that a failure can be replayed with SPARSE_MLA_TEST_SEED).

SPARSE_MLA_TEST_BACKEND picks the backend: "host" (default; NumPy arrays) or
"cuda" (torch CUDA tensors on torch's current stream, which the module takes
as its default stream). The same tests run on both; the few that are about
one backend's objects skip on the other with the reason."""

import os
import random

import numpy as np
import pytest

import sparse_mla
from support import BACKEND, TORCH_VERSION, Arrays, TorchCpuArrays


def pytest_report_header(config):
    return f"sparse_mla backend under test: {BACKEND} (SPARSE_MLA_TEST_BACKEND)"


@pytest.fixture
def device():
    return sparse_mla.open_device(BACKEND, 0)


@pytest.fixture
def arrays(device):
    return Arrays(device)


# The producers a backend's calls are tested with: on the host NumPy and torch
# CPU tensors, on a GPU torch tensors of that device.
PRODUCERS = ["numpy", "torch"] if BACKEND == "host" else ["torch"]


@pytest.fixture(params=PRODUCERS)
def producer_arrays(request, device):
    """Arrays of each producer of the backend under test (torch CPU tensors
    skip where torch is absent)."""
    if request.param == "numpy" or BACKEND != "host":
        return Arrays(device)
    if TORCH_VERSION is None:
        pytest.skip("needs torch (torch CPU tensors on the host backend)")
    return TorchCpuArrays(device)


@pytest.fixture
def rng():
    seed = int(os.environ.get("SPARSE_MLA_TEST_SEED", random.SystemRandom().randrange(2**32)))
    print(f"SPARSE_MLA_TEST_SEED={seed}")
    return np.random.default_rng(seed)

