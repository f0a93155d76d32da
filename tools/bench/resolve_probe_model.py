#!/usr/bin/env python3
"""Probe rounds of the HiSparse resolve's hash set, modelled on the host.

    python3 tools/bench/resolve_probe_model.py

A warp of the resolve (core/kernels/hisparse_resolve.hpp) probes until the
longest chain among its lanes' keys ends, so what a set layout costs is the
warp's rounds, not the mean probe length. This inserts the keys of one row of
`sparse-mla bench`'s resolve rig (K = 2048: a fixed run of 1024 positions and
a rotating run of 1024, through a shuffled source block table of 64-row
blocks) in entry order, then looks up the 4096 slot rows of its steady state
(the fixed keys and 3072 keys of earlier rotation sets), and prints, per set
size P and bucket width, the mean buckets probed and the mean over warps of
the warp's rounds: inserts with 2 keys a thread (entries t and t + 1024),
lookups with 4 slots a thread in two halves of 2. Hashes: "hi" is the
kernel's (Knuth's multiplier, scaled by the high bits), "mix" a murmur
finalizer, "lo" the multiplier modulo P. Sequential inserts stand in for the
kernel's concurrent ones. docs/PERFORMANCE.md (session 19) records what it said.
"""
import random

K, H = 2048, 4096      # top-k entries and hot slots of a row
BLOCK = 64             # rows a source block
FIXED = 1024           # positions selected every step (50% hits)
ROTATING = K - FIXED   # positions that change with the rotation set
SETS = 8               # rotation sets
WARP = 32
THREADS = K // 2       # a 1024-thread team: 2 entries and 4 slots a thread

rng = random.Random(1)


def mean(values):
    return sum(values) / len(values)


def mix(x):
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    x ^= x >> 16
    return x


HASHES = {
    "hi": lambda g, buckets: ((g * 2654435761) & 0xFFFFFFFF) * buckets >> 32,
    "lo": lambda g, buckets: ((g * 2654435761) & 0xFFFFFFFF) % buckets,
    "mix": lambda g, buckets: mix(g) * buckets >> 32,
}


def probe(positions, bucket, first_bucket, key, insert):
    """Buckets visited until `key` is found or an empty position ends the
    probe (taken by `key` when inserting)."""
    buckets = len(positions) // bucket
    b, visited = first_bucket, 1
    while True:
        for i in range(b * bucket, (b + 1) * bucket):
            if positions[i] is None:
                if insert:
                    positions[i] = key
                return visited
            if positions[i] == key:
                return visited
        b = (b + 1) % buckets
        visited += 1


def warp_rounds(per_thread):
    """Mean over warps of the warp's rounds: its slowest thread's."""
    return mean([max(per_thread[w:w + WARP]) for w in range(0, len(per_thread), WARP)])


def run(size, bucket, hash_name, trials):
    hash_bucket = HASHES[hash_name]
    results = []
    for _ in range(trials):
        context_blocks = (FIXED + SETS * ROTATING + BLOCK - 1) // BLOCK
        table = rng.sample(range(context_blocks * 128), context_blocks)  # the pool holds other requests' blocks too

        def host_row(tok):
            return table[tok // BLOCK] * BLOCK + tok % BLOCK

        current = rng.randrange(1, SETS)
        toks = list(range(FIXED)) + list(range(FIXED + current * ROTATING, FIXED + (current + 1) * ROTATING))
        rng.shuffle(toks)
        positions = [None] * size
        buckets = size // bucket
        inserts = [probe(positions, bucket, hash_bucket(g, buckets), g, True) for g in map(host_row, toks)]
        # Thread t inserts entries t and t + THREADS.
        insert_rounds = warp_rounds([max(inserts[t], inserts[t + THREADS]) for t in range(THREADS)])
        # The steady state's slots: the fixed keys and keys of earlier rotation sets.
        earlier = []
        for s in range(SETS):
            if s != current:
                earlier += [host_row(x) for x in range(FIXED + s * ROTATING, FIXED + (s + 1) * ROTATING)]
        state = [host_row(x) for x in range(FIXED)] + earlier[:H - FIXED]
        rng.shuffle(state)
        lookups = [probe(positions, bucket, hash_bucket(g, buckets), g, False) for g in state]
        # Thread t looks up slots 4t .. 4t + 3 in two halves of 2.
        lookup_rounds = warp_rounds([max(lookups[4 * t], lookups[4 * t + 1]) + max(lookups[4 * t + 2], lookups[4 * t + 3])
                                     for t in range(THREADS)])
        results.append((mean(inserts), insert_rounds, mean(lookups), lookup_rounds))
    r = [mean([x[i] for x in results]) for i in range(4)]
    print(f"P={size} bucket={bucket} {hash_name:4s}: insert mean {r[0]:.2f} warp-rounds {r[1]:.2f} | "
          f"lookup mean {r[2]:.2f} warp-rounds(2 halves) {r[3]:.2f}")


for size in (3072, 4096):
    for bucket in (4, 8):
        for hash_name in ("hi", "mix"):
            run(size, bucket, hash_name, 5)
run(4096, 4, "lo", 5)
