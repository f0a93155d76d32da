#!/usr/bin/env python3
"""The real-client check of the Python module (docs/python.md): the seed's
index-group protocol driven from Python through `sparse_mla`, inside a
torch.cuda.graph capture of a whole multi-layer decode step, replayed with
new inputs written in place, compared element by element with the reference
engine's own Triton conversion run in the same process on the same tensors,
and both timed.

    python3 tools/bench/python_graph_check.py path/to/sparse_utils.py
        [--layers 61 --index-every 4 --tokens 1,32,128 --replays 3]

The reference side is the seed's SparseMLAIndexGroup protocol
(../shared/seed/index_group_reference.txt) written out here with torch
streams and events: the leader of each group waits for the logical top-k
event on its side stream, converts once into the group's workspace with
vLLM's Triton kernel (`_convert_req_index_to_global_index_kernel` from the
file passed, launched as its `triton_convert_req_index_to_global_index`
launches it, into the workspace rows as the engine's `out=` call does), and
records the physical event every layer waits for. Ours is the module's
builder and groups with the seed's signatures.

Per batch size T it prints:
- check: every layer's rows and counts, ours against the reference's and both
  against the scalar model, after each of --replays graph replays with new
  inputs (an error exits 1);
- graph: the median time of one replay of the whole captured step (the
  protocol's GPU cost per decode step: conversions, forks and joins), timed
  as tools/bench/reference_convert.py times graphs;
- eager: the host time to issue one whole step from Python (no graph), per
  step and per layer: the Python-call overhead an engine pays when it does
  not capture.
"""

import argparse
import os
import statistics
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_convert import expected, load_reference, time_graph  # noqa: E402

import sparse_mla  # noqa: E402

K = 2048
BLOCK_SIZE = 64
BLOCKS_PER_REQUEST = 512
MAX_DECODE_ROWS = 128


class ReferenceGroup:
    """The seed's SparseMLAIndexGroup (decode path, not piecewise), with the
    reference's Triton kernel writing into the workspace."""

    def __init__(self, reference, logical, has_indexer):
        self.reference = reference
        self.logical_topk_indices = logical
        self.physical_topk_indices = torch.empty((MAX_DECODE_ROWS + 1, K), dtype=torch.int32, device="cuda")
        self.valid_topk_counts = torch.empty(MAX_DECODE_ROWS + 1, dtype=torch.int32, device="cuda")
        self.side_stream = torch.cuda.Stream()
        self.logical_topk_ready = torch.cuda.Event()
        self.physical_topk_ready = torch.cuda.Event()
        self.has_indexer = has_indexer

    def set_logical_topk_ready(self, layer_index):
        if layer_index == 0 and self.has_indexer:
            self.logical_topk_ready.record(torch.cuda.current_stream())

    def convert_logical_to_physical_topk(self, layer_index, logical, md):
        num_tokens = logical.shape[0]
        physical = self.physical_topk_indices[:num_tokens]
        counts = self.valid_topk_counts[:num_tokens]
        compute_stream = torch.cuda.current_stream()
        if layer_index == 0:
            if self.has_indexer:
                self.side_stream.wait_event(self.logical_topk_ready)
            else:
                self.side_stream.wait_stream(compute_stream)
            with torch.cuda.stream(self.side_stream):
                self.convert_into(md.req_id_per_token[:num_tokens], md.block_table, logical, physical, counts)
                self.physical_topk_ready.record(self.side_stream)
        compute_stream.wait_event(self.physical_topk_ready)
        return physical, counts

    def convert_into(self, req_id, block_table, logical, out, counts):
        """triton_convert_req_index_to_global_index(..., return_valid_counts=True,
        out=out, valid_counts_out=counts): its launch, into the given buffers."""
        r = self.reference
        single_tile, block_n, tiles_per_row, num_warps = r._remap_tiling(K, 128, True)
        if not single_tile:
            counts.zero_()
        r._convert_req_index_to_global_index_kernel[(logical.shape[0], tiles_per_row)](
            req_id, block_table, logical, out, counts, None, None,
            block_table.shape[1], BLOCK_SIZE, BLOCK_SIZE, block_n, False, True, single_tile, False, 1, 0, 1,
            block_table.stride(0), block_table.stride(1), logical.stride(0), logical.stride(1),
            out.stride(0), out.stride(1), num_warps=num_warps)


def build_models(reference, logical, layers, index_every):
    builder = sparse_mla.SparseMLAIndexGroupBuilder(logical, MAX_DECODE_ROWS)
    ours, theirs, group = [], [], None
    for layer in range(layers):
        producing = layer % index_every == 0
        ours.append(builder.register_layer(producing))
        if producing or group is None:
            group, index = ReferenceGroup(reference, logical, producing), 0
        else:
            index += 1
        theirs.append((group, index))
    return builder, ours, theirs


def step_ours(layers, logical_rows, md):
    results = []
    for group, index in layers:
        group.set_logical_topk_ready(index)
        group.prepare_for_batch(index, md)
        results.append(group.convert_logical_to_physical_topk(index, logical_rows, md, block_stride_rows=None,
                                                              return_valid_counts=True))
    return results


def step_reference(layers, logical_rows, md):
    results = []
    for group, index in layers:
        group.set_logical_topk_ready(index)
        results.append(group.convert_logical_to_physical_topk(index, logical_rows, md))
    return results


def write_inputs(T, logical, req_id, table, generator):
    """New inputs in place: token t of request t % T, a shuffled table, ~3% -1."""
    req_id.copy_(torch.arange(T, dtype=torch.int32, device="cuda"))
    table.copy_(torch.randperm(table.numel(), generator=generator).view(table.shape).to(torch.int32))
    draw = torch.randint(0, 100 * BLOCKS_PER_REQUEST * BLOCK_SIZE, (T, K), generator=generator, dtype=torch.int64)
    context = BLOCKS_PER_REQUEST * BLOCK_SIZE
    logical[:T].copy_(torch.where(draw < 3 * context, torch.full_like(draw, -1), draw % context).to(torch.int32))


def check(name, ours, theirs, want):
    want_physical, want_counts = want
    for layer, ((p, c), (rp, rc)) in enumerate(zip(ours, theirs)):
        p, c = torch.from_dlpack(p), torch.from_dlpack(c)
        if not (torch.equal(p, rp) and torch.equal(c, rc)):
            raise SystemExit(f"{name}: layer {layer}: ours and the reference differ "
                             f"({int((p != rp).sum())} rows entries, counts equal: {torch.equal(c, rc)})")
        if not (torch.equal(rp, want_physical) and torch.equal(rc, want_counts)):
            raise SystemExit(f"{name}: layer {layer}: the reference differs from the scalar model")


def capture(step, layers, logical_rows, md, stream):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        results = step(layers, logical_rows, md)
    return graph, results


def eager_issue_time(step, layers, logical_rows, md, steps):
    """Host time to issue one step, median over `steps` steps (the GPU keeps up: each waits for the last)."""
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step(layers, logical_rows, md)
        times.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sparse_utils", help="vLLM's vllm/v1/attention/backends/mla/sparse_utils.py")
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--index-every", type=int, default=4)
    parser.add_argument("--tokens", default="1,32,128")
    parser.add_argument("--replays", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--eager-steps", type=int, default=50)
    args = parser.parse_args()

    reference = load_reference(args.sparse_utils)
    device = sparse_mla.open_device("cuda", 0)
    generator = torch.Generator().manual_seed(2026)
    logical = torch.full((MAX_DECODE_ROWS + 1, K), -1, dtype=torch.int32, device="cuda")
    builder, ours, theirs = build_models(reference, logical, args.layers, args.index_every)
    groups = len(builder.groups)
    print(f"{device.info.get('name', 'cuda:0')}: {args.layers} layers in {groups} index groups, K={K}, block size {BLOCK_SIZE}")
    print(f"{'T':>5} {'check':>8} {'graph ours':>12} {'graph ref':>12} {'eager ours':>12} {'eager ref':>12}"
          f" {'per layer ours':>15} {'per layer ref':>14}")
    stream = torch.cuda.Stream()
    for T in [int(t) for t in args.tokens.split(",")]:
        requests = T
        req_id = torch.zeros(T, dtype=torch.int32, device="cuda")
        table = torch.zeros((requests, BLOCKS_PER_REQUEST), dtype=torch.int32, device="cuda")
        md = types.SimpleNamespace(req_id_per_token=req_id, block_table=table, block_size=BLOCK_SIZE,
                                   num_decodes=T, num_decode_tokens=T, num_prefills=0, query_start_loc=None)
        rows = logical[:T]
        with torch.cuda.stream(stream):
            write_inputs(T, logical, req_id, table, generator)
            want = expected(req_id, table, rows)
            # Eager first: the library wraps torch's stream outside any capture.
            check(f"T={T} eager", step_ours(ours, rows, md), step_reference(theirs, rows, md), want)
            torch.cuda.synchronize()
            graph_ours, results_ours = capture(step_ours, ours, rows, md, stream)
            graph_ref, results_ref = capture(step_reference, theirs, rows, md, stream)
            for replay in range(args.replays):
                write_inputs(T, logical, req_id, table, generator)
                want = expected(req_id, table, rows)
                for group in builder.groups:  # poison: every row read must be written by this replay
                    torch.from_dlpack(group.physical_topk_indices).fill_(-0x5A5A5A5B)
                for group, _ in theirs:
                    group.physical_topk_indices.fill_(-0x5A5A5A5B)
                graph_ours.replay()
                graph_ref.replay()
                torch.cuda.synchronize()
                check(f"T={T} replay {replay}", results_ours, results_ref, want)
            graph_us_ours, _ = time_graph(graph_ours, stream, 1, args.warmup, args.repeat)
            graph_us_ref, _ = time_graph(graph_ref, stream, 1, args.warmup, args.repeat)
            eager_ours = eager_issue_time(step_ours, ours, rows, md, args.eager_steps)
            eager_ref = eager_issue_time(step_reference, theirs, rows, md, args.eager_steps)
        del graph_ours, graph_ref, results_ours, results_ref
        print(f"{T:>5} {'exact':>8} {graph_us_ours:>9.2f} us {graph_us_ref:>9.2f} us {eager_ours:>9.1f} us"
              f" {eager_ref:>9.1f} us {eager_ours / args.layers:>12.2f} us {eager_ref / args.layers:>11.2f} us")
    print("graph: one replay of the whole captured decode step (median); eager: host time to issue one step "
          "from Python (median); per layer: eager / layers")


if __name__ == "__main__":
    main()
