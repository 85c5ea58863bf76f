#!/usr/bin/env python3
"""FSDP2 (fully_shard) with FSDP's own gradient reduction against gradzip's compressed one
(gradzip.torch.compress_fsdp): loss curves, bytes and step time.

One process per rank under mpirun (the emulated cluster: benchmarks/emulated_cluster.sh --exec)
or torchrun; every configuration runs in the same job, one after the other, each from the same
initial model (seed 1) over the same data order:

    fsdp_default     FSDP's own reduce-scatter (gloo), no gradzip
    gradzip_<spec>   compress_fsdp(spec): none, fp16, qsgd:bits=4, topk:ratio=0.01 (each with its
                     default error feedback; --specs chooses)

With --nodes N (N nodes of P / N consecutive ranks; with the emulated cluster's
--ranks-per-node P / N, ranks of a node share its namespace and talk over its loopback), hybrid
sharding instead: fsdp_default is PyTorch's native hybrid sharding (fully_shard over the 2-D
mesh: reduce-scatter inside the node, all-reduce of the shards across nodes, both FSDP's), and
gradzip_<spec> shards inside the node with FSDP's own reduce-scatter and all-reduces the shards
across nodes with compress_fsdp(spec, replicate_group=...). powersgd is not a configuration:
FSDP's reduce-scatter never holds a whole gradient matrix (compress_fsdp refuses it).

Model: a decoder-only transformer on bytes (--layers blocks of pre-norm attention and a 4x MLP,
--width, --heads, --context; learned positions; the output layer tied to the embedding), each
block and the root fully_shard'ed. Data: the text of the licences under /usr/share/common-licenses
(on every Debian system), its last tenth held out. AdamW (betas 0.9, 0.95; weight decay 0.1), the
learning rate warmed up linearly over the first tenth of --steps and then on a cosine to a tenth,
gradients clipped to norm 1. A global batch of --batch sequences split over the ranks.

Per configuration: the training loss of every step (mean over ranks), the validation loss every
--eval-every steps and after the last (mean over 16 held-out batches, the same on every rank);
step_time_s: the median over steps [--warmup, --steps) of the slowest rank's step; bytes per rank
per step of the gradient reduction that the configurations differ in (the reduce-scatter, or
under hybrid sharding the all-reduce across nodes), the mean over the timed steps, max over
ranks: gradzip's stats (sent_bytes of every group's calls), FSDP by formula (gloo's ring: a
reduce-scatter sends (P - 1) / P of its input, an all-reduce 2 (P - 1) / P of its tensor). The
parameter all-gathers are FSDP's own in every configuration and are not counted.

Output: a text table on rank 0 and, with --json PATH, the figures as JSON (rank 0 writes it).
(PYTHONPATH=<build>/python finds gradzip; as root under mpirun add OMPI_ALLOW_RUN_AS_ROOT=1
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1.)
"""
import argparse
import glob
import json
import math
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import gradzip.torch

DEFAULT_SPECS = ["none", "fp16", "qsgd:bits=4", "topk:ratio=0.01"]


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, mask):
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ByteTransformer(nn.Module):
    def __init__(self, layers, width, heads, context):
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        nn.init.normal_(self.embed.weight, std=0.02)  # GPT-style: logits start near zero
        self.register_buffer("mask", torch.triu(torch.full((context, context), float("-inf")), 1),
                             persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[:tokens.shape[1]]
        mask = self.mask[:tokens.shape[1], :tokens.shape[1]]
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x) @ self.embed.weight.t()  # tied output layer


def corpus():
    text = b"".join(open(path, "rb").read() for path in sorted(glob.glob("/usr/share/common-licenses/*"))
                    if os.path.isfile(path))
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    split = len(data) * 9 // 10
    return data[:split], data[split:]


def batch_of(data, count, context, generator):
    starts = torch.randint(0, len(data) - context - 1, (count,), generator=generator)
    x = torch.stack([data[s:s + context] for s in starts])
    y = torch.stack([data[s + 1:s + context + 1] for s in starts])
    return x, y


def learning_rate(step, steps, peak):
    warm = max(1, steps // 10)
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def fsdp_formula_bytes(model, world, shard_size, nodes, element_bytes=4):
    """What FSDP's own reduction hands to the network per step and rank, as gloo's ring sends:
    flat, the reduce-scatter of every gradient (padded to the shard count), (P - 1) / P of it;
    hybrid, the all-reduce across nodes of this rank's shards, 2 (N - 1) / N of them."""
    total = 0
    for p in model.parameters():
        rows = p.shape[0]
        padded = -(-rows // shard_size) * shard_size * (p.numel() // max(rows, 1))
        total += padded * element_bytes
    if nodes == 1:
        return (world - 1) * total / world
    return 2 * (nodes - 1) * (total / shard_size) / nodes


def run_configuration(name, spec, args, rank, world, train, valid):
    nodes = args.nodes
    shard_size = world // nodes
    torch.manual_seed(1)
    model = ByteTransformer(args.layers, args.width, args.heads, args.context)
    if nodes == 1:
        mesh = init_device_mesh("cpu", (world,))
        shard_mesh, replicate = mesh, None
    else:
        mesh = init_device_mesh("cpu", (nodes, shard_size), mesh_dim_names=("replicate", "shard"))
        shard_mesh, replicate = mesh["shard"], mesh["replicate"]
    target = mesh if spec is None else shard_mesh  # FSDP's own: native hybrid over the 2-D mesh
    for block in model.blocks:
        fully_shard(block, mesh=target)
    fully_shard(model, mesh=target)
    state = None
    if spec is not None:
        state = gradzip.torch.compress_fsdp(model, spec, replicate_group=replicate)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.1)
    formula = fsdp_formula_bytes(model, world, shard_size, nodes)
    per_rank = args.batch // world
    losses, evals, times, sent = [], [], [], []

    def evaluate():
        model.eval()
        generator = torch.Generator().manual_seed(12345)
        with torch.no_grad():
            total = 0.0
            for _ in range(16):
                x, y = batch_of(valid, per_rank, args.context, generator)
                total += float(nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()))
        model.train()
        value = torch.tensor([total / 16])
        dist.all_reduce(value)
        return float(value) / world

    for step in range(args.steps):
        generator = torch.Generator().manual_seed(1000 * step + rank)
        x, y = batch_of(train, per_rank, args.context, generator)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr)
        dist.barrier()
        began = time.perf_counter()
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        elapsed = time.perf_counter() - began
        figures = torch.tensor([float(loss.detach()), elapsed,
                                sum(s["sent_bytes"] for s in state.last_stats.values()) if state
                                else formula], dtype=torch.float64)
        gathered = [torch.zeros_like(figures) for _ in range(world)]
        dist.all_gather(gathered, figures)
        losses.append(sum(float(g[0]) for g in gathered) / world)
        if step >= args.warmup:
            times.append(max(float(g[1]) for g in gathered))
            sent.append(max(float(g[2]) for g in gathered))
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            evals.append((step + 1, evaluate()))
    if state is not None:
        state.close()
    return {"configuration": name, "spec": spec, "nodes": nodes, "ranks": world,
            "train_loss": losses, "valid_loss": evals,
            "step_time_s": statistics.median(times) if times else None,
            "bytes_per_step": statistics.fmean(sent) if sent else None,
            "bytes_fsdp_formula": formula}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=3, help="steps not timed")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--batch", type=int, default=32, help="global batch (sequences)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--nodes", type=int, default=1, help="hybrid sharding over N nodes")
    parser.add_argument("--specs", default=",".join(DEFAULT_SPECS))
    parser.add_argument("--port", type=int, default=29533)
    parser.add_argument("--json")
    args = parser.parse_args()
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:  # under mpirun
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.nodes or args.batch % world:
        raise SystemExit(f"--nodes {args.nodes} and --batch {args.batch} must divide the "
                         f"{world} ranks")
    torch.set_num_threads(1)
    train, valid = corpus()
    configurations = [("fsdp_default", None)] + [(f"gradzip_{spec}", spec)
                                                 for spec in args.specs.split(",") if spec]
    results = []
    for name, spec in configurations:
        results.append(run_configuration(name, spec, args, rank, world, train, valid))
        if rank == 0:
            r = results[-1]
            print(f"{name:28s} step {r['step_time_s']:.3f} s  sent/rank/step "
                  f"{r['bytes_per_step'] / 2 ** 20:8.2f} MiB  final valid loss "
                  f"{r['valid_loss'][-1][1]:.4f}", flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "torch": torch.__version__,
                       "corpus_bytes": len(train) + len(valid), "results": results}, f, indent=1)
            f.write("\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
