#!/usr/bin/env python3
"""ctest bench_model_json: `gradzip-bench model --json` against what it must say.

    python3 tests/bench/check_model_bench.py BENCH WORK_DIR

Runs the model on a small validation file written here and a small projection (BERT-large,
P = 8 and 1024, 1 / 10 / 100 Gbit/s), then checks the JSON:
  - validation: one row per measured row the model covers (the `mpi` row is not), each with
    error = (model_s - measured_s) / measured_s, and the median, 90th percentile and worst |error|
    are those of the rows (sorted[n/2], sorted[min(n-1, 9n/10)], the last), so the quoted
    figures cover every row, not a subset;
  - projection: every codec's algorithm is one algo=auto may run for it (AUTO_CANDIDATES, the
    list docs/cost-model.md gives): never recursive halving/doubling for qsgd, sign or top-k,
    which the cheapest-of-everything projection used to credit them with; fp16 is never faster
    than the dense 16-bit baseline, the cheapest of all fp16 algorithms (seconds >=
    dense_f16_seconds), and its break-even against that baseline is 0 ("never");
  - an unknown --models name is refused (exit 2) naming it.
Exit 0 when all hold, 1 naming every failure.
"""
import json
import os
import subprocess
import sys

AUTO_CANDIDATES = {
    "fp16": {"ring", "sra", "rhd", "tree"},
    "qsgd:bits=4": {"sra", "tree"},
    "qsgd:bits=8": {"sra", "tree"},
    "sign": {"sra", "tree"},
    "topk:ratio=0.01": {"sparse", "tree"},
    "randk:ratio=0.01": {"randk"},
}
MEASURED = [  # gradzip-bench allreduce --json rows (one object per line)
    {"spec": "none", "algo": "ring", "ranks": 2, "bytes": 1048576, "time_s": 0.0095},
    {"spec": "none", "algo": "ring", "ranks": 4, "bytes": 16777216, "time_s": 0.22},
    {"spec": "qsgd:bits=4", "algo": "sra", "ranks": 3, "bytes": 4194304, "time_s": 0.02},
    {"spec": "none:algo=rhd", "algo": "rhd", "ranks": 4, "bytes": 4194304, "time_s": 0.07},
    {"spec": "fp16:algo=tree", "algo": "tree", "ranks": 3, "bytes": 1048576, "time_s": 0.03},
    {"spec": "none", "algo": "mpi", "ranks": 4, "bytes": 4096, "time_s": 0.0001},
]


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def close(a, b, tolerance=1e-6):
    return abs(a - b) <= tolerance * max(1.0, abs(a), abs(b))


def check(document):
    failures = []
    validation = document.get("validation")
    if validation is None:
        return ["no 'validation' object"]
    rows = validation["rows"]
    covered = [m for m in MEASURED if m["algo"] != "mpi"]
    if [(r["spec"], r["algo"], r["ranks"], r["bytes"]) for r in rows] != \
            [(m["spec"], m["algo"], m["ranks"], m["bytes"]) for m in covered]:
        failures.append(f"validation rows {[(r['spec'], r['algo']) for r in rows]} are not the "
                        f"{len(covered)} modelled measured rows in order")
    for r in rows:
        if not r["model_s"] > 0 or not close(r["error"], (r["model_s"] - r["measured_s"]) / r["measured_s"]):
            failures.append(f"validation row {r}: error is not (model_s - measured_s) / measured_s")
    errors = [abs(r["error"]) for r in rows]
    for key, expected in (("median_abs_error", quantile(errors, 0.5)),
                          ("p90_abs_error", quantile(errors, 0.9)),
                          ("max_abs_error", max(errors))):
        if not close(validation[key], expected):
            failures.append(f"validation {key} {validation[key]} is not {expected} over all rows")

    projection = document["projection"]["rows"]
    if len(projection) != 2 * 3 * len(AUTO_CANDIDATES):
        failures.append(f"{len(projection)} projection rows, expected {2 * 3 * len(AUTO_CANDIDATES)}")
    for r in projection:
        allowed = AUTO_CANDIDATES.get(r["spec"])
        if allowed is None or r["algorithm"] not in allowed:
            failures.append(f"projection {r['spec']} at P={r['ranks']}, {r['gbps']} Gbit/s: "
                            f"algorithm {r['algorithm']}, algo=auto runs only {sorted(allowed or [])}")
        if not (r["seconds"] > 0 and r["dense_f32_seconds"] > 0 and r["dense_f16_seconds"] > 0):
            failures.append(f"projection row {r}: a time is not positive")
        if r["spec"] == "fp16" and r["seconds"] < r["dense_f16_seconds"] * (1 - 1e-9):
            failures.append(f"projection fp16 at P={r['ranks']}, {r['gbps']} Gbit/s: "
                            f"{r['seconds']} s beats the cheapest dense 16-bit all-reduce "
                            f"{r['dense_f16_seconds']} s")
    for r in document["break_even"]:
        if r["spec"] == "fp16" and r["vs_f16_gbps"] != 0:
            failures.append(f"break-even of fp16 against dense 16-bit at P={r['ranks']} is "
                            f"{r['vs_f16_gbps']}, expected 0 (never)")
    return failures


def main():
    bench, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    measured = os.path.join(work, "measured.json")
    with open(measured, "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(m) for m in MEASURED) + "\n]\n")
    output = os.path.join(work, "model.json")
    if os.path.exists(output):
        os.remove(output)
    command = [bench, "model", "--models", "bert-large", "--gbps", "1,10,100", "--ranks", "8,1024",
               "--sample", "65536", "--validate", measured, "--link-gbps", "1",
               "--link-latency-us", "15", "--json", output]
    print(" ".join(command), flush=True)
    run = subprocess.run(command, capture_output=True, text=True, timeout=240)
    failures = []
    if run.returncode != 0:
        failures.append(f"gradzip-bench model exited {run.returncode}: {run.stderr.strip()}")
    else:
        with open(output) as f:
            failures += check(json.load(f))
    refused = subprocess.run([bench, "model", "--models", "gpt-9"], capture_output=True, text=True,
                             timeout=60)
    if refused.returncode != 2 or "gpt-9" not in refused.stderr:
        failures.append(f"--models gpt-9: exit {refused.returncode}, stderr '{refused.stderr.strip()}' "
                        "(expected 2, naming the model)")
    for failure in failures:
        print(f"check_model_bench: FAILED {failure}")
    print("check_model_bench: " + ("all checks passed" if not failures else f"{len(failures)} failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
