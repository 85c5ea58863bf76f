#!/usr/bin/env python3
"""probe.txt (run.sh) as a table: median [min-max] over the rounds of Iallreduce / Allreduce."""
import collections, os, re, statistics
here = os.path.dirname(os.path.abspath(__file__))
times = collections.defaultdict(list)
for line in open(os.path.join(here, "probe.txt")):
    m = re.match(r"round (\d) libnbc_algorithm (\d) n=(\d+) allreduce ([\d.]+) ms iallreduce ([\d.]+) ms", line)
    if m:
        times[(int(m[3]), int(m[2]))].append((float(m[4]), float(m[5])))
print("| floats | libnbc algorithm | MPI_Allreduce ms | MPI_Iallreduce ms | Iallreduce / Allreduce |")
print("|---:|---|---:|---:|---:|")
for (n, algorithm), pairs in sorted(times.items()):
    blocking = [a for a, _ in pairs]
    nonblocking = [i for _, i in pairs]
    ratio = [i / a for a, i in pairs]
    print(f"| {n} | {'default' if algorithm == 0 else 'ring (1)'} | {statistics.median(blocking):.2f} | "
          f"{statistics.median(nonblocking):.2f} | {statistics.median(ratio):.2f} "
          f"[{min(ratio):.2f}–{max(ratio):.2f}] |")
