#!/usr/bin/env python3
"""Fashion-MNIST with PyTorch DistributedDataParallel and gradzip's communication hook.

The C++ example's task (examples/train_fashion_mnist.cpp) in PyTorch: MLP 784-512-256-10, SGD
with momentum 0.9, learning rate 0.1 on a cosine schedule down to 0, a global batch of 240 split
over the ranks, 5 epochs. Run it under torchrun (gradzip's collectives then go over
torch.distributed, on a gloo group of gradzip's own):

    torchrun --nproc_per_node 2 examples/torch_ddp_fashion_mnist.py --spec topk:ratio=0.01,ef=on

or under mpirun (gradzip's collectives go over MPI; the process group is gloo over loopback):

    mpirun -np 2 /usr/bin/python3 examples/torch_ddp_fashion_mnist.py --spec none
    mpirun -np 2 /usr/bin/python3 examples/torch_ddp_fashion_mnist.py --spec topk:ratio=0.01,ef=on

(as root add OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 to the environment; on few
cores add --oversubscribe --bind-to none). PYTHONPATH=<build>/python finds gradzip in a build tree.
Rank 0 prints, per epoch, the test accuracy and the bytes gradzip sent from rank 0.

Options: --epochs N [5]  --spec SPEC [topk:ratio=0.01,ef=on]  --warmup STEPS [0]
         --data DIR [/usr/share/datasets/fashion-mnist]  --max-steps N (stop early; 0: no limit)
         --port P [29650] (under mpirun: the gloo rendezvous on 127.0.0.1; torchrun gives its own)
"""
import argparse
import gzip
import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradzip.torch


def read_idx(path):
    """A gzip'd IDX file (images: uint8 [n, 28, 28]; labels: uint8 [n]) as a NumPy array."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    if magic >> 8 != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes (magic {magic:#x})")
    dims = magic & 0xFF
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(folder, split):
    images = read_idx(os.path.join(folder, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(folder, f"{split}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
    return x, torch.from_numpy(labels.astype(np.int64))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--spec", default="topk:ratio=0.01,ef=on")
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--max-steps", type=int, default=0)
    parser.add_argument("--port", type=int, default=29650)
    parser.add_argument("--batch", type=int, default=240, help="global batch")
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    if "WORLD_SIZE" in os.environ and not gradzip.launched_by_mpi():  # torchrun
        dist.init_process_group("gloo", init_method="env://")
    else:  # mpirun, or one process on its own
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                rank=int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")),
                                world_size=int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} does not split over {world} ranks")
    local_batch = args.batch // world

    train_x, train_y = load(args.data, "train")
    test_x, test_y = load(args.data, "t10k")
    torch.manual_seed(1)  # the same initial model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    ddp = DDP(model)

    # ---- gradzip: the ONE-LINE change (state + hook); without it DDP all-reduces uncompressed ----
    state = gradzip.torch.GradzipState(model, spec=args.spec, warmup=args.warmup)
    ddp.register_comm_hook(state, gradzip.torch.hook)
    # -----------------------------------------------------------------------------------------

    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    steps_per_epoch = len(train_x) // args.batch
    total_steps = steps_per_epoch * args.epochs
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.5 * (1.0 + math.cos(math.pi * min(s, total_steps) / total_steps)))
    if rank == 0:
        print(f"gradzip {gradzip.__version__}: {world} ranks, spec {state.spec.split(',')[0]}..., "
              f"global batch {args.batch}, {total_steps} steps, over {state.communicator.transport} "
              f"(torch {torch.__version__})", flush=True)

    step = 0
    for epoch in range(args.epochs):
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(epoch))
        sent = 0
        began = time.time()
        loss_sum = 0.0
        epoch_steps = 0
        for s in range(steps_per_epoch):
            if step >= total_steps:
                break
            index = order[s * args.batch + rank * local_batch:s * args.batch + (rank + 1) * local_batch]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(train_x[index]), train_y[index])
            loss.backward()
            optimizer.step()
            scheduler.step()
            sent += sum(stats["sent_bytes"] for stats in state.last_stats.values())
            loss_sum += loss.item()
            epoch_steps += 1
            step += 1
        with torch.no_grad():
            accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
        if rank == 0 and epoch_steps:
            print(f"epoch {epoch + 1}: steps {epoch_steps}  train loss {loss_sum / epoch_steps:.4f}  "
                  f"test accuracy {accuracy:.4f}  gradzip bytes sent (rank 0) {sent}  "
                  f"{time.time() - began:.1f} s", flush=True)
        if step >= total_steps:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
