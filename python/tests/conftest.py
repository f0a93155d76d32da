"""Fixtures of the Python suite: the host device and a fresh random seed per
test (printed, so that a failure can be replayed with SPARSE_MLA_TEST_SEED)."""

import os
import random

import numpy as np
import pytest

import sparse_mla


@pytest.fixture
def device():
    return sparse_mla.open_device("host", 0)


@pytest.fixture
def rng():
    seed = int(os.environ.get("SPARSE_MLA_TEST_SEED", random.SystemRandom().randrange(2**32)))
    print(f"SPARSE_MLA_TEST_SEED={seed}")
    return np.random.default_rng(seed)
