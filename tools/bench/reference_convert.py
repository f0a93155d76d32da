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
    return module.triton_convert_req_index_to_global_index


def make_inputs(tokens, generator):
    requests = min(tokens, 128)
    req_id = (torch.arange(tokens, dtype=torch.int32) % requests).cuda()
    table = torch.randperm(requests * BLOCKS_PER_REQUEST, generator=generator).to(torch.int32)
    table = table.view(requests, BLOCKS_PER_REQUEST).cuda()
    draw = torch.randint(0, 100 * 32768, (tokens, K), generator=generator, dtype=torch.int64)
    logical = torch.where(draw < 3 * 32768, torch.full_like(draw, -1), draw % 32768).to(torch.int32).cuda()
    return req_id, table, logical


def expected(req_id, table, logical):
    """The scalar model (SPEC section 2), as tensors."""
    tok = logical.long()
    rows = table.long()[req_id.long()]  # [T, B]
    block = torch.where(tok >= 0, tok // BLOCK_SIZE, torch.zeros_like(tok))
    physical = torch.gather(rows, 1, block) * BLOCK_SIZE + tok % BLOCK_SIZE
    physical = torch.where(tok >= 0, physical, torch.full_like(physical, -1)).to(torch.int32)
    return physical, (physical != -1).sum(dim=1).to(torch.int32)


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


def run_case(convert, tokens, args, generator):
    req_id, table, logical = make_inputs(tokens, generator)
    set_bytes = tokens * (2 * K * 4 + 4)
    sets = min(-(-args.rotate_mib * 2**20 // set_bytes), MAX_SETS)
    sets = max(sets, 1)
    launches = sets * -(-args.min_launches // sets)
    inputs = [logical] + [logical.clone() for _ in range(sets - 1)]

    def launch(s):
        return convert(req_id, table, inputs[s], BLOCK_SIZE=BLOCK_SIZE, NUM_TOPK_TOKENS=K, return_valid_counts=True)

    # Checked before timed: every element and count against the model. The
    # function allocates its outputs; blocks of their sizes are poisoned and
    # freed first, so that the caching allocator hands it poisoned memory and
    # an element it leaves unwritten shows.
    poison = [torch.full_like(logical, -0x5A5A5A5B), torch.full((tokens,), -0x5A5A5A5B, dtype=torch.int32, device="cuda")]
    del poison
    physical, counts = launch(0)
    want_physical, want_counts = expected(req_id, table, logical)
    torch.cuda.synchronize()
    if not torch.equal(physical, want_physical) or not torch.equal(counts, want_counts):
        bad = (physical != want_physical).nonzero()
        return f"T={tokens}: FAILED ({bad.shape[0]} entries differ; counts equal: {torch.equal(counts, want_counts)})"

    stream = torch.cuda.Stream()
    keep = []
    with torch.cuda.stream(stream):
        for i in range(launches):  # one direct pass: nothing lazy is captured
            keep.append(launch(i % sets))
        stream.synchronize()
        keep.clear()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(launches):
                keep.append(launch(i % sets))
        median, low = time_graph(graph, stream, launches, args.warmup, args.repeat)
    gbs = (8.0 * tokens * K + 4.0 * tokens) / (median * 1e3)
    del graph, keep, inputs
    torch.cuda.empty_cache()
    return f"reference/convert/T={tokens:<6} sets {sets:6d}  median {median:9.2f} us  min {low:9.2f} us  {gbs:8.1f} GB/s  ok"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sparse_utils", help="vLLM's vllm/v1/attention/backends/mla/sparse_utils.py")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 256, 1024, 32768])
    parser.add_argument("--rotate-mib", type=int, default=200)
    parser.add_argument("--min-launches", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    convert = load_reference(args.sparse_utils)
    generator = torch.Generator().manual_seed(args.seed)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}")
    gbs = ceiling(args.rotate_mib * 2**20, args.warmup, args.repeat)
    print(f"ceiling/device-copy {args.rotate_mib} MiB: {gbs:.1f} GB/s (read + written)")
    status = 0
    for tokens in args.tokens:
        line = run_case(convert, tokens, args, generator)
        status |= "FAILED" in line
        print(line, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
