"""Scalar models of SPEC sections 2, 2a, 3 and 5 in NumPy, written from the
SPEC's words and independent of the library: what the tests compare the
module's results with."""

import numpy as np


def low32(values):
    """int64 values as the int32 a kernel stores (two's complement wrap)."""
    return ((np.asarray(values, np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def convert(req_id, block_table, logical, block_size, block_stride_rows=None,
            workspace_request=None, workspace_starts=None):
    """SPEC section 2: physical[t, j] = block_table[r, tok // bs] * stride + tok % bs,
    -1 for tok < 0 or a block past the table; the prefill-workspace variant maps a
    token of prefill request p >= 0 to workspace_starts[p] + tok. Returns
    (physical int32 [T, K], valid_counts int32 [T])."""
    stride = block_size if block_stride_rows is None else block_stride_rows
    logical = np.asarray(logical, np.int64)
    T, K = logical.shape
    B = block_table.shape[1]
    physical = np.full((T, K), -1, np.int64)
    for t in range(T):
        p = -1 if workspace_request is None else int(workspace_request[t])
        r = int(req_id[t])
        for j in range(K):
            tok = int(logical[t, j])
            if tok < 0:
                continue
            if p >= 0:
                physical[t, j] = int(workspace_starts[p]) + tok
            elif tok // block_size < B:
                physical[t, j] = int(block_table[r, tok // block_size]) * stride + tok % block_size
    physical = low32(physical)
    return physical, (physical != -1).sum(axis=1).astype(np.int32)


def convert_dcp(req_id, block_table, logical, block_size, dcp_size, dcp_rank, interleave, compact):
    """SPEC section 2a: rank `dcp_rank` owns tok when (tok // I) % S == rank and
    converts it at local = (tok // (S * I)) * I + tok % I; other ranks' tokens give
    -1; with compaction the valid outputs move to the row's front in input order."""
    S, I = dcp_size, interleave
    local = np.array(logical, np.int64)
    for index, tok in np.ndenumerate(local):
        if tok < 0:
            continue
        local[index] = (tok // (S * I)) * I + tok % I if (tok // I) % S == dcp_rank else -1
    physical, counts = convert(req_id, block_table, local, block_size)
    if compact:
        for t in range(physical.shape[0]):
            kept = physical[t][physical[t] != -1]
            physical[t] = -1
            physical[t, :kept.size] = kept
    return physical, counts


def fp8_table(fnuz=False):
    """The 256 fp8 e4m3 values as float32: (-1)^s * 2^(e - bias) * (1 + m / 8), or
    2^(1 - bias) * m / 8 when e = 0; e4m3fn: bias 7, S.1111.111 NaN; e4m3fnuz:
    bias 8, 0x80 the only NaN."""
    bias = 8 if fnuz else 7
    table = np.empty(256, np.float64)
    for byte in range(256):
        sign, exponent, mantissa = byte >> 7, (byte >> 3) & 15, byte & 7
        if exponent == 0:
            magnitude = mantissa / 8.0 * 2.0 ** (1 - bias)
        else:
            magnitude = (1.0 + mantissa / 8.0) * 2.0 ** (exponent - bias)
        nan = byte == 0x80 if fnuz else (exponent == 15 and mantissa == 7)
        table[byte] = np.nan if nan else (-magnitude if sign else magnitude)
    return table.astype(np.float32)


def bf16_nearest_even(x):
    """float32 to bf16 bits, round to nearest, ties to even."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def upconvert_rows(rows, fnuz=False):
    """SPEC section 3, one 656-byte row to 576 bf16 (as uint16 bits): element e < 512
    is bf16_rne(float(fp8[e]) * scale[e // 128]), then the 64 RoPE values copied."""
    rows = np.asarray(rows, np.uint8).reshape(-1, 656)
    values = fp8_table(fnuz)[rows[:, :512]]
    scales = np.ascontiguousarray(rows[:, 512:528]).view(np.float32)  # [n, 4]
    products = values * np.repeat(scales, 128, axis=1)  # float32 products
    out = np.empty((rows.shape[0], 576), np.uint16)
    out[:, :512] = bf16_nearest_even(products)
    out[:, 512:] = np.ascontiguousarray(rows[:, 528:656]).view(np.uint16)
    return out


def gather_upconvert(src_cache, block_table, workspace_starts, batch_size, dst, seq_starts=None, fnuz=False):
    """SPEC section 3's gather into a copy of `dst` (uint16 [TOT, 576], the poison the
    rows nobody writes keep): request r fills rows [ws[r], ws[r+1]) (the last one to
    TOT, ends clamped to TOT); row ws[r] + i is source token s = seq_starts[r] + i at
    src_cache[block_table[r, s // bs], s % bs]."""
    out = np.array(dst, np.uint16)
    total = out.shape[0]
    bs = src_cache.shape[1]
    for r in range(batch_size):
        begin = min(int(workspace_starts[r]), total)
        end = min(int(workspace_starts[r + 1]) if r + 1 < batch_size else total, total)
        first = 0 if seq_starts is None else int(seq_starts[r])
        for row in range(begin, end):
            s = first + row - begin
            block = int(block_table[r, s // bs])
            out[row] = upconvert_rows(src_cache[block, s % bs], fnuz)[0]
    return out


def random_fp8_rows(rng, n, fnuz=False):
    """n random fp8_ds_mla rows: fp8 bytes with no NaN, positive finite scales,
    random bf16 RoPE bits (no NaN), as uint8 [n, 656]."""
    rows = np.empty((n, 656), np.uint8)
    values = rng.integers(0, 256, size=(n, 512), dtype=np.uint8)
    nan = values == 0x80 if fnuz else (values & 0x7F) == 0x7F
    values[nan] = 0x00
    rows[:, :512] = values
    rows[:, 512:528] = rng.uniform(1e-3, 8.0, size=(n, 4)).astype(np.float32).view(np.uint8).reshape(n, 16)
    rope = rng.integers(0, 2**16, size=(n, 64), dtype=np.uint16) & np.uint16(0xBF7F)  # clears NaN/Inf exponents
    rows[:, 528:] = rope.view(np.uint8).reshape(n, 128)
    return rows
