#!/usr/bin/env python3
"""Runs the benchmarks behind docs/results.md's generated tables and records their raw data.

    python3 benchmarks/reproduce.py [--quick] [--only SUITE,...] [--rounds N] [--build DIR]
                                    [--data DIR]

(benchmarks/reproduce.sh is the entry point.) Per suite it writes DIR/<suite>.json (default
docs/data/reproduce/), then runs benchmarks/render_results.py on DIR, which rewrites the
generated sections of docs/results.md and README.md, and benchmarks/render_plots.py, which
draws docs/img/'s plots from the same JSON. With a --data other than the default, both render
into copies in DIR (DIR/results.md, DIR/README.md, DIR/img/) and the repository is untouched:

    {"suite": ..., "quick": bool, "command": [...], "rounds_asked": N,
     "machine": {cpu model, cores, memory, kernel, Open MPI, commit, dirty, date, load average},
     "rounds": [{"round": i, "load_average_before": [1, 5, 15 min], "load_average_after": [...],
                 "seconds": wall time, "rows": <the benchmark's own --json output>}, ...]}

Interleaving: one round runs every configuration of the suite once, in a fixed order (the
benchmark's own loop: A B C), and the rounds repeat it (A B C A B C ...), so that a slow spell of
this shared machine lands on all configurations alike instead of on one of them; the renderer
reports the median over rounds with the min-max spread.

Suites:
  codecs             gradzip-bench codecs (every default codec; encode/decode vs memcpy)
  allreduce_shm      gradzip-bench allreduce --check, 4 ranks over shared memory
  allreduce_cluster  the same inside benchmarks/emulated_cluster.sh (4 namespaces, 1 Gbit/s
                     links; needs root for the namespaces)
  overlap            gradzip-bench overlap in the emulated cluster (4 ranks, 1 Gbit/s,
                     4 MiB buckets): how much of the communication backward hides
  convergence        benchmarks/convergence.sh: Fashion-MNIST, 4 ranks, 5 epochs per
                     configuration (--quick: 1 epoch, none and topk1_ef), one round per seed
                     (1, 2, 3); a round's rows are the training CSVs' per-epoch lines
  peers              benchmarks/peers/ddp_peers.py in the emulated cluster (4 ranks, 1 Gbit/s):
                     PyTorch DDP's all-reduce, its fp16 and PowerSGD hooks, and gradzip's hook
                     (none, fp16, qsgd-4, sign, top-k 1%, PowerSGD-4, algo=auto) on a 24.2M-
                     parameter model (--quick: 1.9M), step time and bytes; needs root and a
                     Python with torch (see torch_python)
  fsdp               benchmarks/fsdp/fsdp_train.py in the emulated cluster (4 ranks, 1 Gbit/s):
                     FSDP2's own reduce-scatter against compress_fsdp (none, fp16, qsgd-4, top-k
                     1%) on a byte-level transformer with AdamW: loss curves, bytes, step time
  fsdp_hybrid        the same as hybrid sharding over 2 nodes of 2 ranks (1 Gbit/s between
                     nodes): FSDP's native hybrid sharding against gradzip's compressed
                     all-reduce across nodes, on a wider model: step time and bytes
  lm, cnn            benchmarks/convergence_ddp/ddp_train.py: convergence through the DDP hook
                     (lm: a byte-level GPT with AdamW on Debian's fortunes; cnn: a CNN with SGD +
                     momentum on Fashion-MNIST), every configuration (PyTorch's DDP, fp16 and
                     PowerSGD hooks, gradzip's codecs and the remedies), 4 ranks under torchrun
                     over loopback, one round per seed (1, 2, 3); then the same configurations'
                     step times in the emulated cluster (4 ranks, 1 Gbit/s) for the time to
                     accuracy. --quick: the first 150 steps of a few configurations. Needs root
                     and a Python with torch
  cost_model         the cost model's validation and projection: the all-reduces of
                     VALIDATION_CODECS in the emulated cluster at P = 2, 3, 4, then
                     `gradzip-bench model --validate ... --json` (every row's error, median,
                     90th percentile, max; BERT-large projected with algo=auto's choices;
                     break-even link speeds); needs root
What each suite measures (the paths whose change stales its figures) is listed in
benchmarks/measured_code.py; tests/lint/check_results_fresh.py names the suites to run again.

--quick: smaller sizes, fewer iterations and 3 rounds (every figure is still measured; the
tables say "quick"). A suite that fails stops the script with its output; the JSON of the
suites before it stays.
"""
import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import plot_convergence  # benchmarks/: read_runs, the checked reader of convergence.sh's CSVs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = ["mpirun", "-np", "4", "--oversubscribe", "--bind-to", "none"]


# The convergence configurations (benchmarks/convergence.sh labels): the uncompressed baseline,
# every codec once with its default error feedback, and the variants the README discusses.
CONVERGENCE_LABELS = ["none", "fp16", "bf16", "qsgd4", "qsgd2", "terngrad_ef", "sign_ef", "sign_noef",
                      "topk1_ef", "topk1_noef", "topk01_ef", "randk1_ef", "powersgd4"]
CONVERGENCE_QUICK_LABELS = ["none", "topk1_ef"]

# The all-reduces the cost model is validated against: every default algorithm, and the ones
# algo=auto may switch to (rhd for the dense codecs, the tree), at P = 2, 3, 4.
VALIDATION_CODECS = ["--codec", "none", "--codec", "fp16", "--codec", "qsgd:bits=4",
                     "--codec", "sign", "--codec", "topk:ratio=0.01", "--codec", "randk:ratio=0.01",
                     "--codec", "none:algo=rhd", "--codec", "qsgd:bits=4,algo=rhd",
                     "--codec", "fp16:algo=tree", "--codec", "qsgd:bits=4,algo=tree"]


def suites(build, quick, python):
    """suite -> (rounds, command, whether it needs root, extra environment). A command is one
    argv, or a list of argvs that a round runs in turn. In a command, {json} is the path the
    benchmark writes its rows to; {out} a scratch folder whose CSVs (convergence.sh's csv/) are
    the rows instead; {seed} the round's seed (1, 2, ...); {scratch} (within an argument) the
    round's scratch folder, for the files one step hands the next.
    `python`: the interpreter with torch that runs the peers suite."""
    bench = os.path.join(build, "bin", "gradzip-bench")
    cluster = ["bash", os.path.join(ROOT, "benchmarks", "emulated_cluster.sh"), "--bench", bench]
    sizes = ["--size", "1048576", "--size", "8388608" if quick else "67108864"]
    iters = ["--iters", "3" if quick else "5"]
    return {
        "codecs": (3 if quick else 5,
                   [bench, "codecs", "--size", "4194304" if quick else "16777216",
                    "--repeat", "3" if quick else "5", "--json", "{json}"], False, {}),
        "allreduce_shm": (3 if quick else 5,
                          MPIRUN + [bench, "allreduce", *sizes, *iters, "--check",
                                    "--json", "{json}"], False, {}),
        "allreduce_cluster": (3,
                              cluster + ["--", *sizes, *iters, "--check", "--link-gbps", "1",
                                         "--json", "{json}"],
                              True, {}),
        "overlap": (3,
                    cluster + ["--ranks", "4", "--rate", "1gbit", "--command", "overlap", "--",
                               "--model", "small" if quick else "25m",
                               "--batch", "1024" if quick else "448",
                               "--iters", "3" if quick else "5", "--warmup", "1",
                               "--bucket-bytes", "4194304", "--json", "{json}"], True, {}),
        "convergence": (3,
                        ["bash", os.path.join(ROOT, "benchmarks", "convergence.sh"),
                         "--build", build, "--epochs", "1" if quick else "5", "--seed", "{seed}",
                         "--only", ",".join(CONVERGENCE_QUICK_LABELS if quick
                                            else CONVERGENCE_LABELS),
                         "--out", "{out}"], False, {}),
        # One job per round runs every configuration one after the other (ddp_peers.py's own
        # loop), each from the same initial model; 10 steps, 7 of them timed. No accuracy: ten
        # steps train nothing worth scoring (the convergence suite is the accuracy evidence,
        # and ctest's python.peers_smoke.np2 checks that each configuration trains).
        "peers": (3,
                  cluster + ["--ranks", "4", "--rate", "1gbit", "--exec", "--", python,
                             os.path.join(ROOT, "benchmarks", "peers", "ddp_peers.py"),
                             *(["--hidden", "1024,1024", "--steps", "6", "--warmup", "2",
                                "--timed", "4"] if quick else
                               ["--steps", "10", "--warmup", "3", "--timed", "7"]),
                             "--batch", "64", "--test-images", "0", "--json", "{json}"],
                  True, {"PYTHONPATH": os.path.join(build, "python")}),
        # FSDP2 (fully_shard) with FSDP's own reduction against compress_fsdp's codecs on a
        # byte-level transformer with AdamW (benchmarks/fsdp/fsdp_train.py), every configuration
        # in one job from the same model and data order. fsdp: 1-D sharding over 4 ranks, each
        # in its own namespace (loss curves, bytes, step time). fsdp_hybrid: 2 nodes of 2 ranks
        # (the ranks of a node share its namespace and loopback; 1 Gbit/s between nodes), FSDP's
        # native hybrid sharding against gradzip's compressed all-reduce across nodes, on a wider
        # model with a small batch, so that the link matters (step time and bytes).
        "fsdp": (3,
                 cluster + ["--ranks", "4", "--rate", "1gbit", "--exec", "--", python,
                            os.path.join(ROOT, "benchmarks", "fsdp", "fsdp_train.py"),
                            *(["--steps", "20", "--eval-every", "10", "--width", "128"] if quick else
                              ["--steps", "60", "--eval-every", "15"]),
                            "--batch", "16", "--context", "64", "--json", "{json}"],
                 True, {"PYTHONPATH": os.path.join(build, "python")}),
        "fsdp_hybrid": (3,
                        cluster + ["--ranks", "4", "--ranks-per-node", "2", "--rate", "1gbit",
                                   "--exec", "--", python,
                                   os.path.join(ROOT, "benchmarks", "fsdp", "fsdp_train.py"),
                                   "--nodes", "2",
                                   *(["--steps", "8", "--width", "256"] if quick else
                                     ["--steps", "24", "--width", "512"]),
                                   "--warmup", "3", "--eval-every", "1000", "--batch", "8",
                                   "--context", "32", "--json", "{json}"],
                        True, {"PYTHONPATH": os.path.join(build, "python")}),
        # Convergence through the DDP hook (benchmarks/convergence_ddp/ddp_train.py), one round
        # per seed: every configuration trained under torchrun (4 ranks on loopback; gradzip over
        # torch.distributed), then their step times in the emulated cluster (4 ranks, 1 Gbit/s,
        # gradzip over MPI), whose JSON carries the convergence run's (--attach).
        **{workload: (3, [
            [python, "-m", "torch.distributed.run", "--nproc_per_node", "4", "--master_port", "29731",
             os.path.join(ROOT, "benchmarks", "convergence_ddp", "ddp_train.py"),
             "--workload", workload, "--seed", "{seed}", *(["--quick"] if quick else []),
             "--json", "{scratch}/convergence.json"],
            cluster + ["--ranks", "4", "--rate", "1gbit", "--exec", "--", python,
                       os.path.join(ROOT, "benchmarks", "convergence_ddp", "ddp_train.py"),
                       "--workload", workload, "--seed", "{seed}", "--timing",
                       *(["--quick", "--warmup", "2", "--timed", "3"] if quick else []),
                       "--attach", "convergence={scratch}/convergence.json", "--json", "{json}"]],
            True, {"PYTHONPATH": os.path.join(build, "python")}) for workload in ("lm", "cnn")},
        # A round: the validation all-reduces in the emulated cluster at P = 2, 3, 4 (1 Gbit/s),
        # then `gradzip-bench model` compares the model with those rows (γ measured here, the
        # link not fitted: the tc rate times TCP's payload share, α = 15 us) and projects
        # BERT-large with what algo=auto would run. The model's JSON is the round's rows.
        "cost_model": (3, [
            *[cluster + ["--ranks", str(p), "--rate", "1gbit", "--",
                         *(["--size", "4096", "--size", "1048576", "--size", "8388608"] if quick
                           else ["--size", "4096", "--size", "1048576", "--size", "16777216",
                                 "--size", "67108864"]),
                         "--iters", "2" if quick else "3", *VALIDATION_CODECS,
                         "--json", f"{{scratch}}/p{p}.json"] for p in (2, 3, 4)],
            [bench, "model", *[a for p in (2, 3, 4) for a in ("--validate", f"{{scratch}}/p{p}.json")],
             "--link-gbps", "1", "--link-latency-us", "15",
             "--sample", "4194304" if quick else "16777216",
             "--models", "bert-large", "--gbps", "1,10,100", "--json", "{json}"]], True, {}),
    }


def run_text(command):
    try:
        return subprocess.run(command, capture_output=True, text=True, check=True,
                              cwd=ROOT).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def machine():
    """What a figure needs beside it: the same commit measured on another 2-core VM can differ
    by 2x (a different CPU model, a different vector ISA)."""
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory_gib = None
    try:
        with open("/proc/meminfo") as f:
            memory_gib = round(int(f.readline().split()[1]) / 2 ** 20, 1)
    except (OSError, ValueError, IndexError):
        pass
    mpi = run_text(["mpirun", "--version"])
    # What this script writes itself (earlier suites' JSON, the rendered tables and plots) does
    # not make a run dirty: only changes to the code and the other files measured do.
    status = run_text(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                       ":!docs/data/reproduce", ":!docs/results.md", ":!README.md", ":!docs/img"])
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "kernel": platform.release(),
        "mpi": mpi.splitlines()[0] if mpi else None,
        "commit": run_text(["git", "rev-parse", "HEAD"]),
        "dirty": bool(status) if status is not None else None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average": list(os.getloadavg()),
    }


def torch_python():
    """The Python that runs the peers suite: $GRADZIP_TORCH_PYTHON, else the current PyTorch of
    scripts/install-deps.sh --torch-venv ($GRADZIP_TORCH_VENV, default
    ~/.cache/gradzip/venv-torch), else python3 (e.g. Debian's python3-torch)."""
    if os.environ.get("GRADZIP_TORCH_PYTHON"):
        return os.environ["GRADZIP_TORCH_PYTHON"]
    venv = os.environ.get("GRADZIP_TORCH_VENV",
                          os.path.join(os.path.expanduser("~"), ".cache", "gradzip", "venv-torch"))
    candidate = os.path.join(venv, "bin", "python")
    return candidate if os.access(candidate, os.X_OK) else shutil.which("python3") or sys.executable


def recorded_path(argument):
    """An argv entry as a record shows it: relative to the repository, or ~/... in the home."""
    if not os.path.isabs(argument):
        return argument
    if argument.startswith(ROOT + os.sep):
        return os.path.relpath(argument, ROOT)
    home = os.path.expanduser("~")
    if home != "/" and argument.startswith(home + os.sep):
        return "~" + argument[len(home):]
    return argument


def steps_of(command):
    """A suite's command as the list of argvs a round runs."""
    return command if isinstance(command[0], list) else [command]


def run_suite(name, rounds, command, environment, data_dir, quick):
    # Paths inside the repository are recorded relative to it, and those in the home directory
    # (the PyTorch virtual environment) as ~/..., so that the rendered command is the same
    # whichever checkout and user renders it.
    steps = steps_of(command)
    recorded = [[recorded_path(a) for a in step] for step in steps]
    recorded = recorded if isinstance(command[0], list) else recorded[0]
    record = {"suite": name, "quick": quick, "command": recorded, "rounds_asked": rounds,
              "machine": machine(), "rounds": []}
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "round.json")
        out = os.path.join(scratch, "out")
        for r in range(rounds):
            round_scratch = os.path.join(scratch, f"round{r}")
            os.makedirs(round_scratch)
            before = list(os.getloadavg())
            began = time.time()
            for step in steps:
                argv = [{"{json}": path, "{out}": out, "{seed}": str(r + 1)}.get(a, a)
                        .replace("{scratch}", round_scratch) for a in step]
                print(f"reproduce: {name} round {r + 1}/{rounds}: {' '.join(argv)}", flush=True)
                done = subprocess.run(argv, cwd=ROOT, env=dict(os.environ, **environment))
                if done.returncode != 0:
                    sys.exit(f"reproduce: {name} round {r + 1} failed (exit {done.returncode})")
            shutil.rmtree(round_scratch)
            if "{out}" in steps[-1]:
                rows = [row for run in plot_convergence.read_runs(out).values() for row in run]
                shutil.rmtree(out)
            else:
                with open(path) as f:
                    rows = json.load(f)
                os.remove(path)
            record["rounds"].append({"round": r, "load_average_before": before,
                                     "load_average_after": list(os.getloadavg()),
                                     "seconds": round(time.time() - began, 1), "rows": rows})
    os.makedirs(data_dir, exist_ok=True)
    out = os.path.join(data_dir, f"{name}.json")
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"reproduce: {name}: wrote {os.path.relpath(out, ROOT)}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="", help="comma-separated suites (default: all)")
    parser.add_argument("--rounds", type=int, default=0, help="override every suite's rounds")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--data", default=os.path.join(ROOT, "docs", "data", "reproduce"))
    args = parser.parse_args()
    python = torch_python()
    table = suites(os.path.abspath(args.build), args.quick, python)
    chosen = [s for s in args.only.split(",") if s] or list(table)
    unknown = [s for s in chosen if s not in table]
    if unknown:
        parser.error(f"unknown suites {unknown}; known: {list(table)}")
    if args.rounds < 0:
        parser.error("--rounds must be >= 1 (0: each suite's own)")
    if not os.path.exists(os.path.join(args.build, "bin", "gradzip-bench")):
        sys.exit(f"reproduce: no {args.build}/bin/gradzip-bench: build first")
    if shutil.which("mpirun") is None:
        sys.exit("reproduce: no mpirun on PATH")
    for name in chosen:
        rounds, command, needs_root, environment = table[name]
        if needs_root and os.geteuid() != 0:
            sys.exit(f"reproduce: suite {name} needs root (network namespaces)")
        if any(python in step for step in steps_of(command)) and subprocess.run([python, "-c", "import torch"],
                                                capture_output=True).returncode != 0:
            sys.exit(f"reproduce: suite {name} needs torch, which {python} cannot import "
                     "(scripts/install-deps.sh --torch-venv makes one; GRADZIP_TORCH_PYTHON "
                     "names another)")
        run_suite(name, args.rounds or rounds, command, environment, args.data, args.quick)
    render = [sys.executable, os.path.join(ROOT, "benchmarks", "render_results.py"),
              "--data", args.data]
    images = os.path.join(ROOT, "docs", "img")
    if os.path.abspath(args.data) != os.path.abspath(parser.get_default("data")):
        # Data elsewhere (a trial run): render into copies beside it, not into the repository.
        for name, source in (("results.md", os.path.join(ROOT, "docs", "results.md")),
                             ("README.md", os.path.join(ROOT, "README.md"))):
            shutil.copyfile(source, os.path.join(args.data, name))
        render += ["--results", os.path.join(args.data, "results.md"),
                   "--readme", os.path.join(args.data, "README.md")]
        images = os.path.join(args.data, "img")
    if subprocess.run(render, cwd=ROOT).returncode != 0:
        sys.exit("reproduce: render_results.py failed")
    if importlib.util.find_spec("matplotlib") is None:
        sys.exit(f"reproduce: {sys.executable} has no matplotlib: the tables are rendered, the "
                 "plots are not (benchmarks/render_plots.py draws them)")
    plots = [sys.executable, os.path.join(ROOT, "benchmarks", "render_plots.py"), "--data", args.data,
             "--img", images]
    sys.exit(subprocess.run(plots, cwd=ROOT).returncode)


if __name__ == "__main__":
    main()
