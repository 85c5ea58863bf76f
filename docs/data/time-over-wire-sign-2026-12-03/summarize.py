#!/usr/bin/env python3
"""time_s / wire_s per spec, median [min-max] over the rounds (gradzip-bench allreduce --json).
The round*.json files of the folder given as the first argument, else of this script's folder;
a second argument replaces the file name prefix "round" (e.g. two-ranks-round)."""
import glob, json, os, statistics, sys
here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
prefix = sys.argv[2] if len(sys.argv) > 2 else "round"
runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(here, prefix + "*.json")))]
print(f"| spec | time_s | time / wire ({len(runs)} rounds) |")
print("|---|---:|---:|")
for i, row in enumerate(runs[0]):
    ratio = [run[i]["time_over_wire"] for run in runs]
    time = [run[i]["time_s"] for run in runs]
    print(f"| `{row['spec']}` | {statistics.median(time):.3f} | "
          f"{statistics.median(ratio):.2f} [{min(ratio):.2f}–{max(ratio):.2f}] |")
