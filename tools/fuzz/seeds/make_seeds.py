#!/usr/bin/env python3
"""Writes small, well-formed golden-format seeds for the fuzzers next to this
script (the shipped golden files of these kinds are too large to fuzz whole).

- hisparse_tiny.safetensors: a hisparse_sequence of 2 steps, 2 batch rows,
  top_k 4, 8 hot slots, 16-byte rows. Its inputs follow golden/README.md; its
  outputs come from a direct transcription of SPEC section 5 below, so the
  seed also passes `sparse-mla validate --golden`.

Deterministic: running it twice gives identical files.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def dump(path, meta, tensors):
    """Same layout as SafetensorsFile::write: sorted, packed, padded to 8."""
    header = {"__metadata__": dict(sorted(meta.items()))}
    data = b""
    for name in sorted(tensors):
        dtype, shape, blob = tensors[name]
        header[name] = {"data_offsets": [len(data), len(data) + len(blob)], "dtype": dtype, "shape": shape}
        data += blob
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def i32(shape, values):
    return ("I32", shape, struct.pack("<%di" % len(values), *values))


def i16(shape, values):
    return ("I16", shape, struct.pack("<%dh" % len(values), *values))


def u8(shape, values):
    return ("U8", shape, bytes(values))


K, H, ROWS, STATES, BS, ROW_BYTES = 4, 8, 2, 2, 4, 16
SRC_BLOCKS, HOST_ROWS, HOT_BLOCKS = 4, 32, 1 + ROWS * (H // BS)
source = [r * SRC_BLOCKS + b for r in range(ROWS) for b in range(SRC_BLOCKS)]  # request r: host blocks 4r..4r+3
resident = [0] * (ROWS * SRC_BLOCKS)
resident[1 * SRC_BLOCKS + 3] = 7  # request 1's block 3 is resident (device block 7)
host_cache = [(7 * i + 3) & 0xFF for i in range(HOST_ROWS * ROW_BYTES)]
hot_table_by_state = [1 + s * (H // BS) + b for s in range(STATES) for b in range(H // BS)]

slot_rows = [[-1] * H for _ in range(STATES)]
lru = [list(range(H)) for _ in range(STATES)]
hot_cache = [0xEE] * (HOT_BLOCKS * BS * ROW_BYTES)


def host_row(req, tok):
    if tok < 0 or tok // BS >= SRC_BLOCKS:
        return -1
    g = source[req * SRC_BLOCKS + tok // BS] * BS + tok % BS
    return g if g < HOST_ROWS else -1


def resident_row(req, tok):
    if tok < 0 or tok // BS >= SRC_BLOCKS:
        return -1
    blk = resident[req * SRC_BLOCKS + tok // BS]
    return -1 if blk <= 0 else blk * BS + tok % BS


def attention(x):
    return -1 if x < 0 else (x // BS) * 8 + x % BS


steps = [
    ([[0, 1, 2, -1], [4, 13, 14, 5]], [0, 1], [0, 1]),
    ([[1, 2, 3, 9], [5, 6, -1, 15]], [1, 0], [1, 0]),
]
meta = {"kind": "hisparse_sequence", "top_k": str(K), "hot_size": str(H), "region_stride": str(H),
        "batch_rows": str(ROWS), "num_state_rows": str(STATES), "num_steps": str(len(steps)),
        "host_rows": str(HOST_ROWS), "row_bytes": str(ROW_BYTES), "hot_block_size": str(BS),
        "hot_cache_blocks": str(HOT_BLOCKS), "source_block_size": str(BS), "resident_block_size": str(BS),
        "resident_null_block": "0", "attention_block_stride": "8", "input_row_stride": "1",
        "output_row_stride": "1", "input_row_offset": "0", "output_row_offset": "0",
        "produced_by": "tools/fuzz/seeds/make_seeds.py (a fuzzing seed, not a reference output)"}
tensors = {
    "host_cache": u8([HOST_ROWS, ROW_BYTES], host_cache),
    "source_block_table": i32([ROWS, SRC_BLOCKS], source),
    "resident_block_table": i32([ROWS, SRC_BLOCKS], resident),
    "initial.device_global_indices": i32([STATES, H], sum(slot_rows, [])),
    "initial.lru_slots": i16([STATES, H], sum(lru, [])),
    "initial.hot_cache": u8([HOT_BLOCKS, BS, ROW_BYTES], hot_cache),
}
hits = misses = 0
for s, (logical, states, requests) in enumerate(steps):
    p = "step%d." % s
    hot_table = [hot_table_by_state[st * (H // BS) + b] for st in states for b in range(H // BS)]
    out = {k: [-9] * (ROWS * K) for k in ("hot", "att", "res", "miss")}
    swap_h, swap_d = [-2] * (ROWS * K), [-2] * (ROWS * K)
    valid, counts = [-9] * ROWS, [-9] * ROWS
    for b in range(ROWS):
        st, req = states[b], requests[b]
        row = logical[b]
        g = [host_row(req, t) for t in row]
        res = [resident_row(req, t) for t in row]
        wanted = []
        for j in range(K):
            if res[j] < 0 and g[j] >= 0 and g[j] not in wanted:
                wanted.append(g[j])
        hit_slots, evictable = [], []
        for slot in lru[st]:
            (hit_slots if slot_rows[st][slot] in wanted else evictable).append(slot)
        slot_of = {slot_rows[st][sl]: sl for sl in hit_slots}
        m = 0
        first = {}
        for j in range(K):
            if g[j] >= 0 and res[j] < 0 and g[j] not in first:
                first[g[j]] = j
        for w in wanted:
            if w in slot_of:
                continue
            sl = evictable[m]
            slot_rows[st][sl] = w
            slot_of[w] = sl
            x = hot_table[b * (H // BS) + sl // BS] * BS + sl % BS
            swap_h[b * K + m], swap_d[b * K + m] = w, x
            out["miss"][b * K + first[w]] = 1
            hot_cache[x * ROW_BYTES:(x + 1) * ROW_BYTES] = host_cache[w * ROW_BYTES:(w + 1) * ROW_BYTES]
            m += 1
        lru[st] = evictable[m:] + evictable[:m] + hit_slots
        hits += len(hit_slots)
        misses += m
        for j in range(K):
            if out["miss"][b * K + j] != 1:
                out["miss"][b * K + j] = 0
            out["res"][b * K + j] = g[j]
            if res[j] >= 0:
                x = res[j]
            elif g[j] >= 0:
                sl = slot_of[g[j]]
                x = hot_table[b * (H // BS) + sl // BS] * BS + sl % BS
            else:
                x = -1
            out["hot"][b * K + j], out["att"][b * K + j] = x, attention(x)
        valid[b] = sum(1 for j in range(K) if res[j] >= 0 or g[j] >= 0)
        counts[b] = m
    tensors.update({
        p + "logical": i32([ROWS, K], sum(logical, [])),
        p + "request_state_indices": i32([ROWS], states),
        p + "request_ids": i32([ROWS], requests),
        p + "hot_block_table": i32([ROWS, H // BS], hot_table),
        p + "hot_indices": i32([ROWS, K], out["hot"]),
        p + "attention_indices": i32([ROWS, K], out["att"]),
        p + "resolved_global_indices": i32([ROWS, K], out["res"]),
        p + "miss_mask": i32([ROWS, K], out["miss"]),
        p + "valid_counts": i32([ROWS], valid),
        p + "swap_counts": i32([ROWS], counts),
        p + "swap_host_rows": i32([ROWS, K], swap_h),
        p + "swap_device_rows": i32([ROWS, K], swap_d),
        p + "device_global_indices": i32([STATES, H], sum(slot_rows, [])),
        p + "lru_slots": i16([STATES, H], sum(lru, [])),
        p + "hot_cache": u8([HOT_BLOCKS, BS, ROW_BYTES], hot_cache),
    })
meta["totals"] = json.dumps({"hits": hits, "misses": misses})
dump(os.path.join(HERE, "hisparse_tiny.safetensors"), meta, tensors)
