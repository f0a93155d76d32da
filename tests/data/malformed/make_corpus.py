#!/usr/bin/env python3
"""Writes the malformed safetensors corpus next to this script.

Usage: python3 make_corpus.py [path/to/c1_convert_tiny_edges.safetensors]

Two kinds of files, listed in expected_errors.tsv (file, check, message part):

- check "parse": the file breaks the safetensors format; SafetensorsFile::read
  must reject it with an Error whose message contains the given text.
- check "content": a valid safetensors file (a copy of golden case c1 with one
  thing changed) that the golden dispatch must reject; the text says what is
  wrong. These need the golden file c1 (default: the project's copy in
  tests/data/golden/).

Output is deterministic: running the script twice gives identical files.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_C1 = os.path.join(HERE, os.pardir, "golden", "c1_convert_tiny_edges.safetensors")

entries = []  # (file name, check, expected message part)


def raw(name, data, check, expect):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)
    entries.append((name, check, expect))


def framed(header_bytes, data=b"", n=None):
    """8-byte length (the real one unless n is given), header, data."""
    return struct.pack("<Q", len(header_bytes) if n is None else n) + header_bytes + data


def st(name, header, data, expect):
    """A file whose header is the given JSON object (dumped as is)."""
    raw(name, framed(json.dumps(header).encode("utf-8"), data), "parse", expect)


def i32(name, shape, offsets):
    return {name: {"dtype": "I32", "shape": shape, "data_offsets": offsets}}


zeros16 = bytes(16)
ok4 = {"dtype": "I32", "shape": [4], "data_offsets": [0, 16]}

# --- the header length field ---
raw("truncated_under_8_bytes.safetensors", b"\x10\x00\x00\x00\x00", "parse",
    "shorter than the 8-byte header length field")
raw("header_length_past_end.safetensors", framed(b"{}", n=1000), "parse",
    "header length 1000 runs past the end of the file")
raw("header_length_over_limit.safetensors", framed(b"{}", n=1 << 62), "parse",
    "exceeds the limit")
raw("header_length_zero.safetensors", framed(b"", n=0), "parse",
    "header length 0 is too short")

# --- the header text ---
raw("header_not_json.safetensors", framed(b'{"x": {"dtype": "I32", "shape": [4],'), "parse",
    "header is not JSON")
raw("header_not_object.safetensors", framed(b"[1, 2, 3]"), "parse",
    "header is not a JSON object (it is array)")
raw("header_not_utf8.safetensors",
    framed(b'{"x\xff": {"dtype": "I32", "shape": [4], "data_offsets": [0, 16]}}', zeros16),
    "parse", "header is not valid UTF-8 (byte 0xff")
raw("header_overlong_utf8.safetensors",
    framed(b'{"x\xc0\xaf": {"dtype": "I32", "shape": [4], "data_offsets": [0, 16]}}', zeros16),
    "parse", "header is not valid UTF-8 (byte 0xc0")
raw("header_nul_then_junk.safetensors", framed(b"{}\0 junk"), "parse",
    "header contains a NUL byte at header offset 2")
raw("header_byte_order_mark.safetensors", framed(b"\xef\xbb\xbf{}"), "parse",
    "byte-order mark")
raw("header_duplicate_key.safetensors",
    framed(b'{"x": {"dtype": "I32", "shape": [4], "data_offsets": [0, 16]},'
           b' "x": {"dtype": "I32", "shape": [4], "data_offsets": [0, 16]}}', zeros16),
    "parse", "header repeats key 'x'")
raw("header_nested_too_deep.safetensors",
    framed(b'{"__metadata__": ' + b"[" * 40 + b"]" * 40 + b"}"), "parse",
    "header nests JSON deeper than 16 levels")

# --- __metadata__ ---
st("metadata_not_object.safetensors", {"__metadata__": ["kind", "topk_convert"]}, b"",
   "'__metadata__' is not an object of strings (it is array)")
st("metadata_not_string_values.safetensors",
   {"__metadata__": {"kind": "topk_convert", "block_size": 64}}, b"",
   "metadata key 'block_size' is not a string (number 64)")

# --- one tensor entry ---
st("entry_not_object.safetensors", {"x": [0, 16]}, zeros16,
   "tensor 'x': entry is not an object")
st("entry_empty_name.safetensors", {"": ok4}, zeros16, "tensor with an empty name")
st("entry_unknown_key.safetensors", {"x": dict(ok4, align=8)}, zeros16,
   "tensor 'x': unknown key 'align'")
st("entry_missing_dtype.safetensors", {"x": {"shape": [4], "data_offsets": [0, 16]}}, zeros16,
   "tensor 'x': missing 'dtype'")
st("unknown_dtype.safetensors", {"x": dict(ok4, dtype="F16")}, zeros16,
   "tensor 'x': unknown dtype 'F16'")
st("dtype_not_string.safetensors", {"x": dict(ok4, dtype=4)}, zeros16,
   "tensor 'x': dtype is not a string")
st("shape_not_array.safetensors", {"x": dict(ok4, shape=4)}, zeros16,
   "tensor 'x': shape is not an array")
st("shape_not_integer.safetensors", {"x": dict(ok4, shape=[2, 2.0])}, zeros16,
   "tensor 'x': shape[1] = 2.0 is not an integer")
st("negative_dimension.safetensors", {"x": dict(ok4, shape=[-4])}, zeros16,
   "tensor 'x': negative dimension shape[0] = -4")
st("shape_product_overflow.safetensors", {"x": dict(ok4, shape=[1 << 32, 1 << 32, 2])}, zeros16,
   "shape product overflow")
st("byte_count_overflow.safetensors", {"x": dict(ok4, shape=[1 << 62])}, zeros16,
   "tensor 'x': byte count of shape [4611686018427387904] of I32 overflows int64")
st("offsets_not_two_integers.safetensors", {"x": dict(ok4, data_offsets=[16])}, zeros16,
   "tensor 'x': data_offsets is not an array of two integers")
st("offsets_negative.safetensors", {"x": dict(ok4, data_offsets=[-16, 0])}, zeros16,
   "tensor 'x': data_offsets [-16,0] has a negative offset")
st("offsets_reversed.safetensors", {"x": dict(ok4, data_offsets=[16, 0])}, zeros16,
   "tensor 'x': data_offsets [16,0] are reversed")
st("offsets_past_end.safetensors", {"x": dict(ok4, data_offsets=[0, 4000])}, zeros16,
   "tensor 'x': data_offsets [0,4000] end past the data section (16 bytes)")
st("shape_bytes_mismatch.safetensors", {"x": dict(ok4, shape=[7, 128])}, zeros16,
   "tensor 'x': data_offsets [0,16] hold 16 bytes but shape [7,128] of I32 needs 3584 bytes")

# --- how the tensors tile the data section ---
st("tensors_overlap.safetensors", {**i32("a", [4], [0, 16]), **i32("b", [4], [8, 24])}, bytes(24),
   "tensors 'a' [0, 16] and 'b' [8, 24] overlap")
st("gap_between_tensors.safetensors", {**i32("a", [2], [0, 8]), **i32("b", [2], [16, 24])},
   bytes(24), "gap of 8 bytes between tensor 'a' (ends at 8) and tensor 'b' (begins at 16)")
st("gap_before_first_tensor.safetensors", i32("a", [2], [8, 16]), zeros16,
   "gap of 8 bytes before the first tensor 'a'")
st("trailing_bytes.safetensors", i32("a", [2], [0, 8]), zeros16,
   "8 unused bytes after the last tensor 'a'")
st("data_without_tensors.safetensors", {"__metadata__": {"kind": "topk_convert"}}, zeros16,
   "data section has 16 bytes but the header lists no tensors")


# --- valid safetensors, wrong content (copies of c1) ---
def load(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    meta = header.pop("__metadata__")
    tensors = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        tensors[name] = (e["dtype"], e["shape"], blob[base + b:base + end])
    return meta, tensors


def dump(meta, tensors):
    """Same layout as SafetensorsFile::write: sorted, packed, padded to 8."""
    header = {"__metadata__": dict(sorted(meta.items()))}
    data = b""
    for name in sorted(tensors):
        dtype, shape, blob = tensors[name]
        header[name] = {"data_offsets": [len(data), len(data) + len(blob)], "dtype": dtype,
                        "shape": shape}
        data += blob
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return framed(text, data)


def content(name, meta, tensors, expect):
    raw(name, dump(meta, tensors), "content", expect)


c1 = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_C1
meta, tensors = load(c1)

t = dict(tensors)
del t["physical"]
content("c1_missing_tensor_physical.safetensors", meta, t, "missing tensor 'physical'")

m = dict(meta)
del m["kind"]
content("c1_missing_kind.safetensors", m, tensors, "missing metadata key 'kind'")
content("c1_unknown_kind.safetensors", dict(meta, kind="bogus"), tensors, "kind 'bogus'")
content("c1_zero_block_size.safetensors", dict(meta, block_size="0"), tensors, "block_size")

dtype, shape, blob = tensors["physical"]
low16 = b"".join(blob[i:i + 2] for i in range(0, len(blob), 4))  # low halves of the int32s
content("c1_physical_i16.safetensors", meta, dict(tensors, physical=("I16", shape, low16)),
        "tensor 'physical' is I16, expected I32")

# --- a golden file cut short, and content cases the CLI's dispatch must catch ---
with open(c1, "rb") as f:
    c1_blob = f.read()
raw("truncated_in_header.safetensors", c1_blob[:100], "parse", "runs past the end of the file")
raw("truncated_in_data.safetensors", c1_blob[:-100], "parse", "end past the data section")
content("c1_no_metadata.safetensors", {}, tensors, "missing metadata key 'kind'")
content("c1_block_size_not_integer.safetensors", dict(meta, block_size="sixty-four"), tensors, "'block_size'")
content("c1_physical_shape_disagrees.safetensors", meta,
        dict(tensors, physical=("I32", [7, 64], blob[:7 * 64 * 4])), "tensor 'physical' has shape [7, 64]")

# --- hisparse_sequence content the kernels would trust (found by tools/fuzz) ---
hs_meta, hs = load(os.path.join(HERE, "..", "..", "..", "tools", "fuzz", "seeds", "hisparse_tiny.safetensors"))
dtype, shape, blob = hs["initial.lru_slots"]
content("hisparse_lru_not_permutation.safetensors", hs_meta,
        dict(hs, **{"initial.lru_slots": (dtype, shape, struct.pack("<h", 3) + blob[2:])}),
        "row 0 is not a permutation of the 8 hot slots")
dtype, shape, blob = hs["initial.lru_slots"]
content("hisparse_lru_out_of_range.safetensors", hs_meta,
        dict(hs, **{"initial.lru_slots": (dtype, shape, struct.pack("<h", 23296) + blob[2:])}),
        "initial.lru_slots[0, 0] = 23296")
# Rejected mid-replay, with work still queued on the replay's stream.
t = dict(hs)
del t["step0.swap_counts"]
content("hisparse_missing_step_output.safetensors", hs_meta, t, "missing tensor 'step0.swap_counts'")
content("hisparse_totals_not_a_number.safetensors", dict(hs_meta, totals='{"hits": x}'), hs,
        "metadata totals: 'hits' is not a small non-negative integer")

with open(os.path.join(HERE, "expected_errors.tsv"), "w") as f:
    f.write("# file\tcheck\tmessage part (generated by make_corpus.py)\n")
    for e in sorted(entries):
        f.write("\t".join(e) + "\n")
