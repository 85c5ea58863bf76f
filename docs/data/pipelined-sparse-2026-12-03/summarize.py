#!/usr/bin/env python3
"""The sparse all-reduce's pipelined exchange against allgatherv (files beside this script)."""
import glob, json, os, statistics

here = os.path.dirname(os.path.abspath(__file__))


def spread(values, fmt):
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}–{fmt.format(max(values))}]"


runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(here, "round*.json")))]
rows = {}
for run in runs:
    for row in run:
        rows.setdefault(row["spec"].replace(",min_bytes=0", ""), []).append(row)
print(f"### Emulated cluster, 4 ranks, 1 Gbit/s, 64 MiB ({len(runs)} runs)\n")
print("| spec | time_s | time / wire | encode_s | communicate_s | decode_s | segment=0 time / wire | "
      "segment=0 ÷ pipelined time |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for spec, mine in rows.items():
    if "segment=0" in spec:
        continue
    other = rows[spec + ",segment=0"]
    print(f"| `{spec}` | {spread([r['time_s'] for r in mine], '{:.3f}')} | "
          f"{spread([r['time_over_wire'] for r in mine], '{:.2f}')} | "
          f"{statistics.median(r['encode_s'] for r in mine):.3f} | "
          f"{statistics.median(r['communicate_s'] for r in mine):.3f} | "
          f"{statistics.median(r['decode_s'] for r in mine):.3f} | "
          f"{spread([r['time_over_wire'] for r in other], '{:.2f}')} | "
          f"{spread([o['time_s'] / r['time_s'] for o, r in zip(other, mine)], '{:.2f}')} |")

log = os.path.join(here, "torch.log")
if os.path.exists(log):
    print("\n### torch.distributed (gloo over loopback), 4 processes, 64 MiB (median of 3 calls)\n")
    print("| spec | time_s | segment=0 time_s | segment=0 ÷ pipelined |")
    print("|---|---:|---:|---:|")
    median = {}
    for line in open(log):
        line = line.split("] ", 1)[-1]
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[0] != "spec":
            try:
                median[parts[0].replace(",min_bytes=0", "").replace(":min_bytes=0", "")] = float(parts[1])
            except ValueError:
                pass
    for spec, value in median.items():
        if "segment=0" in spec:
            continue
        twin = median.get(spec + ",segment=0")
        if twin is None:
            continue
        print(f"| `{spec}` | {value:.3f} | {twin:.3f} | {twin / value:.2f} |")
