#!/usr/bin/env python3
"""Median [min-max] over rounds of EF/memcpy and enc/memcpy, before and after, per codec, from
the before-round*.json / after-round*.json of benchmarks/fused_ef_compare.sh in DIRECTORY.

    python3 benchmarks/fused_ef_summary.py docs/data/fused-ef-2026-12-03
"""
import glob, json, os, statistics, sys
if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
    sys.exit("usage: fused_ef_summary.py DIRECTORY")
here = sys.argv[1]
def rows(build):
    out = {}
    for path in sorted(glob.glob(os.path.join(here, f"{build}-round*.json"))):
        with open(path) as f:
            text = f.read()
        objects = json.loads(text)
        for row in objects:
            out.setdefault(row["codec"], []).append(row)
    return out
def spread(values):
    return f"{statistics.median(values):.2f} [{min(values):.2f}–{max(values):.2f}]"
before, after = rows("before"), rows("after")
print("| codec | EF enc / memcpy, before | EF enc / memcpy, after | enc / memcpy (no EF), after |")
print("|---|---:|---:|---:|")
for codec in before:
    ef = lambda rs: spread([r["ef_encode_gbps"] / r["memcpy_gbps"] for r in rs])
    enc = lambda rs: spread([r["encode_gbps"] / r["memcpy_gbps"] for r in rs])
    print(f"| `{codec}` | {ef(before[codec])} | {ef(after[codec])} | {enc(after[codec])} |")
