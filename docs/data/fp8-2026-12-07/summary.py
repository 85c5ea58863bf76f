#!/usr/bin/env python3
"""Writes summary.md beside it from the raw files run.sh wrote (codecs/, allreduce/,
convergence/): per configuration the median over rounds with [min-max] for speed, the
all-reduce's checked error against its bound, and the mean +- standard deviation over seeds of
the final test accuracy and loss, with the bytes sent relative to `none`."""
import csv
import glob
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))


def spread(values, digits=2):
    values = sorted(values)
    return f"{statistics.median(values):.{digits}f} [{values[0]:.{digits}f}-{values[-1]:.{digits}f}]"


def codecs_table():
    rows = {}
    for path in sorted(glob.glob(os.path.join(HERE, "codecs", "round*.json"))):
        for r in json.load(open(path)):
            entry = rows.setdefault(r["codec"], {"enc": [], "dec": [], "ratio": r["ratio"], "err": r["rel_error"]})
            entry["enc"].append(r["encode_gbps"] / r["memcpy_gbps"])
            entry["dec"].append(r["decode_gbps"] / r["memcpy_gbps"])
    out = ["| codec | compression ratio | relative error | encode / memcpy | decode / memcpy |",
           "|---|---|---|---|---|"]
    for codec, e in rows.items():
        out.append(f"| `{codec}` | {e['ratio']:.2f} | {e['err']:.2e} | {spread(e['enc'])} | {spread(e['dec'])} |")
    return out, len(glob.glob(os.path.join(HERE, "codecs", "round*.json")))


def allreduce_table():
    rows = {}
    for path in sorted(glob.glob(os.path.join(HERE, "allreduce", "round*.json"))):
        for r in json.load(open(path)):
            key = (r["spec"].replace(",min_bytes=0", "").replace(":min_bytes=0", ""), r["bytes"])
            e = rows.setdefault(key, {"algo": r["algo"], "speedup": [], "sent": r["sent_bytes_per_rank"],
                                      "share": [], "cos": [], "identical": True})
            e["speedup"].append(r["speedup_vs_mpi"])
            e["share"].append(r["max_abs_error"] / r["error_bound"] if r["error_bound"] > 0 else 0.0)
            e["cos"].append(r["cosine"])
            e["identical"] &= r["ranks_identical"]
    out = ["| spec | bytes per rank | algorithm | sent per rank | time / MPI_Allreduce's (speedup) | max error / bound | cosine | ranks identical |",
           "|---|---|---|---|---|---|---|---|"]
    for (spec, size), e in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        out.append(f"| `{spec}` | {size} | {e['algo']} | {e['sent']} | {spread(e['speedup'])} | "
                   f"{max(e['share']):.3f} | {min(e['cos']):.6f} | {'yes' if e['identical'] else 'NO'} |")
    return out


def convergence_table():
    runs = {}
    for path in sorted(glob.glob(os.path.join(HERE, "convergence", "*.csv"))):
        with open(path) as f:
            last = list(csv.DictReader(f))[-1]
        label = os.path.basename(path).rsplit("_s", 1)[0]
        runs.setdefault(label, []).append(last)
    none_bytes = statistics.mean(float(r["bytes_sent"]) for r in runs.get("none", [{"bytes_sent": "nan"}]))
    out = ["| label | spec | seeds | final test accuracy (mean ± sd) | final test loss | bytes vs none |",
           "|---|---|---|---|---|---|"]
    for label, rows in runs.items():
        acc = [100 * float(r["test_accuracy"]) for r in rows]
        loss = [float(r["test_loss"]) for r in rows]
        sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
        lsd = statistics.stdev(loss) if len(loss) > 1 else 0.0
        ratio = statistics.mean(float(r["bytes_sent"]) for r in rows) / none_bytes
        out.append(f"| {label} | `{rows[0]['spec']}` | {len(rows)} | {statistics.mean(acc):.2f} ± {sd:.2f}% | "
                   f"{statistics.mean(loss):.4f} ± {lsd:.4f} | {ratio:.4f} |")
    return out


def main():
    codecs, rounds = codecs_table()
    bench = open(os.path.join(HERE, "commit-bench.txt")).read().strip()
    trained = open(os.path.join(HERE, "commit-convergence.txt")).read().strip()
    lines = [f"# fp8 beside the casts and qsgd-8 (benchmarks at {bench[:12]}, training at {trained[:12]})", "",
             "Written by summary.py from the raw files of `bash docs/data/fp8-2026-12-07/run.sh`.", "",
             f"## Codec throughput, 4 Mi f32 elements, {rounds} rounds (median [min-max] over rounds)", ""]
    lines += codecs + ["", "## All-reduce, 4 ranks over loopback, `--check` (speedup: median [min-max] over rounds)", ""]
    lines += allreduce_table() + ["", "## Fashion-MNIST, 4 ranks, 5 epochs", ""]
    lines += convergence_table() + [""]
    with open(os.path.join(HERE, "summary.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
