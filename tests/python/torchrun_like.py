#!/usr/bin/python3
"""Runs a command in N processes started the way torchrun starts them (or by torchrun itself).

Each process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and
MASTER_PORT, and none of the variables an MPI launcher sets (so gradzip's transport=auto picks
torch.distributed, as under torchrun). Why not torchrun itself: Debian's PyTorch 1.13 ships a
torchrun that fails on Python 3.11; with a current PyTorch the tests use the real one.

The processes run in their own sessions; all of them must exit 0 within --timeout seconds, else
the ones still running are killed (a hang fails). Each process's output is printed, prefixed by
its rank. Exit: 0 when every process exited 0; 77 (ctest: skipped) when `import torch` fails in
this interpreter; else 1.

With --torchrun PATH the real torchrun at PATH (a current PyTorch's, from a virtual environment)
starts them instead: `PATH --nproc_per_node N --master_port PORT COMMAND...` under the same
outer bound, where COMMAND starts with a Python module's name after "-m" or a script. Exit 77
when PATH does not exist (the environment was not made: scripts/install-deps.sh makes it).

Usage: torchrun_like.py --nproc N --port PORT [--timeout S] [--torchrun PATH] -- COMMAND [ARGS...]
"""
import argparse
import os
import signal
import subprocess
import sys
import time

_MPI_LAUNCHER_PREFIXES = ("OMPI_COMM_WORLD", "OMPI_MCA_", "PMIX_", "PMI_", "ORTE_", "OPAL_",
                          "MPI_LOCALNRANKS", "MPI_LOCALRANKID")


def torchrun_environment(rank, world, port):
    """The environment torchrun gives rank `rank` of `world` on one node (MASTER_PORT `port`),
    with every MPI launcher variable removed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_MPI_LAUNCHER_PREFIXES)}
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), TORCHELASTIC_RUN_ID="gradzip-tests")
    return env


def run(command, world, port, timeout_s):
    """Starts `world` processes of `command`; returns (exit codes, outputs, timed out)."""
    processes = [subprocess.Popen(command, env=torchrun_environment(rank, world, port),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
                 for rank in range(world)]
    start = time.monotonic()
    outputs, codes, timed_out = [], [], False
    for process in processes:
        remaining = max(1.0, timeout_s - (time.monotonic() - start))
        try:
            output, _ = process.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            timed_out = True
            for other in processes:
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
            output, _ = process.communicate()
        outputs.append(output)
        codes.append(process.returncode)
    return codes, outputs, timed_out


def run_real_torchrun(torchrun, command, world, port, timeout_s):
    if not os.path.exists(torchrun):
        print(f"SKIP: {torchrun} does not exist (scripts/install-deps.sh makes the PyTorch "
              f"virtual environment it belongs to)")
        return 77
    env = {k: v for k, v in os.environ.items() if not k.startswith(_MPI_LAUNCHER_PREFIXES)}
    full = [torchrun, "--nproc_per_node", str(world), "--master_addr", "127.0.0.1",
            "--master_port", str(port)] + command
    print("torchrun_like: " + " ".join(full), flush=True)
    process = subprocess.Popen(full, env=env, start_new_session=True)
    try:
        code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        print(f"torchrun_like: torchrun killed after {timeout_s:.0f} s")
        return 1
    print(f"torchrun_like: torchrun exit code {code}")
    return 0 if code == 0 else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=540.0)
    parser.add_argument("--torchrun", help="a real torchrun to start the processes with")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.nproc < 1:
        parser.error("need --nproc >= 1 and a command after --")
    if args.torchrun:
        return run_real_torchrun(args.torchrun, command, args.nproc, args.port, args.timeout)
    try:
        import torch  # noqa: F401
    except ImportError as error:
        print(f"SKIP: torch is not importable ({error})")
        return 77
    codes, outputs, timed_out = run(command, args.nproc, args.port, args.timeout)
    for rank, output in enumerate(outputs):
        for line in output.splitlines():
            print(f"[rank {rank}] {line}")
    print(f"torchrun_like: exit codes {codes}" + (f"; killed after {args.timeout:.0f} s" if timed_out else ""))
    return 0 if not timed_out and all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
