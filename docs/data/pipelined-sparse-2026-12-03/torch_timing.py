#!/usr/bin/env python3
"""gradzip.Communicator(transport="torch") (gloo) all-reduce of 64 MiB per rank: each pipelined
spec (default segment) and its segment=0 twin interleaved, one warm-up and 3 timed calls each;
rank 0 prints the median and the three times (the slowest rank's time of each call)."""
import time

import numpy as np
import torch
import torch.distributed as dist

import gradzip

dist.init_process_group("gloo")
comm = gradzip.Communicator(transport="torch")
n = 1 << 24
base = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
pairs = ["qsgd:bits=4", "sign", "topk:ratio=0.01"]
specs = [s + ("," if ":" in s else ":") + extra for s in pairs
         for extra in ("min_bytes=0", "min_bytes=0,segment=0")]
times = {s: [] for s in specs}
for call in range(4):
    for spec in specs:
        x = base.copy()
        dist.barrier()
        start = time.perf_counter()
        comm.allreduce(x, name=spec, spec=spec)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if call > 0:
            times[spec].append(float(elapsed))
if comm.rank == 0:
    print("spec | median_s | calls_s")
    for spec in specs:
        print(f"{spec} | {sorted(times[spec])[1]:.4f} | {' '.join(f'{t:.4f}' for t in times[spec])}")
dist.destroy_process_group()
