"""A tiny safetensors reader for the golden files (format: tests/data/golden/README.md):
8 bytes little-endian header length N, N bytes of JSON, then the raw row-major
little-endian tensor data; metadata values are JSON-encoded strings."""

import json
import os
import struct
from pathlib import Path

import numpy as np

DTYPES = {"I32": "<i4", "I16": "<i2", "U8": "u1", "BF16": "<u2", "F32": "<f4", "I64": "<i8"}


def golden_dir():
    """SPARSE_MLA_GOLDEN_DIR where it names a folder that exists (as the C++ tests
    read it), else the project's own copy."""
    env = os.environ.get("SPARSE_MLA_GOLDEN_DIR")
    if env and Path(env).is_dir():
        return Path(env)
    return Path(__file__).resolve().parents[2] / "tests" / "data" / "golden"


def read_safetensors(path):
    """(tensors, metadata): BF16 tensors come back as their uint16 bits."""
    data = Path(path).read_bytes()
    (header_bytes,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_bytes])
    raw_metadata = header.pop("__metadata__", {})
    base = 8 + header_bytes
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = np.dtype(DTYPES[entry["dtype"]])
        count = (end - begin) // dtype.itemsize
        tensors[name] = np.frombuffer(data, dtype, count, base + begin).reshape(entry["shape"]).copy()
    metadata = {}
    for key, value in raw_metadata.items():
        try:
            metadata[key] = json.loads(value)
        except ValueError:
            metadata[key] = value  # free text (notes)
    return tensors, metadata


def read_case(stem):
    return read_safetensors(golden_dir() / f"{stem}.safetensors")
