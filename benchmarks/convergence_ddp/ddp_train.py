#!/usr/bin/env python3
"""Convergence through the DDP hook: a byte-level GPT with AdamW and a CNN with SGD + momentum,
every configuration of PyTorch's own communication and of gradzip's hook, one seed per job.

    torchrun --nproc_per_node 4 benchmarks/convergence_ddp/ddp_train.py --workload lm \
        --seed 1 --json lm-seed1.json
    torchrun --nproc_per_node 4 benchmarks/convergence_ddp/ddp_train.py --workload cnn --quick

Under torchrun gradzip's collectives go over torch.distributed (a gloo group of gradzip's own);
under mpirun (e.g. benchmarks/emulated_cluster.sh --exec, for --timing) over MPI, with the gloo
rendezvous at tcp://$MASTER_ADDR:--port. PYTHONPATH=<build>/python finds gradzip.

Workloads (each configuration starts from the same initial model, seeded by --seed, and sees the
same data order):
  lm   a decoder-only transformer on bytes: --layers pre-norm blocks (causal self-attention and a
       4x GELU MLP), width --width, 4 heads, context --context, learned positions, a separate
       output layer; 0.87M parameters at the defaults (4 layers, width 128, context 64). Text:
       the fortunes of Debian's `fortunes` package (/usr/share/games/fortunes, 2.6 MB of English),
       the files concatenated in name order, the last tenth held out. AdamW (betas 0.9, 0.95,
       weight decay 0.1 on matrices and embeddings, none on norms and biases), the learning rate
       warmed up linearly over the first 5% of the steps, then a cosine to a tenth; gradients
       clipped to norm 1 (after the all-reduce, on the averaged gradient). A global batch of
       --batch sequences of --context bytes, drawn at random positions. Metric: validation
       loss in nats per byte (and bits per byte = loss / ln 2) over 64 fixed held-out sequences
       per rank (256 in all).
  cnn  Fashion-MNIST (Debian's dataset-fashion-mnist): conv 3x3 1->32, max-pool, conv 3x3
       32->64 with stride 2, linear 3136->128, linear 128->10, ReLU between (0.42M parameters; the
       second convolution's 4-D kernel is a 64 x 288 matrix to PowerSGD). SGD with momentum 0.9,
       no weight decay, the learning rate on a cosine from --lr to 0; a global batch of --batch
       images, the training set shuffled per epoch (seeded by --seed and the epoch). Metric: test
       accuracy and loss over the 10,000 test images.

Configurations (--configs picks; `all` runs them in this order):
  ddp_default       DDP's own all-reduce (gloo), no hook
  torch_fp16        PyTorch's fp16_compress_hook
  torch_powersgd4   PyTorch's PowerSGD hook, rank 4, error feedback, warm start (its buckets
                    chained as benchmarks/peers/ddp_peers.py's in_bucket_order explains)
  <codec label>     gradzip.torch.hook with that spec and its default error feedback: none,
                    fp16, bf16, qsgd4, terngrad, sign, topk1 (ratio 0.01), topk01 (0.001), randk1
                    (0.01), powersgd4
  remedies          <label>_mc: momentum correction (GradzipState(momentum_correction=0.9), the
                    optimizer without momentum; the cnn workload); <label>_fv: the lm workload's
                    1-bit-Adam-style remedy: momentum correction with b1 = 0.9 and
                    gradzip.optim.FrozenVarianceAdamW, dense for the first --remedy-warmup steps,
                    the second moment frozen from then on, no gradient clipping (the reduced
                    tensor is a momentum)
Every compressed configuration runs its first --dense-steps steps uncompressed (PyTorch's
PowerSGD hook needs start_powerSGD_iter >= 2; gradzip's warmup gives the others the same start).

Per configuration the JSON holds the curve (every --eval-every steps and after the last: the
training loss averaged over the steps since the previous point and over ranks, the validation
metric), the final metric, bytes per rank per step (gradzip: the hook's sent_bytes over the
buckets; PyTorch: the ring formula of ddp_peers.py), the wall time, whether the replicas ended
identical, and `diverged` (the step at which the training loss became non-finite; the run stops
there). --timing instead runs --timed steps after --warmup untimed ones per configuration, no
evaluation, and records the median of the slowest rank's step times (for the time to accuracy,
measured in the emulated cluster); there every compressed configuration, the _warm remedies too,
is compressed from --dense-steps on, so that the timed steps are its compressed ones.
--attach NAME=PATH puts the JSON at PATH into this run's JSON as NAME (benchmarks/reproduce.py
joins a seed's convergence run and its timing run that way).

--sabotage zero|negate (a check's own failure case, never a measurement): gradzip's hook hands
DDP a zero or a negated average, so that tests/python/run_convergence_quick.py can show that its
thresholds fail a broken hook.
"""
import argparse
import gc
import glob
import gzip
import hashlib
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import gradzip
import gradzip.torch
from gradzip.optim import FrozenVarianceAdamW

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
from ddp_peers import (POWERSGD_MIN_COMPRESSION_RATE, POWERSGD_RANK, bucket_bytes,  # noqa: E402
                       in_bucket_order, max_over_ranks, pytorch_bytes_per_step, read_idx)

FORTUNES = "/usr/share/games/fortunes"
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"

# label -> spec of gradzip's hook (its default error feedback)
CODECS = {"none": "none", "fp16": "fp16", "bf16": "bf16", "qsgd4": "qsgd:bits=4",
          "terngrad": "terngrad", "sign": "sign", "topk1": "topk:ratio=0.01",
          "topk01": "topk:ratio=0.001", "randk1": "randk:ratio=0.01",
          "powersgd4": "powersgd:rank=4"}
PYTORCH = {"ddp_default": None, "torch_fp16": "fp16", "torch_powersgd4": "powersgd"}
# The remedies each workload's `all` adds (measured where the plain codec falls behind).
REMEDIES = {"lm": ["sign_warm", "topk1_warm", "sign_fv", "topk1_fv", "topk01_fv"],
            "cnn": ["sign_mc", "topk1_mc", "topk01_mc", "randk1_mc"]}
MOMENTUM = 0.9  # SGD's momentum (cnn), and AdamW's b1 (lm), which the _fv remedy needs equal


def configuration(label):
    """label -> {"label", "kind": pytorch|gradzip, "spec", "momentum_correction", "warmup",
    "frozen_variance"}."""
    if label in PYTORCH:
        return {"label": label, "kind": "pytorch", "spec": PYTORCH[label],
                "momentum_correction": False, "warmup": False, "frozen_variance": False}
    base, _, remedy = label.partition("_")
    if base not in CODECS or remedy not in ("", "mc", "warm", "fv"):
        raise ValueError(f"unknown configuration '{label}'")
    return {"label": label, "kind": "gradzip", "spec": CODECS[base],
            "momentum_correction": remedy in ("mc", "fv"), "warmup": remedy in ("warm", "fv"),
            "frozen_variance": remedy == "fv"}


def all_labels(workload):
    return list(PYTORCH) + list(CODECS) + REMEDIES[workload]


# ---- the language model ---------------------------------------------------------------------

class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, length, width))


class GptBlock(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.attention_norm = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp_in = nn.Linear(width, 4 * width)
        self.mlp_out = nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(x))))


class ByteGpt(nn.Module):
    def __init__(self, layers, width, heads, context):
        super().__init__()
        self.embedding = nn.Embedding(256, width)
        self.positions = nn.Parameter(torch.randn(context, width) * 0.02)
        self.blocks = nn.ModuleList(GptBlock(width, heads) for _ in range(layers))
        self.final_norm = nn.LayerNorm(width)
        self.output = nn.Linear(width, 256, bias=False)
        nn.init.normal_(self.embedding.weight, std=0.02)
        nn.init.normal_(self.output.weight, std=0.02)

    def forward(self, tokens):
        x = self.embedding(tokens) + self.positions[:tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.output(self.final_norm(x))


class LanguageModel:
    """The lm workload: model, data, optimizer, metric."""
    metric, higher_is_better = "validation_loss", False

    def __init__(self, args, rank, world):
        files = sorted(p for p in glob.glob(os.path.join(args.text, "*"))
                       if os.path.isfile(p) and not p.endswith((".dat", ".u8")))
        if not files:
            raise SystemExit(f"ddp_train: no text under {args.text} (apt-get install fortunes)")
        text = b"".join(open(p, "rb").read() for p in files)
        data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
        split = len(data) * 9 // 10
        self.train, self.valid = data[:split], data[split:]
        self.args, self.rank, self.world = args, rank, world
        self.local = args.batch // world
        # 64 held-out sequences per rank, the same in every configuration
        generator = torch.Generator().manual_seed(10_000 + rank)
        self.valid_batch = self._sequences(self.valid, 64, generator)
        self.description = (f"byte GPT {args.layers}x{args.width}, context {args.context}, "
                            f"{len(text) / 1e6:.2f} MB of text ({len(self.valid) / 1e6:.2f} MB held out)")

    def _sequences(self, data, count, generator):
        starts = torch.randint(0, len(data) - self.args.context - 1, (count,), generator=generator)
        x = torch.stack([data[s:s + self.args.context] for s in starts])
        y = torch.stack([data[s + 1:s + self.args.context + 1] for s in starts])
        return x, y

    def model(self):
        a = self.args
        return ByteGpt(a.layers, a.width, heads=4, context=a.context)

    def optimizer(self, model, config):
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        plain = [p for n, p in model.named_parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}]
        if config["frozen_variance"]:
            return FrozenVarianceAdamW(groups, lr=self.args.lr, betas=(MOMENTUM, 0.95),
                                       freeze_step=self.args.remedy_warmup)
        if config["momentum_correction"]:
            raise ValueError("the lm workload's momentum correction is its _fv remedy")
        return torch.optim.AdamW(groups, lr=self.args.lr, betas=(MOMENTUM, 0.95))

    def learning_rate_factor(self, step):
        warm = max(1, self.args.steps // 20)
        if step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, self.args.steps - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    def batch(self, step):
        # the step's global batch from one generator, this rank's slice of it
        generator = torch.Generator().manual_seed(self.args.seed * 1_000_003 + step)
        x, y = self._sequences(self.train, self.args.batch, generator)
        mine = slice(self.rank * self.local, (self.rank + 1) * self.local)
        return x[mine], y[mine]

    @staticmethod
    def loss(output, target):
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))

    @staticmethod
    def clip(model, config):
        if not config["frozen_variance"]:  # the hook hands that optimizer momenta: never clipped
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

    def evaluate(self, model):
        with torch.no_grad():
            x, y = self.valid_batch
            total = torch.tensor([self.loss(model(x), y).item() * len(x), len(x)], dtype=torch.float64)
        dist.all_reduce(total)
        loss = (total[0] / total[1]).item()
        return {"validation_loss": loss, "bits_per_byte": loss / math.log(2)}


# ---- the convolutional network ----------------------------------------------------------------

class FashionCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, stride=2, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, images):
        x = images.to(torch.float32).div_(255.0).view(-1, 1, 28, 28)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.conv2(x))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class ConvolutionalNetwork:
    """The cnn workload."""
    metric, higher_is_better = "test_accuracy", True

    def __init__(self, args, rank, world):
        def images(split):
            return torch.from_numpy(read_idx(os.path.join(args.data, f"{split}-images-idx3-ubyte.gz")).copy())

        def labels(split):
            return torch.from_numpy(read_idx(os.path.join(args.data, f"{split}-labels-idx1-ubyte.gz")).astype(np.int64))

        self.train_x, self.train_y = images("train"), labels("train")
        test_x, test_y = images("t10k"), labels("t10k")
        self.test_x, self.test_y = test_x[rank::world], test_y[rank::world]
        self.test_count = len(test_x)
        self.args, self.rank, self.world = args, rank, world
        self.local = args.batch // world
        self.steps_per_epoch = len(self.train_x) // args.batch
        self.order = {}
        self.description = f"CNN 32-64 conv + 128 fc, Fashion-MNIST, {self.steps_per_epoch} steps an epoch"

    def model(self):
        return FashionCnn()

    def optimizer(self, model, config):
        if config["frozen_variance"]:
            raise ValueError("the _fv remedy is for AdamW: the lm workload")
        return torch.optim.SGD(model.parameters(), lr=self.args.lr,
                               momentum=0.0 if config["momentum_correction"] else MOMENTUM)

    def learning_rate_factor(self, step):
        return 0.5 * (1 + math.cos(math.pi * min(step, self.args.steps) / self.args.steps))

    def batch(self, step):
        epoch, within = divmod(step, self.steps_per_epoch)
        if epoch not in self.order:
            self.order = {epoch: torch.randperm(len(self.train_x), generator=torch.Generator().manual_seed(
                self.args.seed * 1_000_003 + epoch))}
        first = within * self.args.batch + self.rank * self.local
        index = self.order[epoch][first:first + self.local]
        return self.train_x[index], self.train_y[index]

    @staticmethod
    def loss(output, target):
        return F.cross_entropy(output, target)

    @staticmethod
    def clip(model, config):
        pass

    def evaluate(self, model):
        totals = torch.zeros(2, dtype=torch.float64)
        with torch.no_grad():
            for begin in range(0, len(self.test_x), 500):
                logits = model(self.test_x[begin:begin + 500])
                target = self.test_y[begin:begin + 500]
                totals[0] += (logits.argmax(1) == target).sum()
                totals[1] += F.cross_entropy(logits, target, reduction="sum").item()
        dist.all_reduce(totals)
        return {"test_accuracy": totals[0].item() / self.test_count,
                "test_loss": totals[1].item() / self.test_count}


WORKLOADS = {"lm": LanguageModel, "cnn": ConvolutionalNetwork}


# ---- one configuration ---------------------------------------------------------------------------

def sabotaged(hook, how):
    """`hook` whose averaged bucket comes back zeroed or negated (--sabotage)."""
    def broken(state, bucket):
        def corrupt(future):
            values = future.value()
            return values.zero_() if how == "zero" else values.neg_()
        return hook(state, bucket).then(corrupt)
    return broken


def attach(ddp, model, config, args, communicator):
    """Registers the configuration's hook; returns the GradzipState (None for PyTorch's)."""
    if config["kind"] == "gradzip":
        warmup = args.remedy_warmup if config["warmup"] and not args.timing else args.dense_steps
        state = gradzip.torch.GradzipState(
            model, spec=config["spec"], warmup=warmup, communicator=communicator,
            momentum_correction=MOMENTUM if config["momentum_correction"] else 0.0)
        hook = gradzip.torch.hook if not args.sabotage else sabotaged(gradzip.torch.hook, args.sabotage)
        ddp.register_comm_hook(state, hook)
        return state
    if config["spec"] == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif config["spec"] == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=POWERSGD_RANK,
            start_powerSGD_iter=args.dense_steps, min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE,
            use_error_feedback=True, warm_start=True, random_seed=args.seed)
        ddp.register_comm_hook(state, in_bucket_order(powerSGD_hook.powerSGD_hook))
    return None


def run_configuration(config, workload, args, communicator, rank, world):
    torch.manual_seed(args.seed)  # the same initial model on every rank and in every configuration
    model = workload.model()
    ddp = DDP(model)
    state = attach(ddp, model, config, args, communicator)
    optimizer = workload.optimizer(model, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, workload.learning_rate_factor)
    steps = args.warmup + args.timed if args.timing else args.steps
    curve, interval_losses, sent, times = [], [], 0.0, []
    diverged = None
    began = time.perf_counter()
    for step in range(steps):
        x, y = workload.batch(step)
        timed = args.timing and step >= args.warmup
        if timed:
            dist.barrier()
        step_began = time.perf_counter()
        optimizer.zero_grad()
        loss = workload.loss(ddp(x), y)
        loss.backward()
        workload.clip(model, config)
        optimizer.step()
        scheduler.step()
        if timed:
            times.append(time.perf_counter() - step_began)
        if state is not None:
            sent += sum(bucket_bytes(s, world) for s in state.last_stats.values())
        interval_losses.append(loss.item())
        finished = step + 1 == steps
        if args.timing:
            continue
        if (step + 1) % args.eval_every == 0 or finished:
            mean_loss = max_over_ranks([statistics.fmean(interval_losses)])[0]  # worst rank
            point = {"step": step + 1, "train_loss": mean_loss, **workload.evaluate(model)}
            curve.append(point)
            interval_losses = []
            if not math.isfinite(mean_loss) or not math.isfinite(point[workload.metric]):
                diverged = step + 1
                break
            if rank == 0 and args.verbose:
                print(f"  {config['label']} step {step + 1}: train {mean_loss:.4f} "
                      f"{workload.metric} {point[workload.metric]:.4f}", flush=True)
    wall = time.perf_counter() - began
    done = curve[-1]["step"] if curve else steps
    if state is not None:
        bytes_per_step = max_over_ranks([sent / done])[0]
    else:
        bytes_per_step = pytorch_bytes_per_step(model, config["spec"], world)
    digest = hashlib.sha256(torch.cat([p.detach().reshape(-1) for p in model.parameters()])
                            .numpy().tobytes()).hexdigest()
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    result = dict(config, spec=config["spec"] or "none", bytes_per_step=bytes_per_step,
                  wall_s=max_over_ranks([wall])[0], replicas_identical=len(set(digests)) == 1,
                  diverged=diverged)
    if args.timing:
        slowest = max_over_ranks(times)
        result.update(step_time_s=statistics.median(slowest), step_times_s=slowest)
    else:
        result.update(curve=curve, final=curve[-1] if curve else None)
    if state is not None:
        state.close()
    del ddp, model, optimizer
    gc.collect()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--configs", default="all", help="comma-separated labels, or all")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0,
                        help="training steps per configuration [lm 400, cnn 468 (one epoch); "
                             "--quick 150]")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="[lm: steps / 12; cnn: steps / 8, its evaluation being the costlier]")
    parser.add_argument("--batch", type=int, default=0, help="global batch [lm 32, cnn 128]")
    parser.add_argument("--lr", type=float, default=0.0, help="peak learning rate [lm 3e-3, cnn 0.05]")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--dense-steps", type=int, default=2)
    parser.add_argument("--remedy-warmup", type=int, default=0,
                        help="uncompressed steps of the _warm remedies [a tenth of --steps]")
    parser.add_argument("--quick", action="store_true",
                        help="150 steps of none, qsgd4 and topk1_fv (lm) or none and topk1_mc (cnn)")
    parser.add_argument("--timing", action="store_true", help="step times only (see the docstring)")
    parser.add_argument("--warmup", type=int, default=3, help="--timing: untimed steps first")
    parser.add_argument("--timed", type=int, default=8, help="--timing: timed steps")
    parser.add_argument("--text", default=FORTUNES)
    parser.add_argument("--data", default=FASHION_MNIST)
    parser.add_argument("--port", type=int, default=29690, help="gloo rendezvous port (mpirun)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--json", default="", help="write the results here (rank 0)")
    parser.add_argument("--verbose", action="store_true", help="print every curve point")
    parser.add_argument("--attach", action="append", default=[], metavar="NAME=PATH",
                        help="include the JSON at PATH in this run's JSON as NAME")
    parser.add_argument("--sabotage", choices=["zero", "negate"], default=None,
                        help="break gradzip's hook on purpose (a check's failure case)")
    args = parser.parse_args()
    lm = args.workload == "lm"
    args.steps = args.steps or (150 if args.quick else 400 if lm else 468)
    args.batch = args.batch or (32 if lm else 128)
    args.lr = args.lr or (3e-3 if lm else 0.05)
    args.eval_every = args.eval_every or max(1, args.steps // (12 if lm else 8))
    args.remedy_warmup = args.remedy_warmup or max(args.dense_steps, args.steps // 10)
    if args.dense_steps < 2:
        parser.error("--dense-steps must be >= 2 (PyTorch's PowerSGD hook needs start_powerSGD_iter >= 2)")
    if args.configs == "all":
        labels = (["none", "qsgd4", "topk1_fv"] if lm else ["none", "topk1_mc"]) if args.quick \
            else all_labels(args.workload)
    else:
        labels = args.configs.split(",")
    try:
        configs = [configuration(label) for label in labels]
    except ValueError as error:
        parser.error(str(error))
    if any(c["momentum_correction"] and not c["frozen_variance"] for c in configs) if lm else \
            any(c["frozen_variance"] for c in configs):
        parser.error("the _mc remedies are the cnn workload's (SGD), the _fv ones the lm's (AdamW)")

    torch.set_num_threads(args.threads)
    if gradzip.launched_by_mpi():
        communicator = gradzip.Communicator()  # MPI first: its rank is the gloo rank
        master = os.environ.get("MASTER_ADDR", "127.0.0.1")
        dist.init_process_group("gloo", init_method=f"tcp://{master}:{args.port}",
                                rank=communicator.rank, world_size=communicator.size)
    else:  # torchrun
        dist.init_process_group("gloo", init_method="env://")
        communicator = gradzip.Communicator()
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        parser.error(f"--batch {args.batch} does not split over {world} ranks")
    workload = WORKLOADS[args.workload](args, rank, world)
    parameters = sum(p.numel() for p in workload.model().parameters())
    if rank == 0:
        print(f"ddp_train {args.workload}: {workload.description}, {parameters / 1e6:.2f}M parameters, "
              f"{world} ranks, global batch {args.batch}, {args.steps} steps, seed {args.seed}, "
              f"transport {communicator.transport_name}", flush=True)
    results = []
    for config in configs:
        result = run_configuration(config, workload, args, communicator, rank, world)
        results.append(result)
        if rank == 0:
            if args.timing:
                summary = f"step {result['step_time_s']:.3f} s"
            elif result["final"] is None:
                summary = "no evaluation"
            else:
                summary = f"{workload.metric} {result['final'][workload.metric]:.4f}"
            if result["diverged"]:
                summary += f", diverged at step {result['diverged']}"
            print(f"{config['label']:<16} {summary}, {result['bytes_per_step'] / 1e6:.3f} MB/step, "
                  f"{result['wall_s']:.0f} s", flush=True)
    attached = {}
    for item in args.attach:
        name, _, path = item.partition("=")
        with open(path) as f:
            attached[name] = json.load(f)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({**attached, "workload": args.workload, "description": workload.description,
                       "metric": workload.metric, "higher_is_better": workload.higher_is_better,
                       "parameters": parameters, "ranks": world, "torch": torch.__version__,
                       "transport": communicator.transport_name, "seed": args.seed,
                       "steps": args.steps, "batch": args.batch, "lr": args.lr,
                       "eval_every": args.eval_every, "dense_steps": args.dense_steps,
                       "remedy_warmup": args.remedy_warmup, "timing": args.timing,
                       "quick": args.quick, "sabotage": args.sabotage, "command": " ".join(sys.argv),
                       "results": results}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
