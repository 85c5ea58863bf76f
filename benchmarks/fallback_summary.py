#!/usr/bin/env python3
"""Summarises benchmarks/fallback_demo.sh's raw JSON (gradzip-demo --json) as markdown tables.

    python3 benchmarks/fallback_summary.py OUT

Shared memory: per codec, for the defaults and with fallback=dense, the median over rounds of
vs_none (the same run's `none` time over the codec's time; >= 1 is no slower than gradzip
uncompressed) with its min-max, the tensors sent dense and the compression ratio. Emulated
cluster (when OUT holds cluster-*.json): the same figures from one run each.
"""
import glob
import json
import os
import statistics
import sys


def load(paths):
    runs = []
    for path in sorted(paths):
        with open(path) as f:
            runs.append(json.load(f))
    return runs


def by_codec(run):
    """codec without the appended options -> row; vs_none added."""
    none = next(r for r in run["rows"] if r["codec"] == "none")
    rows = {}
    for row in run["rows"]:
        codec = row["codec"]
        options = run["options"]
        if options and codec.endswith(options):
            codec = codec[: -len(options) - 1]
        row = dict(row, vs_none=none["seconds"] / row["seconds"])
        rows[codec] = row
    return rows


def spread(values):
    return f"{statistics.median(values):.2f} [{min(values):.2f}–{max(values):.2f}]"


def table(plain_runs, fallback_runs, title):
    plain = [by_codec(r) for r in plain_runs]
    fallback = [by_codec(r) for r in fallback_runs]
    codecs = [c for c in plain[0] if c not in ("MPI_Allreduce", "none")]
    runs = f"{len(plain)} rounds, interleaved" if len(plain) > 1 else "one run each"
    print(f"\n{title} ({runs})\n")
    print("| codec | vs none, defaults | vs none, fallback=dense | tensors dense | ratio, defaults | ratio, fallback=dense |")
    print("|---|---:|---:|---:|---:|---:|")
    for codec in codecs:
        dense = sorted({r[codec]["fallback_tensors"] for r in fallback})
        print(f"| `{codec}` | {spread([r[codec]['vs_none'] for r in plain])} | "
              f"{spread([r[codec]['vs_none'] for r in fallback])} | "
              f"{'/'.join(str(d) for d in dense)} of 52 | "
              f"{statistics.median(r[codec]['ratio'] for r in plain):.2f} | "
              f"{statistics.median(r[codec]['ratio'] for r in fallback):.2f} |")
    mpi = [r["MPI_Allreduce"]["seconds"] / r["none"]["seconds"] for r in plain + fallback]
    print(f"\n`none` against MPI_Allreduce in the same runs: {spread(mpi)} "
          "(MPI_Allreduce's time over none's).")


def main():
    out = sys.argv[1]
    plain = load(glob.glob(os.path.join(out, "shm-plain-round*.json")))
    fallback = load(glob.glob(os.path.join(out, "shm-fallback-round*.json")))
    if not plain or not fallback:
        sys.exit(f"fallback_summary.py: no shm-plain-round*.json / shm-fallback-round*.json in {out}")
    table(plain, fallback, "Shared memory, 4 ranks")
    cluster_plain = load(glob.glob(os.path.join(out, "cluster-plain.json")))
    cluster_fallback = load(glob.glob(os.path.join(out, "cluster-fallback.json")))
    if cluster_plain and cluster_fallback:
        table(cluster_plain, cluster_fallback, "Emulated cluster, 4 ranks, 1 Gbit/s")


if __name__ == "__main__":
    main()
