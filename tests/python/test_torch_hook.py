"""gradzip.torch: the DDP communication hook against DDP's own all-reduce, its residual
bookkeeping across DDP's bucket rebuild, checkpoints, warm-up and a short training run.

Each test builds its models from fixed seeds (the same on every rank) and feeds rank-dependent
data; every rank runs the same iterations, so gradzip's collectives and gloo's pair up. Each
GradzipState gets its own gradzip.Communicator (residuals are keyed by bucket names, which repeat
between tests that build the same model).
"""
import json
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import gradzip  # noqa: E402
import gradzip.torch  # noqa: E402

# The span-nesting check of the Reducer's timeline test, shared with the hook's.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import check_timeline  # noqa: E402

U = 2.0 ** -24  # f32 unit roundoff
# min_bytes=0: every bucket compressed, with residuals; the sparse all-reduce pinned (its worker
# residuals are what these tests follow; algo=auto may take the tree on fast links)
TOPK = "topk:ratio=0.01,ef=on,min_bytes=0,algo=sparse"


class Net(torch.nn.Module):
    """~690k parameters: 3 to 4 buckets at bucket_cap_mb=0.5 (DDP's first bucket holds up to
    1 MiB). The layers are declared in an order other than the one forward uses, so DDP's first
    buckets (reverse declaration order) differ from the ones it rebuilds after iteration 0
    (gradient-ready order)."""

    def __init__(self):
        super().__init__()
        self.c = torch.nn.Linear(256, 10)
        self.a = torch.nn.Linear(32, 512)
        self.e = torch.nn.Linear(512, 512)
        self.d = torch.nn.Linear(512, 512)
        self.b = torch.nn.Linear(512, 256)

    def forward(self, x):
        h = torch.relu(self.d(torch.relu(self.a(x))))
        return self.c(torch.relu(self.b(torch.relu(self.e(h)))))


def make_net(seed=0):
    torch.manual_seed(seed)
    return Net()


def batch(rank, step, n=16):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def sum_over_ranks(comm, tensors, name):
    """The element-wise sum over ranks (spec none, op sum) of a list of f32 tensors."""
    flat = torch.cat([t.reshape(-1).to(torch.float32) for t in tensors]).contiguous()
    comm.allreduce(flat, name, "none", op="sum")
    return flat


def step(ddp, rank, i, zero=False):
    ddp.zero_grad(set_to_none=False)
    x, y = batch(rank, i)
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    (loss * 0 if zero else loss).backward()
    return loss.item()


def divided_abs_sum(comm, model, rank, i, tag):
    """A_i = sum_r |g_r,i| / P: every rank's local (not reduced) gradient of `model` at its
    parameters on batch i, from a plain copy, summed over ranks with spec none."""
    plain = make_net()
    plain.load_state_dict(model.state_dict())
    x, y = batch(rank, i)
    torch.nn.functional.cross_entropy(plain(x), y).backward()
    return sum_over_ranks(comm, [p.grad.abs() / comm.size for p in plain.parameters()], tag)


def test_none_hook_equals_ddp_allreduce(process_group, comm, rank, size):
    # 2 ranks: bitwise. Both divide each gradient by 2 (exact, a power of two) and add the two
    # halves once (commutative: the same bits in either order). Other rank counts: the two sums
    # of P divided terms may add in different orders, each within (P - 1) u A_i of the exact sum
    # (A_i = sum_r |g_r,i| / P), so they differ by at most 2 (P - 1) u A_i (1% for second order).
    reference = DDP(make_net(), bucket_cap_mb=0.5)
    hooked_model = make_net()
    hooked = DDP(hooked_model, bucket_cap_mb=0.5)
    state = gradzip.torch.GradzipState(hooked_model, "none", communicator=gradzip.Communicator())
    hooked.register_comm_hook(state, gradzip.torch.hook)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    results = []
    for i in range(3):  # iteration 0 on the first buckets, 1 and 2 on the rebuilt ones
        a = divided_abs_sum(comm, reference.module, rank, i, "none.abs") if size != 2 else None
        step(reference, rank, i)
        step(hooked, rank, i)
        e = torch.cat([p.grad.reshape(-1) for p in reference.module.parameters()])
        g = torch.cat([p.grad.reshape(-1) for p in hooked.module.parameters()])
        results.append((e, g, a))
        optimizer.step()
        with torch.no_grad():  # the hooked model continues from the reference's parameters
            for p, q in zip(reference.module.parameters(), hooked.module.parameters()):
                q.copy_(p)
    assert len(state.last_stats) >= 3, "the model should span several buckets"
    assert all(s["spec"].startswith("none") for s in state.last_stats.values())
    for e, g, a in results:
        assert torch.count_nonzero(e) > 0
        if size == 2:
            assert torch.equal(e, g)
        else:
            assert torch.all((e - g).abs() <= 2 * (size - 1) * U * a * 1.01)


def test_fp16_hook_matches_torch_fp16_compress_hook(process_group, comm, rank, size):
    reference = DDP(make_net(1), bucket_cap_mb=0.5)
    reference.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    hooked_model = make_net(1)
    hooked = DDP(hooked_model, bucket_cap_mb=0.5)
    state = gradzip.torch.GradzipState(hooked_model, "fp16:min_bytes=0", communicator=gradzip.Communicator())
    hooked.register_comm_hook(state, gradzip.torch.hook)
    step(reference, rank, 0)
    step(hooked, rank, 0)
    a = divided_abs_sum(comm, make_net(1), rank, 0, "fp16.abs")
    e = torch.cat([p.grad.reshape(-1) for p in reference.module.parameters()])
    g = torch.cat([p.grad.reshape(-1) for p in hooked.module.parameters()])
    # gradzip's fp16 ring: <= P roundings of partial sums, each <= 2^-11 of <= A_i (+ 2^-25 in
    # f16's subnormal range). torch's hook: P casts of g_r/P and P - 1 f16 adds (gloo), each
    # <= 2^-11 A_i (+ 2^-25). The difference is at most the sum of both, 1% for second order.
    bound = (3 * size) * (2.0 ** -11 * a * 1.01 + 2.0 ** -25)
    assert torch.all((e - g).abs() <= bound), f"max excess {torch.max((e - g).abs() - bound)}"


def residuals_of(state):
    return {k: np.array(v, copy=True) for k, v in state.state_dict()["residuals"].items()}


def check_carried(comm, model, before, after, tag):
    """After an iteration whose local gradients were zero, the bucket input was exactly the
    carried residual R0 (on each rank), so: (1) element-wise the new residual R1 is R0 (dropped)
    or 0 (sent); (2) the result (op average: every contribution was divided first, so the
    residual is in divided units) is sum_r (R0_r - R1_r), up to the order of P - 1 f32 adds.
    Both fail if the residual were dropped at the rebuild (then R1 = 0 and the result is 0)."""
    sent = []
    for name, p in model.named_parameters():
        r0, r1 = before[name], after[name]
        assert np.all((r1 == r0) | (r1 == 0)), name
        sent.append(torch.from_numpy(r0 - r1))
    total = sum_over_ranks(comm, sent, tag)
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    scale = sum_over_ranks(comm, [t.abs() for t in sent], tag + ".abs")
    assert torch.all((got - total).abs() <= 2 * comm.size * U * scale)
    assert torch.count_nonzero(total) > 0


def test_topk_residuals_survive_the_bucket_rebuild(process_group, rank, size):
    comm = gradzip.Communicator()
    model = make_net(2)
    ddp = DDP(model, bucket_cap_mb=0.5)
    state = gradzip.torch.GradzipState(model, TOPK, communicator=comm)
    ddp.register_comm_hook(state, gradzip.torch.hook)
    step(ddp, rank, 0)
    names_before = set(comm.residual_names())
    r0 = residuals_of(state)
    assert set(r0) == {n for n, _ in model.named_parameters()}
    # every weight matrix has a residual (a small bias may have been sent whole)
    assert all(np.count_nonzero(r0[n]) > 0 for n, p in model.named_parameters() if p.dim() == 2)
    step(ddp, rank, 1, zero=True)  # DDP rebuilds its buckets before this backward
    names_after = set(comm.residual_names())
    r1 = residuals_of(state)
    assert names_after - names_before, "DDP's rebuild should have produced new bucket layouts"
    check_carried(comm, model, r0, r1, "rebuild")


# Every algorithm the hook may run, each with the residuals it keeps: SRA's owner side, the
# tree's root, halving/doubling's steps and owner, the hierarchical shard's (and its inner SRA's),
# the ring's and the sparse all-reduce's worker residuals; and algo=auto.
EVERY_ALGORITHM = [
    "sign:algo=sra,min_bytes=0", "sign:algo=tree,min_bytes=0", "sign:algo=rhd,min_bytes=0",
    "sign:algo=hier,ranks_per_node=1,min_bytes=0", "topk:ratio=0.01,algo=ring,min_bytes=0",
    "topk:ratio=0.01,algo=sparse,min_bytes=0", "sign:min_bytes=0", "qsgd:bits=2,ef=on,min_bytes=0",
    # the defaults: parameters under min_bytes averaged uncompressed, the rest packed or in place
    "sign", "topk:ratio=0.01"]


def compressed_parameters(model, spec):
    """The parameters the hook compresses (and keeps residuals for): with algo=auto, those of at
    least min_bytes (4 bytes an element); with another algorithm, all."""
    canonical = gradzip.parse_spec(spec)
    min_bytes = int(canonical.split("min_bytes=")[1].split(",")[0])
    auto = "algo=auto" in canonical
    return {n for n, p in model.named_parameters() if not auto or 4 * p.numel() >= min_bytes}


@pytest.mark.parametrize("spec", EVERY_ALGORITHM)
def test_every_algorithms_residuals_survive_the_rebuild_and_the_checkpoint(comm, process_group, rank, size, spec):
    # Error feedback's invariant, summed over ranks and per element: result + residual mass
    # after = input + residual mass before. After DDP's rebuild (before iteration 1's backward)
    # the buckets change; iteration 1 feeds zero gradients, so its result must equal
    # sum_r (M0_r - M1_r), M = state_dict()'s per-parameter residuals (every residual folded in,
    # owner and root ones included). A residual dropped at the rebuild, or left out of the
    # checkpoint, breaks the equation by its own size; f32 rounding stays within the bound,
    # taken per parameter from its largest magnitudes (a folded M may be small where a worker
    # and an owner residual nearly cancel, while the rounding follows their own sizes).
    model = make_net(6)
    ddp = DDP(model, bucket_cap_mb=0.5)
    own = gradzip.Communicator()
    state = gradzip.torch.GradzipState(model, spec, communicator=own)
    ddp.register_comm_hook(state, gradzip.torch.hook)
    step(ddp, rank, 0)
    names_before = set(own.residual_names())
    auxiliary = [n for n in names_before if not n.startswith("ddp.bucket")]
    if "algo=sra" in spec or "algo=hier" in spec or ("algo=tree" in spec and rank == 0) or "algo=rhd" in spec:
        assert auxiliary, f"{spec}: the algorithm should keep residuals besides the workers' ({names_before})"
    m0 = residuals_of(state)
    assert set(m0) == compressed_parameters(model, spec)
    step(ddp, rank, 1, zero=True)
    assert set(own.residual_names()) - names_before, "DDP's rebuild should have produced new buckets"
    m1 = residuals_of(state)
    # a parameter averaged uncompressed has no residual: none before, none after
    for n, p in model.named_parameters():
        m0.setdefault(n, np.zeros(p.numel(), dtype=np.float32))
        m1.setdefault(n, np.zeros(p.numel(), dtype=np.float32))
    delivered = sum_over_ranks(comm, [torch.from_numpy(m0[n] - m1[n]) for n, _ in model.named_parameters()],
                               f"every-algorithm.{spec}")
    scale = sum_over_ranks(comm, [torch.from_numpy(np.abs(m0[n]) + np.abs(m1[n]))
                                  for n, _ in model.named_parameters()], f"every-algorithm.{spec}.abs")
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert torch.count_nonzero(delivered) > 0
    bound = torch.cat([torch.full((p.numel(),), 8 * (size + 2) * U * (
        scale[o:o + p.numel()].max().item() + size * got[o:o + p.numel()].abs().max().item()))
        for o, p in zip(np.cumsum([0] + [q.numel() for q in model.parameters()]), model.parameters())])
    excess = (got - delivered).abs() - bound
    algorithms = sorted({stats["algorithm"] for stats in state.last_stats.values()})
    assert torch.all(excess <= 0), f"{spec} ({algorithms}): max excess {excess.max().item()} (max |delivered| {delivered.abs().max().item()})"


def test_split_of_a_bucket_by_min_bytes():
    # Offsets and numels in elements; the large parameters go in buffer order. Contiguous large
    # parameters are compressed in place (run = their range, offsets relative to it); otherwise
    # they are packed and the offsets are the packed ones.
    split = gradzip.torch._Split(small=(("b", 0, 5),), large=[("w", 5, 100), ("v", 105, 50)])
    assert split.run == (5, 155)
    assert split.layout == (("w", 0, 100), ("v", 100, 50))
    split = gradzip.torch._Split(small=(("b1", 100, 5),), large=[("w1", 0, 100), ("w2", 105, 200)])
    assert split.run is None
    assert split.layout == (("w1", 0, 100), ("w2", 100, 200))
    split = gradzip.torch._Split(small=(("b", 0, 5), ("c", 5, 3)), large=[])
    assert split.run is None and split.layout == ()


@pytest.mark.parametrize("spec", ["sign", "topk:ratio=0.01", "qsgd:bits=2"])
def test_parameters_under_min_bytes_are_averaged_uncompressed(comm, process_group, rank, size, spec):
    # With algo=auto and the default min_bytes (65536), Net's biases and its 10 x 256 output
    # layer (10 KiB) are averaged uncompressed: each within the f32 rounding of an all-reduce,
    # (P + 1) u A_i (A_i = sum_r |g_r,i| / P; 2x and 1% for the orders of the sums), of the exact
    # average, which no compressed parameter is; those keep residuals, the small ones none.
    model = make_net(9)
    ddp = DDP(model, bucket_cap_mb=0.5)
    state = gradzip.torch.GradzipState(model, spec, communicator=gradzip.Communicator())
    ddp.register_comm_hook(state, gradzip.torch.hook)
    step(ddp, rank, 0)
    reference = make_net(9)
    x, y = batch(rank, 0)
    torch.nn.functional.cross_entropy(reference(x), y).backward()
    names = [n for n, _ in model.named_parameters()]
    exact = sum_over_ranks(comm, [p.grad / size for p in reference.parameters()], f"min_bytes.{spec}")
    a = divided_abs_sum(comm, make_net(9), rank, 0, f"min_bytes.{spec}.abs")
    large = compressed_parameters(model, spec)
    assert large == {"a.weight", "e.weight", "d.weight", "b.weight"}
    offset = 0
    for name, p in zip(names, model.parameters()):
        got = p.grad.reshape(-1)
        want = exact[offset:offset + p.numel()]
        bound = 2 * (size + 1) * U * a[offset:offset + p.numel()] * 1.01
        offset += p.numel()
        assert torch.count_nonzero(want) > 0, name
        within = torch.all((got - want).abs() <= bound).item()
        assert within == (name not in large), f"{spec} {name}: within the rounding bound: {within}"
    assert set(state.state_dict()["residuals"]) == large
    notes = [s["note"] for s in state.last_stats.values()]
    assert any("parameters under min_bytes" in note for note in notes), notes


def _orthonormal_columns(p):
    """Modified Gram-Schmidt in f64 with PowerSGD's rule (pipeline/powersgd.h): a column whose
    norm after projection is at most 1e-5 of its norm before is set to zero."""
    p = p.astype(np.float64).copy()
    for j in range(p.shape[1]):
        before = np.linalg.norm(p[:, j])
        for i in range(j):
            p[:, j] -= np.dot(p[:, i], p[:, j]) * p[:, i]
        after = np.linalg.norm(p[:, j])
        p[:, j] = p[:, j] / after if after > 1e-5 * before and after > 0 else 0.0
    return p


def test_powersgd_hook_equals_a_reference_step(comm, process_group, rank, size):
    # One PowerSGD step of the hook against NumPy, from the state the hook kept (Q and each
    # rank's residual E after two steps): for each matrix, with A = the average over ranks of
    # M_r + E_r (M_r: rank r's local gradient, computed here on a plain copy of the model),
    #   P = orthonormal columns of A Q,  output = P (A^T P)^T;
    # other parameters (biases): the plain average. Then the state round-trips through
    # state_dict() into a fresh state, bit for bit.
    spec = "powersgd:rank=2"
    model = make_net(8)
    ddp = DDP(model, bucket_cap_mb=0.5)
    state = gradzip.torch.GradzipState(model, spec, communicator=gradzip.Communicator())
    ddp.register_comm_hook(state, gradzip.torch.hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for i in range(2):
        step(ddp, rank, i)
        optimizer.step()
    own = state.communicator
    matrices = {n: p for n, p in model.named_parameters() if p.dim() >= 2}
    kept = {n: (own.residual(f"powersgd-q:{n}"), own.residual(f"powersgd:{n}")) for n in matrices}
    assert all(q is not None and e is not None for q, e in kept.values())

    plain = make_net()
    plain.load_state_dict(model.state_dict())
    x, y = batch(rank, 2)
    torch.nn.functional.cross_entropy(plain(x), y).backward()
    local = {n: p.grad.detach().numpy().astype(np.float32) for n, p in plain.named_parameters()}
    compensated = [torch.from_numpy(local[n].reshape(-1) + (kept[n][1] if n in matrices else 0))
                   for n, _ in model.named_parameters()]
    summed = sum_over_ranks(comm, compensated, "powersgd.reference").numpy()

    step(ddp, rank, 2)
    offset = 0
    for name, parameter in model.named_parameters():
        numel = parameter.numel()
        average = summed[offset:offset + numel].astype(np.float64) / size
        offset += numel
        got = parameter.grad.detach().numpy().reshape(-1).astype(np.float64)
        if name in matrices:
            rows = parameter.shape[0]
            a = average.reshape(rows, numel // rows)
            q_flat, _ = kept[name]
            rank_r = q_flat.size // a.shape[1]
            q = q_flat.reshape(rank_r, a.shape[1]).T  # column-major storage: column j is a row here
            p = _orthonormal_columns(a @ q)
            expected = (p @ (a.T @ p).T).reshape(-1)
        else:
            expected = average
        tolerance = 1e-4 * max(np.abs(expected).max(), 1e-30)
        assert np.abs(got - expected).max() <= tolerance, (name, np.abs(got - expected).max(), tolerance)

    saved = state.state_dict()
    assert set(saved["powersgd"]) == set(matrices)
    restored = gradzip.torch.GradzipState(make_net(8), spec, communicator=gradzip.Communicator())
    restored.load_state_dict(saved)
    for name in matrices:
        for prefix, part in (("powersgd-q", "q"), ("powersgd", "residual")):
            assert np.array_equal(restored.communicator.residual(f"{prefix}:{name}"), saved["powersgd"][name][part])


def _scaled_input(rank):
    g = torch.Generator().manual_seed(rank)
    return torch.randn(8, 256, generator=g) * (1 + rank)


def _local_scaled_weight_gradient(rank, scale):
    """This rank's own (not reduced) gradient of the weight in _scaled_step, from a plain copy."""
    torch.manual_seed(11)
    model = torch.nn.Linear(256, 256)
    (model(_scaled_input(rank)).pow(2).sum() * scale).backward()
    return model.weight.grad.detach().clone()


def _scaled_step(rank, hook, hook_state, scale):
    """One GradScaler step of a 256-256 linear model whose loss is multiplied by `scale`: returns
    (the reduced gradient of the weight, whether the optimiser step was skipped, the scale after
    update())."""
    torch.manual_seed(11)
    model = torch.nn.Linear(256, 256)
    ddp = DDP(model)
    if hook is not None:
        ddp.register_comm_hook(hook_state(model) if callable(hook_state) else hook_state, hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=1000)
    before = model.weight.detach().clone()
    loss = ddp(_scaled_input(rank)).pow(2).sum()
    scaler.scale(loss).backward()
    reduced = model.weight.grad.detach().clone()
    scaler.step(optimizer)
    scaler.update()
    skipped = torch.equal(before, model.weight.detach())
    return reduced, skipped, scaler.get_scale()


@pytest.mark.current_torch
def test_gradscaler_sees_true_values_or_the_overflow_never_a_clipped_gradient(comm, process_group, rank, size):
    # AMP policy: gradzip's fp16 never hands a saturated (clipped) gradient to the GradScaler.
    # (1) Scaled gradients beyond fp16's range but finite in f32: the call falls back to an
    # uncompressed f32 reduction (the wire-range fallback), so the result equals DDP's own
    # all-reduce and the step is taken; PyTorch's fp16_compress_hook turns them into Inf and
    # skips the step (the scenario does overflow fp16), and a saturating codec would have taken
    # a step with clipped gradients. (2) Gradients that overflow f32 itself: gradzip propagates
    # the Inf (nonfinite=propagate), so the scaler skips the step and backs the scale off
    # exactly as with PyTorch's hook.
    if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
        pytest.skip("torch.amp.GradScaler on the CPU needs a current PyTorch (2.3 or later)")
    try:
        torch.amp.GradScaler("cpu")
    except Exception as error:  # noqa: BLE001
        pytest.skip(f"torch.amp.GradScaler('cpu') is not available here: {error}")

    def gradzip_state(model):
        return gradzip.torch.GradzipState(model, "fp16:min_bytes=0", communicator=gradzip.Communicator())

    scale = 2.0 ** 16
    dense, dense_skipped, _ = _scaled_step(rank, None, None, scale)
    assert dense.abs().max().item() > 65504 and torch.isfinite(dense).all(), "the scenario must exceed fp16"
    ours, ours_skipped, ours_scale = _scaled_step(rank, gradzip.torch.hook, gradzip_state, scale)
    theirs, theirs_skipped, _ = _scaled_step(rank, default_hooks.fp16_compress_hook, dist.group.WORLD, scale)
    assert not dense_skipped and not ours_skipped and theirs_skipped
    assert not torch.isfinite(theirs).all()
    assert ours_scale == scale
    if size == 2:
        assert torch.equal(ours, dense)  # both: halves added once, in either order the same bits
    else:
        # Two sums of the P divided terms in different orders: each within (P - 1) u A_i of the
        # exact sum, A_i = sum_r |g_r,i| / P (1% for second order).
        a = sum_over_ranks(comm, [_local_scaled_weight_gradient(rank, scale).abs() / size],
                           "gradscaler.abs").reshape(dense.shape)
        assert torch.all((ours - dense).abs() <= 2 * (size - 1) * U * a * 1.01)

    huge = 2.0 ** 125  # the scaled gradients overflow f32 itself
    ours, ours_skipped, ours_scale = _scaled_step(rank, gradzip.torch.hook, gradzip_state, huge)
    theirs, theirs_skipped, theirs_scale = _scaled_step(rank, default_hooks.fp16_compress_hook,
                                                        dist.group.WORLD, huge)
    assert ours_skipped and theirs_skipped
    assert ours_scale == theirs_scale == huge * 0.5
    assert not torch.isfinite(ours).all()


class HalfScale(torch.nn.Module):
    """One fp16 parameter w of n elements, forward (w * x).sum(): the gradient of w is exactly
    the input x (fp16), so a test chooses each rank's gradient, Inf included."""

    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(n, dtype=torch.float16))

    def forward(self, x):
        return (self.w * x).sum()


@pytest.mark.parametrize("spec", ["none", "fp16:min_bytes=0", "sign:min_bytes=0",
                                  "qsgd:bits=8,min_bytes=0"])
def test_fp16_parameters_keep_an_overflow_as_infinity(process_group, rank, size, spec):
    # fp16 parameters (DDP buckets fp16 gradients): where a rank's gradient overflowed to +Inf
    # or -Inf, DDP's own average is that Inf, which a loss scaler reads as "skip this step".
    # The hook must give the same Inf, never the largest finite fp16 (65504) that a saturating
    # store writes, and never a finite value there. Finite elements where no rank overflowed
    # stay finite. (Rank 0 overflows elements 0-99 up and 100-199 down; every other rank has
    # finite gradients everywhere.)
    n = 40000
    model = HalfScale(n)
    ddp = DDP(model)
    state = gradzip.torch.GradzipState(model, spec, communicator=gradzip.Communicator())
    ddp.register_comm_hook(state, gradzip.torch.hook)
    g = torch.Generator().manual_seed(7 + rank)
    x = (torch.randn(n, generator=g) * 100).to(torch.float16)
    if rank == 0:
        x[:100] = float("inf")
        x[100:200] = float("-inf")
    model.zero_grad()
    ddp(x).backward()
    grad = model.w.grad.float()
    assert torch.equal(grad[:100], torch.full((100,), float("inf"))), grad[:100]
    assert torch.equal(grad[100:200], torch.full((100,), float("-inf"))), grad[100:200]
    # Every rank's gradients are finite from element 200 on; the average is too, and compressed
    # or not it stays within fp16's range.
    rest = grad[200:]
    assert torch.isfinite(rest).all() and rest.abs().max() <= 65504
    assert torch.count_nonzero(rest) > 0


def test_steady_state_copies_no_residual(process_group, rank, size):
    # Residuals are assembled and copied into the communicator only for a new bucket layout:
    # once per bucket of iteration 0, once per bucket after DDP's rebuild (iteration 1), then
    # never. A hook that re-prepared buckets every step would copy 3-4 per step.
    model = make_net(5)
    ddp = DDP(model, bucket_cap_mb=0.5)
    state = gradzip.torch.GradzipState(model, TOPK, communicator=gradzip.Communicator())
    ddp.register_comm_hook(state, gradzip.torch.hook)
    copies, buckets = [], []
    for i in range(5):
        step(ddp, rank, i)
        copies.append(state.residual_copies)
        buckets.append(len(state.last_stats))
    assert buckets[-1] >= 3, "the model should span several buckets after the rebuild"
    assert copies[0] == buckets[0], (copies, buckets)
    assert copies[1] - copies[0] == buckets[1], (copies, buckets)  # the rebuilt buckets
    assert copies[2] == copies[3] == copies[4] == copies[1], (copies, buckets)


def test_a_long_run_across_the_rebuild_never_reports_released_residuals(process_group, rank, size, capfd):
    # The communicator releases the residuals of a name no call used for a whole window (16
    # calls here: 4-5 iterations of 3-4 buckets) and says so on stderr. The buckets of
    # iteration 0 are gone after DDP's rebuild; their residuals, carried over to the new
    # buckets, must be dropped then, not left for the window to report 16 calls later. Every
    # current bucket runs every iteration, so a correct hook never has anything released.
    comm = gradzip.Communicator(release_unused_after_calls=16)
    model = make_net(8)
    ddp = DDP(model, bucket_cap_mb=0.5)
    state = gradzip.torch.GradzipState(model, "sign:algo=sra,min_bytes=0", communicator=comm)
    ddp.register_comm_hook(state, gradzip.torch.hook)
    step(ddp, rank, 0)
    first_buckets = {name for name, _ in state._layouts.values()}
    for i in range(1, 16):
        step(ddp, rank, i)
    now = {name for name, _ in state._layouts.values()}
    assert first_buckets - now, "DDP's rebuild should have replaced some of the first buckets"
    err = capfd.readouterr().err
    assert "released the error-feedback residuals" not in err, err
    # What the communicator holds is the current buckets' residuals and nothing else: each a
    # bucket's worker residual or placed in one (SRA's owner side).
    placed = {key for name in now for key, _ in comm.placed_residuals(name)}
    assert set(comm.residual_names()) == now | placed, (sorted(comm.residual_names()), sorted(now))
    assert placed, "SRA keeps owner residuals placed in the workers'"


@pytest.mark.parametrize("spec", ["sign:algo=sra,min_bytes=0", "sign:algo=ring,min_bytes=0",
                                  "sign:algo=hier,ranks_per_node=1,min_bytes=0",
                                  "qsgd:bits=4,ef=on,min_bytes=0,algo=rhd"])
def test_taking_a_state_dict_does_not_change_the_run(process_group, rank, size, spec):
    # Two identical runs; one takes state_dict() after every iteration (folding the owner and
    # per-hop residuals into the workers' on the live communicator would change what the next
    # call sends). Their parameters must stay bit for bit equal. Algorithms pinned: algo=auto
    # measures the link in each run's own communicator and may choose differently.
    runs = []
    for take in (False, True):
        model = make_net(9)
        ddp = DDP(model, bucket_cap_mb=0.5)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        state = gradzip.torch.GradzipState(model, spec, communicator=gradzip.Communicator())
        ddp.register_comm_hook(state, gradzip.torch.hook)
        for i in range(4):
            step(ddp, rank, i)
            optimizer.step()
            if take:
                saved = state.state_dict()
                assert saved["buckets"] and saved["residuals"]
        runs.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
        state.close()
    assert torch.equal(runs[0], runs[1]), f"max difference {(runs[0] - runs[1]).abs().max().item()}"


def test_state_dict_round_trip_into_another_layout(process_group, rank, size):
    model = make_net(3)
    ddp = DDP(model, bucket_cap_mb=0.5)
    state = gradzip.torch.GradzipState(model, TOPK, communicator=gradzip.Communicator())
    ddp.register_comm_hook(state, gradzip.torch.hook)
    for i in range(2):
        step(ddp, rank, i)
    saved = state.state_dict()
    r0 = {k: np.array(v, copy=True) for k, v in saved["residuals"].items()}
    assert saved["iteration"] == 2

    # A fresh model, state and communicator, with one bucket for everything (another layout).
    fresh_model = make_net(3)
    fresh = DDP(fresh_model, bucket_cap_mb=25)
    restored = gradzip.torch.GradzipState(fresh_model, TOPK, communicator=gradzip.Communicator())
    restored.load_state_dict(saved)
    assert restored.iteration == 2
    loaded = residuals_of(restored)
    assert set(loaded) == set(r0) and all(np.array_equal(loaded[k], r0[k]) for k in r0)
    fresh.register_comm_hook(restored, gradzip.torch.hook)
    step(fresh, rank, 5, zero=True)
    check_carried(gradzip.Communicator(), fresh_model, r0, residuals_of(restored), "restored")
    with pytest.raises(ValueError):
        gradzip.torch.GradzipState(fresh_model, "none",
                                   communicator=restored.communicator).load_state_dict(saved)


def test_warmup_iterations_run_uncompressed(process_group, rank, size):
    model = make_net(4)
    ddp = DDP(model, bucket_cap_mb=0.5)
    state = gradzip.torch.GradzipState(model, TOPK, warmup=2, communicator=gradzip.Communicator())
    ddp.register_comm_hook(state, gradzip.torch.hook)
    specs = []
    for i in range(3):
        step(ddp, rank, i)
        specs.append([s["spec"] for _, s in sorted(state.last_stats.items())])
    assert all(s.startswith("none") for s in specs[0] + specs[1]), specs
    assert specs[2] and all(s.startswith("topk") for s in specs[2]), specs
    assert state.iteration == 3


def test_timeline_holds_each_bucket_its_calls_and_their_stages(process_group, rank, size, tmp_path):
    # Iterations 1 and 2 of 4 recorded (0 is before DDP's rebuild); "sign" with the default
    # min_bytes: each bucket is one compressed call plus one uncompressed call of its small
    # parameters, so a bucket span holds two calls.
    model = make_net(6)
    ddp = DDP(model, bucket_cap_mb=0.5)
    state = gradzip.torch.GradzipState(model, "sign", communicator=gradzip.Communicator(),
                                       timeline=str(tmp_path / "trace.json"),
                                       timeline_first_step=1, timeline_steps=2)
    ddp.register_comm_hook(state, gradzip.torch.hook)
    path = tmp_path / (f"trace.rank{rank}.json" if size > 1 else "trace.json")
    stats = {}
    for i in range(4):
        step(ddp, rank, i)
        stats[i] = {index: dict(s) for index, s in state.last_stats.items()}
        if i == 1:
            assert not path.exists(), "written before the last recorded iteration"
        if i == 2:
            assert path.exists(), "not written after the last recorded iteration"
            written = path.read_text()
    assert path.read_text() == written, "iteration 3 changed the file"
    trace = json.loads(written)
    events = trace["traceEvents"]
    assert trace["otherData"]["rank"] == rank and all(e["pid"] == rank for e in events)
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert names == {0: "DDP hook calls", 1: "gradzip communication thread"}

    hooks = [e for e in events if e["ph"] == "i"]
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["tid"] == 1 for e in spans)
    tasks = {}
    for span, parent in check_timeline.nest(spans):  # fails on spans that do not nest
        if parent is None:
            assert span["cat"] == "task", span
            tasks[(span["args"]["step"], span["args"]["bucket"])] = span
        elif span["cat"] == "call":
            assert parent["cat"] == "task", (span["name"], parent["name"])
        else:
            assert span["cat"] == "stage" and parent["cat"] in ("call", "stage"), (span, parent)
    for i in (1, 2):
        assert sorted(b for s, b in tasks if s == i) == sorted(stats[i]), "one span per bucket"
    assert {e["args"]["step"] for e in hooks} == {1, 2}
    assert {(e["args"]["step"], e["args"]["bucket"]) for e in hooks} == set(tasks)
    for hook_call in hooks:
        task = tasks[(hook_call["args"]["step"], hook_call["args"]["bucket"])]
        assert hook_call["ts"] <= task["ts"], "a bucket reduced before DDP handed it over"
    # Bytes: each bucket's calls add up to the hook's stats of that bucket (MPI's own all-reduce
    # of the small parameters counted as a ring, as the hook counts it).
    calls = [e for e in spans if e["cat"] == "call"]
    for (i, index), task in tasks.items():
        held = [c for c in calls if task["ts"] <= c["ts"] <= task["ts"] + task["dur"]]
        assert len(held) == 2, [c["name"] for c in held]
        sent = sum(gradzip.torch._ring_bytes(c["args"]) for c in held)
        assert sent == stats[i][index]["sent_bytes"] == task["args"]["sent_bytes"], (i, index)
        assert any(c["args"]["spec"].startswith("sign") and c["args"]["encoded_message_bytes"] > 0
                   for c in held)
    stages = [e for e in spans if e["cat"] == "stage"]
    assert {e["name"] for e in stages} >= {"encode", "communicate", "decode"}
    state.close()


def _train_gaussian_classes(rank, hook, hook_state):
    """80 steps of SGD on 4 Gaussian classes (see the test below) through DDP with `hook`;
    returns (losses, the trained model's parameters as one float32 array)."""
    torch.manual_seed(7)
    centres = torch.randn(4, 16)
    model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 4))
    ddp = DDP(model)
    if hook is not None:
        ddp.register_comm_hook(hook_state(model) if callable(hook_state) else hook_state, hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(80):
        y = torch.randint(0, 4, (32,), generator=g)
        x = centres[y] + torch.randn(32, 16, generator=g)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    parameters = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    return losses, parameters


def test_short_topk_training_run_reduces_the_loss(process_group, rank, size, digests):
    # 4 Gaussian classes in 16 dimensions (centres ~N(0, 1), unit noise), a 16-256-256-4 MLP
    # (~70k parameters, one bucket), SGD lr 0.05 momentum 0.9, 80 steps of 32 samples per rank
    # with top-k 1% + EF: the first step's loss is near ln 4 = 1.39; the mean of the last 5
    # steps must be below half of it (measured: 1.37-1.44 -> 0.015-0.17 at 2 and 4 ranks).
    # A falling loss alone would pass with no communication at all (each rank learns from its
    # own data), so the run is also checked against two controls: every rank must end with the
    # same parameters (DDP's replicas stay in step only if the gradients were averaged), which
    # a run without communication (PyTorch's noop_hook) must fail; and its loss must come
    # within 0.1 of DDP's own dense all-reduce's.
    from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks

    holder = {}

    def topk_state(model):
        holder["state"] = gradzip.torch.GradzipState(
            model, "topk:ratio=0.01,ef=on,algo=sparse", communicator=gradzip.Communicator())
        return holder["state"]

    losses, parameters = _train_gaussian_classes(rank, gradzip.torch.hook, topk_state)
    dense_losses, _ = _train_gaussian_classes(rank, None, None)
    _, alone = _train_gaussian_classes(rank, debugging_hooks.noop_hook, None)
    state = holder["state"]
    assert all(s["spec"].startswith("topk") and s["algorithm"] != "mpi" for s in state.last_stats.values())
    first, last, dense_last = losses[0], np.mean(losses[-5:]), np.mean(dense_losses[-5:])
    print(f"rank {rank}: loss {first:.3f} -> {last:.3f} (dense {dense_last:.3f})")
    assert first > 1.2 and last < 0.5 * first, (first, last)
    assert last <= dense_last + 0.1, (last, dense_last)
    comm = state.communicator
    same = digests(comm, parameters.tobytes())
    assert all(row == same[0] for row in same), "the replicas diverged: the hook did not average"
    if size > 1:
        apart = digests(comm, alone.tobytes())
        assert len(set(apart)) == size, "the no-communication control should end with different replicas"


def test_momentum_correction_without_compression_is_sgd_momentum(process_group, comm, rank, size):
    # momentum_correction=M, spec none: each rank hands u_r = M u_r + g_r to the average, so the
    # reduced gradient is the average of the u_r, which is exactly the momentum buffer b of SGD
    # with momentum M on the averaged gradient (b = M b + mean g). The reference model's
    # parameters are copied into the hooked model after every step, so both see the same
    # gradients; what differs is rounding: per rank 2u(|M u_r| + |g_r|) for u_r, the average's
    # (P - 1) u V (V = sum_r |u_r| / P), the reference's (P - 1) u A and 2u (|M b| + |mean g|),
    # all within (P + 6) u V, plus M times the previous step's difference. A hook that ignores
    # the option (reduced gradient = mean g) or counts the momentum twice misses this by
    # M |b_prev|, orders of magnitude above it.
    M = 0.9
    reference = DDP(make_net(11), bucket_cap_mb=0.5)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=M)
    hooked_model = make_net(11)
    hooked = DDP(hooked_model, bucket_cap_mb=0.5)
    state = gradzip.torch.GradzipState(hooked_model, "none", momentum_correction=M,
                                       communicator=gradzip.Communicator())
    hooked.register_comm_hook(state, gradzip.torch.hook)
    bound = None
    for i in range(4):  # iteration 0 on DDP's first buckets, the others on the rebuilt ones
        step(reference, rank, i)
        step(hooked, rank, i)
        optimizer.step()
        buffers = torch.cat([optimizer.state[p]["momentum_buffer"].reshape(-1)
                             for p in reference.module.parameters()])
        got = torch.cat([p.grad.reshape(-1) for p in hooked.module.parameters()])
        names = [n for n, _ in hooked_model.named_parameters()]
        v = sum_over_ranks(comm, [state._momentum[n].abs() / size for n in names], f"mc.abs{i}")
        bound = (size + 6) * U * v * 1.01 + (M * bound if bound is not None else 0)
        assert torch.count_nonzero(buffers) > 0
        excess = (got - buffers).abs() - bound
        assert torch.all(excess <= 0), f"iteration {i}: max excess {excess.max().item()}"
        with torch.no_grad():
            for p, q in zip(reference.module.parameters(), hooked.module.parameters()):
                q.copy_(p)
    state.close()


def test_momentum_correction_resumes_bit_for_bit_from_the_state_dict(process_group, rank, size):
    # top-k with error feedback and momentum correction: a run checkpointed after 3 iterations
    # (model, and the hook's state_dict with the ranks' momenta and residuals) and resumed in a
    # new DDP, state and communicator must end bit for bit where the uninterrupted run ends. A
    # checkpoint without the momenta restarts u from the gradient and lands elsewhere.
    spec, M = "topk:ratio=0.01,ef=on,min_bytes=0,algo=sparse", 0.9

    def run(iterations, first=0, checkpoint=None):
        model = make_net(12)
        if checkpoint is not None:
            model.load_state_dict(checkpoint["model"])
        ddp = DDP(model, bucket_cap_mb=0.5)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)  # the momentum is the hook's
        state = gradzip.torch.GradzipState(model, spec, momentum_correction=M,
                                           communicator=gradzip.Communicator())
        if checkpoint is not None:
            state.load_state_dict(checkpoint["hook"])
        ddp.register_comm_hook(state, gradzip.torch.hook)
        for i in range(first, first + iterations):
            step(ddp, rank, i)
            optimizer.step()
        saved = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                 "hook": state.state_dict()}
        state.close()
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), saved

    whole, _ = run(6)
    _, saved = run(3)
    assert saved["hook"]["momentum_correction"] == M
    assert set(saved["hook"]["momentum"]) == {n for n, _ in make_net(12).named_parameters()}
    resumed, _ = run(3, first=3, checkpoint=saved)
    assert torch.equal(whole, resumed), f"max difference {(whole - resumed).abs().max().item()}"
    forgotten = dict(saved["hook"], momentum={})
    amnesiac, _ = run(3, first=3, checkpoint=dict(saved, hook=forgotten))
    assert not torch.equal(whole, amnesiac), "the momenta should matter to the resumed run"
    model = make_net(12)
    with pytest.raises(ValueError, match="momentum_correction"):
        gradzip.torch.GradzipState(model, spec, communicator=gradzip.Communicator()).load_state_dict(saved["hook"])
    with pytest.raises(ValueError, match="momentum_correction"):
        gradzip.torch.GradzipState(model, spec, momentum_correction=1.0)


def _momenta(gradients, b1):
    """U_t = b1 U_(t-1) + G_t in float32, as the hook with momentum_correction=b1 hands them on."""
    u, out = torch.zeros_like(gradients[0]), []
    for g in gradients:
        u = b1 * u + g
        out.append(u.clone())
    return out


def _gradients(steps, seed):
    g = torch.Generator().manual_seed(seed)
    # coordinates of very different scales, as in a network (Adam's reason to exist)
    scale = torch.logspace(-4, 0, 64)
    return [torch.randn(64, generator=g) * scale for _ in range(steps)]


@pytest.mark.parametrize("max_grad_norm", [None, 0.5])
def test_frozen_variance_adamw_before_the_freeze_is_adamw(max_grad_norm):
    # Fed the momenta U_t of gradients G_t, with freeze_step beyond the run, it must take AdamW's
    # steps on G_t, and with max_grad_norm AdamW's steps on G_t after clip_grad_norm_ over both
    # tensors together (two parameter groups: the norm spans them). Each step moves a parameter
    # by at most lr (1 + weight decay); the two computations differ in rounding only: the
    # recovered G_t = U_t - b1 U_(t-1) carries an error of a few u |U| <= a few u |G| / (1 - b1),
    # relative 1e-5 at most here, which moves a step by as much; 20 steps: 20 * lr * 1e-4 covers
    # it with margin. Missing bias corrections, a wrong b2, clipping each tensor on its own or
    # not at all change the steps by a sizeable fraction of lr.
    from gradzip.optim import FrozenVarianceAdamW
    steps, lr, betas = 20, 1e-2, (0.9, 0.95)
    gradients = [_gradients(steps, 3), _gradients(steps, 6)]
    starts = [torch.randn(64, generator=torch.Generator().manual_seed(s)) for s in (4, 7)]
    reference = [s.clone().requires_grad_() for s in starts]
    ours = [s.clone().requires_grad_() for s in starts]
    adamw = torch.optim.AdamW([{"params": [reference[0]], "weight_decay": 0.1},
                               {"params": [reference[1]], "weight_decay": 0.0}],
                              lr=lr, betas=betas, eps=1e-8)
    frozen = FrozenVarianceAdamW([{"params": [ours[0]], "weight_decay": 0.1},
                                  {"params": [ours[1]], "weight_decay": 0.0}],
                                 lr=lr, betas=betas, eps=1e-8, freeze_step=steps,
                                 max_grad_norm=max_grad_norm, variance_floor=0.0)
    momenta = [_momenta(gradients[0], betas[0]), _momenta(gradients[1], betas[0])]
    for t in range(steps):
        for i in range(2):
            reference[i].grad, ours[i].grad = gradients[i][t].clone(), momenta[i][t].clone()
        if max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(reference, max_grad_norm)
            assert norm > 2 * max_grad_norm  # the clipping acts at every step
        adamw.step()
        frozen.step()
    for r, o, s in zip(reference, ours, starts):
        assert not torch.equal(r, s)
        difference = (r - o).abs().max().item()
        assert difference <= steps * lr * 1e-4, difference


@pytest.mark.parametrize("max_grad_norm,variance_floor", [(None, 0.0), (0.5, 0.01)])
def test_frozen_variance_adamw_freezes_its_second_moment(max_grad_norm, variance_floor):
    # freeze_step 5 of 12 steps: the second moment stays exactly what the first 5 (clipped)
    # recovered gradients made it, floored at variance_floor x its mean, and every step is
    # lr * m_hat / (sqrt(v_hat) + eps), with m from the clipped gradients up to the freeze and
    # (1 - b1) U_t (unclipped) after it, v_hat frozen (bias-corrected at step 5); checked
    # against that formula evaluated in float64 (bound as in the test above).
    from gradzip.optim import FrozenVarianceAdamW
    steps, freeze, lr, (b1, b2), eps = 12, 5, 1e-2, (0.9, 0.95), 1e-8
    gradients = _gradients(steps, 5)
    p = torch.zeros(64, requires_grad=True)
    optimizer = FrozenVarianceAdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=0.0,
                                    freeze_step=freeze, max_grad_norm=max_grad_norm,
                                    variance_floor=variance_floor)
    expected = torch.zeros(64, dtype=torch.float64)
    m = v = torch.zeros(64, dtype=torch.float64)
    for t, (g, u) in enumerate(zip(gradients, _momenta(gradients, b1)), start=1):
        p.grad = u.clone()
        optimizer.step()
        g64 = g.to(torch.float64)
        if t <= freeze:
            if max_grad_norm is not None:
                g64 = g64 * min(1.0, max_grad_norm / (g64.norm().item() + 1e-6))
            m = b1 * m + (1 - b1) * g64
            v = b2 * v + (1 - b2) * g64 * g64
            if t == freeze:
                below = int((v < variance_floor * v.mean()).sum())
                v = v.clamp(min=variance_floor * v.mean().item())
                frozen = optimizer.state[p]["second_moment"].clone()
                assert set(optimizer.state[p]) == {"step", "second_moment"}  # the rest released
            m_hat = m / (1 - b1 ** t)
        else:
            assert torch.equal(optimizer.state[p]["second_moment"], frozen), t
            m_hat = (1 - b1) * u.to(torch.float64) / (1 - b1 ** t)
        v_hat = v / (1 - b2 ** min(t, freeze))
        expected -= lr * m_hat / (v_hat.sqrt() + eps)
    if variance_floor:
        assert below > 0  # the floor acted on some coordinates
    difference = (p.detach().to(torch.float64) - expected).abs().max().item()
    assert difference <= steps * lr * 1e-4, difference


def test_frozen_variance_adamw_floor_is_a_fraction_of_the_mean():
    # Two optimizers on the same momenta, one without the floor: at the freeze the floored
    # second moment is exactly max(v, floor * mean(v)) of the unfloored one, per tensor (the
    # second tensor, 1000x larger, gets its own floor); and it is then frozen.
    from gradzip.optim import FrozenVarianceAdamW
    steps, freeze, floor = 4, 3, 0.01
    gradients = _gradients(steps, 9)
    momenta = _momenta(gradients, 0.9)
    params = {f: [torch.zeros(64, requires_grad=True) for _ in range(2)] for f in (0.0, floor)}
    optimizers = {f: FrozenVarianceAdamW(params[f], lr=1e-3, betas=(0.9, 0.95), freeze_step=freeze,
                                         max_grad_norm=None, variance_floor=f) for f in params}
    for u in momenta:
        for f in params:
            params[f][0].grad, params[f][1].grad = u.clone(), 1000 * u
            optimizers[f].step()
    for plain_p, floored_p in zip(params[0.0], params[floor]):
        plain = optimizers[0.0].state[plain_p]["second_moment"]
        floored = optimizers[floor].state[floored_p]["second_moment"]
        assert (plain < floor * plain.mean()).any()
        assert torch.equal(floored, torch.clamp(plain, min=floor * plain.mean()))
    for bad, match in (({"freeze_step": 0}, "freeze_step"), ({"max_grad_norm": 0.0}, "max_grad_norm"),
                       ({"variance_floor": -1.0}, "variance_floor")):
        with pytest.raises(ValueError, match=match):
            FrozenVarianceAdamW([torch.zeros(1, requires_grad=True)], **bad)
