#!/usr/bin/python3
"""A torchrun-style launch without mpirun: gradzip runs over torch.distributed, or refuses;
it never trains unsynchronised.

torchrun starts each process with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set
and no MPI launcher around it, so each process's MPI world is a singleton of one rank: an MPI
communicator's all-reduce would return each rank's own gradient. This driver starts 2 processes
exactly that way (tests/python/torchrun_like.py's environment: Debian's torch 1.13 torchrun
fails on Python 3.11) and each must see:

  1. gradzip.Communicator() refused with gradzip.Error, code invalid_argument, naming WORLD_SIZE
     and init_process_group, before torch.distributed is initialised; after it,
     Communicator(transport="mpi") refused naming torch.distributed's process group, and
     Communicator() running over torch.distributed ("torch", 2 ranks, an exact sum); and
     Communicator(transport="torch") before init_process_group refused naming it;
  2. gradzip.torch.GradzipState with a one-rank communicator (the binding's own, which does not
     check) refused at construction, naming the process group's 2 ranks and mpirun;
  3. a state made before torch.distributed existed (nothing to compare with then) refused at the
     hook's first call: the backward through DDP raises instead of completing;
  4. the same state check passes for a communicator of the group's size (the positive control:
     a state over a fake 2-rank communicator is accepted), so the refusals are about the size.

Each process prints "VERDICT rank=R ok=1" or the failures; the driver requires both within an
outer bound (a hang fails). Exit 77 (ctest: skipped) when torch is not importable.

Usage: run_torchrun_launch.py [--port PORT]   (PYTHONPATH must reach the gradzip package)
"""
import argparse
import os
import subprocess
import sys
import time

from torchrun_like import torchrun_environment

WORLD = 2
OUTER_BOUND_S = 240


def worker():
    rank = int(os.environ["RANK"])
    failures = []

    def expect_refusal(what, action, *needles):
        try:
            action()
        except gradzip.Error as error:
            text = str(error)
            if getattr(error, "code", None) != "invalid_argument":
                failures.append(f"{what}: code {getattr(error, 'code', None)!r}, not invalid_argument")
            for needle in needles:
                if needle not in text:
                    failures.append(f"{what}: the message lacks {needle!r}: {text}")
            return
        except Exception as error:  # noqa: BLE001 - any other type is a failure to report
            failures.append(f"{what}: raised {type(error).__name__}: {error}, not gradzip.Error")
            return
        failures.append(f"{what}: was not refused")

    import gradzip
    import gradzip.torch
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    singleton = gradzip._gradzip.Communicator()  # the binding's own: no launch check
    if singleton.size != 1:
        failures.append(f"the MPI world has {singleton.size} ranks; this launch should give 1")

    # 1, before torch.distributed: WORLD_SIZE says 2.
    expect_refusal("Communicator() before init_process_group", gradzip.Communicator,
                   "WORLD_SIZE", "says 2", "init_process_group", "mpirun")
    expect_refusal("Communicator(transport='torch') before init_process_group",
                   lambda: gradzip.Communicator(transport="torch"),
                   "torch.distributed is not initialised", "init_process_group")
    # 3, first half: no WORLD_SIZE and no process group yet, so nothing to compare with.
    world_size = os.environ.pop("WORLD_SIZE")
    early_state = gradzip.torch.GradzipState(model, "none", communicator=singleton)
    os.environ["WORLD_SIZE"] = world_size

    dist.init_process_group("gloo", init_method="env://")
    # 1, after: the process group says 2; over MPI refused, over torch.distributed it works.
    expect_refusal("Communicator(transport='mpi') after init_process_group",
                   lambda: gradzip.Communicator(transport="mpi"),
                   "torch.distributed's process group", "mpirun")
    over_torch = gradzip.Communicator()
    if (over_torch.transport_name, over_torch.size, over_torch.rank) != ("torch", WORLD, rank):
        failures.append(f"Communicator() after init_process_group: {over_torch.transport_name}, "
                        f"{over_torch.size} ranks, rank {over_torch.rank}; expected torch, {WORLD}, {rank}")
    values = torch.arange(4096, dtype=torch.float32) * (rank + 1)
    over_torch.allreduce(values, "launch-check", "none:min_bytes=0")
    expected = torch.arange(4096, dtype=torch.float32) * sum(range(1, WORLD + 1))
    if not torch.equal(values, expected):
        failures.append(f"the all-reduce over torch.distributed is off by "
                        f"{(values - expected).abs().max().item()}")
    # 2.
    expect_refusal("GradzipState(communicator of 1 rank)",
                   lambda: gradzip.torch.GradzipState(model, "none", communicator=singleton),
                   "spans 1 rank(s)", "says 2", "mpirun")

    # 3, second half: the hook refuses at its first call.
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(early_state, gradzip.torch.hook)
    inputs = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
    try:
        ddp(inputs).sum().backward()
        failures.append("a backward through the hook of a one-rank communicator completed")
    except Exception as error:  # noqa: BLE001 - DDP may wrap gradzip.Error in RuntimeError
        if "mpirun" not in str(error) or "spans 1 rank(s)" not in str(error):
            failures.append(f"the hook's refusal does not say why: {type(error).__name__}: {error}")

    # 4: a communicator-like object of the group's size is accepted by the same check.
    class TwoRanks:
        size = WORLD
    try:
        gradzip.torch.GradzipState(model, "none", communicator=TwoRanks())
    except Exception as error:  # noqa: BLE001
        failures.append(f"a communicator of the group's size was refused: {error}")

    dist.barrier()
    dist.destroy_process_group()
    for failure in failures:
        print(f"rank {rank} FAIL: {failure}", flush=True)
    print(f"VERDICT rank={rank} ok={0 if failures else 1}", flush=True)
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=29690)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker()
    try:
        import torch  # noqa: F401
    except ImportError as error:
        print(f"SKIP: torch is not importable ({error})")
        return 77
    start = time.monotonic()
    processes = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"],
                                  env=torchrun_environment(rank, WORLD, args.port), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True)
                 for rank in range(WORLD)]
    ok = True
    for rank, process in enumerate(processes):
        remaining = max(1.0, OUTER_BOUND_S - (time.monotonic() - start))
        try:
            output, _ = process.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            for other in processes:
                if other.poll() is None:
                    os.killpg(other.pid, 9)
            output, _ = process.communicate()
            print(f"rank {rank} FAIL: still running after {OUTER_BOUND_S} s (a hang)")
            ok = False
        print(f"--- rank {rank} (exit {process.returncode}) ---\n{output.rstrip()}")
        if f"VERDICT rank={rank} ok=1" not in output or process.returncode != 0:
            ok = False
    print(f"{'PASS' if ok else 'FAIL'}: a torchrun-style launch of {WORLD} processes without mpirun "
          f"{'was refused at every entry point' if ok else 'was not refused as required'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
