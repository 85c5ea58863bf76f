#!/usr/bin/env python3
"""ctest bench_calls_json: `gradzip-bench calls --json` on a machine without a GPU.

    python3 tests/bench/check_calls_bench.py BENCH WORK_DIR [RANKS MPIEXEC [MPIEXEC_ARGS...]]

With RANKS and MPIEXEC: `MPIEXEC MPIEXEC_ARGS -np RANKS BENCH calls --world ...`, the counts of
an all-reduce over RANKS processes (each the largest over the ranks), checked the same way and
"ranks" == RANKS in the JSON. Runs `calls` with GRADZIP_DEVICE unset: without a CUDA device it must run itself again on the
emulated device and say so ("device": "emulated"; on a machine with a GPU, "cuda"). Then checks
the JSON:
  - complete, one row per spec the command lists, none failed, every row over NCCL;
  - every row: allocations_per_call == 0 (device memory comes from the per-thread cache after
    warm-up), and host_waits_per_call / host_device_bytes_per_call are numbers >= 0;
  - every row over NCCL runs stream-ordered: exactly one completion wait per call
    (completion_waits_per_call == 1), and for the fixed-size codecs nothing else waits
    (host_waits_per_call == 0, no site but the completion: the non-finite count is a device
    flag read at the completion) and nothing is copied between host and device
    (host_device_bytes_per_call == 0: headers are checked on the device, status words are read
    from pinned memory);
  - error feedback keeps its residual in device memory: each ef=on row copies fewer bytes
    between host and device per call than a quarter of the tensor's f32 bytes (a residual
    copied in and out is 8 bytes per element, 2x the tensor; what remains are message headers
    and validation words);
  - target_met is exactly (allocations, waits, bytes) == (0, 0, 0) for the fixed-size rows.
Exit 0 when all hold, 1 naming every failure.
"""
import json
import os
import subprocess
import sys

SIZE = 1 << 16
COMPLETION_SITE = "stream-ordered call: completion"


def sites(text):
    """The site names of a wait_sites string ("site a 2.00, site b 1.00", or "none")."""
    if text == "none":
        return []
    return [part.rsplit(" ", 1)[0] for part in text.split(", ")]


def main(bench, work_dir, ranks=1, launcher=()):
    os.makedirs(work_dir, exist_ok=True)
    path = os.path.join(work_dir, f"calls-np{ranks}.json")
    env = {k: v for k, v in os.environ.items() if k != "GRADZIP_DEVICE"}
    command = [bench, "calls", "--size", str(SIZE), "--calls", "3", "--json", path]
    if launcher:
        command = list(launcher) + ["-np", str(ranks)] + command + ["--world"]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    print(run.stdout)
    failures = []
    if run.returncode != 0:
        failures.append(f"exit {run.returncode}: {run.stderr.strip()}")
    with open(path, encoding="utf-8") as file:
        report = json.load(file)
    if not report.get("complete"):
        failures.append("the JSON is not complete")
    said_no_device = "running on the emulated device" in run.stdout
    expected = "emulated" if said_no_device else "cuda"
    if report.get("device") != expected:
        failures.append(f"device {report.get('device')!r}, expected {expected!r}")
    if report.get("ranks") != ranks:
        failures.append(f"ranks {report.get('ranks')!r}, expected {ranks}")
    rows = {row["spec"]: row for row in report.get("rows", [])}
    if len(rows) < 10:
        failures.append(f"only {len(rows)} rows")
    for spec, row in rows.items():
        if "failed" in row:
            failures.append(f"{spec}: failed: {row['failed']}")
            continue
        if "over NCCL" not in row["note"]:
            failures.append(f"{spec}: not over NCCL ({row['note']})")
        if row["allocations_per_call"] != 0:
            failures.append(f"{spec}: {row['allocations_per_call']} allocations per steady-state call")
        for key in ("host_waits_per_call", "host_device_bytes_per_call"):
            if not isinstance(row[key], (int, float)) or row[key] < 0:
                failures.append(f"{spec}: {key} = {row[key]!r}")
        zero = (row["allocations_per_call"], row["host_waits_per_call"],
                row["host_device_bytes_per_call"]) == (0, 0, 0)
        if row["fixed_size"] and row["target_met"] != zero:
            failures.append(f"{spec}: target_met {row['target_met']} for {zero and '0/0/0' or 'non-zero counts'}")
        if "over NCCL" in row["note"]:
            if row.get("completion_waits_per_call") != 1:
                failures.append(f"{spec}: {row.get('completion_waits_per_call')!r} completion waits per call (expected 1)")
            if row["fixed_size"]:
                if row["host_device_bytes_per_call"] != 0:
                    failures.append(f"{spec}: {row['host_device_bytes_per_call']} bytes between host and device per call")
                other = [site for site in sites(row["wait_sites"]) if site != COMPLETION_SITE]
                if other or row["host_waits_per_call"] != 0:
                    failures.append(f"{spec}: waits inside the call: {row['wait_sites']}")
        if "ef=on" in spec:
            copied = row["host_device_bytes_per_call"]
            if copied >= SIZE:  # a quarter of the tensor's 4 * SIZE bytes
                failures.append(f"{spec}: {copied} bytes between host and device per call: the residual moved")
    for line in failures:
        print("FAIL:", line)
    print(f"{len(rows)} rows checked, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 3:
        sys.exit(main(sys.argv[1], sys.argv[2]))
    if len(sys.argv) >= 5:
        sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]))
    print(__doc__)
    sys.exit(2)
