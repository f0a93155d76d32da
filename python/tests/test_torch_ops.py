"""The operations as torch ops (torch.ops.sparse_mla.*) and torch in, torch out:
registered when the package is imported with torch importable, the schemas
declaring what each op writes, the kernels against the scalar models, the fake
implementations under FakeTensorMode and torch.library.opcheck, a function
that converts and gathers traced by torch.compile(fullgraph=True) with no graph
break, and the package working without torch. Runs on torch CPU tensors on the
host backend and on CUDA tensors with SPARSE_MLA_TEST_BACKEND=cuda."""

import os
import subprocess
import sys

import numpy as np
import pytest

import sparse_mla
from models import convert, convert_dcp, gather_upconvert, random_fp8_rows
from support import BACKEND, POISON, Arrays, TorchCpuArrays, metadata, needs_torch_2_4, random_conversion_inputs

BF16_POISON = 0xDEAD
OPS = ("convert_req_index_to_global_index", "convert_req_index_to_global_index_out",
       "cp_gather_and_upconvert_fp8_kv_cache")


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def arrays(device, torch):
    """torch tensors of the backend under test: CPU on the host, CUDA on a GPU."""
    return TorchCpuArrays(device) if BACKEND == "host" else Arrays(device)


def test_importing_the_package_registers_the_ops_with_the_writes_declared(torch):
    assert sparse_mla._torch_ops is not None
    written = {}
    for name in OPS:
        schema = getattr(torch.ops.sparse_mla, name).default._schema
        written[name] = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == {"convert_req_index_to_global_index": [],
                       "convert_req_index_to_global_index_out": ["out", "valid_counts_out"],
                       "cp_gather_and_upconvert_fp8_kv_cache": ["dst"]}


def test_the_conversion_op_matches_the_model(arrays, torch, rng):
    req_id, table, logical = random_conversion_inputs(rng, T=7, K=128)
    physical, counts = torch.ops.sparse_mla.convert_req_index_to_global_index(
        arrays(req_id), arrays(table), arrays(logical), 16, 32, True, 1, 0, 1, True, None, None)
    want_physical, want_counts = convert(req_id, table, logical, 16, 32)
    np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
    np.testing.assert_array_equal(arrays.numpy(counts), want_counts)
    (only,) = torch.ops.sparse_mla.convert_req_index_to_global_index(
        arrays(req_id), arrays(table), arrays(logical), 16, None, False, 1, 0, 1, True, None, None)
    np.testing.assert_array_equal(arrays.numpy(only), convert(req_id, table, logical, 16)[0])


def test_the_out_op_writes_the_callers_buffers(arrays, torch, rng):
    req_id, table, logical = random_conversion_inputs(rng, T=5, K=64, block_size=64 * 2)
    out, counts = arrays.poisoned((5, 64)), arrays.poisoned(5)
    assert torch.ops.sparse_mla.convert_req_index_to_global_index_out(
        arrays(req_id), arrays(table), arrays(logical), 64, None, True, 2, 1, 4, True, None, None, out=out,
        valid_counts_out=counts) is None
    want_physical, want_counts = convert_dcp(req_id, table, logical, 64, 2, 1, 4, True)
    np.testing.assert_array_equal(arrays.numpy(out), want_physical)
    np.testing.assert_array_equal(arrays.numpy(counts), want_counts)


def test_torch_in_torch_out_from_the_librarys_own_functions(device, arrays, torch, rng):
    req_id, table, logical = random_conversion_inputs(rng, T=6, K=128)
    inputs = arrays(req_id), arrays(table), arrays(logical)
    want_physical, want_counts = convert(req_id, table, logical, 16)
    # Fresh results: torch tensors torch allocated, on the inputs' device.
    physical, counts = sparse_mla.convert_req_index_to_global_index(*inputs, block_size=16, return_valid_counts=True)
    assert isinstance(physical, torch.Tensor) and physical.device == inputs[2].device
    np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
    np.testing.assert_array_equal(arrays.numpy(counts), want_counts)
    # The caller's buffers: the same objects, or views of their first rows.
    out, counts_out = arrays.poisoned((6, 128)), arrays.poisoned(9)
    physical, counts = sparse_mla.convert_req_index_to_global_index(*inputs, block_size=16, return_valid_counts=True,
                                                                    out=out, valid_counts_out=counts_out)
    assert physical is out and counts.data_ptr() == counts_out.data_ptr() and tuple(counts.shape) == (6,)
    np.testing.assert_array_equal(arrays.numpy(counts_out)[:6], want_counts)
    assert (arrays.numpy(counts_out)[6:] == POISON).all()
    # Only out, a DCP conversion: its counts go to a scratch buffer, not returned.
    assert sparse_mla.convert_req_index_to_global_index(*inputs, block_size=16, out=out, dcp_size=2, dcp_rank=1,
                                                        compact=True) is out
    np.testing.assert_array_equal(arrays.numpy(out), convert_dcp(req_id, table, logical, 16, 2, 1, 1, True)[0])
    # An explicit stream runs the library directly; its buffers come back as torch views of them.
    stream = device.create_stream()
    stream.wait_stream(device.default_stream())
    physical = sparse_mla.convert_req_index_to_global_index(*inputs, block_size=16, stream=stream)
    assert isinstance(physical, torch.Tensor)
    stream.synchronize()
    np.testing.assert_array_equal(arrays.numpy(physical), want_physical)


def test_a_rejected_op_call_raises_the_librarys_error_and_writes_nothing(arrays, torch, rng):
    req_id, table, logical = random_conversion_inputs(rng, T=8, K=64)
    out, counts = arrays.poisoned((8, 64)), arrays.poisoned(8)
    with pytest.raises(ValueError, match="req_id has shape"):
        sparse_mla.convert_req_index_to_global_index(arrays(req_id[:3]), arrays(table), arrays(logical), block_size=16,
                                                     out=out, valid_counts_out=counts, return_valid_counts=True)
    with pytest.raises(ValueError, match="valid_counts_out given but return_valid_counts is false"):
        sparse_mla.convert_req_index_to_global_index(arrays(req_id), arrays(table), arrays(logical), block_size=16,
                                                     out=out, valid_counts_out=counts)
    with pytest.raises(TypeError, match="logical top-k has dtype I16, expected I32"):
        sparse_mla.convert_req_index_to_global_index(arrays(req_id), arrays(table), arrays(logical.astype(np.int16)),
                                                     block_size=16)
    assert (arrays.numpy(out) == POISON).all() and (arrays.numpy(counts) == POISON).all()


def test_the_gather_op_writes_dst_as_the_model(arrays, torch, rng):
    cache = random_fp8_rows(rng, 8 * 16).reshape(8, 16, 656)
    table = rng.integers(0, 8, size=(2, 3), dtype=np.int32)
    starts = np.array([0, 21], np.int32)
    bits = arrays.poisoned((30, 576), np.uint16, BF16_POISON)
    torch.ops.sparse_mla.cp_gather_and_upconvert_fp8_kv_cache(arrays(cache), arrays.bf16(bits), arrays(table),
                                                              arrays(starts), 2, None, None, None, None, 0, "e4m3fn", "fp8_ds_mla")
    want = gather_upconvert(cache, table, starts, 2, np.full((30, 576), BF16_POISON, np.uint16))
    np.testing.assert_array_equal(arrays.bits(bits), want)


def test_a_group_built_on_torch_hands_out_torch_tensors(arrays, torch, rng):
    """Its conversion results and workspaces are torch tensors of its memory; every layer of a
    step gets the leader's tensor objects; a prefill-sized call's fresh buffers come as torch too."""
    K, T = 128, 3
    logical = arrays.poisoned((8, K))
    builder = sparse_mla.SparseMLAIndexGroupBuilder(logical, 4)
    layers = [builder.register_layer(i == 0) for i in range(3)]
    for step_rows in (T, T, T - 1):
        req_id, table, rows = random_conversion_inputs(rng, T=step_rows, K=K)
        arrays.set(logical, slice(0, step_rows), rows)
        md = metadata(req_id_per_token=arrays(req_id), block_table=arrays(table), block_size=16,
                      num_decodes=step_rows, num_decode_tokens=step_rows)
        results = []
        for group, index in layers:
            group.set_logical_topk_ready(index)
            group.prepare_for_batch(index, md)
            results.append(group.convert_logical_to_physical_topk(index, logical[:step_rows], md,
                                                                  return_valid_counts=True))
        want_physical, want_counts = convert(req_id, table, rows, 16)
        for physical, counts in results:
            assert physical is results[0][0] and counts is results[0][1]
            np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
            np.testing.assert_array_equal(arrays.numpy(counts), want_counts)
    whole = builder.groups[0].physical_topk_indices
    assert isinstance(whole, torch.Tensor) and whole.shape[1] == K and whole.shape[0] >= 4
    assert whole.data_ptr() == results[0][0].data_ptr()
    assert isinstance(builder.groups[0].valid_topk_counts, torch.Tensor)
    # Prefill-sized (more rows than the workspace): the library's fresh buffers, as torch tensors.
    req_id, table, rows = random_conversion_inputs(rng, T=7, K=K)
    arrays.set(logical, slice(0, 7), rows)
    md = metadata(req_id_per_token=arrays(req_id), block_table=arrays(table), block_size=16, num_prefills=3)
    group, index = layers[0]
    physical = group.convert_logical_to_physical_topk(index, logical[:7], md)
    assert isinstance(physical, torch.Tensor)
    np.testing.assert_array_equal(arrays.numpy(physical), convert(req_id, table, rows, 16)[0])


def fake_inputs(torch, T=4, K=128):
    return (torch.zeros(T, dtype=torch.int32), torch.zeros((2, 3), dtype=torch.int32),
            torch.zeros((T, K), dtype=torch.int32))


@needs_torch_2_4
def test_the_fake_implementations_give_the_outputs_shapes(torch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        req_id, table, logical = (mode.from_tensor(t) for t in fake_inputs(torch, T=5))
        physical, counts = torch.ops.sparse_mla.convert_req_index_to_global_index(
            req_id, table, logical, 16, None, True, 1, 0, 1, True, None, None)
        (only,) = torch.ops.sparse_mla.convert_req_index_to_global_index(
            req_id, table, logical, 16, None, False, 4, 1, 1, True, None, None)
    assert (tuple(physical.shape), tuple(counts.shape), tuple(only.shape)) == ((5, 128), (5,), (5, 128))
    assert physical.dtype == counts.dtype == torch.int32


@needs_torch_2_4
def test_opcheck_passes_on_every_op(arrays, torch, rng):
    req_id, table, logical = (arrays(a) for a in random_conversion_inputs(rng, T=4, K=64))
    cache = arrays(random_fp8_rows(rng, 4 * 16).reshape(4, 16, 656))
    dst = arrays.bf16(np.zeros((20, 576), np.uint16))
    gather_table, starts = arrays(np.array([[0, 1], [2, 3]], np.int32)), arrays(np.array([0, 10], np.int32))
    cases = [
        (torch.ops.sparse_mla.convert_req_index_to_global_index.default,
         (req_id, table, logical, 16, None, True, 1, 0, 1, True, None, None), {}),
        (torch.ops.sparse_mla.convert_req_index_to_global_index.default,
         (req_id, table, logical, 16, None, False, 2, 1, 1, True, None, None), {}),
        (torch.ops.sparse_mla.convert_req_index_to_global_index_out.default,
         (req_id, table, logical, 16, None, True, 1, 0, 1, True, None, None),
         dict(out=arrays.poisoned((4, 64)), valid_counts_out=arrays.poisoned(4))),
        (torch.ops.sparse_mla.cp_gather_and_upconvert_fp8_kv_cache.default,
         (cache, dst, gather_table, starts, 2, None, None, None, None, 0, "e4m3fn", "fp8_ds_mla"), {}),
    ]
    for op, args, kwargs in cases:
        torch.library.opcheck(op, args, kwargs)


@needs_torch_2_4
def test_compile_traces_a_function_that_converts_and_gathers_with_no_graph_break(arrays, torch, rng):
    from sparse_mla import vllm

    K, block_size = 128, 16
    req_id, table, logical = random_conversion_inputs(rng, T=6, K=K, block_size=block_size)
    cache = random_fp8_rows(rng, 40 * block_size).reshape(40, block_size, 656)
    starts = np.array([0, 9], np.int32)

    def step(req_id, table, logical, cache, dst, starts):
        physical, counts = vllm.triton_convert_req_index_to_global_index(
            req_id, table, logical, BLOCK_SIZE=block_size, NUM_TOPK_TOKENS=K, return_valid_counts=True)
        vllm.cp_gather_and_upconvert_fp8_kv_cache(cache, dst, table, starts, 2)
        return physical, counts

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    bits = arrays.poisoned((24, 576), np.uint16, BF16_POISON)
    physical, counts = compiled(arrays(req_id), arrays(table), arrays(logical), arrays(cache), arrays.bf16(bits),
                                arrays(starts))
    want_physical, want_counts = convert(req_id, table, logical, block_size)
    np.testing.assert_array_equal(arrays.numpy(physical), want_physical)
    np.testing.assert_array_equal(arrays.numpy(counts), want_counts)
    np.testing.assert_array_equal(arrays.bits(bits), gather_upconvert(cache, table, starts, 2,
                                                                      np.full((24, 576), BF16_POISON, np.uint16)))
    explanation = torch._dynamo.explain(step)(arrays(req_id), arrays(table), arrays(logical), arrays(cache),
                                              arrays.bf16(bits), arrays(starts))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_the_package_works_without_torch(tmp_path):
    """With torch unimportable the package is the extension as it is: no ops, NumPy calls unchanged."""
    script = tmp_path / "without_torch.py"
    script.write_text(
        "import sys\n"
        "sys.modules['torch'] = None  # import torch raises ImportError\n"
        "import numpy as np\n"
        "import sparse_mla\n"
        "from sparse_mla.vllm import triton_convert_req_index_to_global_index as convert\n"
        "assert sparse_mla._torch_ops is None\n"
        "out = convert(np.zeros(2, np.int32), np.arange(4, dtype=np.int32).reshape(2, 2),\n"
        "              np.array([[0, 17, -1, 5], [16, 1, 2, 40]], np.int32), BLOCK_SIZE=16, NUM_TOPK_TOKENS=4,\n"
        "              BLOCK_N=4)\n"
        "assert isinstance(out, sparse_mla.Tensor)\n"
        "print(np.asarray(out).tolist())\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            env=dict(os.environ, SPARSE_MLA_TEST_BACKEND="host"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[0, 17, -1, 5], [16, 1, 2, -1]]"
