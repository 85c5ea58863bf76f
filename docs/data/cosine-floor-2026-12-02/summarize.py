#!/usr/bin/env python3
"""Summarises np<P>.json (gradzip-bench allreduce --check rows) into summary.txt's table:
per codec, the smallest and largest cosine / floor over every algorithm, size and rank count."""
import collections
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
rows = []
for ranks in (2, 3, 4, 5, 8, 12):
    with open(os.path.join(HERE, f"np{ranks}.json")) as f:
        for row in json.load(f):
            row["np"] = ranks
            rows.append(row)
floored = [r for r in rows if r["min_cosine"] > 0]
failures = [r for r in rows if not (r["cosine"] >= r["min_cosine"] and
                                    r["max_abs_error"] <= r["error_bound"] and r["ranks_identical"])]
print(f"{len(rows)} rows (2, 3, 4, 5, 8, 12 ranks x 3 sizes x {len(rows) // 18} specs), "
      f"{len(floored)} with a floor (>= 1024 elements per rank); failures: {len(failures)}")
by_codec = collections.defaultdict(list)
for r in floored:
    by_codec[r["spec"].split(",algo")[0].split(":algo")[0]].append(r)
print("codec | smallest cosine / floor (where) | largest")
for codec, group in by_codec.items():
    low = min(group, key=lambda r: r["cosine"] / r["min_cosine"])
    high = max(group, key=lambda r: r["cosine"] / r["min_cosine"])
    print(f"{codec} | {low['cosine'] / low['min_cosine']:.2f} ({low['algo']}, {low['np']} ranks, "
          f"{low['bytes']} B: {low['cosine']:.3f} vs {low['min_cosine']:.3f}) "
          f"| {high['cosine'] / high['min_cosine']:.2f}")
