#!/usr/bin/env python3
"""Times the reference engine's top-k conversion the way `sparse-mla bench`
times ours, on the same machine, so that the two can be compared.

The reference is vLLM's Triton `triton_convert_req_index_to_global_index`
(vllm/v1/attention/backends/mla/sparse_utils.py; the golden files name the
commit, 02a26fa06df2ecb7b87ebe0fc93d5d211ce4d650). This script does not
contain it: pass that file's path. It needs torch with CUDA and Triton, and
nothing else of vLLM (the file imports only torch and `vllm.triton_utils`,
which this script provides).

    python3 tools/bench/reference_convert.py path/to/sparse_utils.py
    python3 tools/bench/reference_convert.py path/to/sparse_utils.py --tokens 256 --rotate-mib 1
    python3 tools/bench/reference_convert.py path/to/sparse_utils.py \
        --ours build/cuda/lib/libsparse-mla-convert-ctypes.so --rounds 2
    python3 tools/bench/reference_convert.py path/to/sparse_utils.py --ours ... \
        --dcp-size 8 --dcp-rank 0 --dcp-interleave 1 --compact

With --dcp-size > 1 the cases are the DCP filter-and-convert (SPEC section
2a): the reference's `triton_filter_and_convert_dcp_index` (compacting when
--compact is given) beside ours, on the same inputs, the block table being
the rank's.

With --ours (the library's kernel as a shared library, tools/bench/
convert_ctypes.cpp), the library's conversion is timed the same way in the
same process, case by case beside the reference, its outputs allocated the
same way; each round times every case once, and the figures of all rounds
are printed. Launch floors come with it, empty kernels of one block: a
Triton kernel of 8 warps, and CUDA kernels of 256 threads in modules with no
constant memory, 256 bytes, 32 KiB, and in the library's translation unit,
whose module holds the 32 KiB buffer Kokkos defines in every CUDA
translation unit that includes it. What a module's constant memory adds to
each launch of its kernels is the difference. This is the comparison to
quote: the same kernel measures 0.3-0.4 us a launch slower here than in
`sparse-mla bench` (docs/PERFORMANCE.md).

Method, as in docs/bench.md: the inputs of each case are those of
`convert/T=...` (K = 2048, block size 64, token t of request t % min(T, 128),
a shuffled table of 512 blocks a request, about 3% of positions -1); the
output of the first launch is compared with a scalar model before anything is
timed; the launches of one cycle through enough copies ("sets") of the
inputs and outputs to exceed --rotate-mib are captured into one CUDA graph,
which is replayed between two events; the figure is the median over
--repeat replays of the time per launch. The outputs are the ones the
function allocates, kept alive, so they rotate too. The ceiling is a
device-to-device copy of --rotate-mib, counted read + written.
"""
import argparse
import importlib.util
import statistics
import sys
import types

import torch
import triton
import triton.language as tl

K = 2048
BLOCK_SIZE = 64
BLOCKS_PER_REQUEST = 32768 // BLOCK_SIZE
MAX_SETS = 16384


def load_reference(path):
    """The reference's conversion function from vLLM's sparse_utils.py."""
    utils = types.ModuleType("vllm.triton_utils")
    utils.tl, utils.triton = tl, triton
    vllm = types.ModuleType("vllm")
    vllm.triton_utils = utils
    sys.modules.setdefault("vllm", vllm)
    sys.modules.setdefault("vllm.triton_utils", utils)
    spec = importlib.util.spec_from_file_location("reference_sparse_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_inputs(tokens, generator):
    requests = min(tokens, 128)
    req_id = (torch.arange(tokens, dtype=torch.int32) % requests).cuda()
    table = torch.randperm(requests * BLOCKS_PER_REQUEST, generator=generator).to(torch.int32)
    table = table.view(requests, BLOCKS_PER_REQUEST).cuda()
    draw = torch.randint(0, 100 * 32768, (tokens, K), generator=generator, dtype=torch.int64)
    logical = torch.where(draw < 3 * 32768, torch.full_like(draw, -1), draw % 32768).to(torch.int32).cuda()
    return req_id, table, logical


def expected(req_id, table, logical, dcp=None):
    """The scalar model (SPEC sections 2 and 2a), as tensors; dcp: (size, rank, interleave, compact) or None."""
    tok = logical.long()
    rows = table.long()[req_id.long()]  # [T, B]
    keep = tok >= 0
    if dcp is not None:
        size, rank, interleave, compact = dcp
        keep = keep & ((tok // interleave) % size == rank)
        tok = (tok // (size * interleave)) * interleave + tok % interleave
    tok = torch.where(keep, tok, torch.zeros_like(tok))
    keep = keep & (tok // BLOCK_SIZE < rows.shape[1])
    block = torch.where(keep, tok // BLOCK_SIZE, torch.zeros_like(tok))
    physical = torch.gather(rows, 1, block) * BLOCK_SIZE + tok % BLOCK_SIZE
    physical = torch.where(keep, physical, torch.full_like(physical, -1)).to(torch.int32)
    if dcp is not None and dcp[3]:  # valid entries first, in input order
        order = torch.sort((physical == -1).to(torch.int8), dim=1, stable=True).indices
        physical = torch.gather(physical, 1, order)
    return physical, (physical != -1).sum(dim=1).to(torch.int32)


@triton.jit
def _empty_kernel(unused_ptr):
    pass


def load_ours(path):
    """The library's conversion from libsparse-mla-convert-ctypes.so."""
    import ctypes

    lib = ctypes.CDLL(path)
    i32p, i64, i32, vp = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
    lib.sparse_mla_ctypes_convert_dcp.argtypes = [vp, i32p, i32p, i64, i32, i32p, i32p, i32p, i64, i32, i32,
                                                  i32, i32, i32, i32]
    empties = [("empty-cuda-no-constant-256", lib.sparse_mla_ctypes_empty_constant_0),
               ("empty-cuda-constant-256B-256", lib.sparse_mla_ctypes_empty_constant_256),
               ("empty-cuda-constant-32KiB-256", lib.sparse_mla_ctypes_empty_constant_32768),
               ("empty-kokkos-tu-256", lib.sparse_mla_ctypes_empty)]
    for _, function in empties:
        function.argtypes = [vp, ctypes.c_int]
    if lib.sparse_mla_ctypes_init() != 0:
        raise RuntimeError(f"{path}: Kokkos did not initialise")

    def convert(req_id, table, logical, BLOCK_SIZE, NUM_TOPK_TOKENS, return_valid_counts, dcp=None):
        out = torch.empty_like(logical)
        counts = torch.empty(logical.shape[0], dtype=torch.int32, device=logical.device)
        size, rank, interleave, compact = dcp if dcp is not None else (1, 0, 1, False)
        status = lib.sparse_mla_ctypes_convert_dcp(
            torch.cuda.current_stream().cuda_stream, req_id.data_ptr(), table.data_ptr(), table.stride(0),
            table.shape[1], logical.data_ptr(), out.data_ptr(), counts.data_ptr(), logical.shape[0],
            NUM_TOPK_TOKENS, BLOCK_SIZE, size, rank, interleave, int(compact))
        if status != 0:
            raise RuntimeError(f"sparse_mla_ctypes_convert returned {status}")
        return out, counts

    def launcher(name, function):
        def empty(_):
            status = function(torch.cuda.current_stream().cuda_stream, 256)
            if status != 0:
                raise RuntimeError(f"{name}: the launch returned {status}")
        return empty

    return lib, convert, [(name, launcher(name, function)) for name, function in empties]


def triton_empty(x):
    _empty_kernel[(1,)](x, num_warps=8)


def time_graph(graph, stream, launches, warmup, repeat):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    per_launch = []
    for _ in range(repeat):
        start.record(stream)
        graph.replay()
        stop.record(stream)
        stop.synchronize()
        per_launch.append(start.elapsed_time(stop) * 1000.0 / launches)
    return statistics.median(per_launch), min(per_launch)


def ceiling(rotate_bytes, warmup, repeat):
    src = torch.empty(rotate_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        dst.copy_(src)
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            dst.copy_(src)
        median, _ = time_graph(graph, stream, 1, warmup, repeat)
    return 2 * rotate_bytes / (median * 1e3)


def rotation(tokens, args):
    """Copies of a case's inputs and outputs ("sets") that exceed --rotate-mib, and the launches of one graph."""
    set_bytes = tokens * (2 * K * 4 + 4)
    sets = max(min(-(-args.rotate_mib * 2**20 // set_bytes), MAX_SETS), 1)
    return sets, sets * -(-args.min_launches // sets)


def make_case(tokens, args, generator):
    """Inputs, their expected outputs, and the rotation of one case."""
    req_id, table, logical = make_inputs(tokens, generator)
    sets, launches = rotation(tokens, args)
    inputs = [logical] + [logical.clone() for _ in range(sets - 1)]
    want = expected(req_id, table, logical, args.dcp)
    torch.cuda.synchronize()
    return types.SimpleNamespace(tokens=tokens, req_id=req_id, table=table, inputs=inputs, want=want, sets=sets,
                                 launches=launches)


def time_launches(launch, case, args):
    """Median and minimum per launch of launch(s), s = 0, 1, ..., captured into one graph."""
    stream = torch.cuda.Stream()
    keep = []
    with torch.cuda.stream(stream):
        for i in range(case.launches):  # one direct pass: nothing lazy is captured
            keep.append(launch(i % case.sets))
        stream.synchronize()
        keep.clear()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(case.launches):
                keep.append(launch(i % case.sets))
        median, low = time_graph(graph, stream, case.launches, args.warmup, args.repeat)
    del graph, keep
    torch.cuda.empty_cache()
    return median, low


def run_case(name, convert, case, args):
    tokens = case.tokens
    label = "convert-dcp" if args.dcp is not None else "convert"

    extra = {} if args.dcp is None else {"dcp": args.dcp}

    def launch(s):
        return convert(case.req_id, case.table, case.inputs[s], BLOCK_SIZE=BLOCK_SIZE, NUM_TOPK_TOKENS=K,
                       return_valid_counts=True, **extra)

    # Checked before timed: every element and count against the model. The
    # function allocates its outputs; blocks of their sizes are poisoned and
    # freed first, on the same stream (the caching allocator reuses a block
    # on the stream that freed it), so that it is handed poisoned memory and
    # an element it leaves unwritten shows. A stream of its own, as the timed
    # launches have (the library binds its Kokkos instance per stream).
    with torch.cuda.stream(torch.cuda.Stream()):
        poison = [torch.full_like(case.inputs[0], -0x5A5A5A5B),
                  torch.full((tokens,), -0x5A5A5A5B, dtype=torch.int32, device="cuda")]
        del poison
        physical, counts = launch(0)
    torch.cuda.synchronize()
    want_physical, want_counts = case.want
    if not torch.equal(physical, want_physical) or not torch.equal(counts, want_counts):
        bad = (physical != want_physical).nonzero()
        return f"{name}/{label}/T={tokens}: FAILED ({bad.shape[0]} entries differ; counts equal: {torch.equal(counts, want_counts)})"
    del physical, counts
    median, low = time_launches(launch, case, args)
    gbs = (8.0 * tokens * K + 4.0 * tokens) / (median * 1e3)
    return f"{name + '/' + label + '/T=' + str(tokens):<32} sets {case.sets:6d}  median {median:9.3f} us  min {low:9.3f} us  {gbs:8.1f} GB/s  ok"


def run_floor(name, empty, args):
    """Per-launch time of an empty kernel, over as many launches as the T=1 case."""
    case = types.SimpleNamespace(sets=1, launches=rotation(1, args)[1])
    x = torch.empty(1, dtype=torch.int32, device="cuda")
    median, low = time_launches(lambda s: empty(x), case, args)
    return f"{'launch/' + name:<38} launches {case.launches:5d}  median {median:9.3f} us  min {low:9.3f} us"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sparse_utils", help="vLLM's vllm/v1/attention/backends/mla/sparse_utils.py")
    parser.add_argument("--ours", help="libsparse-mla-convert-ctypes.so: time the library's kernel beside it")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 256, 1024, 32768])
    parser.add_argument("--rotate-mib", type=int, default=200)
    parser.add_argument("--min-launches", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1, help="times each case is timed, rounds interleaved")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dcp-size", type=int, default=1, help="> 1: the DCP filter-and-convert of this many ranks")
    parser.add_argument("--dcp-rank", type=int, default=0)
    parser.add_argument("--dcp-interleave", type=int, default=1)
    parser.add_argument("--compact", action="store_true", help="DCP: valid rows to the front of each row")
    args = parser.parse_args()
    args.dcp = (args.dcp_size, args.dcp_rank, args.dcp_interleave, args.compact) if args.dcp_size > 1 else None

    reference = load_reference(args.sparse_utils)
    if args.dcp is None:
        reference_convert = reference.triton_convert_req_index_to_global_index
    else:
        def reference_convert(req_id, table, logical, BLOCK_SIZE, NUM_TOPK_TOKENS, return_valid_counts, dcp):
            size, rank, interleave, compact = dcp
            return reference.triton_filter_and_convert_dcp_index(
                req_id, table, logical, size, rank, cp_kv_cache_interleave_size=interleave, BLOCK_SIZE=BLOCK_SIZE,
                NUM_TOPK_TOKENS=NUM_TOPK_TOKENS, return_valid_counts=return_valid_counts,
                compact_valid_to_front=compact)
    kernels = [("reference", reference_convert)]
    floors = []
    ours = None
    if args.ours:
        ours, convert, empties = load_ours(args.ours)
        kernels.append(("sparse-mla", convert))
        floors = [("empty-triton-8-warps", triton_empty)] + empties
    generator = torch.Generator().manual_seed(args.seed)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}")
    gbs = ceiling(args.rotate_mib * 2**20, args.warmup, args.repeat)
    print(f"ceiling/device-copy {args.rotate_mib} MiB: {gbs:.1f} GB/s (read + written)")
    status = 0
    cases = [make_case(tokens, args, generator) for tokens in args.tokens]
    for round_ in range(args.rounds):
        if args.rounds > 1:
            print(f"round {round_ + 1}")
        for name, launch_empty in floors:
            print(run_floor(name, launch_empty, args), flush=True)
        for case in cases:
            for name, launch_convert in kernels:
                line = run_case(name, launch_convert, case, args)
                status |= "FAILED" in line
                print(line, flush=True)
    del cases
    if ours is not None:
        torch.cuda.synchronize()
        ours.sparse_mla_ctypes_finalize()
    return status


if __name__ == "__main__":
    sys.exit(main())
