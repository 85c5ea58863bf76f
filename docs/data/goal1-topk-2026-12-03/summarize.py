#!/usr/bin/env python3
"""time_s / wire_s per spec, median [min-max] over the rounds (gradzip-bench allreduce --json)."""
import glob, json, os, statistics
here = os.path.dirname(os.path.abspath(__file__))
runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(here, "round*.json")))]
print(f"| spec | time_s | time / wire ({len(runs)} rounds) |")
print("|---|---:|---:|")
for i, row in enumerate(runs[0]):
    ratio = [run[i]["time_over_wire"] for run in runs]
    time = [run[i]["time_s"] for run in runs]
    print(f"| `{row['spec']}` | {statistics.median(time):.3f} | "
          f"{statistics.median(ratio):.2f} [{min(ratio):.2f}–{max(ratio):.2f}] |")
