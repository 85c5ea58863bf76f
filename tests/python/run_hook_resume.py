#!/usr/bin/python3
"""A job resumed from a DDP-hook checkpoint continues bit for bit like the uninterrupted job.

For every codec with its default algorithm (and sign over the ring, SRA and the tree, qsgd over
recursive halving/doubling, whose per-hop, owner and root residuals a checkpoint must keep apart
from the worker's), 2 ranks:

  first job    trains 2N iterations; after N it saves the model's, the optimizer's and the
               GradzipState's state_dict() (torch.save), and at the end the parameters;
  second job   (new processes) builds everything afresh from another seed, loads the three
               state dicts and trains iterations N..2N-1.

The second job's parameters must equal the first job's bit for bit, for every spec: a
checkpoint that lost a residual, a call's random draws or algo=auto's measured choice, or a
state_dict() that changed the run that took it (the first job takes it mid-run), fails here.
The model's layers are declared in the order forward uses them, so DDP's first buckets in the
second job have the layout of the rebuilt ones the first job checkpointed; the second job also
checks that every saved bucket was restored exactly (not from per-parameter slices).

Launchers: torchrun-like (tests/python/torchrun_like.py's environment, --python PY) or the real
torchrun at --torchrun PATH. Exit 77 (ctest: skipped) when PY cannot import torch or there is
no torchrun at PATH; 0 when every spec resumed exactly; else 1.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

SPECS = ["none", "fp16", "bf16", "qsgd:bits=4", "terngrad", "sign", "sign:algo=ring",
         "sign:algo=sra", "sign:algo=tree", "qsgd:bits=4,algo=rhd", "topk:ratio=0.01",
         "randk:ratio=0.01", "powersgd:rank=4"]


def make_model(seed):
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                               torch.nn.ReLU(), torch.nn.Linear(512, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


def train_step(ddp, optimizer, rank, iteration):
    import torch
    g = torch.Generator().manual_seed(1000 * iteration + rank)
    x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
    optimizer.zero_grad(set_to_none=False)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    optimizer.step()


def worker(phase, directory, steps):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradzip
    import gradzip.torch

    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    mismatches = []
    for index, spec in enumerate(SPECS):
        model = make_model(0 if phase == "first" else 99)
        ddp = DDP(model, bucket_cap_mb=0.5)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        state = gradzip.torch.GradzipState(model, spec, communicator=gradzip.Communicator())
        ddp.register_comm_hook(state, gradzip.torch.hook)
        checkpoint = os.path.join(directory, f"spec{index}.rank{rank}.pt")
        final = os.path.join(directory, f"spec{index}.rank{rank}.final.pt")
        if phase == "first":
            for iteration in range(2 * steps):
                if iteration == steps:
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "gradzip": state.state_dict()}, checkpoint)
                train_step(ddp, optimizer, rank, iteration)
            torch.save([p.detach().clone() for p in model.parameters()], final)
            print(f"SAVED rank={rank} spec={spec}", flush=True)
        else:
            # NumPy arrays inside: not a weights-only file (PyTorch >= 2.6 defaults to that)
            saved = torch.load(checkpoint, weights_only=False)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            state.load_state_dict(saved["gradzip"])
            buckets = set(saved["gradzip"]["buckets"])
            for iteration in range(steps, 2 * steps):
                train_step(ddp, optimizer, rank, iteration)
                if iteration == steps:
                    # every saved bucket was made again by DDP and restored exactly
                    left = sorted(state._saved_buckets)
                    now = {name for name, _ in state._layouts.values()}
                    if left or (buckets and not buckets <= now):
                        mismatches.append(f"{spec}: saved buckets {sorted(buckets)} not all "
                                          f"restored exactly (left {left}, now {sorted(now)})")
            expected = torch.load(final)
            worst = max(float((p.detach() - e).abs().max()) for p, e in zip(model.parameters(), expected))
            same = all(torch.equal(p.detach(), e) for p, e in zip(model.parameters(), expected))
            print(f"RESUMED rank={rank} spec={spec}: {'bitwise equal' if same else 'DIFFERS'} "
                  f"(max |difference| {worst:.3g})", flush=True)
            if not same:
                mismatches.append(f"{spec}: resumed parameters differ by up to {worst:.3g}")
        state.close()
    dist.destroy_process_group()
    for mismatch in mismatches:
        print(f"MISMATCH rank={rank} {mismatch}", flush=True)
    print(f"DONE rank={rank} phase={phase}", flush=True)
    return 1 if mismatches else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--torchrun", help="the real torchrun to start the jobs with")
    parser.add_argument("--port", type=int, default=29871)
    parser.add_argument("--steps", type=int, default=3, help="N: iterations before and after")
    parser.add_argument("--worker", nargs=2, metavar=("PHASE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker[0], args.worker[1], args.steps)

    if not os.path.exists(args.python) or subprocess.run(
            [args.python, "-c", "import torch"], capture_output=True).returncode != 0:
        print(f"SKIP: {args.python} cannot import torch")
        return 77
    if args.torchrun is not None and not os.path.exists(args.torchrun):
        print(f"SKIP: no torchrun at {args.torchrun} (scripts/install-deps.sh --torch-venv makes it)")
        return 77
    here = os.path.dirname(os.path.abspath(__file__))
    directory = tempfile.mkdtemp(prefix="gradzip-hook-resume-")
    try:
        for offset, phase in enumerate(["first", "resume"]):
            script = [os.path.abspath(__file__), "--steps", str(args.steps), "--worker", phase, directory]
            command = [sys.executable, os.path.join(here, "torchrun_like.py"), "--nproc", "2",
                       "--port", str(args.port + offset), "--timeout", "400"]
            if args.torchrun:
                command += ["--torchrun", args.torchrun, "--"] + script
            else:
                command += ["--"] + [args.python] + script
            result = subprocess.run(command, capture_output=True, text=True, timeout=500)
            output = result.stdout + result.stderr
            print(output)
            done = output.count(f"phase={phase}")
            if result.returncode == 77:
                print(f"SKIP: the launcher could not start the {phase} job (its reason is above)")
                return 77
            if result.returncode != 0 or done != 2:
                print(f"FAIL: the {phase} job exited {result.returncode} with {done} of 2 ranks done")
                return 1
        resumed = sum(output.count(f"spec={spec}: bitwise equal") for spec in SPECS)
        print(f"{resumed} of {2 * len(SPECS)} (rank, spec) pairs resumed bit for bit")
        return 0 if resumed == 2 * len(SPECS) else 1
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
