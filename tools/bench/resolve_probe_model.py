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
rng=random.Random(1)
def mean(a): return sum(a)/len(a)
K=2048; H=4096; blk=64; fixed=1024; rot=K-fixed; sets=8
def hash_hi(g,nb): return ((g*2654435761)&0xFFFFFFFF)*nb>>32
def hash_lo(g,nb): return ((g*2654435761)&0xFFFFFFFF)%nb
def mix(x):
    x=x&0xFFFFFFFF; x^=x>>16; x=(x*0x7feb352d)&0xFFFFFFFF; x^=x>>15; x=(x*0x846ca68b)&0xFFFFFFFF; x^=x>>16; return x
def hash_mix(g,nb): return mix(g)*nb>>32
def run(P, bucket, hf, trials=20):
    res=[]
    for t in range(trials):
        ctx_blocks=(fixed+sets*rot+blk-1)//blk
        table=rng.sample(range(ctx_blocks*128), ctx_blocks)  # pool larger (rows*blocks)
        def g(tok): return int(table[tok//blk])*blk+tok%blk
        s=rng.randrange(1,sets)
        toks=list(range(fixed))+list(range(fixed+s*rot, fixed+(s+1)*rot))
        rng.shuffle(toks)
        keys=[g(x) for x in toks]
        nb=P//bucket
        occ=[None]*P
        probes=[]
        for k in keys:
            b=hash_fn(hf,k,nb); n=1
            while True:
                base=b*bucket; done=False
                for i in range(bucket):
                    if occ[base+i] is None: occ[base+i]=k; done=True; break
                    if occ[base+i]==k: done=True; break
                if done: break
                b=(b+1)%nb; n+=1
            probes.append(n)
        th=[max(probes[i],probes[i+1024]) for i in range(1024)]
        ins=mean([max(th[w*32:(w+1)*32]) for w in range(32)])
        # lookups: state = fixed keys + 3072 keys of previous sets (other blocks)
        prev=[]
        for s2 in range(sets):
            if s2==s: continue
            prev+= [g(x) for x in range(fixed+s2*rot, fixed+(s2+1)*rot)]
        prev=prev[:H-fixed]
        state=[g(x) for x in range(fixed)]+prev
        rng.shuffle(state)
        lp=[]
        kset=set(keys)
        for k in state:
            b=hash_fn(hf,k,nb); n=1
            while True:
                base=b*bucket; done=False
                for i in range(bucket):
                    if occ[base+i] is None or occ[base+i]==k: done=True; break
                if done: break
                b=(b+1)%nb; n+=1
            lp.append(n)
        th=[max(lp[4*t],lp[4*t+1])+max(lp[4*t+2],lp[4*t+3]) for t in range(1024)]
        look=mean([max(th[w*32:(w+1)*32]) for w in range(32)])
        res.append((mean(probes), ins, mean(lp), look))
    r=[mean([x[i] for x in res]) for i in range(4)]
    print(f"P={P} bucket={bucket} {hf:4s}: insert mean {r[0]:.2f} warp-rounds {r[1]:.2f} | lookup mean {r[2]:.2f} warp-rounds(2 halves) {r[3]:.2f}")
def hash_fn(hf,k,nb):
    return {'hi':hash_hi,'lo':hash_lo,'mix':hash_mix}[hf](k,nb)
for P in (3072,4096):
  for bucket in (4,8):
    for hf in ('hi','mix'):
      run(P,bucket,hf,5)
run(4096,4,'lo',5)
