#!/usr/bin/env python3
"""The torch-native check of the Python module (docs/python.md, "Drop-in"):
the reference engine's call lines pointed at `sparse_mla.vllm`, on CUDA
tensors, in one process beside vLLM's own Triton functions.

    PYTHONPATH=build/cuda/python python3 tools/bench/torch_ops_check.py path/to/sparse_utils.py
    PYTHONPATH=build/host/python python3 tools/bench/torch_ops_check.py --device cpu   # the overhead table alone

It needs torch with CUDA and Triton, and nothing of vLLM but the file passed
(vllm/v1/attention/backends/mla/sparse_utils.py, loaded as
tools/bench/reference_convert.py loads it). In order, each failure printed
and counted (exit 1 when any):

1. exact: triton_convert_req_index_to_global_index and
   triton_filter_and_convert_dcp_index from sparse_mla.vllm against the same
   functions of the file, called with the same arguments on the same tensors
   (K = 2048 and 512, decode and prefill-workspace rows, block strides, every
   DCP case the reference orders deterministically), rows and counts equal
   element for element, and every result a torch tensor of the inputs' device;
2. compile: torch.compile(fullgraph=True) over a function that converts (the
   reference's call line) and gathers (ops.cp_gather_and_upconvert_fp8_kv_cache),
   torch._dynamo.explain finding one graph and no break, its outputs equal to
   the reference's conversion and to an fp8 upconvert written in torch;
3. graph: the same function, eager and compiled, captured by torch.cuda.graph
   (torch's own capture stream, after an eager warm-up on another stream) and
   replayed with new inputs written in place, exact after every replay;
4. overhead: the host time of one call at decode sizes (T = 1, 32, 128;
   K = 2048; return_valid_counts=True, as the engine calls it): the registered
   torch op called directly, the drop-in (sparse_mla.vllm's function: the
   reference's checks, then the op), the module's direct call into buffers it
   is given (no torch op, no allocation), and the reference's Triton function.
   Each figure is the median over rounds of the mean time of --calls calls
   issued back to back, the GPU idle at the start of each round: the cost of
   issuing, which is what a decode step pays per call when the kernels are
   shorter than the issuing (they are, at these sizes).
"""

import argparse
import os
import statistics
import sys
import time

import torch

import sparse_mla
from sparse_mla import vllm as ops
from sparse_mla.vllm import triton_convert_req_index_to_global_index, triton_filter_and_convert_dcp_index

K = 2048
BLOCK_SIZE = 64
failures = []


def check(name, condition, detail=""):
    if not condition:
        failures.append(name)
        print(f"FAIL {name} {detail}")


def conversion_inputs(T, K, block_size, generator, device, requests=8, blocks=64, invalid=0.05):
    """req_id [T], a shuffled table [requests, blocks], token_indices [T, K] with -1 entries and
    tokens past the table."""
    req_id = torch.randint(0, requests, (T,), generator=generator, dtype=torch.int32)
    table = torch.randperm(requests * blocks * 4, generator=generator)[: requests * blocks].reshape(requests, blocks)
    logical = torch.randint(0, (blocks + 2) * block_size, (T, K), generator=generator, dtype=torch.int32)
    logical[torch.rand((T, K), generator=generator) < invalid] = -1
    return req_id.to(device), table.to(torch.int32).to(device), logical.to(device)


def same(name, ours, theirs):
    for index, (a, b) in enumerate(zip(ours if isinstance(ours, tuple) else (ours,),
                                       theirs if isinstance(theirs, tuple) else (theirs,))):
        check(f"{name} output {index} is a torch tensor of the inputs' device",
              isinstance(a, torch.Tensor) and a.device == b.device, f"({type(a)})")
        check(f"{name} output {index} exact", isinstance(a, torch.Tensor) and torch.equal(a, b),
              f"({(a != b).sum().item() if isinstance(a, torch.Tensor) else '?'} elements differ)")


def check_exact(reference, generator):
    cases = 0
    for T in (1, 32, 128, 300):
        for k in (K, 512):
            req_id, table, logical = conversion_inputs(T, k, BLOCK_SIZE, generator, "cuda")
            for stride in (None, 3 * BLOCK_SIZE):
                for counts in (False, True):
                    args = dict(BLOCK_SIZE=BLOCK_SIZE, BLOCK_STRIDE_ROWS=stride, NUM_TOPK_TOKENS=k,
                                return_valid_counts=counts)
                    same(f"convert T={T} K={k} stride={stride} counts={counts}",
                         triton_convert_req_index_to_global_index(req_id, table, logical, **args),
                         reference.triton_convert_req_index_to_global_index(req_id, table, logical, **args))
                    cases += 1
            # Prefill-workspace rows (tokens within their request's table, as an engine's are).
            prefill = torch.where(torch.arange(T, device="cuda") % 3 == 0, -1,
                                  torch.arange(T, device="cuda") % 4).to(torch.int32)
            starts = torch.tensor([0, 5000, 12000, 30000], dtype=torch.int32, device="cuda")
            within = torch.where(logical >= 64 * BLOCK_SIZE, -1, logical)
            args = dict(BLOCK_SIZE=BLOCK_SIZE, NUM_TOPK_TOKENS=k, HAS_PREFILL_WORKSPACE=True,
                        prefill_workspace_request_ids=prefill, prefill_workspace_starts=starts,
                        return_valid_counts=True)
            same(f"convert prefill workspace T={T} K={k}",
                 triton_convert_req_index_to_global_index(req_id, table, within, **args),
                 reference.triton_convert_req_index_to_global_index(req_id, table, within, **args))
            cases += 1
        # DCP at K = 2048 (a power of two: the reference compacts in one tile, in input order).
        for size, rank, interleave in ((1, 0, 1), (2, 1, 1), (4, 3, 16), (8, 5, 64), (8, 0, 4)):
            req_id, table, logical = conversion_inputs(T, K, BLOCK_SIZE * size, generator, "cuda")
            for compact in (True, False):
                for counts in (False, True):
                    args = dict(cp_kv_cache_interleave_size=interleave, BLOCK_SIZE=BLOCK_SIZE, NUM_TOPK_TOKENS=K,
                                return_valid_counts=counts, compact_valid_to_front=compact)
                    same(f"dcp T={T} size={size} rank={rank} interleave={interleave} compact={compact} counts={counts}",
                         triton_filter_and_convert_dcp_index(req_id, table, logical, size, rank, **args),
                         reference.triton_filter_and_convert_dcp_index(req_id, table, logical, size, rank, **args))
                    cases += 1
    return cases


def random_cache(num_blocks, block_size, generator):
    """fp8_ds_mla rows: fp8 e4m3fn bytes without NaN, positive scales, finite bf16 RoPE."""
    rows = torch.randint(0, 256, (num_blocks * block_size, 656), generator=generator, dtype=torch.uint8)
    nope = rows[:, :512]
    nope[(nope & 0x7F) == 0x7F] = 0
    rows[:, 512:528] = (torch.rand((rows.shape[0], 4), generator=generator) * 4 + 0.01).view(torch.uint8)
    rope = torch.randn((rows.shape[0], 64), generator=generator).to(torch.bfloat16)
    rows[:, 528:] = rope.view(torch.uint8)
    return rows.reshape(num_blocks, block_size, 656).cuda()


def upconvert_model(cache, block_table, starts, batch_size, total):
    """SPEC section 3 in torch: row ws[r] + i is token i of request r, bf16_rne(fp8 * scale) then the RoPE bits."""
    out = torch.empty((total, 576), dtype=torch.bfloat16, device=cache.device)
    bounds = starts.tolist() + [total]
    for r in range(batch_size):
        tokens = torch.arange(bounds[r + 1] - bounds[r], device=cache.device)
        rows = cache[block_table[r, tokens // cache.shape[1]].long(), tokens % cache.shape[1]]
        scales = rows[:, 512:528].contiguous().view(torch.float32).repeat_interleave(128, dim=1)
        out[bounds[r]:bounds[r + 1], :512] = (rows[:, :512].view(torch.float8_e4m3fn).float() * scales).to(torch.bfloat16)
        out[bounds[r]:bounds[r + 1], 512:] = rows[:, 528:].contiguous().view(torch.bfloat16)
    return out


def step(req_id, block_table, token_indices, cache, dst, gather_table, starts):
    """A decode step's conversion and a prefill chunk's gather, as the engine writes them."""
    topk_indices, valid_counts = triton_convert_req_index_to_global_index(
        req_id, block_table, token_indices, BLOCK_SIZE=BLOCK_SIZE, NUM_TOPK_TOKENS=K, return_valid_counts=True)
    ops.cp_gather_and_upconvert_fp8_kv_cache(cache, dst, gather_table, starts, gather_table.shape[0])
    return topk_indices, valid_counts


class StepInputs:
    """The step's inputs, rewritten in place with new values (what a captured graph replays on)."""

    def __init__(self, T, generator):
        self.generator = generator
        self.tensors = list(conversion_inputs(T, K, BLOCK_SIZE, generator, "cuda"))
        self.cache = random_cache(32, BLOCK_SIZE, generator)
        self.gather_table = torch.zeros((3, 4), dtype=torch.int32, device="cuda")
        self.starts = torch.tensor([0, 70, 150], dtype=torch.int32, device="cuda")
        self.dst = torch.zeros((200, 576), dtype=torch.bfloat16, device="cuda")
        self.refresh()

    def refresh(self):
        T = self.tensors[2].shape[0]
        for tensor, fresh in zip(self.tensors, conversion_inputs(T, K, BLOCK_SIZE, self.generator, "cuda")):
            tensor.copy_(fresh)
        self.gather_table.copy_(torch.randint(0, 32, (3, 4), generator=self.generator, dtype=torch.int32))
        self.dst.fill_(float("nan"))

    def args(self):
        return (*self.tensors, self.cache, self.dst, self.gather_table, self.starts)

    def expect(self, name, reference, outputs):
        want = reference.triton_convert_req_index_to_global_index(*self.tensors, BLOCK_SIZE=BLOCK_SIZE,
                                                                  NUM_TOPK_TOKENS=K, return_valid_counts=True)
        same(name, tuple(outputs), want)
        model = upconvert_model(self.cache, self.gather_table, self.starts, 3, self.dst.shape[0])
        check(f"{name} gather exact", torch.equal(self.dst.view(torch.int16), model.view(torch.int16)))


def check_compile_and_graphs(reference, generator):
    inputs = StepInputs(32, generator)
    explanation = torch._dynamo.explain(step)(*inputs.args())
    check("compile: one graph, no graph break", explanation.graph_count == 1 and explanation.graph_break_count == 0,
          f"({explanation.graph_count} graphs, {explanation.graph_break_count} breaks: {explanation.break_reasons})")
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    for _ in range(2):
        inputs.refresh()
        inputs.expect("compile", reference, compiled(*inputs.args()))
    for name, function in (("graph (eager)", step), ("graph (compiled)", compiled)):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # torch's documented warm-up, on another stream
            function(*inputs.args())
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = function(*inputs.args())
        for _ in range(3):
            inputs.refresh()
            graph.replay()
            inputs.expect(name, reference, outputs)


def host_time(call, calls, rounds, synchronize):
    per_round = []
    for _ in range(rounds):
        synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        per_round.append((time.perf_counter() - start) / calls * 1e6)
    synchronize()
    return statistics.median(per_round)


def overhead_table(reference, device, calls, rounds):
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    op = torch.ops.sparse_mla.convert_req_index_to_global_index.default
    generator = torch.Generator().manual_seed(1)
    columns = ["torch op", "drop-in", "direct"] + (["reference"] if reference is not None else [])
    print(f"per-call host time, us (K = {K}, return_valid_counts=True, {device}; median of {rounds} rounds of "
          f"{calls} calls)")
    print(f"{'T':>5}" + "".join(f"{c:>12}" for c in columns))
    for T in (1, 32, 128):
        req_id, table, logical = conversion_inputs(T, K, BLOCK_SIZE, generator, device)
        out = torch.empty_like(logical)
        counts = torch.empty(T, dtype=torch.int32, device=device)
        candidates = {
            "torch op": lambda: op(req_id, table, logical, BLOCK_SIZE, None, True, 1, 0, 1, True, None, None),
            "drop-in": lambda: triton_convert_req_index_to_global_index(req_id, table, logical, BLOCK_SIZE=BLOCK_SIZE,
                                                                        NUM_TOPK_TOKENS=K, return_valid_counts=True),
            "direct": lambda: sparse_mla._native.convert_req_index_to_global_index(
                req_id, table, logical, block_size=BLOCK_SIZE, return_valid_counts=True, out=out,
                valid_counts_out=counts),
        }
        if reference is not None:
            candidates["reference"] = lambda: reference.triton_convert_req_index_to_global_index(
                req_id, table, logical, BLOCK_SIZE=BLOCK_SIZE, NUM_TOPK_TOKENS=K, return_valid_counts=True)
        for call in candidates.values():  # warm-up: Triton's compile, the library's stream wrapping
            call()
        figures = [host_time(candidates[c], calls, rounds, synchronize) for c in columns]
        print(f"{T:>5}" + "".join(f"{f:>12.2f}" for f in figures))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sparse_utils", nargs="?", help="vLLM's sparse_utils.py (required on cuda)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    print(f"torch {torch.__version__}, sparse_mla {sparse_mla.__version__}, {args.device}")
    reference = None
    if args.device == "cuda":
        if args.sparse_utils is None:
            parser.error("the cuda checks compare with vLLM's sparse_utils.py: pass its path")
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from reference_convert import load_reference

        reference = load_reference(args.sparse_utils)
        generator = torch.Generator().manual_seed(0)
        cases = check_exact(reference, generator)
        print(f"exact: {cases} reference-named calls against vLLM's Triton functions, "
              f"{len(failures)} failures")
        before = len(failures)
        check_compile_and_graphs(reference, generator)
        print(f"compile and graphs: torch.compile(fullgraph=True), torch.cuda.graph eager and compiled, "
              f"{len(failures) - before} failures")
    overhead_table(reference, args.device, args.calls, args.rounds)
    print(f"torch ops check: {'FAILED, ' + str(len(failures)) + ' failures' if failures else 'ok'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
