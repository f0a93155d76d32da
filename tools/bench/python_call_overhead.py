#!/usr/bin/env python3
"""Host time to issue one decode step of the seed's index-group protocol from
Python through `sparse_mla`, without a graph: what an engine that does not
capture pays per step and per layer, on any backend.

    PYTHONPATH=build/host/python python3 tools/bench/python_call_overhead.py
    PYTHONPATH=build/cuda/python python3 tools/bench/python_call_overhead.py --backend cuda

The model is DeepSeek-V3.2's shape (61 layers, an indexer every 4, K = 2048,
block size 64) at T decode tokens. On the host backend the inputs are NumPy
arrays and the calls take a library stream (implicit host calls wait for
their stream, as NumPy users expect); on cuda they are torch tensors and the
calls run on torch's current stream. Each step is issued after the last one
finished, so the figure is the issuing alone; it also breaks the step down
into the follower's three calls. tools/bench/python_graph_check.py compares
the same protocol with the reference's on a GPU.
"""

import argparse
import statistics
import time
import types

import numpy as np

import sparse_mla


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="host")
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--index-every", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()

    K, T, L = 2048, args.tokens, args.layers
    device = sparse_mla.open_device(args.backend, 0)
    rng = np.random.default_rng(0)
    logical = np.full((129, K), -1, np.int32)
    logical[:T] = rng.integers(0, 64 * 64, size=(T, K))
    req_id = np.arange(T, dtype=np.int32)
    table = rng.permutation(T * 64).reshape(T, 64).astype(np.int32)
    if args.backend == "host":
        stream = device.create_stream()
        sync = stream.synchronize
    else:
        import torch

        logical, req_id, table = (torch.from_numpy(a).cuda() for a in (logical, req_id, table))
        stream = None  # torch's current stream
        sync = torch.cuda.synchronize
    builder = sparse_mla.SparseMLAIndexGroupBuilder(logical, 128)
    layers = [builder.register_layer(layer % args.index_every == 0) for layer in range(L)]
    md = types.SimpleNamespace(req_id_per_token=req_id, block_table=table, block_size=64, num_decodes=T,
                               num_decode_tokens=T, num_prefills=0, query_start_loc=None)
    rows = logical[:T]

    def step():
        for group, index in layers:
            group.set_logical_topk_ready(index, stream=stream)
            group.prepare_for_batch(index, md, stream=stream)
            group.convert_logical_to_physical_topk(index, rows, md, block_stride_rows=None, return_valid_counts=True,
                                                   stream=stream)

    for _ in range(5):
        step()
    times = []
    for _ in range(args.steps):
        sync()
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e6)
    sync()
    per_step = statistics.median(times)

    def per_call(call, n=2000):
        start = time.perf_counter()
        for _ in range(n):
            call()
        sync()
        return (time.perf_counter() - start) / n * 1e6

    follower, index = layers[1]
    print(f"{args.backend}: {L} layers, {len(builder.groups)} index groups, T={T}, K={K}")
    print(f"eager step {per_step:.1f} us, {per_step / L:.2f} us a layer (median of {args.steps} steps)")
    print(f"follower: set_logical_topk_ready {per_call(lambda: follower.set_logical_topk_ready(index, stream=stream)):.2f} us, "
          f"prepare_for_batch {per_call(lambda: follower.prepare_for_batch(index, md, stream=stream)):.2f} us, "
          f"convert_logical_to_physical_topk "
          f"{per_call(lambda: follower.convert_logical_to_physical_topk(index, rows, md, block_stride_rows=None, return_valid_counts=True, stream=stream)):.2f} us")


if __name__ == "__main__":
    main()
