#!/usr/bin/env python3
"""Median all-reduce time per (spec, size) of the old and new builds over the rounds in bench/,
with each version's range: the figures docs/results.md quotes."""
import glob
import json
import os
import statistics

here = os.path.dirname(os.path.abspath(__file__))
times = {}
for path in sorted(glob.glob(os.path.join(here, "bench", "allreduce-*-*.json"))):
    version = os.path.basename(path).split("-")[1]
    for row in json.load(open(path)):
        key = (row["spec"], row["bytes"])
        times.setdefault(key, {}).setdefault(version, []).append((row["time_s"], row["algo"]))
print(f"{'spec':40} {'bytes':>8} {'old ms':>8} {'new ms':>8} {'new/old':>8}  old range ms      new range ms      algos")
for (spec, size), by_version in sorted(times.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    old = [t for t, _ in by_version.get("old", [])]
    new = [t for t, _ in by_version.get("new", [])]
    if not old or not new:
        continue
    algos = sorted({a for v in by_version.values() for _, a in v})
    mo, mn = statistics.median(old), statistics.median(new)
    print(f"{spec:40} {size:>8} {mo*1e3:8.3f} {mn*1e3:8.3f} {mn/mo:8.3f}  "
          f"{min(old)*1e3:7.3f}-{max(old)*1e3:<7.3f}  {min(new)*1e3:7.3f}-{max(new)*1e3:<7.3f}  {','.join(algos)}")

# The follow-up: ten more interleaved rounds of the two qsgd specs at 4 MiB (bench/qsgd-V-R.json).
follow = {}
for path in sorted(glob.glob(os.path.join(here, "bench", "qsgd-*-*.json"))):
    version = os.path.basename(path).split("-")[1]
    for row in json.load(open(path)):
        follow.setdefault(row["spec"], {}).setdefault(version, []).append(row["time_s"] * 1e3)
for spec, by_version in sorted(follow.items()):
    old, new = by_version["old"], by_version["new"]
    print(f"follow-up {spec} 4194304: median old {statistics.median(old):.3f} ms, new "
          f"{statistics.median(new):.3f} ms, new/old {statistics.median(new) / statistics.median(old):.3f}; "
          f"old {min(old):.3f}-{max(old):.3f}, new {min(new):.3f}-{max(new):.3f} ({len(old)} rounds)")
