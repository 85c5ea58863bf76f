#!/usr/bin/env python3
"""Median [min-max] over rounds of EF/memcpy and enc/memcpy, before and after, per codec."""
import glob, json, os, statistics
here = os.path.dirname(os.path.abspath(__file__))
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
