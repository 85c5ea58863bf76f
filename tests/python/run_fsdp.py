#!/usr/bin/python3
"""gradzip.torch.compress_fsdp under torchrun: FSDP2 (fully_shard) with gradzip's reduce-scatter.

A small transformer-shaped model (an input layer, two residual blocks with a LayerNorm and two
Linear layers, a head with one output), each block and the root fully_shard'ed over a 1-D CPU
mesh (gloo), AdamW. Checks, on every rank:

  reference  spec "none": each step's sharded gradients equal FSDP's own reduce-scatter's and
             the average of every rank's gradient that each rank computes itself on an
             unsharded copy (bitwise with 2 ranks, where the sum of two is the same in any
             order; else within the bound of summing W float32 values in another order), and
             so do the parameters after AdamW.
  conserve   every codec (error feedback on): per element of this rank's shard, the reduced
             output equals the sum over ranks of what each rank handed in plus the residual it
             held before minus the residual it holds after (every residual folded in), within
             float32 rounding; and the output is not zero where the exact sum is not.
  mixed      FSDP's own reduction with MixedPrecisionPolicy(reduce_dtype=float16) against
             gradzip's fp16 codec and against gradzip's `none` on the float16 input, within the
             derived float16 rounding bound (check_mixed_precision's docstring).
  bfloat16   MixedPrecisionPolicy(reduce_dtype=bfloat16) under `none`, and the bf16 codec,
             against the exact average within bfloat16's derived rounding bound.
  async      the reduce-scatter called with async_op=True returns a Work that waits, with the
             synchronous call's bits (1-D sharding; under hybrid sharding it is FSDP's own).
  unused     a parameter without a gradient: refused on every rank naming the cause; with
             set_reduce_scatter_unused_params(True) `none` equals FSDP's own reduction and a
             compressed run leaves the unused gradients zero.
  warmup     warmup=2: the first two steps equal the "none" run's bit for bit.
  small      the head's bias has one element: with more ranks than elements its shard is empty
             on every rank but one, and the run above covers it; the root group (every
             parameter under min_bytes) is reduced uncompressed.
  resume     (phases first / resume, new processes) N steps, save model shards, AdamW state and
             the FSDPState's state_dict(), N more; the resumed job's parameters equal the
             uninterrupted job's bit for bit, for every codec.
  spanning   a communicator over one rank is refused on every rank, naming the sizes.
  mismatch   rank 0 asks for qsgd, the others for sign: every rank gets gradzip.Error naming
             the spec (under hybrid sharding the first node's ranks ask for qsgd).

With 4 ranks (or any even count from 4) the same checks run again under hybrid sharding: two
"nodes" of nproc / 2 ranks, fully_shard over the node's 1-D mesh, compress_fsdp with
replicate_group= the other mesh dimension; "none" is compared with FSDP's native hybrid
sharding over the 2-D mesh, and the conservation holds across the replicate group.

Launchers: the real torchrun at --torchrun PATH, or --mpirun PATH (every rank --python PY; the
default gradzip communicator then runs over MPI, torch.distributed's gloo over the variables
the script sets from Open MPI's). Exit 77 (ctest: skipped) when PY cannot import torch, its
PyTorch has no fully_shard with a custom reduce-scatter, or there is no torchrun at --torchrun;
0 when every check passed; else 1.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

CODECS = ["fp16", "bf16", "qsgd:bits=4", "terngrad", "sign", "sign:algo=ring", "topk:ratio=0.05",
          "randk:ratio=0.05"]
FEATURES = 16


def with_ef(spec):
    """The spec with error feedback on (spec grammar: codec[:key=value,...])."""
    return spec + (",ef=on" if ":" in spec else ":ef=on")


def make_model(seed):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(64)
            self.up = nn.Linear(64, 256)
            self.down = nn.Linear(256, 64)
            self.skip_norm = False  # True: the norm's parameters get no gradient (check_unused)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x if self.skip_norm else self.norm(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(FEATURES, 64)
            self.blocks = nn.ModuleList([Block(), Block()])
            self.head = nn.Linear(64, 1)

        def forward(self, x):
            x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x).sum(dim=-1)  # one output: not a view (FSDP warns on views)

    torch.manual_seed(seed)
    return Model()


def shard(model, mesh, reduce_dtype=None):
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype) if reduce_dtype else MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


class Layout:
    """How the job is sharded: 1-D over every rank, or hybrid (2 "nodes" of world / 2 ranks:
    FSDP shards over `shard_mesh` inside the node, gradzip all-reduces across `replicate`)."""

    def __init__(self, world, hybrid):
        from torch.distributed.device_mesh import init_device_mesh
        self.hybrid = hybrid
        if hybrid:
            mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
            self.shard_mesh, self.replicate, self.full_mesh = mesh["shard"], mesh["replicate"], mesh
        else:
            self.shard_mesh, self.replicate = init_device_mesh("cpu", (world,)), None
        self.shard_rank = self.shard_mesh.get_local_rank()
        self.shard_size = self.shard_mesh.size()

    def compress(self, model, spec, **options):
        import gradzip.torch
        return gradzip.torch.compress_fsdp(model, spec, replicate_group=self.replicate, **options)


def batch(rank, step):
    import torch
    g = torch.Generator().manual_seed(7919 * step + rank)
    x = torch.randn(8, FEATURES, generator=g)
    return x, x.sum(dim=1).sin()


def loss_of(model, rank, step):
    import torch
    x, y = batch(rank, step)
    return torch.nn.functional.mse_loss(model(x), y)


def local_shard(tensor, rank, world):
    """Rank `rank`'s dim-0 shard of `tensor` as FSDP cuts it (ceil(rows / world) per rank)."""
    rows = tensor.shape[0]
    per = -(-rows // world)
    return tensor[min(rank * per, rows):min((rank + 1) * per, rows)]


def fsdp_run(spec, layout, steps, rank, world, warmup=0, observe=None, reduce_dtype=None,
             prepare=None):
    """Trains `steps` steps with compress_fsdp(spec) (spec None: FSDP's own reduce-scatter, and
    under hybrid sharding FSDP's own hybrid sharding over the 2-D mesh); returns (per-step local
    gradients by name, final local parameters by name, per-step full parameters by name (before
    the step's backward)). `prepare(model)`, when given, runs on the sharded model before
    compress_fsdp."""
    import torch
    if spec is None:
        model = shard(make_model(0), layout.full_mesh if layout.hybrid else layout.shard_mesh,
                      reduce_dtype)
        if prepare is not None:
            prepare(model)
        state = None
    else:
        model = shard(make_model(0), layout.shard_mesh, reduce_dtype)
        if prepare is not None:
            prepare(model)
        state = layout.compress(model, spec, warmup=warmup)
    if observe is not None:
        observe(state)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    grads, full = [], []
    for step in range(steps):
        full.append({n: p.full_tensor().detach().clone() for n, p in model.named_parameters()})
        optimizer.zero_grad()
        loss_of(model, rank, step).backward()
        grads.append({n: p.grad.to_local().detach().clone() for n, p in model.named_parameters()
                      if p.grad is not None})
        optimizer.step()
    params = {n: p.to_local().detach().clone() for n, p in model.named_parameters()}
    if state is not None:
        state.close()
    return grads, params, full


def check_reference(layout, rank, world, failures):
    """spec none against each rank's own unsharded computation of the average gradient and FSDP's
    own reduction. With 2 ranks every step bitwise, and the parameters after AdamW. With more, the
    sums run in other orders: each step's reference gradient is computed at the parameters the
    gradzip run had (AdamW turns last-bit differences into visible ones, so the runs' parameters
    part after the first step), and FSDP's own reduction is compared at the first step, where
    both start from the same parameters."""
    import torch
    steps = 3
    grads, params, full = fsdp_run("none", layout, steps, rank, world)
    fsdp_grads, fsdp_params, _ = fsdp_run(None, layout, steps, rank, world)
    shard_rank, shard_size = layout.shard_rank, layout.shard_size
    plain = make_model(0)
    optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    worst = 0.0
    for step in range(steps):
        if world > 2:
            with torch.no_grad():
                for name, p in plain.named_parameters():
                    p.copy_(full[step][name])
        per_rank = []
        for r in range(world):
            plain.zero_grad()
            loss_of(plain, r, step).backward()
            per_rank.append({n: p.grad.detach().clone() for n, p in plain.named_parameters()})
        for name, p in plain.named_parameters():
            total = per_rank[0][name].clone()
            for r in range(1, world):
                total += per_rank[r][name]
            p.grad = total / world
            expected = local_shard(p.grad, shard_rank, shard_size)
            # Two sums of W float32 values in different orders: each has at most W - 1 roundings
            # of at most 2^-24 of sum |g|, then one division by W, so they differ by at most
            # 2W x 2^-24 x (sum |g|) / W.
            magnitude = sum(local_shard(g[name], shard_rank, shard_size).abs() for g in per_rank) / world
            bound = 2 * world * 2.0 ** -24 * magnitude * 1.01 + 1e-30
            references = [("the unsharded average", expected)]
            if world == 2 or step == 0:
                references.append(("FSDP's own reduction", fsdp_grads[step][name]))
            for against, reference in references:
                got = grads[step][name]
                if got.shape != reference.shape:
                    failures.append(f"reference: step {step} {name}: shape {tuple(got.shape)}, "
                                    f"{against} {tuple(reference.shape)}")
                    continue
                difference = (got - reference).abs()
                ok = torch.equal(got, reference) if world == 2 else bool((difference <= bound).all())
                worst = max(worst, float(difference.max()) if got.numel() else 0.0)
                if not ok:
                    failures.append(f"reference: step {step} {name}: differs from {against} by "
                                    f"up to {float(difference.max()):.3g}")
            if magnitude.numel() and float(magnitude.max()) > 0 and \
                    float(grads[step][name].abs().max()) == 0:
                failures.append(f"reference: step {step} {name}: gradient is all zero")
        optimizer.step()
    for name, p in plain.named_parameters():
        expected = local_shard(p.detach(), shard_rank, shard_size)
        if world == 2 and not (torch.equal(params[name], expected) and
                               torch.equal(params[name], fsdp_params[name])):
            failures.append(f"reference: parameter {name} after AdamW differs")
    what = "hybrid sharding" if layout.hybrid else "reduce-scatter"
    print(f"CHECK rank={rank} reference: spec none matches the unsharded average and FSDP's own "
          f"{what} (max |difference| {worst:.3g}; bitwise with 2 ranks)", flush=True)


def check_conservation(layout, rank, world, failures, codecs=CODECS):
    """Every codec: what gradzip's call returns equals the sum over its group's ranks of (what
    each handed in + the residual it held before - the residual it holds after), per element of
    this rank's part. The reduce-scatter: this rank's row of every rank's contribution; hybrid
    sharding: the node-reduced shard, summed across the replicate group."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from gradzip import fsdp as gradzip_fsdp

    for spec in codecs:
        records = []

        def observe(state):
            def residual(group):
                """(the folded residual, the sum of |each residual| placed where it folds): the
                bound needs the magnitudes, which a worker and an owner residual of opposite
                signs hide once folded."""
                if not group.large:
                    return None
                count = state.rows * group.large_row_numel
                communicator = state.communicator
                folded = communicator.folded_residual(group.name, count)
                if folded is None:
                    return None
                magnitude = np.zeros(count, dtype=np.float32)
                worker = communicator.residual(group.name)
                if worker is not None:
                    magnitude[:worker.size] += np.abs(worker[:count])
                for key, offset in communicator.placed_residuals(group.name):
                    placed = np.abs(communicator.residual(key))
                    magnitude[offset:offset + placed.size] += placed[:max(0, count - offset)]
                return folded, magnitude

            if layout.hybrid:
                original = state.all_reduce_shard

                def recording(group, shard):
                    before, rows = residual(group), shard.view(1, -1).float().clone()
                    stats = original(group, shard)
                    records.append((group, rows, before, residual(group), shard.float().clone(),
                                    stats["algorithm"]))
                    return stats

                state.all_reduce_shard = recording
            else:
                original = state.reduce_scatter

                def recording(group, output, contribution, op):
                    before = residual(group)
                    rows = contribution.view(world, group.row_numel).float().clone()
                    stats = original(group, output, contribution, op)
                    records.append((group, rows, before, residual(group), output.float().clone(),
                                    stats["algorithm"]))
                    return stats

                state.reduce_scatter = recording

        fsdp_run(with_ef(spec), layout, 2, rank, world, observe=observe)
        members = layout.replicate.get_group() if layout.hybrid else None
        size = dist.get_world_size(members)
        row = 0 if layout.hybrid else rank
        worst, compressed_groups, algorithms = 0.0, 0, set()
        for group, rows, before, after, output, algorithm in records:
            algorithms.add(algorithm)
            if not group.large:
                continue
            compressed_groups += 1
            large = gradzip_fsdp._gather_columns(rows, group.large)
            zeros = torch.zeros_like(large)
            e_before = torch.from_numpy(before[0]).view_as(large) if before is not None else zeros
            e_after = torch.from_numpy(after[0]).view_as(large) if after is not None else zeros
            e_before_magnitude = (torch.from_numpy(before[1]).view_as(large) if before is not None
                                  else zeros)
            e_after_magnitude = (torch.from_numpy(after[1]).view_as(large) if after is not None
                                 else zeros)
            sent = large + e_before - e_after  # what this rank's contribution delivered
            gathered = [torch.empty_like(sent) for _ in range(size)]
            dist.all_gather(gathered, sent, group=members)
            exact = [torch.empty_like(large) for _ in range(size)]
            dist.all_gather(exact, large + e_before, group=members)
            handed = [torch.empty_like(large) for _ in range(size)]
            dist.all_gather(handed, large.abs() + e_before_magnitude, group=members)
            kept = [torch.empty_like(large) for _ in range(size)]
            dist.all_gather(kept, e_after_magnitude, group=members)
            delivered = sum(g[row] for g in gathered)
            wanted = sum(e[row] for e in exact)
            got = gradzip_fsdp._gather_columns(output.view(1, -1), group.large)[0]
            # Float32 roundings, u = 2^-24 each, at the magnitudes of each residual separately (a
            # worker and an owner residual of opposite signs fold to less than either): every
            # residual is (c + e) - d for a decoded d, |d| <= |c| + |e| + |e_after|, rounded once; an algorithm that re-encodes a partial sum
            # (SRA's owner, the tree's root, the ring's hops) rounds once more at that sum's
            # magnitude, at most the sum of the |d|; the `size` decoded values are summed in some
            # order (size - 1 roundings), and the output is rounded at |output|. So |output -
            # delivered| <= (2 size + 4) u (sum over ranks of |c| + |e| + |e_after|, + |output|).
            scale = (sum(h[row] for h in handed) + sum(k[row] for k in kept) + got.abs())
            bound = (2 * size + 4) * 2.0 ** -24 * scale + 1e-30
            difference = (got - delivered).abs()
            worst = max(worst, float(difference.max()))
            if not bool((difference <= bound).all()):
                at = int((difference - bound).argmax())
                failures.append(f"conserve {spec}: group {group.name} ({algorithm}): output differs "
                                f"from the delivered sum by {float(difference.max()):.3g} (element "
                                f"{at}: output {float(got[at]):.9g}, delivered "
                                f"{float(delivered[at]):.9g}, bound {float(bound[at]):.3g})")
            if float(got.abs().max()) == 0.0 and float(wanted.abs().max()) > 0:
                failures.append(f"conserve {spec}: group {group.name}: output is all zero")
        if compressed_groups == 0:
            failures.append(f"conserve {spec}: no group was compressed")
        print(f"CHECK rank={rank} conserve {spec}: {compressed_groups} compressed calls "
              f"({', '.join(sorted(algorithms))}), max |output - delivered| {worst:.3g}", flush=True)


def check_mixed_precision(layout, rank, world, failures):
    """FSDP's own reduction with MixedPrecisionPolicy(reduce_dtype=float16) against gradzip's
    fp16 codec (float32 gradients, float16 on the wire) and against gradzip's `none` handed the
    float16 reduce-scatter input itself, at the first step (same parameters everywhere).

    The bound, per element, with u = 2^-11 (float16's unit roundoff) and m = sum over ranks of
    |g_r| / W: FSDP rounds each contribution to float16 (u |g_r| each) and each of its W - 1
    float16 additions (u sum |g_r| at most), then its division: u (W + 1) m in all after dividing
    by W; gradzip's fp16 rounds each contribution once and sums in float32: u m; `none` on
    float16 input: FSDP's casts plus one rounding of the float32 sum, u 2 m. So the two differ by
    at most u (W + 3) m, plus float16's subnormal spacing 2^-24 per rounding for tiny values."""
    import torch
    reference, _, _ = fsdp_run(None, layout, 1, rank, world, reduce_dtype=torch.float16)
    plain = make_model(0)  # every rank's gradient at the first step's parameters, for m
    magnitude = {}
    for r in range(world):
        plain.zero_grad()
        loss_of(plain, r, 0).backward()
        for name, p in plain.named_parameters():
            magnitude[name] = magnitude.get(name, 0) + p.grad.abs() / world
    for spec, reduce_dtype in (("fp16", None), ("none", torch.float16)):
        grads, _, _ = fsdp_run(spec, layout, 1, rank, world, reduce_dtype=reduce_dtype)
        worst = 0.0
        for name, got in grads[0].items():
            if got.numel() == 0:
                continue
            want = reference[0][name]
            m = local_shard(magnitude[name], layout.shard_rank, layout.shard_size)
            bound = (2.0 ** -11 * (world + 3) * m + (world + 3) * 2.0 ** -24) * 1.01
            difference = (got - want).abs()
            worst = max(worst, float(difference.max()))
            if not bool((difference <= bound).all()):
                failures.append(f"mixed precision {spec} (reduce dtype {reduce_dtype}): {name} "
                                f"differs from FSDP's float16 reduction by {float(difference.max()):.3g}")
            if float(want.abs().max()) > 0 and float(got.abs().max()) == 0:
                failures.append(f"mixed precision {spec}: {name} is all zero")
        print(f"CHECK rank={rank} mixed precision: {spec} (reduce dtype {reduce_dtype}) against "
              f"FSDP's float16 reduction: max |difference| {worst:.3g}", flush=True)


def average_gradients(rank, world, layout, prepare=None):
    """(each parameter's exact average over ranks of the first step's gradient, this rank's
    shard; the mean over ranks of |gradient|, the same shard), from unsharded copies (after
    `prepare(model)` when given)."""
    import torch
    per_rank = []
    plain = make_model(0)
    if prepare is not None:
        prepare(plain)
    for r in range(world):
        plain.zero_grad()
        loss_of(plain, r, 0).backward()
        per_rank.append({n: (p.grad if p.grad is not None else torch.zeros_like(p)).double()
                         for n, p in plain.named_parameters()})
    average, magnitude = {}, {}
    for name in per_rank[0]:
        cut = lambda t: local_shard(t, layout.shard_rank, layout.shard_size)  # noqa: E731
        average[name] = cut(sum(g[name] for g in per_rank) / world)
        magnitude[name] = cut(sum(g[name].abs() for g in per_rank) / world)
    return average, magnitude


def check_bfloat16(layout, rank, world, failures):
    """MixedPrecisionPolicy(reduce_dtype=bfloat16) under gradzip's `none`, and gradzip's bf16
    codec on float32 gradients, against the exact average of the first step's gradients (FSDP's
    own bfloat16 reduction over gloo would average with ReduceOp.AVG, which gloo lacks, so the
    exact average is the reference).

    The bound, per element, with u = 2^-8 (bfloat16's unit roundoff) and m = the mean over ranks
    of |g_r|: a bfloat16 reduce dtype rounds each contribution (u m after the division), FSDP's
    own bfloat16 reduce-scatter inside a node under hybrid sharding rounds each of its additions
    (at most u (W - 1) m), gradzip sums in float32 (W 2^-24 m) and rounds the sum back to
    bfloat16 (u m), and FSDP divides in bfloat16 (u m): at most (u (W + 2) + W 2^-24) m. The
    bf16 codec rounds each contribution once and sums and divides in float32, inside that."""
    import torch
    average, magnitude = average_gradients(rank, world, layout)
    for spec, reduce_dtype in (("none", torch.bfloat16), ("bf16", None)):
        grads, _, _ = fsdp_run(spec, layout, 1, rank, world, reduce_dtype=reduce_dtype)
        worst = 0.0
        for name, got in grads[0].items():
            if got.numel() == 0:
                continue
            if got.dtype != torch.float32:
                failures.append(f"bfloat16 {spec}: {name}'s gradient is {got.dtype}, not float32")
            bound = (2.0 ** -8 * (world + 2) + world * 2.0 ** -24) * magnitude[name] * 1.01 + 1e-38
            difference = (got.double() - average[name]).abs()
            worst = max(worst, float(difference.max()))
            if not bool((difference <= bound).all()):
                failures.append(f"bfloat16 {spec} (reduce dtype {reduce_dtype}): {name} differs "
                                f"from the exact average by {float(difference.max()):.3g}")
            if float(average[name].abs().max()) > 0 and float(got.abs().max()) == 0:
                failures.append(f"bfloat16 {spec}: {name} is all zero")
        print(f"CHECK rank={rank} bfloat16: {spec} (reduce dtype {reduce_dtype}) against the exact "
              f"average: max |difference| {worst:.3g}", flush=True)


def check_async(layout, rank, world, failures):
    """FSDP's ReduceScatter interface with async_op=True: the call returns a Work whose wait()
    succeeds, and the output is the same bits as the synchronous call's on an identical state
    (spec none), and the exact row sum within float32's reordering bound."""
    import torch
    import torch.distributed as dist
    outputs = []
    for async_op in (False, True):
        model = shard(make_model(0), layout.shard_mesh)
        state = layout.compress(model, "none")
        comm = model.blocks[0]._get_fsdp_state()._fsdp_param_groups[0]._reduce_scatter_comm
        numel = comm._group.row_numel
        g = torch.Generator().manual_seed(rank + 1)
        contribution = torch.randn(world * numel, generator=g)
        output = comm.allocate((numel,), dtype=torch.float32, device=torch.device("cpu"))
        # The input is FSDP's scratch: gradzip reduces in it, so the call gets a copy.
        work = comm(output, contribution.clone(), layout.shard_mesh.get_group(),
                    dist.ReduceOp.SUM, async_op=async_op)
        if async_op:
            if work is None:
                failures.append("async: async_op=True returned no Work")
            else:
                work.wait()
                if not work.is_completed():
                    failures.append("async: the Work is not completed after wait()")
        elif work is not None:
            failures.append("async: async_op=False returned a Work")
        outputs.append(output.clone())
        state.close()
    rows = [torch.empty_like(contribution) for _ in range(world)]
    dist.all_gather(rows, contribution, group=layout.shard_mesh.get_group())
    exact = sum(r.view(world, -1)[rank].double() for r in rows)
    magnitude = sum(r.view(world, -1)[rank].abs().double() for r in rows)
    bound = 2 * world * 2.0 ** -24 * magnitude * 1.01
    if not torch.equal(outputs[0], outputs[1]):
        failures.append("async: the async_op=True output differs from the synchronous call's")
    difference = (outputs[1].double() - exact).abs()
    if not bool((difference <= bound).all()):
        failures.append(f"async: output differs from the exact row sum by {float(difference.max()):.3g}")
    print(f"CHECK rank={rank} async: async_op=True waits and equals the synchronous call "
          f"(|output - exact| <= {float(difference.max()):.3g})", flush=True)


def check_unused(layout, rank, world, failures):
    """A parameter without a gradient in a backward (block 0's norm skipped). FSDP's default
    leaves it out of the reduction, which changes the group's layout: refused on every rank
    with gradzip.Error naming it. With set_reduce_scatter_unused_params(True) (and the explicit
    reduce dtype FSDP then requires) the layout is kept: `none` equals FSDP's own reduction under
    the same settings (bitwise with 2 ranks, else within check_reference's reordering bound at
    the first step), and a compressed spec trains with the unused parameters' gradients zero."""
    import torch
    import gradzip

    def skip(model):
        model.blocks[0].skip_norm = True

    try:
        fsdp_run("qsgd:bits=4,ef=on", layout, 1, rank, world, prepare=skip)
        failures.append("unused: a parameter without a gradient was not refused")
    except gradzip.Error as error:
        if "without gradients" not in str(error):
            failures.append(f"unused: the error does not name the cause: {error}")
        print(f"CHECK rank={rank} unused: refused: {str(error)[:160]}", flush=True)

    def keep_layout(model):
        skip(model)
        model.set_reduce_scatter_unused_params(True)

    mine, _, _ = fsdp_run("none", layout, 2, rank, world, reduce_dtype=torch.float32,
                          prepare=keep_layout)
    theirs, _, _ = fsdp_run(None, layout, 2, rank, world, reduce_dtype=torch.float32,
                            prepare=keep_layout)
    _, magnitude = average_gradients(rank, world, layout, prepare=skip)
    for step in range(2 if world == 2 else 1):
        for name, want in theirs[step].items():
            got = mine[step].get(name)
            if got is None or got.shape != want.shape:
                failures.append(f"unused: step {step} {name}: no gradient or another shape")
                continue
            bound = 2 * world * 2.0 ** -24 * magnitude[name].float() * 1.01 + 1e-30
            ok = torch.equal(got, want) if world == 2 else bool(((got - want).abs() <= bound).all())
            if not ok:
                failures.append(f"unused: step {step} {name} differs from FSDP's own reduction")
    compressed, _, _ = fsdp_run("qsgd:bits=4,ef=on", layout, 2, rank, world,
                                reduce_dtype=torch.float32, prepare=keep_layout)
    for name, got in compressed[1].items():
        if name.startswith("blocks.0.norm.") and got.numel() and float(got.abs().max()) != 0:
            failures.append(f"unused: {name} has a nonzero gradient under qsgd")
    if "blocks.0.norm.weight" not in compressed[1]:
        failures.append("unused: the unused norm got no (zero) gradient with the layout kept")
    print(f"CHECK rank={rank} unused: with set_reduce_scatter_unused_params(True) none equals "
          f"FSDP's own reduction, qsgd trains with the unused gradients zero", flush=True)


def check_warmup(layout, rank, world, failures):
    import torch
    plain_grads, _, _ = fsdp_run("none", layout, 3, rank, world)
    warm_grads, _, _ = fsdp_run(with_ef("qsgd:bits=2"), layout, 3, rank, world, warmup=2)
    for step in range(3):
        same = all(torch.equal(warm_grads[step][n], plain_grads[step][n]) for n in plain_grads[step])
        if step < 2 and not same:
            failures.append(f"warmup: step {step} is not the uncompressed run's")
        if step == 2 and same:
            failures.append("warmup: step 2 (after warm-up) is still uncompressed")
    print(f"CHECK rank={rank} warmup: 2 uncompressed steps, then compressed", flush=True)


def local_optimizer_state(optimizer, model):
    state = {}
    for name, p in model.named_parameters():
        entry = optimizer.state.get(p)
        if entry:
            state[name] = {k: (v.to_local() if hasattr(v, "to_local") else v).clone()
                           for k, v in entry.items()}
    return state


def load_local_optimizer_state(optimizer, model, saved):
    import torch
    from torch.distributed.tensor import DTensor
    for name, p in model.named_parameters():
        if name not in saved:
            continue
        entry = {}
        for key, value in saved[name].items():
            if key == "step":
                entry[key] = value.clone()
            else:
                entry[key] = DTensor.from_local(value.clone(), p.device_mesh, p.placements,
                                                shape=p.shape, stride=p.stride())
        optimizer.state[p] = entry


def resume_phase(phase, directory, layout, rank, world, failures, specs, steps=3):
    import torch
    for index, spec in enumerate(specs):
        model = shard(make_model(0 if phase == "first" else 5), layout.shard_mesh)
        state = layout.compress(model, with_ef(spec) if spec != "none" else spec)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        tag = "hybrid" if layout.hybrid else "flat"
        checkpoint = os.path.join(directory, f"{tag}.spec{index}.rank{rank}.pt")
        final = os.path.join(directory, f"{tag}.spec{index}.rank{rank}.final.pt")
        first = 0
        if phase == "resume":
            saved = torch.load(checkpoint, weights_only=False)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.to_local().copy_(saved["model"][name])
            load_local_optimizer_state(optimizer, model, saved["optimizer"])
            state.load_state_dict(saved["gradzip"])
            first = steps
        for step in range(first, 2 * steps):
            if phase == "first" and step == steps:
                torch.save({"model": {n: p.to_local().detach().clone() for n, p in model.named_parameters()},
                            "optimizer": local_optimizer_state(optimizer, model),
                            "gradzip": state.state_dict()}, checkpoint)
            optimizer.zero_grad()
            loss_of(model, rank, step).backward()
            optimizer.step()
        params = {n: p.to_local().detach().clone() for n, p in model.named_parameters()}
        if phase == "first":
            torch.save(params, final)
        else:
            expected = torch.load(final)
            same = all(torch.equal(params[n], expected[n]) for n in expected)
            worst = max(float((params[n] - expected[n]).abs().max()) if params[n].numel() else 0.0
                        for n in expected)
            print(f"RESUMED rank={rank} spec={spec}: {'bitwise equal' if same else 'DIFFERS'} "
                  f"(max |difference| {worst:.3g})", flush=True)
            if not same:
                failures.append(f"resume {spec}: parameters differ by up to {worst:.3g}")
        state.close()


def check_not_spanning(layout, rank, world, failures):
    """A communicator over this rank alone, given to compress_fsdp: refused on every rank at
    construction (gradzip.Error naming both sizes), never left to reduce each rank alone."""
    import torch.distributed as dist
    import gradzip
    singles = [dist.new_group([r]) for r in range(world)]  # every rank makes every group
    alone = gradzip.Communicator(transport="torch", process_group=singles[rank])
    model = shard(make_model(0), layout.shard_mesh)
    try:
        layout.compress(model, "qsgd:bits=4", communicator=alone)
        failures.append("not spanning: a one-rank communicator was accepted")
    except gradzip.Error as error:
        if "1 rank" not in str(error) and "of 1" not in str(error):
            failures.append(f"not spanning: the error does not name the sizes: {error}")
        print(f"CHECK rank={rank} not spanning: refused: {str(error)[:160]}", flush=True)
    dist.barrier()


def check_mismatch(layout, rank, world, failures):
    import gradzip
    model = shard(make_model(0), layout.shard_mesh)
    # The first rank of every group gradzip reduces over asks for another spec than the others:
    # rank 0 of the job, or under hybrid sharding the first node's ranks (one in every
    # replicate group), so that every group sees the mismatch.
    first = rank < layout.shard_size if layout.hybrid else rank == 0
    spec = "qsgd:bits=4,ef=on" if first else "sign:ef=on"
    layout.compress(model, spec)
    try:
        loss_of(model, rank, 0).backward()
        failures.append("mismatch: specs differing across ranks were not refused")
    except gradzip.Error as error:
        if "spec" not in str(error):
            failures.append(f"mismatch: the error does not name the spec: {error}")
        print(f"CHECK rank={rank} mismatch: refused: {str(error)[:160]}", flush=True)


RESUME_SPECS = ["none"] + CODECS
HYBRID_CODECS = ["fp16", "qsgd:bits=4", "qsgd:bits=4,algo=sra", "terngrad", "sign", "topk:ratio=0.05",
                 "randk:ratio=0.05"]
HYBRID_RESUME_SPECS = ["none"] + HYBRID_CODECS



def worker(phase, directory):
    import torch.distributed as dist

    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:  # under mpirun
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    hybrid = phase.startswith("hybrid")
    layout = Layout(world, hybrid)
    if rank == 0:
        import gradzip
        print(f"TRANSPORT of the default communicator over the whole job: "
              f"{gradzip.choose_transport('auto')}", flush=True)
    if phase in ("checks", "hybrid-checks"):
        check_reference(layout, rank, world, failures)
        check_conservation(layout, rank, world, failures, HYBRID_CODECS if hybrid else CODECS)
        check_mixed_precision(layout, rank, world, failures)
        check_bfloat16(layout, rank, world, failures)
        if not hybrid:  # under hybrid sharding the reduce-scatter is FSDP's own
            check_async(layout, rank, world, failures)
        check_unused(layout, rank, world, failures)
        check_warmup(layout, rank, world, failures)
        check_not_spanning(layout, rank, world, failures)
        check_mismatch(layout, rank, world, failures)  # last: the group may be out of step after it
    else:
        resume_phase(phase.split("-")[-1], directory, layout, rank, world, failures,
                     HYBRID_RESUME_SPECS if hybrid else RESUME_SPECS)
    for failure in failures:
        print(f"FAILED rank={rank} {failure}", flush=True)
    print(f"DONE rank={rank} phase={phase} failures={len(failures)}", flush=True)
    dist.destroy_process_group()
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--torchrun", help="start the jobs with this torchrun")
    parser.add_argument("--mpirun", help="start the jobs with this mpirun instead (each rank: "
                        "--python PY; gradzip's default communicator then runs over MPI)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--port", type=int, default=29911)
    parser.add_argument("--worker", nargs=2, metavar=("PHASE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker[0], args.worker[1])

    probe = ("import torch; from torch.distributed.fsdp import FSDPModule; "
             "assert hasattr(FSDPModule, 'set_custom_reduce_scatter')")
    if not os.path.exists(args.python) or subprocess.run(
            [args.python, "-c", probe], capture_output=True).returncode != 0:
        print(f"SKIP: {args.python} has no PyTorch with FSDP2's set_custom_reduce_scatter "
              "(scripts/install-deps.sh --torch-venv installs a current one)")
        return 77
    if (args.torchrun is None) == (args.mpirun is None):
        parser.error("give exactly one of --torchrun and --mpirun")
    if args.torchrun is not None and not os.path.exists(args.torchrun):
        print(f"SKIP: no torchrun at {args.torchrun} (scripts/install-deps.sh --torch-venv makes it)")
        return 77
    phases = ["checks", "first", "resume"]
    resumed_specs = len(RESUME_SPECS)
    if args.nproc >= 4 and args.nproc % 2 == 0:  # two "nodes" of nproc / 2 ranks
        phases += ["hybrid-checks", "hybrid-first", "hybrid-resume"]
        resumed_specs += len(HYBRID_RESUME_SPECS)
    directory = tempfile.mkdtemp(prefix="gradzip-fsdp-")
    resumed = 0
    try:
        for offset, phase in enumerate(phases):
            script = [os.path.abspath(__file__), "--worker", phase, directory]
            if args.torchrun is not None:
                command = [args.torchrun, "--nproc_per_node", str(args.nproc), "--master_port",
                           str(args.port + offset)] + script
            else:  # torch.distributed's rendezvous from the variables below (worker())
                command = [args.mpirun, "--oversubscribe", "--bind-to", "none", "-np",
                           str(args.nproc), "-x", "MASTER_ADDR=127.0.0.1", "-x",
                           f"MASTER_PORT={args.port + offset}", "-x", "OMP_NUM_THREADS=1",
                           args.python] + script
            result = subprocess.run(command, capture_output=True, text=True, timeout=600,
                                    env=dict(os.environ, OMP_NUM_THREADS="1"))
            output = result.stdout + result.stderr
            print(output)
            done = output.count(f"phase={phase} failures=0")
            if result.returncode != 0 or done != args.nproc:
                print(f"FAIL: the {phase} job exited {result.returncode}; {done} of {args.nproc} "
                      "ranks passed every check")
                return 1
            resumed += output.count("bitwise equal")
        expected = args.nproc * resumed_specs
        print(f"{resumed} of {expected} (rank, spec) pairs resumed bit for bit")
        return 0 if resumed == expected else 1
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
