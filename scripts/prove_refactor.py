#!/usr/bin/env python3
"""Proves that a refactor of the C++ product code changed no byte and no speed, so that the
suites measured before it still describe the code after it.

    python3 scripts/prove_refactor.py BEFORE [--after REV] [--rounds R] [--out DIR]

BEFORE and AFTER (default HEAD) are commits; each is checked out into a temporary git worktree
and built there (Release, through ccache as scripts/configure-and-build.sh does). Then:
  - same bytes: scripts/result_digests.py (AFTER's copy, for both builds) under mpirun with
    1, 2, 3 and 4 ranks: the digests of every codec x algorithm's all-reduce and reduce-scatter
    results and residuals must be identical between the builds; and the Reducer's:
    scripts/reducer_digests/ (AFTER's copy, built against each build installed) runs the
    Reducer over buckets, chunks, two lanes, warm-up, ramp, rules and PowerSGD for four steps
    and prints the digests of every tensor and each group's spec, algorithms and bytes;
  - same speed: R rounds (default 5), BEFORE and AFTER interleaved within each round (the order
    alternating between rounds), of `gradzip-bench allreduce` (4 ranks, 64 KiB and 4 MiB, the
    default codecs), `gradzip-bench codecs` (4 Mi elements; on an AVX-512 CPU also with
    --isa avx2, so that both vector paths are timed) and `gradzip-bench overlap` (4 ranks, the
    small model: the Reducer alone and overlapped with backward).
Everything is written to DIR (default docs/data/refactor-proofs/<date>-<after, 12 digits>):
proof.json (the commits, the measured paths the refactor changed, the machine, each round's load
average), digests/{before,after}-npP.txt, digests/reducer-{before,after}-npP.txt,
bench/{allreduce,codecs,codecs-avx2,overlap}-{before,after}-R.json and
summary.txt (what it printed: the digests' verdicts and every row's ratios).
Commit DIR: tests/lint/check_results_fresh.py then carries a suite measured at BEFORE (or at any
commit whose measured code equals BEFORE's) over to AFTER when verify() accepts the proof.

verify() is the rule, shared with the lint, recomputed from the raw files (never from a verdict
written in proof.json):
  1. BEFORE is an ancestor of AFTER, both in this checkout's history;
  2. every path the refactor changed among the paths any suite measures lies under
     REFACTORABLE: the C++ library and its build, which the digests exercise, and pipeline/
     (the Reducer) when the proof has the Reducer's digests; elsewhere (the Python binding, a
     benchmark driver) a file may change only its #include lines, as when a header it uses
     moves. Any other change to the Python package, a benchmark driver or the emulated
     cluster is not covered by these digests and needs the suites run again;
  3. the digests of 1, 2, 3 and 4 ranks exist for both builds, each with its "P ranks" header
     and at least MIN_DIGEST_LINES calls, and are byte-identical between the builds; so are the
     Reducer's where the proof has them (proofs written before they existed have none);
  4. speed: each benchmark row (all-reduce time per spec and size; encode and decode time per
     codec; the Reducer's step alone and overlapped) gives one paired ratio AFTER / BEFORE per
     round. No row may have every round's ratio above ROW_TOLERANCE (or every one below its
     inverse). The change over all rows is M, the geometric mean of the rows' median ratios,
     with a standard error SE (of log M) from the spread of the rounds' own geometric means over
     the rows; the proof fails when the change is shown to exceed MEAN_TOLERANCE either way at
     two standard errors: log M - 2 SE > log MEAN_TOLERANCE, or log M + 2 SE < -log
     MEAN_TOLERANCE. On a 2-core machine one row's paired ratio moves by 20-50% between rounds
     even for identical code (two builds of the same code: 0.48-1.66 for all-reduce rows, 0.65-1.35
     for codec rows, 0.63-1.23 for the overlap rows), and a whole round by 5-10% (the rounds'
     geometric means 0.90-1.06), so a single row can only catch a gross slowdown that every
     round shows, and the mean one of a few percent with 5 rounds (a 10% slowdown with the
     spread above: log M - 2 SE = log 1.10 - 2 x 0.027, beyond log 1.03).
"""
import argparse
import datetime
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFACTORABLE = ["include", "kernels", "compressors", "error_feedback", "collectives",
                "CMakeLists.txt", "cmake"]
REDUCER_PATHS = ["pipeline"]
INCLUDE_LINE = re.compile(r'^\s*#\s*include\s')
RANK_COUNTS = [1, 2, 3, 4]
MIN_DIGEST_LINES = 700
MIN_REDUCER_DIGEST_LINES = 500
ROW_TOLERANCE = 1.25
MEAN_TOLERANCE = 1.03
ALLREDUCE_SIZES = [65536, 4194304]
CODEC_ELEMENTS = 4194304


def git(root, *args, check=False):
    result = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def under(path, prefixes):
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def load_measured(root):
    """benchmarks/measured_code.py's MEASURED of the checkout at `root`: {suite: [paths]}."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("measured_code",
                                                  Path(root) / "benchmarks" / "measured_code.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MEASURED


def measured_paths(root):
    """The union of every suite's measured paths (benchmarks/measured_code.py)."""
    return sorted({p for paths in load_measured(root).values() for p in paths})


def changed_measured_paths(root, before, after, measured):
    diff = git(root, "diff", "--name-only", before, after, "--", *measured)
    return diff.stdout.split()


def only_includes_changed(root, before, after, path):
    """Whether `path` exists at both commits and every line the diff adds or removes is an
    #include (or blank): a header that moved, seen from a file the digests do not exercise."""
    if any(git(root, "cat-file", "-e", f"{commit}:{path}").returncode != 0 for commit in (before, after)):
        return False
    diff = git(root, "diff", "-U0", before, after, "--", path).stdout.splitlines()
    changed = [line[1:] for line in diff
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    return bool(changed) and all(INCLUDE_LINE.match(line) or not line.strip() for line in changed)


def bench_times(rows, kind):
    """{row key: time} of one benchmark JSON: all-reduce seconds per (spec, ranks, size); codec
    encode and decode seconds per byte (1 / throughput) per (codec, size); the Reducer's step
    alone and overlapped with backward per spec (overlap)."""
    times = {}
    for row in rows:
        if kind == "overlap":
            for metric in ("comm_s", "overlapped_s"):
                times[f"overlap {row['spec']} ranks={row['ranks']} {metric}"] = row[metric]
        elif kind == "allreduce":
            times[f"allreduce {row['spec']} ranks={row['ranks']} bytes={row['bytes']}"] = row["time_s"]
        else:  # codecs, or codecs-avx2: the same rows with the AVX2 kernels forced
            suffix = " isa=avx2" if kind == "codecs-avx2" else ""
            for direction in ("encode", "decode"):
                times[f"codecs {row['codec']} size={row['size']} {direction}{suffix}"] = \
                    1.0 / row[f"{direction}_gbps"]
    return times


def speed_rows(bench_dir, rounds):
    """{row: [AFTER / BEFORE ratio of each round]} from bench/{kind}-{version}-{round}.json
    (overlap only where the proof has it: proofs written before it was added have none)."""
    ratios = {}
    kinds = ["allreduce", "codecs"] + [kind for kind in ("codecs-avx2", "overlap")
                                       if (bench_dir / f"{kind}-before-1.json").exists()]
    for kind in kinds:
        for r in range(1, rounds + 1):
            before = bench_times(json.loads((bench_dir / f"{kind}-before-{r}.json").read_text()), kind)
            after = bench_times(json.loads((bench_dir / f"{kind}-after-{r}.json").read_text()), kind)
            if set(before) != set(after):
                raise ValueError(f"round {r} of {kind}: the builds measured different rows "
                                 f"({sorted(set(before) ^ set(after))[:3]})")
            for key in before:
                ratios.setdefault(key, []).append(after[key] / before[key])
    return ratios


def verify(root, proof_dir, refactorable=REFACTORABLE, measured=None):
    """(proof dict or None, [problems]): whether the proof in proof_dir shows that its AFTER
    commit computes the same bytes at the same speed as its BEFORE commit (the module docstring's
    rule). measured: the paths the suites measure (default: benchmarks/measured_code.py)."""
    proof_dir = Path(proof_dir)
    name = proof_dir.name
    try:
        proof = json.loads((proof_dir / "proof.json").read_text())
        before, after, rounds = proof["before"], proof["after"], int(proof["rounds"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        return None, [f"proof {name}: proof.json unreadable ({error})"]
    problems = []
    for commit in (before, after):
        if git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            return proof, [f"proof {name}: commit {commit[:12]} is not in this checkout's history"]
    if git(root, "merge-base", "--is-ancestor", before, after).returncode != 0:
        problems.append(f"proof {name}: before {before[:12]} is not an ancestor of after {after[:12]}")
    measured = measured if measured is not None else measured_paths(root)
    reducer_files = [proof_dir / "digests" / f"reducer-{version}-np{ranks}.txt"
                     for ranks in RANK_COUNTS for version in ("before", "after")]
    has_reducer = any(path.exists() for path in reducer_files)
    covered = list(refactorable) + (REDUCER_PATHS if has_reducer else [])
    uncovered = [p for p in changed_measured_paths(root, before, after, measured)
                 if not under(p, covered) and not only_includes_changed(root, before, after, p)]
    if uncovered:
        problems.append(f"proof {name}: the refactor changed measured paths the digests do not "
                        f"cover ({', '.join(uncovered[:5])}); those suites must be run again")
    kinds = [("", MIN_DIGEST_LINES)] + ([("reducer-", MIN_REDUCER_DIGEST_LINES)] if has_reducer else [])
    for (prefix, min_lines), ranks in ((kind, ranks) for kind in kinds for ranks in RANK_COUNTS):
        texts = []
        for version in ("before", "after"):
            path = proof_dir / "digests" / f"{prefix}{version}-np{ranks}.txt"
            text = path.read_text() if path.exists() else ""
            lines = text.splitlines()
            if not lines or lines[0] != f"{ranks} ranks" or len(lines) - 1 < min_lines:
                problems.append(f"proof {name}: {path.name} is missing or not a digest of "
                                f"{ranks} ranks with at least {min_lines} lines")
            texts.append(lines)
        if texts[0] and texts[1] and texts[0] != texts[1]:
            differing = next(i for i, (a, b) in enumerate(zip(texts[0] + [""], texts[1] + [""]))
                             if a != b)
            problems.append(f"proof {name}: the {prefix}digests of {ranks} ranks differ from line "
                            f"{differing + 1}: '{(texts[0] + [''])[differing][:90]}'")
    try:
        ratios = speed_rows(proof_dir / "bench", rounds)
    except (OSError, ValueError, KeyError, ZeroDivisionError) as error:
        return proof, problems + [f"proof {name}: the benchmark files are unreadable ({error})"]
    if not ratios or rounds < 3:
        return proof, problems + [f"proof {name}: needs at least 3 rounds of benchmark rows"]
    for key, values in sorted(ratios.items()):
        if min(values) > ROW_TOLERANCE or max(values) < 1 / ROW_TOLERANCE:
            problems.append(f"proof {name}: {key}: after / before = {min(values):.3f}-"
                            f"{max(values):.3f} in {rounds} rounds, every one outside "
                            f"[{1 / ROW_TOLERANCE:.3f}, {ROW_TOLERANCE}]")
    mean, error = mean_change(ratios)
    limit = math.log(MEAN_TOLERANCE)
    if math.log(mean) - 2 * error > limit or math.log(mean) + 2 * error < -limit:
        problems.append(f"proof {name}: over {len(ratios)} rows after / before = {mean:.4f} "
                        f"(geometric mean of the rows' medians; two standard errors: "
                        f"{math.exp(math.log(mean) - 2 * error):.4f}-"
                        f"{math.exp(math.log(mean) + 2 * error):.4f}), a change beyond "
                        f"{MEAN_TOLERANCE} either way")
    return proof, problems


def mean_change(ratios):
    """(M, SE): M = the geometric mean over rows of each row's median ratio; SE = the standard
    error of log M, from the spread of the rounds' geometric means over the rows (0 for one
    round)."""
    mean = math.exp(statistics.fmean(math.log(statistics.median(v)) for v in ratios.values()))
    rounds = len(next(iter(ratios.values())))
    per_round = [statistics.fmean(math.log(v[r]) for v in ratios.values()) for r in range(rounds)]
    error = statistics.stdev(per_round) / math.sqrt(rounds) if rounds > 1 else 0.0
    return mean, error


def speed_summary(proof_dir, rounds):
    ratios = speed_rows(Path(proof_dir) / "bench", rounds)
    lines = []
    for key, values in sorted(ratios.items()):
        lines.append(f"  {key}: median {statistics.median(values):.3f} "
                     f"[{min(values):.3f}-{max(values):.3f}]")
    mean, error = mean_change(ratios)
    return lines, mean, error


def same_digests(out, prefix, ranks):
    """Whether digests/{prefix}before-npP.txt and {prefix}after-npP.txt are identical."""
    return (out / "digests" / f"{prefix}before-np{ranks}.txt").read_text() == \
        (out / "digests" / f"{prefix}after-np{ranks}.txt").read_text()


def build(root, commit, workdir):
    """A Release build of `commit` (the Python module and gradzip-bench) in a worktree."""
    tree = workdir / commit[:12]
    git(root, "worktree", "add", "--detach", str(tree), commit, check=True)
    env = dict(os.environ)
    log = workdir / f"build-{commit[:12]}.log"
    with open(log, "w") as out:
        done = subprocess.run(["bash", "scripts/configure-and-build.sh", "--target", "_gradzip",
                               "--target", "gradzip-bench"], cwd=tree, env=env, stdout=out,
                              stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"building {commit[:12]} failed (log: {log})")
    return tree / "build"


def build_reducer_digests(build_dir, source, workdir, version):
    """scripts/reducer_digests (from `source`, AFTER's copy) built against `build_dir` installed
    into a prefix of its own; returns the program."""
    prefix, out = workdir / f"prefix-{version}", workdir / f"reducer-{version}"
    log = workdir / f"reducer-{version}.log"
    with open(log, "w") as sink:
        for command in (["cmake", "--install", str(build_dir), "--prefix", str(prefix)],
                        ["cmake", "-S", str(source), "-B", str(out), f"-DCMAKE_PREFIX_PATH={prefix}",
                         "-DCMAKE_BUILD_TYPE=Release"],
                        ["cmake", "--build", str(out)]):
            if subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT).returncode != 0:
                raise SystemExit(f"building the Reducer's digests against {version} failed (log: {log})")
    return out / "reducer_digests"


def mpirun(ranks, command, env):
    base = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"]
    if "PYTHONPATH" in env:
        base += ["-x", "PYTHONPATH"]
    return subprocess.run(base + command, env=env, capture_output=True, text=True, timeout=900)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    before = git(ROOT, "rev-parse", "--verify", f"{args.before}^{{commit}}", check=True).stdout.strip()
    after = git(ROOT, "rev-parse", "--verify", f"{args.after}^{{commit}}", check=True).stdout.strip()
    out = Path(args.out) if args.out else (
        ROOT / "docs" / "data" / "refactor-proofs" / f"{datetime.date.today()}-{after[:12]}")
    (out / "digests").mkdir(parents=True, exist_ok=True)
    (out / "bench").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    workdir = Path(tempfile.mkdtemp(prefix="gradzip-proof-"))
    builds = {}
    try:
        for version, commit in (("before", before), ("after", after)):
            print(f"building {version} {commit[:12]} in {workdir}", flush=True)
            builds[version] = build(ROOT, commit, workdir)
        digest_script = builds["after"].parent / "scripts" / "result_digests.py"
        for ranks in RANK_COUNTS:
            for version in ("before", "after"):
                run_env = dict(env, PYTHONPATH=str(builds[version] / "python"))
                done = mpirun(ranks, [python, str(digest_script)], run_env)
                if done.returncode != 0:
                    raise SystemExit(f"digests of {version}, {ranks} ranks failed:\n{done.stderr[-2000:]}")
                (out / "digests" / f"{version}-np{ranks}.txt").write_text(done.stdout)
            print(f"digests, {ranks} ranks: "
                  f"{'identical' if same_digests(out, '', ranks) else 'DIFFERENT'}", flush=True)
        reducer_source = builds["after"].parent / "scripts" / "reducer_digests"
        programs = {version: build_reducer_digests(builds[version], reducer_source, workdir, version)
                    for version in ("before", "after")}
        for ranks in RANK_COUNTS:
            for version in ("before", "after"):
                done = mpirun(ranks, [str(programs[version])], dict(env))
                if done.returncode != 0:
                    raise SystemExit(f"Reducer digests of {version}, {ranks} ranks failed:\n"
                                     f"{done.stderr[-2000:]}")
                (out / "digests" / f"reducer-{version}-np{ranks}.txt").write_text(done.stdout)
            print(f"Reducer digests, {ranks} ranks: "
                  f"{'identical' if same_digests(out, 'reducer-', ranks) else 'DIFFERENT'}", flush=True)
        loads = []
        avx512 = "avx512f" in Path("/proc/cpuinfo").read_text()
        for r in range(1, args.rounds + 1):
            order = ("before", "after") if r % 2 else ("after", "before")
            load_before = list(os.getloadavg())
            for version in order:
                bench = str(builds[version] / "bin" / "gradzip-bench")
                sizes = [a for s in ALLREDUCE_SIZES for a in ("--size", str(s))]
                done = mpirun(4, [bench, "allreduce", *sizes, "--iters", "20", "--json",
                                  str(out / "bench" / f"allreduce-{version}-{r}.json")], env)
                if done.returncode != 0:
                    raise SystemExit(f"allreduce bench of {version} failed:\n{done.stderr[-2000:]}")
                done = mpirun(4, [bench, "overlap", "--model", "small", "--iters", "10", "--json",
                                  str(out / "bench" / f"overlap-{version}-{r}.json")], env)
                if done.returncode != 0:
                    raise SystemExit(f"overlap bench of {version} failed:\n{done.stderr[-2000:]}")
                # The codecs at the CPU's own ISA and, on an AVX-512 CPU, with the AVX2 kernels too.
                for kind, isa in [("codecs", [])] + ([("codecs-avx2", ["--isa", "avx2"])] if avx512 else []):
                    done = subprocess.run([bench, "codecs", "--size", str(CODEC_ELEMENTS), "--repeat", "5",
                                           *isa, "--json", str(out / "bench" / f"{kind}-{version}-{r}.json")],
                                          capture_output=True, text=True, timeout=900)
                    if done.returncode != 0:
                        raise SystemExit(f"{kind} bench of {version} failed:\n{done.stderr[-2000:]}")
            loads.append({"round": r, "order": list(order), "load_average_before": load_before,
                          "load_average_after": list(os.getloadavg())})
            print(f"round {r} of {args.rounds} done (load {loads[-1]['load_average_after'][0]:.2f})",
                  flush=True)
    finally:
        for version, build_dir in builds.items():
            git(ROOT, "worktree", "remove", "--force", str(build_dir.parent))
        git(ROOT, "worktree", "prune")
        shutil.rmtree(workdir, ignore_errors=True)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    proof = {
        "before": before, "after": after, "rounds": args.rounds,
        "changed_measured_paths": changed_measured_paths(ROOT, before, after, measured_paths(ROOT)),
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "date": str(datetime.date.today())},
        "rank_counts": RANK_COUNTS, "allreduce_sizes": ALLREDUCE_SIZES,
        "codec_elements": CODEC_ELEMENTS, "round_loads": loads,
        "command": f"python3 scripts/prove_refactor.py {before[:12]} --after {after[:12]} "
                   f"--rounds {args.rounds}",
    }
    (out / "proof.json").write_text(json.dumps(proof, indent=1) + "\n")
    lines, mean, error = speed_summary(out, args.rounds)
    _, problems = verify(ROOT, out)
    same = [f"{label}digests, {ranks} ranks: " +
            ("identical" if same_digests(out, prefix, ranks) else "DIFFERENT")
            for label, prefix in (("", ""), ("Reducer ", "reducer-")) for ranks in RANK_COUNTS]
    summary = [f"{proof['command']}", *same,
               "after / before, median [min-max] of the rounds' paired ratios:", *lines,
               f"geometric mean over {len(lines)} rows: {mean:.4f} (two standard errors: "
               f"{math.exp(math.log(mean) - 2 * error):.4f}-{math.exp(math.log(mean) + 2 * error):.4f})",
               *[f"REJECTED {problem}" for problem in problems],
               "accepted" if not problems else "rejected"]
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    print("\n".join(summary[len(same) + 1:]))
    print(f"{out}: written")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
