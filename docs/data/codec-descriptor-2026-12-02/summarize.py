#!/usr/bin/env python3
"""Medians and ranges over the rounds in bench/ (run_bench.sh): old against new for
gradzip-bench codecs (encode / decode GB/s) and allreduce (ms), then TernGrad against
qsgd:bits=2 (new build only). The figures docs/results.md quotes."""
import glob
import json
import os
import statistics

here = os.path.dirname(os.path.abspath(__file__))


def rows(pattern):
    for path in sorted(glob.glob(os.path.join(here, "bench", pattern))):
        name = os.path.basename(path)[:-len(".json")]
        yield name, json.load(open(path))


def spread(values, scale=1.0, fmt="{:.3f}"):
    return (fmt.format(statistics.median(values) * scale),
            (fmt + "-" + fmt).format(min(values) * scale, max(values) * scale))


# codecs: old vs new
codec = {}
for name, data in rows("codecs-*-*.json"):
    version = name.split("-")[1]
    for row in data:
        for field in ("encode_gbps", "decode_gbps"):
            codec.setdefault((row["codec"], field), {}).setdefault(version, []).append(row[field])
print("gradzip-bench codecs, 4 Mi elements: GB/s, median of the rounds (range)")
print(f"{'codec':22} {'':11} {'old':>8} {'new':>8} {'new/old':>8}  old range        new range")
for (name, field), by in sorted(codec.items()):
    old, new = by["old"], by["new"]
    mo, mn = statistics.median(old), statistics.median(new)
    print(f"{name:22} {field:11} {mo:8.2f} {mn:8.2f} {mn / mo:8.3f}  "
          f"{min(old):6.2f}-{max(old):<8.2f} {min(new):6.2f}-{max(new):<8.2f}")

# allreduce: old vs new
times = {}
for name, data in rows("allreduce-*-*.json"):
    version = name.split("-")[1]
    for row in data:
        times.setdefault((row["spec"], row["bytes"]), {}).setdefault(version, []).append(row["time_s"])
print()
print("gradzip-bench allreduce, 4 ranks: ms, median of the rounds (range)")
print(f"{'spec':36} {'bytes':>8} {'old ms':>8} {'new ms':>8} {'new/old':>8}  old range        new range")
for (spec, size), by in sorted(times.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    old, new = by["old"], by["new"]
    mo, mn = statistics.median(old), statistics.median(new)
    print(f"{spec:36} {size:>8} {mo * 1e3:8.3f} {mn * 1e3:8.3f} {mn / mo:8.3f}  "
          f"{min(old) * 1e3:6.3f}-{max(old) * 1e3:<8.3f} {min(new) * 1e3:6.3f}-{max(new) * 1e3:<8.3f}")

# TernGrad against qsgd:bits=2
print()
print("TernGrad against qsgd:bits=2 (new build): codecs at 4 Mi elements, all-reduce at 4 ranks")
tc = {}
for _, data in rows("terngrad-codecs-*.json"):
    for row in data:
        entry = tc.setdefault(row["codec"], {"ratio": row["ratio"], "rel_error": row["rel_error"]})
        for field in ("encode_gbps", "decode_gbps", "memcpy_gbps"):
            entry.setdefault(field, []).append(row[field])
for name, entry in tc.items():
    print(f"{name:14} ratio {entry['ratio']:.2f}x  rel_error {entry['rel_error']:.3f}  "
          f"encode {statistics.median(entry['encode_gbps']):.2f} GB/s "
          f"({min(entry['encode_gbps']):.2f}-{max(entry['encode_gbps']):.2f})  "
          f"decode {statistics.median(entry['decode_gbps']):.2f} GB/s "
          f"({min(entry['decode_gbps']):.2f}-{max(entry['decode_gbps']):.2f})  "
          f"memcpy {statistics.median(entry['memcpy_gbps']):.2f} GB/s")
ta = {}
for _, data in rows("terngrad-allreduce-*.json"):
    for row in data:
        entry = ta.setdefault((row["spec"], row["bytes"]), {"algo": row["algo"], "sent": row["sent_bytes_per_rank"]})
        entry.setdefault("t", []).append(row["time_s"])
        entry.setdefault("mpi", []).append(row["mpi_time_s"])
for (spec, size), entry in sorted(ta.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f"{spec:28} {size:>8} {entry['algo']:5} sent/rank {entry['sent']:>8} B  "
          f"{statistics.median(entry['t']) * 1e3:.3f} ms ({min(entry['t']) * 1e3:.3f}-{max(entry['t']) * 1e3:.3f})  "
          f"MPI_Allreduce {statistics.median(entry['mpi']) * 1e3:.3f} ms")
