#!/usr/bin/env python3
"""PyTorch DDP's own communication against gradzip's hook: step time, bytes, accuracy.

One process per rank under mpirun; every configuration runs in the same job, one after the
other, each from the same initial model (seed 1) over the same data order:

    no_communication   torch's noop_hook: no communication at all (the compute floor of a step;
                       ranks train apart, so no accuracy is reported)
    ddp_default        DDP's built-in all-reduce (gloo ring), no hook
    ddp_fp16_hook      torch's fp16_compress_hook (cast to fp16, gloo all-reduce, divide)
    ddp_powersgd_hook  torch's PowerSGD hook, rank 4, error feedback and warm start (its buckets
                       chained in order, see in_bucket_order: unchained it crashes gloo, under
                       PyTorch 1.13 and 2.15 alike)
    gradzip_none       gradzip.torch.hook without compression: gradzip's transport (MPI) and
                       hook against DDP's own gloo all-reduce, so that the compression's gain
                       is not confused with the transport's
    gradzip_<codec>    gradzip.torch.hook with fp16, qsgd:bits=4, sign, topk:ratio=0.01 and
                       powersgd:rank=4 (spec defaults otherwise: algo=auto, error feedback on
                       for sign, top-k and PowerSGD)

    mpirun -np 4 --oversubscribe --bind-to none /usr/bin/python3 benchmarks/peers/ddp_peers.py \
        --steps 40 --json peers.json
    benchmarks/emulated_cluster.sh --exec -- /usr/bin/python3 benchmarks/peers/ddp_peers.py ...

(PYTHONPATH=<build>/python finds gradzip; as root add OMPI_ALLOW_RUN_AS_ROOT=1
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1.) gloo rendezvous at tcp://$MASTER_ADDR:--port (MASTER_ADDR
defaults to 127.0.0.1; inside the emulated cluster it is rank 0's 198.18.0.1 and
GLOO_SOCKET_IFNAME names the rank's link). gradzip's collectives go over MPI.

Model: the Fashion-MNIST MLP widened, 784-4096-4096-1024-10 by default (24.2M parameters).
Its linear layers are 1x1 convolutions on a 1x1 image: the same function and parameter shapes
as nn.Linear (weights [out, in, 1, 1], which both PowerSGDs see as out x in matrices), but
Debian's PyTorch 1.13 runs nn.Linear through the reference BLAS (about 7 s per step here) and
convolutions through oneDNN (about 0.8 s). SGD with momentum 0.9, the learning rate on a cosine
schedule from --lr to 0 over --steps, a global batch of --batch images split over the ranks.

Per configuration: --steps training steps; steps [--warmup, --warmup + --timed) are timed
(a barrier before each; a step is forward, backward with its communication, optimizer step);
then the test accuracy of the model after --steps steps (--test-images of the 10,000).
- step_time_s: the median over timed steps of the slowest rank's time of that step.
- bytes_per_step: what one rank hands to the network per step (max over ranks, mean over
  the timed steps). gradzip: the hook's stats (sent_bytes summed over the buckets; a bucket
  that went through MPI's own all-reduce, under min_bytes, counted as a ring). PyTorch: by
  formula, since gloo keeps no count: its all-reduce of CPU tensors is a ring, which sends
  2(P-1)/P x the tensor's bytes per rank; default: f32 gradients; fp16 hook: 2 bytes each;
  PowerSGD: per parameter viewed as an n x m matrix with R = min(4, n, m), P (n x R) and Q
  (m x R) f32 when (n + m) R * 2 < n m (the hook's min_compression_rate 2), else the whole
  tensor uncompressed (biases), all times 2(P-1)/P.
- link_tx_bytes_per_step: inside the emulated cluster, the bytes the rank's link interface
  ($GLOO_SOCKET_IFNAME) transmitted per timed step, TCP/IP headers and the barriers included
  (max over ranks); null elsewhere. It checks the counted bytes against the wire.
- algorithms (gradzip): the algorithms the timed steps' bucket calls ran, with how many calls
  each (algo=auto's choices: e.g. {"sra": 21}); PyTorch's rows have none.
- replicas_identical: whether every rank ended with the same parameters (a SHA-256 of them,
  all-gathered). DDP's replicas stay in step only if the gradients were averaged: false for
  no_communication, and for any hook that did not communicate.
- --dense-steps N: the first N steps of every compressed configuration are uncompressed
  (PowerSGD's hook needs start_powerSGD_iter >= 2; gradzip's warmup gives the same start).

Output: a text table on rank 0 and, with --json PATH, the figures as JSON (rank 0 writes it).
"""
import argparse
import gc
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
from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks, default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import gradzip
import gradzip.torch

# The IDX reader of the PyTorch example (examples/torch_ddp_fashion_mnist.py), reused as is.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from torch_ddp_fashion_mnist import read_idx  # noqa: E402

# (name, kind, spec): kind "pytorch" (spec: None = no hook, "fp16", "powersgd", "noop") or
# "gradzip". no_communication (torch's noop_hook: every rank keeps its own gradient) is the
# compute floor of a step, not a way to train: its accuracy is not reported.
CONFIGURATIONS = [
    ("no_communication", "pytorch", "noop"),
    ("ddp_default", "pytorch", None),
    ("ddp_fp16_hook", "pytorch", "fp16"),
    ("ddp_powersgd_hook", "pytorch", "powersgd"),
    ("gradzip_none", "gradzip", "none"),
    ("gradzip_fp16", "gradzip", "fp16"),
    ("gradzip_qsgd4", "gradzip", "qsgd:bits=4"),
    ("gradzip_sign", "gradzip", "sign"),
    ("gradzip_topk1", "gradzip", "topk:ratio=0.01"),
    ("gradzip_powersgd4", "gradzip", "powersgd:rank=4"),
]
POWERSGD_RANK = 4
POWERSGD_MIN_COMPRESSION_RATE = 2  # torch's PowerSGDState default, kept


def load(folder, split):
    """Images as uint8 [n, 784] (scaled per batch, to keep four ranks' memory small), labels."""
    images = read_idx(os.path.join(folder, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(folder, f"{split}-labels-idx1-ubyte.gz"))
    return (torch.from_numpy(images.reshape(len(images), -1).copy()),
            torch.from_numpy(labels.astype(np.int64)))


class WideMlp(torch.nn.Module):
    """784-h1-...-10 MLP with ReLU; each linear layer is a 1x1 convolution (see the docstring)."""

    def __init__(self, hidden):
        super().__init__()
        widths = [784] + list(hidden) + [10]
        layers = []
        for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
            layers.append(torch.nn.Conv2d(fan_in, fan_out, 1))
            if i + 2 < len(widths):
                layers.append(torch.nn.ReLU())
        self.layers = torch.nn.Sequential(*layers)

    def forward(self, images):
        x = images.to(torch.float32).div_(255.0).view(images.shape[0], -1, 1, 1)
        return self.layers(x).flatten(1)


def in_bucket_order(hook):
    """`hook` with each bucket's call started when the previous bucket's future completed.

    PyTorch's PowerSGD hook issues its second and third all-reduce from future callbacks. Over
    gloo with several DDP buckets the ranks then issued them in different orders, and gloo
    aborted (in the emulated cluster, 4 ranks, 3 buckets: "enforce fail at
    gloo/transport/tcp/pair.cc:510 op.preamble.length <= op.nbytes. 8192 vs 4096" under PyTorch
    1.13, the same at pair.cc:464 under 2.15; docs/data/powersgd-unchained-2026-12-02). Chaining the
    buckets fixes the order on every rank; the bytes and the math are the hook's own, and a
    bucket's communication still overlaps the rest of the backward pass (not the communication of
    the bucket before it: gradzip's hook runs its buckets one after the other too).
    """
    last = [None]

    def ordered(state, bucket):
        previous = last[0] if bucket.index() != 0 else None
        result = torch.futures.Future()

        def start(_=None):
            try:
                inner = hook(state, bucket)
            except Exception as error:  # noqa: BLE001  (handed to DDP's wait)
                result.set_exception(error)
                return

            def finish(done):
                try:
                    result.set_result(done.value())
                except Exception as error:  # noqa: BLE001
                    result.set_exception(error)

            inner.add_done_callback(finish)

        last[0] = result
        if previous is None:
            start()
        else:
            previous.add_done_callback(start)
        return result

    return ordered


def ring_factor(world):
    return 2.0 * (world - 1) / world


def pytorch_bytes_per_step(model, spec, world):
    """Bytes one rank sends per step under DDP's ring all-reduce with the given torch hook."""
    if spec == "noop":
        return 0.0
    if spec is None:
        elements, element_bytes = sum(p.numel() for p in model.parameters()), 4
    elif spec == "fp16":
        elements, element_bytes = sum(p.numel() for p in model.parameters()), 2
    elif spec == "powersgd":
        elements, element_bytes = 0, 4
        for p in model.parameters():
            n = p.shape[0]
            m = p.numel() // n
            rank = min(n, m, POWERSGD_RANK)
            compressed = (n + m) * rank
            elements += compressed if compressed * POWERSGD_MIN_COMPRESSION_RATE < n * m else n * m
    else:
        raise ValueError(f"no byte count for the torch hook '{spec}'")
    return ring_factor(world) * elements * element_bytes


def bucket_bytes(stats, world):
    """A gradzip bucket's sent bytes; a bucket under min_bytes goes through MPI's own all-reduce,
    which reports none: count what a ring sends for its f32 values."""
    if stats["algorithm"] == "mpi":
        return ring_factor(world) * 4 * stats["count"]
    return stats["sent_bytes"]


def gradzip_supports(communicator, spec):
    """Whether the hook takes `spec` (a collective: every rank asks, same answer). PowerSGD goes
    through the binding's powersgd_allreduce, which older builds lack."""
    if gradzip.parse_spec(spec).startswith("powersgd"):
        if hasattr(communicator, "powersgd_allreduce"):
            return True, ""
        return False, "this gradzip build's binding has no powersgd_allreduce"
    probe = np.zeros(8, dtype=np.float32)
    try:
        communicator.allreduce(probe, "peers.probe", spec, op="average")
        return True, ""
    except gradzip.Error as error:
        return False, str(error).splitlines()[0]


def link_tx_bytes():
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    if not interface:
        return None
    try:
        with open(f"/sys/class/net/{interface}/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return None


def max_over_ranks(values):
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def evaluate(model, test_x, test_y, rank, world):
    """Test accuracy over test_x (each rank scores every world-th image)."""
    correct = torch.zeros(1, dtype=torch.float64)
    with torch.no_grad():
        mine_x, mine_y = test_x[rank::world], test_y[rank::world]
        for begin in range(0, len(mine_x), 500):
            logits = model(mine_x[begin:begin + 500])
            correct += (logits.argmax(1) == mine_y[begin:begin + 500]).sum()
    dist.all_reduce(correct)
    return correct.item() / len(test_x)


def run_configuration(name, kind, spec, args, data, communicator, rank, world):
    train_x, train_y, test_x, test_y = data
    torch.manual_seed(1)  # the same initial model on every rank and in every configuration
    model = WideMlp(args.hidden)
    ddp = DDP(model)
    gradzip_state = None
    if kind == "gradzip":
        gradzip_state = gradzip.torch.GradzipState(model, spec=spec, warmup=args.dense_steps,
                                                   communicator=communicator)
        ddp.register_comm_hook(gradzip_state, gradzip.torch.hook)
    elif spec == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif spec == "noop":
        ddp.register_comm_hook(None, debugging_hooks.noop_hook)
    elif spec == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=POWERSGD_RANK,
            start_powerSGD_iter=args.dense_steps, min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE,
            use_error_feedback=True, warm_start=True, random_seed=0)
        ddp.register_comm_hook(state, in_bucket_order(powerSGD_hook.powerSGD_hook))

    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.5 * (1.0 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    local_batch = args.batch // world
    steps_per_epoch = len(train_x) // args.batch
    order = None
    times, sent, losses = [], [], []
    algorithms = {}  # gradzip: algorithm -> bucket calls in the timed steps
    tx_begin = tx_end = None
    timed = range(args.warmup, args.warmup + args.timed)
    for step in range(args.steps):
        epoch, within = divmod(step, steps_per_epoch)
        if within == 0:
            order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(epoch))
        first = within * args.batch + rank * local_batch
        index = order[first:first + local_batch]
        if step in timed:
            dist.barrier()
            if step == timed.start:
                tx_begin = link_tx_bytes()
        began = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(train_x[index]), train_y[index])
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step in timed:
            times.append(time.perf_counter() - began)
            if gradzip_state is not None:
                sent.append(sum(bucket_bytes(s, world) for s in gradzip_state.last_stats.values()))
                for s in gradzip_state.last_stats.values():
                    algorithms[s["algorithm"]] = algorithms.get(s["algorithm"], 0) + 1
            if step == timed.stop - 1:
                tx_end = link_tx_bytes()
        losses.append(loss.item())

    slowest = max_over_ranks(times)
    if gradzip_state is not None:
        bytes_per_step = max_over_ranks([statistics.fmean(sent)])[0]
        counted = "gradzip hook stats (sent_bytes over the buckets)"
    else:
        bytes_per_step = pytorch_bytes_per_step(model, spec, world)
        counted = "formula: ring 2(P-1)/P x " + {None: "f32 gradients", "fp16": "fp16 gradients",
                                                  "powersgd": "PowerSGD P, Q and uncompressed tensors",
                                                  "noop": "nothing"}[spec]
    tx = None
    if tx_begin is not None and tx_end is not None:
        tx = max_over_ranks([(tx_end - tx_begin) / args.timed])[0]
    digest = hashlib.sha256(torch.cat([p.detach().reshape(-1) for p in model.parameters()])
                            .numpy().tobytes()).hexdigest()
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    accuracy = evaluate(model, test_x[:args.test_images], test_y[:args.test_images], rank, world) \
        if args.test_images and spec != "noop" else None
    result = {
        "name": name, "kind": kind, "spec": spec if spec is not None else "none",
        "step_time_s": statistics.median(slowest), "step_times_s": slowest,
        "bytes_per_step": bytes_per_step, "bytes_counted": counted,
        "link_tx_bytes_per_step": tx,
        "algorithms": dict(sorted(algorithms.items())) if kind == "gradzip" else None,
        "test_accuracy": accuracy, "final_train_loss": statistics.fmean(losses[-10:]),
        "replicas_identical": len(set(digests)) == 1,
    }
    del ddp, model, optimizer
    gc.collect()
    return result


def print_table(results, baseline_time, baseline_bytes):
    print(f"{'configuration':<20} {'step_s':>8} {'speedup':>8} {'MB/step':>9} {'vs default':>10} "
          f"{'link MB/step':>12} {'test acc':>8}")
    for r in results:
        if "skipped" in r:
            print(f"{r['name']:<20} skipped: {r['skipped']}")
            continue
        link = f"{r['link_tx_bytes_per_step'] / 1e6:12.2f}" if r["link_tx_bytes_per_step"] else f"{'-':>12}"
        accuracy = f"{100 * r['test_accuracy']:7.2f}%" if r["test_accuracy"] is not None else f"{'-':>8}"
        print(f"{r['name']:<20} {r['step_time_s']:8.3f} {baseline_time / r['step_time_s']:7.2f}x "
              f"{r['bytes_per_step'] / 1e6:9.2f} {r['bytes_per_step'] / baseline_bytes:10.4f} "
              f"{link} {accuracy}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", default="4096,4096,1024",
                        help="hidden widths, comma-separated [4096,4096,1024: 24.2M parameters]")
    parser.add_argument("--steps", type=int, default=40, help="training steps per configuration")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before the timed ones")
    parser.add_argument("--timed", type=int, default=8, help="timed steps")
    parser.add_argument("--dense-steps", type=int, default=2,
                        help="uncompressed first steps of the compressed configurations (>= 2)")
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--configs", default="all",
                        help="comma-separated configuration names, or all")
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--port", type=int, default=29690, help="gloo rendezvous port")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--test-images", type=int, default=10000,
                        help="test images scored after the last step (0: no accuracy, e.g. for a "
                             "timing run too short to train)")
    parser.add_argument("--json", default="", help="write the results here (rank 0)")
    args = parser.parse_args()
    args.hidden = [int(w) for w in args.hidden.split(",") if w]
    if args.dense_steps < 2:
        parser.error("--dense-steps must be >= 2 (torch's PowerSGD hook needs start_powerSGD_iter >= 2)")
    if args.warmup < args.dense_steps or args.warmup + args.timed > args.steps or args.timed < 1:
        parser.error("need --dense-steps <= --warmup, --timed >= 1 and --warmup + --timed <= --steps")
    known = [c[0] for c in CONFIGURATIONS]
    chosen = known if args.configs == "all" else args.configs.split(",")
    unknown = [c for c in chosen if c not in known]
    if unknown:
        parser.error(f"unknown configurations {unknown}; known: {known}")

    torch.set_num_threads(args.threads)
    communicator = gradzip.Communicator()  # initialises MPI first: its rank is the gloo rank
    rank, world = communicator.rank, communicator.size
    if args.batch % world:
        parser.error(f"--batch {args.batch} does not split over {world} ranks")
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{args.port}", rank=rank,
                            world_size=world)
    data = (*load(args.data, "train"), *load(args.data, "t10k"))
    parameters = sum(p.numel() for p in WideMlp(args.hidden).parameters())
    if rank == 0:
        print(f"ddp_peers: {world} ranks, model 784-{'-'.join(map(str, args.hidden))}-10 "
              f"({parameters / 1e6:.1f}M parameters), global batch {args.batch}, {args.steps} steps "
              f"per configuration, timed steps {args.warmup}..{args.warmup + args.timed - 1}, "
              f"gloo at {master}, link {os.environ.get('GLOO_SOCKET_IFNAME', 'default')}", flush=True)

    results = []
    for name, kind, spec in CONFIGURATIONS:
        if name not in chosen:
            continue
        if kind == "gradzip":
            supported, reason = gradzip_supports(communicator, spec)
            if not supported:
                results.append({"name": name, "kind": kind, "spec": spec, "skipped": reason})
                if rank == 0:
                    print(f"{name}: skipped ({reason})", flush=True)
                continue
        began = time.time()
        results.append(run_configuration(name, kind, spec, args, data, communicator, rank, world))
        if rank == 0:
            r = results[-1]
            accuracy = f"{100 * r['test_accuracy']:.2f}%" if r["test_accuracy"] is not None else "-"
            print(f"{name}: step {r['step_time_s']:.3f} s, {r['bytes_per_step'] / 1e6:.2f} MB/step, "
                  f"accuracy {accuracy} ({time.time() - began:.0f} s)", flush=True)

    measured = [r for r in results if "skipped" not in r]
    if rank == 0 and measured:
        baseline = next((r for r in measured if r["name"] == "ddp_default"), measured[0])
        print(f"\nbaseline for speedup and bytes: {baseline['name']}")
        print_table(results, baseline["step_time_s"], baseline["bytes_per_step"])
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": world, "torch": torch.__version__, "hidden": args.hidden, "parameters": parameters,
                           "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
                           "timed": args.timed, "dense_steps": args.dense_steps, "lr": args.lr,
                           "test_images": args.test_images,
                           "link": os.environ.get("GLOO_SOCKET_IFNAME"),
                           "load_average_after": os.getloadavg(),
                           "command": " ".join(sys.argv), "results": results}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
