"""cp_gather_and_upconvert_fp8_kv_cache against the scalar model (SPEC section 3) on
fresh random rows, the host-backed variant, and its rejections."""

import numpy as np
import pytest

import sparse_mla
from models import gather_upconvert, random_fp8_rows, upconvert_rows
from support import host_only

BF16_POISON = 0xDEAD


def random_paged_cache(rng, num_blocks, block_size, fnuz=False):
    return random_fp8_rows(rng, num_blocks * block_size, fnuz).reshape(num_blocks, block_size, 656)


def random_gather(rng, block_size, seq_lens, num_blocks, seq_starts=None):
    batch = len(seq_lens)
    blocks_needed = max((s + l + block_size - 1) // block_size
                        for s, l in zip(seq_starts or [0] * batch, seq_lens))
    table = rng.integers(0, num_blocks, size=(batch, blocks_needed), dtype=np.int32)
    starts = np.concatenate([[0], np.cumsum(seq_lens)[:-1]]).astype(np.int32)
    return table, starts, int(np.sum(seq_lens))


@pytest.mark.parametrize("block_size,seq_lens,fp8_format", [(64, [1, 65, 200], "e4m3fn"), (16, [33, 7], "e4m3fn"),
                                                           (1, [1, 17, 40], "e4m3fn"), (64, [90, 64], "e4m3fnuz")])
def test_the_gather_upconvert_matches_the_model(arrays, rng, block_size, seq_lens, fp8_format):
    fnuz = fp8_format == "e4m3fnuz"
    cache = random_paged_cache(rng, num_blocks=24, block_size=block_size, fnuz=fnuz)
    table, starts, total = random_gather(rng, block_size, seq_lens, 24)
    dst = arrays.poisoned((total, 576), np.uint16, BF16_POISON)
    sparse_mla.cp_gather_and_upconvert_fp8_kv_cache(arrays(cache), arrays.bf16(dst), arrays(table), arrays(starts),
                                                    len(seq_lens), fp8_format=fp8_format)
    want = gather_upconvert(cache, table, starts, len(seq_lens), np.full((total, 576), BF16_POISON, np.uint16),
                            fnuz=fnuz)
    np.testing.assert_array_equal(arrays.bits(dst), want)


def test_seq_starts_pick_the_first_source_token_of_each_request(arrays, rng):
    cache = random_paged_cache(rng, num_blocks=15, block_size=64)
    seq_lens, seq_starts = [70, 3, 100, 64], [0, 5, 64, 130]
    table, starts, total = random_gather(rng, 64, seq_lens, 15, seq_starts)
    dst = arrays.poisoned((total, 576), np.uint16, BF16_POISON)
    sparse_mla.cp_gather_and_upconvert_fp8_kv_cache(arrays(cache), arrays.bf16(dst), arrays(table), arrays(starts), 4,
                                                    seq_starts=arrays(np.array(seq_starts, np.int32)))
    want = gather_upconvert(cache, table, starts, 4, np.full((total, 576), BF16_POISON, np.uint16),
                            seq_starts=seq_starts)
    np.testing.assert_array_equal(arrays.bits(dst), want)


def test_the_host_backed_variant_reads_staged_rows_from_pinned_memory(device, arrays, rng):
    cache = random_paged_cache(rng, num_blocks=4, block_size=16)
    host_rows = random_fp8_rows(rng, 50)
    host_cache = device.empty((50, 656), "uint8", kind="pinned_host")
    np.asarray(host_cache)[:] = host_rows
    # Two staged pages of 16 rows: row n reads the device cache where device_row_ids[n] >= 0, else the host pool.
    host_row_ids = rng.integers(0, 50, size=32, dtype=np.int32)
    device_row_ids = np.where(rng.random(32) < 0.3, rng.integers(0, 64, size=32), -1).astype(np.int32)
    table = np.array([[1, 0]], np.int32)  # request 0: staged page 1, then page 0
    dst = arrays.poisoned((32, 576), np.uint16, BF16_POISON)
    sparse_mla.cp_gather_and_upconvert_fp8_kv_cache(
        arrays(cache), arrays.bf16(dst), arrays(table), arrays(np.array([0], np.int32)), 1,
        host_cache=host_cache, host_row_ids=arrays(host_row_ids), device_row_ids=arrays(device_row_ids))
    result = arrays.bits(dst)
    flat = cache.reshape(-1, 656)
    for row in range(32):
        staged = table[0, row // 16] * 16 + row % 16
        source = flat[device_row_ids[staged]] if device_row_ids[staged] >= 0 else host_rows[host_row_ids[staged]]
        np.testing.assert_array_equal(result[row], upconvert_rows(source)[0], err_msg=f"row {row}")
    with pytest.raises(ValueError, match="host_cache is in host memory, expected pinned_host"):
        sparse_mla.cp_gather_and_upconvert_fp8_kv_cache(
            arrays(cache), arrays.bf16(dst), arrays(table), arrays(np.array([0], np.int32)), 1,
            host_cache=host_rows, host_row_ids=arrays(host_row_ids), device_row_ids=arrays(device_row_ids))


def rejections(arrays):
    def dst_int16(a):
        a["dst"] = a["bits"].view(np.int16) if arrays.host else a["bits"]

    def dst_uint16(a):
        a["dst"] = a["bits"]

    def short_rows(a):
        a["src_cache"] = a["src_cache"][:, :, :640]

    def too_few_table_rows(a):
        a["batch_size"] = 3

    def wrong_device(a):
        a["workspace_starts"] = arrays.foreign(np.array([0, 10], np.int32))

    def bad_format(a):
        a["fp8_format"] = "e5m2"

    def bad_kv_format(a):
        a["kv_format"] = "fp8_ds_mla_v4"

    def rows_read_as_pages(a):
        a["kv_format"] = "model1_fp8"

    return {
        "dst int16": (TypeError, "dst has dtype I16, expected BF16", dst_int16),
        "dst uint16 bits": (TypeError, "dst has dtype uint16, which no sparse_mla operation takes", dst_uint16),
        "rows of 640 bytes": (ValueError, "bytes per fp8_ds_mla row", short_rows),
        "batch past the table": (ValueError, "block_table has shape", too_few_table_rows),
        "wrong device": (ValueError, "workspace_starts " + arrays.foreign_message, wrong_device),
        "unknown format": (ValueError, "unknown fp8_format 'e5m2'", bad_format),
        "unknown kv format": (ValueError, "unknown kv_format 'fp8_ds_mla_v4'", bad_kv_format),
        "rows read as model1_fp8 pages": (ValueError, "bytes per model1_fp8 token", rows_read_as_pages),
    }


@pytest.mark.parametrize("name", ["dst int16", pytest.param("dst uint16 bits", marks=host_only), "rows of 640 bytes",
                                  "batch past the table", "wrong device", "unknown format", "unknown kv format",
                                  "rows read as model1_fp8 pages"])
def test_a_rejected_gather_raises_with_the_library_message_and_writes_nothing(arrays, rng, name):
    error, message, breaks = rejections(arrays)[name]
    cache = arrays(random_paged_cache(rng, num_blocks=4, block_size=16))
    bits = arrays.poisoned((20, 576), np.uint16, BF16_POISON)
    args = dict(src_cache=cache, bits=bits, dst=arrays.bf16(bits), block_table=arrays(np.array([[0, 1], [2, 3]], np.int32)),
                workspace_starts=arrays(np.array([0, 10], np.int32)), batch_size=2, fp8_format="e4m3fn",
                kv_format="fp8_ds_mla")
    breaks(args)
    with pytest.raises(error, match=message):
        sparse_mla.cp_gather_and_upconvert_fp8_kv_cache(args["src_cache"], args["dst"], args["block_table"],
                                                        args["workspace_starts"], args["batch_size"],
                                                        fp8_format=args["fp8_format"], kv_format=args["kv_format"])
    assert (arrays.bits(bits) == BF16_POISON).all()
