#!/usr/bin/python3
"""Processes with several GradzipStates, or one dropped mid-run, exit with code 0.

Two ways a process that trained correctly ended with std::terminate (exit code 134,
"terminate called without an active exception") at interpreter finalisation, intermittently:
the DDP hook's communication thread (and the torch transport's send reaper) inside C++ code with
the GIL released (about one run in three before gradzip stopped them at exit); and a gloo worker
thread dropping the last reference to a finished collective's tensors, whose destruction needs
the GIL (about one run in twenty under PyTorch 1.13 before gradzip kept finished works
referenced: _lifecycle.FinishedWorks). So each configuration runs `--reps` times, 2 ranks,
and every run must exit 0 on every rank with "DONE" printed and no "terminate called":

  states=1, states=2, states=5   that many DDP models, each with its own GradzipState, trained
                                 3 steps, left open at exit;
  drop                           a state (and its model) dropped and garbage-collected after
                                 one step, a second one trained on;
  close                          a state closed explicitly (the hook must refuse afterwards) and
                                 one used as a context manager.

Launchers: --launcher mpirun (MPIEXEC --python PY), torchrun-like (tests/python/torchrun_like.py's
environment, PY), torchrun (the real one at --torchrun PATH). Exit 77 (ctest: skipped) when the
launcher or interpreter is missing or PY cannot import torch.
"""
import argparse
import gc
import os
import subprocess
import sys
import time

CONFIGS = ["states=1", "states=2", "states=5", "drop", "close"]


def worker(config):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradzip
    import gradzip.torch

    if gradzip.launched_by_mpi():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['GRADZIP_TEST_PORT']}",
                                rank=int(os.environ["OMPI_COMM_WORLD_RANK"]),
                                world_size=int(os.environ["OMPI_COMM_WORLD_SIZE"]))
    else:
        dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()

    def model_with_state(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        ddp = DDP(model)
        state = gradzip.torch.GradzipState(model, "topk:ratio=0.1,ef=on")
        ddp.register_comm_hook(state, gradzip.torch.hook)
        return ddp, state

    def train(ddp, steps):
        for step in range(steps):
            inputs = torch.randn(8, 64, generator=torch.Generator().manual_seed(100 * rank + step))
            ddp(inputs).sum().backward()

    if config.startswith("states="):
        pairs = [model_with_state(i) for i in range(int(config.split("=")[1]))]
        for _ in range(3):
            for ddp, _state in pairs:
                train(ddp, 1)
    elif config == "drop":
        ddp, state = model_with_state(0)
        train(ddp, 1)
        del ddp, state
        gc.collect()
        ddp, state = model_with_state(1)
        train(ddp, 3)
    elif config == "close":
        ddp, state = model_with_state(0)
        train(ddp, 2)
        assert state.close() and state.closed
        try:
            train(ddp, 1)
            raise AssertionError("the hook of a closed state ran")
        except RuntimeError as error:
            assert "closed" in str(error), error
        with model_with_state(1)[1] as scoped:
            assert not scoped.closed
        assert scoped.closed
    print(f"DONE rank={rank} config={config}", flush=True)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", choices=["mpirun", "torchrun-like", "torchrun"])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--mpirun", default="mpirun")
    parser.add_argument("--torchrun")
    parser.add_argument("--port", type=int, default=29851)
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help="comma-separated subset of " + ", ".join(CONFIGS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    if args.launcher is None:
        parser.error("--launcher is required")

    here = os.path.dirname(os.path.abspath(__file__))
    if not os.path.exists(args.python) or subprocess.run(
            [args.python, "-c", "import torch"], capture_output=True).returncode != 0:
        print(f"SKIP: {args.python} cannot import torch")
        return 77
    if args.launcher == "torchrun" and not (args.torchrun and os.path.exists(args.torchrun)):
        print(f"SKIP: no torchrun at {args.torchrun}")
        return 77
    sys.path.insert(0, here)
    from torchrun_like import run as run_torchrun_like

    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown --configs {unknown}; known: {CONFIGS}")
    failures = []
    start = time.monotonic()
    for rep in range(args.reps):
        for config in configs:
            port = args.port + (rep * len(configs) + configs.index(config)) % 40
            script = [os.path.abspath(__file__), "--worker", config]
            if args.launcher == "mpirun":
                command = [args.mpirun, "--oversubscribe", "--bind-to", "none", "-np", "2",
                           "-x", f"GRADZIP_TEST_PORT={port}", args.python] + script
                result = subprocess.run(command, capture_output=True, text=True, timeout=300)
                codes, output = [result.returncode], result.stdout + result.stderr
            elif args.launcher == "torchrun":
                command = [args.torchrun, "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                           "--master_port", str(port)] + script
                result = subprocess.run(command, capture_output=True, text=True, timeout=300)
                codes, output = [result.returncode], result.stdout + result.stderr
            else:
                codes, outputs, timed_out = run_torchrun_like([args.python] + script, 2, port, 300)
                output = "".join(outputs) + ("\nTIMED OUT" if timed_out else "")
            done = output.count("DONE rank=")
            if any(code != 0 for code in codes) or done != 2 or "terminate called" in output:
                failures.append(f"rep {rep} {config}: exit {codes}, {done} of 2 DONE\n{output[-1500:]}")
    runs = args.reps * len(configs)
    print(f"{args.launcher}: {runs - len(failures)} of {runs} runs exited 0 on both ranks "
          f"({time.monotonic() - start:.0f} s)")
    for failure in failures:
        print("FAIL " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
