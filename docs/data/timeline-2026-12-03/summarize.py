#!/usr/bin/python3
"""The table of docs/results.md's "Timeline of an overlapped step" from the bench JSON here.

    /usr/bin/python3 docs/data/timeline-2026-12-03/summarize.py

Per spec and rank count: the medians gradzip-bench overlap reports, the range [min, max] of the
timed iterations' samples, and hidden / comm = (seq - ovl) / comm from the medians.
"""
import glob
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def span(samples):
    return f"[{min(samples):.3f}–{max(samples):.3f}]"


print("| ranks | spec | compute_s | comm_s | seq_s | ovl_s | hidden / comm | ovl / compute | cpu_bnd | sent/rank |")
print("|---|---|---|---|---|---|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(HERE, "*.bench.json"))):
    with open(path) as f:
        rows = json.load(f)
    for r in rows:
        print(f"| {r['ranks']} | `{r['spec']}` | {r['compute_s']:.3f} {span(r['compute_samples_s'])} "
              f"| {r['comm_s']:.3f} {span(r['comm_samples_s'])} "
              f"| {r['sequential_s']:.3f} {span(r['sequential_samples_s'])} "
              f"| {r['overlapped_s']:.3f} {span(r['overlapped_samples_s'])} "
              f"| {r['hidden_comm_fraction']:.2f} | {r['overlap_vs_compute']:.2f} "
              f"| {r['cpu_bound_s']:.2f} | {r['sent_bytes'] / 2**20:.1f} MiB |")
