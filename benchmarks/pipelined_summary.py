#!/usr/bin/env python3
"""Pipelined collectives (the ring and SRA, the `segment` key) against their unsegmented form:
median [min-max] over the runs of time_s, time / wire and the stage times, from the
gradzip-bench allreduce --json files in the directory given (round*.json: emulated cluster,
sweep*.json: segment sizes, shm*.json: shared memory, tworanks.json), as markdown tables.

    python3 benchmarks/pipelined_summary.py docs/data/pipelined-ring-2026-12-03
"""
import glob, json, os, statistics, sys

if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
    sys.exit("usage: pipelined_summary.py DIRECTORY (holding the benchmark's round*.json, ...)")
here = sys.argv[1]


def load(prefix):
    return [json.load(open(p)) for p in sorted(glob.glob(os.path.join(here, prefix + "*.json")))]


def spread(values, fmt):
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}–{fmt.format(max(values))}]"


def by_spec(runs):
    table = {}
    for run in runs:
        for row in run:
            table.setdefault(row["spec"], []).append(row)
    return table


def strip(spec):
    return spec.replace(",min_bytes=0", "").replace(":min_bytes=0", "")


rounds = by_spec(load("round"))
print(f"### Emulated cluster, 4 ranks, 1 Gbit/s, 64 MiB ({len(load('round'))} runs; pipelined = "
      "the default segment=65536)\n")
print("| spec | time_s | time / wire | encode_s | communicate_s | decode_s | unsegmented time / wire | "
      "unsegmented ÷ pipelined time |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
def unsegmented(spec):
    base = strip(spec)
    return base + ("," if ":" in base else ":") + "segment=0"


stripped = {strip(spec): rows for spec, rows in rounds.items()}
for spec, rows in rounds.items():
    if "segment=0" in spec:
        continue
    other = stripped.get(unsegmented(spec))
    line = (f"| `{strip(spec)}` ({rows[0]['algo']}) | {spread([r['time_s'] for r in rows], '{:.3f}')} | "
            f"{spread([r['time_over_wire'] for r in rows], '{:.2f}')} | "
            f"{statistics.median(r['encode_s'] for r in rows):.3f} | "
            f"{statistics.median(r['communicate_s'] for r in rows):.3f} | "
            f"{statistics.median(r['decode_s'] for r in rows):.3f} | ")
    if other:
        ratios = [o["time_s"] / r["time_s"] for o, r in zip(other, rows)]
        line += (f"{spread([o['time_over_wire'] for o in other], '{:.2f}')} | "
                 f"{spread(ratios, '{:.2f}')} |")
    else:
        line += "– | – |"
    print(line)

sweeps = by_spec(load("sweep"))
if sweeps:
    print(f"\n### Segment size sweep, same cluster ({len(load('sweep'))} runs): time / wire\n")
    sizes, codecs = {}, []
    for spec, rows in sweeps.items():
        codec = strip(spec).split(",segment=")[0].split(":segment=")[0]
        if codec not in codecs:
            codecs.append(codec)
        size = 65536
        for part in spec.replace(":", ",").split(","):
            if part.startswith("segment="):
                size = int(part.split("=")[1])
        sizes.setdefault(size, {})[codec] = [r["time_over_wire"] for r in rows]
    print("| segment (bytes) | " + " | ".join(codecs) + " |")
    print("|---:|" + "---:|" * len(codecs))
    for size in sorted(sizes):
        cells = [spread(sizes[size][c], "{:.2f}") if c in sizes[size] else "–" for c in codecs]
        print(f"| {size} | " + " | ".join(cells) + " |")

shm = by_spec(load("shm"))
if shm:
    print(f"\n### Shared memory, 4 ranks, 64 MiB ({len(load('shm'))} runs)\n")
    print("| spec | pipelined time_s | unsegmented time_s | unsegmented ÷ pipelined | MPI_Allreduce ÷ pipelined |")
    print("|---|---:|---:|---:|---:|")
    shm_stripped = {strip(spec): rows for spec, rows in shm.items()}
    for spec, rows in shm.items():
        if "segment=0" in spec:
            continue
        other = shm_stripped.get(unsegmented(spec))
        if not other:
            continue
        print(f"| `{strip(spec)}` | {spread([r['time_s'] for r in rows], '{:.4f}')} | "
              f"{spread([o['time_s'] for o in other], '{:.4f}')} | "
              f"{spread([o['time_s'] / r['time_s'] for o, r in zip(other, rows)], '{:.2f}')} | "
              f"{spread([r['speedup_vs_mpi'] for r in rows], '{:.2f}')} |")

two = load("tworanks")
if two:
    print("\n### Emulated cluster, 2 ranks (one core each), 1 Gbit/s, 64 MiB (1 run)\n")
    print("| spec | time_s | wire_s | time / wire | encode_s | communicate_s | decode_s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in two[0]:
        print(f"| `{strip(r['spec'])}` ({r['algo']}) | {r['time_s']:.4f} | {r['wire_s']:.4f} | "
              f"{r['time_over_wire']:.2f} | {r['encode_s']:.4f} | {r['communicate_s']:.4f} | "
              f"{r['decode_s']:.4f} |")
