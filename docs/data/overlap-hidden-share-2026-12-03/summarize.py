#!/usr/bin/env python3
"""The rows of this folder's gradzip-bench overlap JSON files as a table (summary.md)."""
import json, os
here = os.path.dirname(os.path.abspath(__file__))
print("| run | spec | compute_s | comm_s | seq_s | ovl_s | hidden / comm | cpu_bnd | ovl / cpu_bnd |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for name in ["overlap-2r-1gbit.bench.json", "overlap-2r-1gbit-iters7.bench.json",
             "overlap-4r-1gbit.bench.json"]:
    label = name.replace(".bench.json", "").replace("overlap-", "")
    for r in json.load(open(os.path.join(here, name))):
        print(f"| {label} | `{r['spec']}` | {r['compute_s']:.3f} | {r['comm_s']:.3f} | "
              f"{r['sequential_s']:.3f} | {r['overlapped_s']:.3f} | {r['hidden_comm_fraction']:.2f} | "
              f"{r['cpu_bound_s']:.3f} | {r['overlapped_s'] / r['cpu_bound_s']:.2f} |")
