"""gradzip as a PyTorch DistributedDataParallel communication hook.

    import gradzip.torch
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = gradzip.torch.GradzipState(model, spec="topk:ratio=0.01,ef=on", warmup=100)
    ddp.register_comm_hook(state, gradzip.torch.hook)

Run under torchrun (after torch.distributed.init_process_group, as DDP needs anyway): the
default communicator runs over torch.distributed, on a gloo group of gradzip's own over the
process group's ranks. Under mpirun it runs over MPI (gradzip initialises it), whatever backend
the process group uses. Every rank must build the same model and state. A state whose
communicator does not have the process group's rank count is refused (gradzip.Error), so a
gradient is never averaged over other ranks than the training's.

- hook(state, bucket) averages the bucket's flat gradient buffer with gradzip and returns a
  torch.futures.Future that gradzip's communication thread completes, so DDP goes on with
  backward (and launches the next buckets) while the bucket is compressed and sent.
- With algo=auto (the default), a parameter under the spec's min_bytes (65536 by default: biases,
  small layers) is averaged uncompressed, as a collective sends a tensor under min_bytes: the
  bucket's small parameters go packed in one uncompressed call, the others in one compressed call
  (in place when they are contiguous in the bucket, else through a packed copy). Error feedback
  covers the compressed parameters only; state_dict() has no residual for the others.
- Buckets are all-reduced under names made of their parameters' names, and error-feedback
  residuals are kept per bucket name. When DDP rebuilds its buckets (after the first
  iteration), a bucket with a new set of parameters starts from the residual slices its
  parameters had in the old buckets, so no residual is lost, and the old buckets' residuals are
  dropped from the communicator (its release window never reports them).
- Random draws (stochastic rounding, random-k's indices) are keyed by the bucket's name and the
  iteration, not by how often the name was called, so they follow from the checkpoint.
- state_dict() / load_state_dict(): a checkpoint that resumes exactly. state_dict() changes
  nothing (taking one does not change the run). It holds the iteration; every residual of every
  current bucket as the algorithms keep it (the worker's and SRA's owner side, the tree's root,
  halving/doubling's, the hierarchical shard's), with the bucket's layout; algo=auto's measured
  model inputs, so the resumed job chooses the same algorithms; and the residuals per parameter
  name. A resumed job whose DDP makes a bucket of the same layout restores that bucket's
  residuals exactly (the parameters then continue bit for bit as in the uninterrupted job);
  any other bucket starts from its parameters' residual slices (every residual folded in, so no
  residual mass is lost), which survives any bucket layout.
- warmup=N: the first N iterations run uncompressed (spec "none", no error feedback).
- timeline=PATH (or the environment variable GRADZIP_TIMELINE=PATH): a Chrome trace / Perfetto
  JSON of iterations [timeline_first_step, timeline_first_step + timeline_steps) (from iteration
  1, one, by default; GRADZIP_TIMELINE_STEPS="COUNT" or "FIRST:COUNT" overrides), written when
  the last of them is reduced (or at close()): track 0 holds each hook call ("hook bucket I",
  when DDP handed the bucket over), track 1 the communication thread's work per bucket ("bucket
  I"), each gradzip call in it and the call's encode / communicate / decode stages, with bytes.
  Rank R writes PATH with "{rank}" replaced by R, or with ".rank<R>" before the extension when
  there are several ranks.
- momentum_correction=M (Deep Gradient Compression's momentum correction, Lin et al. 2018):
  each rank's gradient is replaced by its own momentum u = M u + g before it is reduced, and the
  optimizer runs without momentum (torch.optim.SGD(..., momentum=0)). Uncompressed, SGD on the
  average of the ranks' u is SGD with momentum M on the averaged gradient (the average of the
  u is the momentum of the averages); with error feedback the residual then holds momentum
  that was not sent instead of raw gradients that the optimizer's momentum would amplify when
  they arrive late. Weight decay given to the optimizer acts on the averaged update, outside
  the momentum. The momentum is kept per parameter name (state_dict() holds it).
- spec powersgd:rank=R: each parameter of two or more dimensions (rows = shape[0]) is reduced
  by PowerSGD as a rows x (numel / rows) matrix, its residual and Q kept per parameter name
  (so bucket rebuilds need nothing, and state_dict() holds them by parameter name); other
  parameters are averaged uncompressed.
"""
import hashlib
import json

import numpy as np
import torch

from . import _gradzip, _lifecycle, _world
from ._stats import ring_bytes as _ring_bytes
from . import Communicator
try:  # FSDP2's compressed reduce-scatter (gradzip/fsdp.py), re-exported here
    from .fsdp import FSDPState, compress_fsdp
except Exception as _error_importing_fsdp:  # noqa: BLE001
    # A PyTorch whose torch.distributed.fsdp does not import (PyTorch 1.13 under Python 3.11
    # raises ValueError from a dataclass there) still gets the DDP hook; compress_fsdp then
    # says why it is missing.
    _FSDP_MISSING = (f"gradzip.torch.compress_fsdp needs PyTorch's FSDP2 (fully_shard, PyTorch "
                     f"2.6 or later); importing it failed here: {_error_importing_fsdp!r}")
    FSDPState = None

    def compress_fsdp(*args, **kwargs):
        error = _gradzip.Error(_FSDP_MISSING)
        error.code = "unsupported"
        raise error


def _run_task(task):
    task()  # each task delivers its own errors through its future


class GradzipState:
    """The hook's state: the spec, warm-up, the communicator and the bucket layouts.

    model: the module DDP wraps (its named_parameters() name the residuals).
    spec: a gradzip compression spec, e.g. "topk:ratio=0.01,ef=on" (checked here).
    warmup: iterations run uncompressed first.
    communicator: a gradzip.Communicator (default: a new one, transport "auto": over
        torch.distributed's `process_group` when torch.distributed is initialised and no MPI
        launcher started the process, else over MPI_COMM_WORLD).
    process_group: the torch.distributed group DDP reduces over (default: the world).
    timeline, timeline_first_step, timeline_steps: the timeline's file and iterations (module
        docstring); GRADZIP_TIMELINE and GRADZIP_TIMELINE_STEPS override them.
    momentum_correction: the momentum factor M in [0, 1) kept per rank before the reduction
        (module docstring); 0 (the default) hands DDP's gradients over unchanged. Give the
        optimizer momentum=0 with it.

    The communicator must span that group: gradzip.Error when its rank count differs from the
    group's size (checked here when torch.distributed is initialised or WORLD_SIZE is set, else
    at the hook's first call).
    """

    def __init__(self, model, spec="none", warmup=0, communicator=None, process_group=None,
                 timeline=None, timeline_first_step=1, timeline_steps=1, momentum_correction=0.0):
        self.spec = _gradzip.parse_spec(spec)
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        self.warmup = int(warmup)
        momentum_correction = float(momentum_correction)
        if not 0.0 <= momentum_correction < 1.0:
            raise ValueError(f"momentum_correction must be in [0, 1), got {momentum_correction}")
        self.momentum_correction = momentum_correction
        self._momentum = {}  # parameter name -> this rank's momentum (momentum_correction > 0)
        if communicator is None:
            communicator = Communicator(process_group=process_group)
        self.communicator = communicator
        self._process_group = process_group
        _world.refuse_communicator_not_spanning(self.communicator.size, process_group)
        self._spans_checked = _world.torch_world(process_group) is not None
        self._timeline = _Timeline.from_request(self.communicator, timeline, timeline_first_step,
                                                timeline_steps)
        self.iteration = 0
        self._names = {id(p): name for name, p in model.named_parameters()}
        self._shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
        self._powersgd = self.spec.split(":")[0] == "powersgd"
        # With algo=auto a collective sends a tensor under min_bytes uncompressed; the hook
        # applies that rule per parameter, not to the bucket as a whole (a bucket is far above
        # min_bytes): such parameters are averaged uncompressed, the others compressed.
        # Compressing a small output layer with error feedback is what made sign diverge.
        # The rule is the collectives' own (_gradzip.sent_uncompressed); `none` has nothing to
        # split and PowerSGD has its own per-parameter path.
        self._split_by_size = self.spec.split(":")[0] not in ("none", "powersgd")
        self._splits = {}  # bucket layout -> _Split (only for layouts with a parameter under it)
        # bucket index -> (bucket name, ((parameter name, offset, numel), ...)) as last seen
        self._layouts = {}
        # parameter name -> residual slice (float32) waiting for the bucket that holds it
        self._pending = {}
        # bucket name -> a loaded checkpoint's bucket ({"layout", "residual", "placed"}) waiting
        # for DDP to make a bucket of that layout again (load_state_dict)
        self._saved_buckets = {}
        # DDP's buckets as the hook saw them: index -> layout, of the last whole iteration and of
        # the one under way (state_dict() saves the former)
        self._ddp_layouts = {}
        self._iteration_layouts = {}
        # After load_state_dict: the checkpoint's DDP layouts, and the buckets of the first
        # iteration collected until its last one arrives (_reduce_resumed_iteration)
        self._resume_layouts = None
        self._resume_buckets = None
        self.last_stats = {}  # bucket index -> the stats dict of its latest call
        # Bucket residuals assembled and copied into the communicator (new layouts only).
        self.residual_copies = 0
        # One thread runs gradzip's calls in submission order (DDP submits the buckets in the
        # same order on every rank, so every rank's collectives pair up); stopped by close() or
        # at interpreter exit (gradzip/_lifecycle.py says why it must be).
        self._thread = _lifecycle.Worker("gradzip-communication", _run_task)

    # ---- lifecycle -----------------------------------------------------------------------------

    def close(self, timeout=_lifecycle.EXIT_JOIN_S):
        """Finishes the buckets already submitted and stops the communication thread (at most
        `timeout` seconds; returns whether it ended). Idempotent; the hook refuses afterwards.
        Interpreter exit does it for every state still open. A timeline whose last iteration was
        never reduced is written with what it holds."""
        stopped = self._thread.stop(timeout)
        if self._timeline is not None and stopped:
            self._timeline.write_if_pending()
        return stopped

    @property
    def closed(self):
        return not self._thread.alive

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
        return False

    # ---- layouts and residuals ---------------------------------------------------------------

    def _layout_of(self, bucket):
        buffer = bucket.buffer()
        base = buffer.data_ptr()
        size = buffer.element_size()
        layout = []
        for parameter, gradient in zip(bucket.parameters(), bucket.gradients()):
            name = self._names.get(id(parameter))
            if name is None:
                raise ValueError("gradzip.torch: a bucket holds a parameter that is not in the model "
                                 "given to GradzipState (pass the module DDP wraps)")
            layout.append((name, (gradient.data_ptr() - base) // size, gradient.numel()))
        return tuple(layout)

    def _split_of(self, layout):
        """The bucket's _Split when it holds a parameter under min_bytes (and the spec uses the
        rule), else None: the whole bucket is one compressed call."""
        if not self._split_by_size:
            return None
        split = self._splits.get(layout)
        if split is None:
            under = [_gradzip.sent_uncompressed(self.spec, entry[2]) for entry in layout]
            small = tuple(entry for entry, uncompressed in zip(layout, under) if uncompressed)
            if not small:
                split = _Split.WHOLE
            else:
                large = sorted((entry for entry, uncompressed in zip(layout, under) if not uncompressed),
                               key=lambda entry: entry[1])
                split = _Split(small, large)
            self._splits[layout] = split
        return None if split is _Split.WHOLE else split

    @staticmethod
    def _bucket_name(index, layout):
        digest = hashlib.sha1("|".join(f"{n}:{k}" for n, _, k in layout).encode()).hexdigest()[:12]
        return f"ddp.bucket{index}.{digest}"

    def _correct_momentum(self, buffer, layout):
        """Replaces each parameter's gradient in the bucket's buffer by this rank's momentum
        u = M u + g (momentum_correction). Runs in the hook's caller, before the bucket is
        handed to the communication thread."""
        for parameter, offset, numel in layout:
            gradient = buffer[offset:offset + numel]
            velocity = self._momentum.get(parameter)
            if velocity is not None and (velocity.device != gradient.device
                                         or velocity.dtype != gradient.dtype):
                velocity = self._momentum[parameter] = velocity.to(gradient)  # a loaded one
            if velocity is None:
                velocity = self._momentum[parameter] = gradient.detach().clone()
            else:
                velocity.mul_(self.momentum_correction).add_(gradient)
            gradient.copy_(velocity)

    def _parameter_residuals(self, fold):
        """The residual slice of every parameter in the current buckets, by parameter name.

        Every residual an algorithm keeps for a bucket besides the worker's (SRA's owner side,
        the tree's root, halving/doubling's, the hierarchical shard's) is added in at its place
        (the same mass per element, which the next call delivers whatever algorithm runs it),
        so the slices hold all of it. fold=True moves them into the worker's residual in the
        communicator (DDP replaces the buckets anyway); fold=False computes the same values and
        changes nothing (a checkpoint)."""
        slices = {}
        for name, layout in self._layouts.values():
            numel = max((offset + count for _, offset, count in layout), default=0)
            if fold:
                self.communicator.fold_residuals(name, numel)
                values = self.communicator.residual(name)
            else:
                values = self.communicator.folded_residual(name, numel)
            if values is None:
                continue
            for parameter, offset, numel in layout:
                slices[parameter] = values[offset:offset + numel].copy()
        return slices

    def _bucket_residuals(self):
        """Every residual of every current bucket as the algorithms keep it, by bucket name:
        {"layout", "residual": the worker's, "placed": {residual name: (offset, values)}}."""
        buckets = {}
        for name, layout in self._layouts.values():
            worker = self.communicator.residual(name)
            if worker is None:
                continue
            placed = {key: (offset, self.communicator.residual(key))
                      for key, offset in self.communicator.placed_residuals(name)}
            buckets[name] = {"layout": layout, "residual": worker, "placed": placed}
        return buckets

    def _prepare(self, index, layout, numel):
        """The bucket's name; on a new layout, its residuals set in the communicator.

        Runs on the communication thread, the only one that touches the communicator while DDP
        runs. A bucket index seen before with the same layout costs nothing (the steady state:
        no residual is copied). An index seen before with another layout, or a layout holding a
        parameter that a known bucket holds, means DDP rebuilt its buckets: every parameter's
        residual moves to _pending first, so a bucket that takes parameters from a bucket not
        re-prepared yet still finds them, and the old buckets' residuals are dropped from the
        communicator. A layout not seen yet (an index never seen, or any bucket after a
        rebuild) gets a loaded checkpoint's residuals of the same bucket exactly when there are
        some, else its residual assembled from _pending (zeros where nothing is carried); either
        way whatever the communicator held under that name before (an earlier state's) is
        dropped first, so it never leaks in.
        """
        known = self._layouts.get(index)
        if known is not None and known[1] == layout:
            return known[0]
        held = {parameter for _, old in self._layouts.values() for parameter, _, _ in old}
        if known is not None or any(parameter in held for parameter, _, _ in layout):
            self._pending.update(self._parameter_residuals(fold=True))  # DDP rebuilt its buckets
            for old_name, _ in self._layouts.values():
                self.communicator.drop_residuals(old_name)
            self._layouts = {}
            # a checkpoint's buckets describe a layout DDP has moved on from
            self._saved_buckets = {}
        name = self._bucket_name(index, layout)
        self.communicator.drop_residuals(name)
        saved = self._saved_buckets.pop(name, None)
        if saved is not None and saved["layout"] == layout:
            self.communicator.set_residual(name, saved["residual"])
            for key, (offset, values) in saved["placed"].items():
                self.communicator.set_residual(key, values, placed_in=name, offset=offset)
            for parameter, _, _ in layout:
                self._pending.pop(parameter, None)
        else:
            residual = np.zeros(numel, dtype=np.float32)
            for parameter, offset, count in layout:
                carried = self._pending.pop(parameter, None)
                if carried is not None:
                    residual[offset:offset + count] = carried
            self.communicator.set_residual(name, residual)
        self.residual_copies += 1
        self._layouts[index] = (name, layout)
        return name

    def state_dict(self):
        """The iteration, the settings and the residuals (NumPy arrays), changing nothing. Take
        it between iterations (no bucket in flight).

        "residuals": per parameter name, every residual folded in (survives any bucket layout);
        "buckets": per bucket name, its layout and every residual as the algorithms keep it
        (restored exactly into a bucket of the same layout); "layouts": DDP's buckets of the
        last iteration (index -> layout), which the resumed job's first iteration is reduced
        in; "auto_model": algo=auto's measured model inputs; with a powersgd spec also
        PowerSGD's per-matrix state ("powersgd": parameter name -> {"residual", "q"}), kept by
        parameter name and so independent of the bucket layout."""
        residuals = dict(self._pending)
        residuals.update(self._parameter_residuals(fold=False))
        buckets = dict(self._saved_buckets)  # loaded, not reached by DDP yet
        buckets.update(self._bucket_residuals())
        layouts = self._resume_layouts if self._resume_layouts is not None else self._ddp_layouts
        state = {"spec": self.spec, "warmup": self.warmup, "iteration": self.iteration,
                 "residuals": residuals, "buckets": buckets, "layouts": dict(layouts),
                 "auto_model": self.communicator.auto_model_state()}
        if self.momentum_correction:
            state["momentum_correction"] = self.momentum_correction
            state["momentum"] = {name: velocity.cpu().numpy().copy()
                                 for name, velocity in self._momentum.items()}
        if self._powersgd:
            powersgd = {}
            for name in self._shapes:
                entry = {part: self.communicator.residual(f"{prefix}:{name}")
                         for part, prefix in (("residual", "powersgd"), ("q", "powersgd-q"))}
                entry = {part: values for part, values in entry.items() if values is not None}
                if entry:
                    powersgd[name] = entry
            state["powersgd"] = powersgd
        return state

    def load_state_dict(self, state):
        """Restores what state_dict() returned; whatever this state's buckets held in the
        communicator is dropped first.

        Each bucket's residuals reach it at its next call: exactly when DDP makes a bucket of a
        saved layout, else from the per-parameter slices. The first iteration after loading is
        reduced in the checkpoint's bucket layouts when they hold the same parameters as DDP's
        buckets of that iteration: a new DDP starts from its first bucketing, not the rebuilt
        one that was checkpointed, and a bucket's composition decides what a codec sends
        (top-k over the bucket, sign's scale), so the resumed job then computes what the
        uninterrupted one did. That iteration's buckets are reduced together when its last one
        arrives (no overlap with backward for that one iteration, and no timeline events).
        algo=auto's model inputs, PowerSGD's residuals and Q are set at once."""
        if _gradzip.parse_spec(state["spec"]) != self.spec:
            raise ValueError(f"gradzip.torch: the checkpoint's spec '{state['spec']}' is not this "
                             f"state's '{self.spec}'")
        saved_momentum = float(state.get("momentum_correction", 0.0))
        if saved_momentum != self.momentum_correction:
            raise ValueError(f"gradzip.torch: the checkpoint's momentum_correction {saved_momentum} "
                             f"is not this state's {self.momentum_correction}")
        self.iteration = int(state["iteration"])
        self._momentum = {name: torch.from_numpy(np.asarray(values, dtype=np.float32).copy())
                          for name, values in state.get("momentum", {}).items()}
        for name, _ in self._layouts.values():
            self.communicator.drop_residuals(name)
        self._layouts = {}  # every bucket re-assembles its residuals from the checkpoint
        self._pending = {name: np.asarray(values, dtype=np.float32).copy()
                         for name, values in state["residuals"].items()}
        self._saved_buckets = {
            name: {"layout": tuple((str(p), int(o), int(n)) for p, o, n in bucket["layout"]),
                   "residual": np.asarray(bucket["residual"], dtype=np.float32).copy(),
                   "placed": {key: (int(offset), np.asarray(values, dtype=np.float32).copy())
                              for key, (offset, values) in bucket["placed"].items()}}
            for name, bucket in state.get("buckets", {}).items()}
        layouts = {int(index): tuple((str(p), int(o), int(n)) for p, o, n in layout)
                   for index, layout in state.get("layouts", {}).items()}
        self._resume_layouts = layouts or None
        self._resume_buckets = [] if layouts else None
        if state.get("auto_model") is not None:
            self.communicator.adopt_auto_model_state(state["auto_model"])
        for name, entry in state.get("powersgd", {}).items():
            for part, prefix in (("residual", "powersgd"), ("q", "powersgd-q")):
                if part in entry:
                    self.communicator.set_residual(f"{prefix}:{name}", entry[part])


class _Split:
    """A bucket's parameters divided by min_bytes.

    small: ((parameter, offset, numel), ...) under min_bytes, packed and averaged uncompressed.
    large: the others in buffer order; `run` is (begin, end) when they fill one contiguous range
        of the bucket (compressed in place), else None (packed into a copy, compressed, copied
        back). `layout` gives their offsets in what is compressed: it names the residual.
    """
    WHOLE = object()  # marks a layout with nothing under min_bytes

    def __init__(self, small, large):
        self.small = small
        self.large = tuple(large)
        self.run = None
        if large:
            begin, end = large[0][1], large[-1][1] + large[-1][2]
            if end - begin == sum(numel for _, _, numel in large):
                self.run = (begin, end)
        base = self.run[0] if self.run else 0
        offsets = np.cumsum([0] + [numel for _, _, numel in self.large])
        self.layout = tuple((parameter, (offset - base) if self.run else int(packed), numel)
                            for (parameter, offset, numel), packed in zip(self.large, offsets))


def _pack(buffer, entries):
    return torch.cat([buffer[offset:offset + numel] for _, offset, numel in entries])


def _unpack(packed, buffer, entries):
    at = 0
    for _, offset, numel in entries:
        buffer[offset:offset + numel].copy_(packed[at:at + numel])
        at += numel


def _split_allreduce(state, buffer, index, layout, split, spec, step):
    """Averages the bucket's parameters under min_bytes uncompressed (one call, packed) and the
    others with `spec` (one call: in place when contiguous, else packed); one stats dict for the
    bucket (the compressed call's, its sent_bytes including the uncompressed call's)."""
    stats = None
    if split.large:
        target = buffer[split.run[0]:split.run[1]] if split.run else _pack(buffer, split.large)
        name = state._prepare(index, split.layout, target.numel())
        stats = state.communicator.allreduce(target, name, spec, op="average", step=step)
        if split.run is None:
            _unpack(target, buffer, split.large)
    else:
        name = state._bucket_name(index, layout)
    dense = _pack(buffer, split.small)
    dense_stats = state.communicator.allreduce(dense, f"{name}.uncompressed", "none", op="average",
                                               step=step)
    _unpack(dense, buffer, split.small)
    if stats is None:
        stats = dict(dense_stats, sent_bytes=_ring_bytes(dense_stats))
    else:
        stats["sent_bytes"] = _ring_bytes(stats) + _ring_bytes(dense_stats)
    uncompressed = sum(numel for _, _, numel in split.small)
    stats["note"] = (stats["note"] + "; " if stats["note"] else "") + (
        f"{len(split.small)} parameters under min_bytes ({uncompressed} elements) uncompressed")
    return stats


def _powersgd_allreduce(state, buffer, index, layout, step):
    """PowerSGD over the bucket's matrices, plain average of its other parameters; one stats
    dict for the bucket (algorithm "powersgd", sent_bytes of all its calls)."""
    group = state._bucket_name(index, layout)
    matrices, dense = [], []
    for parameter, offset, numel in layout:
        shape = state._shapes[parameter]
        if len(shape) >= 2 and numel > 0:
            matrices.append((parameter, offset, shape[0], numel // shape[0]))
        else:
            dense.append((parameter, offset, numel))
    stats = state.communicator.powersgd_allreduce(buffer, group, state.spec, matrices, step)
    # stats["note"] is "P: <algorithm>, Q: <algorithm>"; a P or Q under min_bytes went through
    # MPI's own all-reduce, which reports no bytes: a ring's count of its R-column factors.
    rank = int(state.spec.split("rank=")[1].split(",")[0])
    factors = {"P": sum(min(rank, r, c) * r for _, _, r, c in matrices),
               "Q": sum(min(rank, r, c) * c for _, _, r, c in matrices)}
    sent = stats["sent_bytes"]
    for part in stats["note"].split(", "):
        which, algorithm = part.split(": ")
        if algorithm == "mpi":
            sent += _ring_bytes({"algorithm": "mpi", "ranks": stats["ranks"], "count": factors[which]})
    for parameter, offset, numel in dense:
        part = state.communicator.allreduce(buffer[offset:offset + numel], f"{group}/{parameter}",
                                            "none", op="average", step=step)
        sent += _ring_bytes(part)
    stats["sent_bytes"] = sent
    return stats


class _Timeline:
    """The hook's timeline: which iterations it records, its file, and the events."""

    HOOK_TRACK, THREAD_TRACK = 0, 1

    def __init__(self, communicator, path, first, count):
        self.events = _gradzip.Timeline(communicator.rank)
        self.path = _gradzip.timeline_path_for_rank(path, communicator.rank, communicator.size)
        self.steps = range(first, first + count)
        self.written = False
        self.events.name_track(self.HOOK_TRACK, "DDP hook calls")
        self.events.name_track(self.THREAD_TRACK, "gradzip communication thread")

    @classmethod
    def from_request(cls, communicator, path, first, count):
        # timeline_request refuses timeline_steps = 0 (gradzip.Error); a negative number would
        # only meet the binding's unsigned type, so it is refused here by name.
        if first < 0 or count < 0:
            raise ValueError(f"timeline_first_step and timeline_steps must not be negative, got "
                             f"{first} and {count}")
        path, first, count = _gradzip.timeline_request(path or "", first, count)
        return cls(communicator, path, first, count) if path else None

    def records(self, step):
        return step in self.steps

    def hook_called(self, index, step, buffer):
        self.events.instant(self.HOOK_TRACK, f"hook bucket {index}", "launch", self.events.now_us(),
                            _json_members(bucket=index, step=step,
                                          bytes=buffer.numel() * buffer.element_size()))

    def bucket_done(self, index, step, begin_us, stats, last):
        """The bucket's span on the thread's track; writes the file after the last one."""
        args = {"bucket": index, "step": step}
        if stats is None:
            args["failed"] = True
        else:
            args.update(sent_bytes=stats["sent_bytes"], algorithm=stats["algorithm"])
        self.events.span(self.THREAD_TRACK, f"bucket {index}", "task", begin_us,
                         self.events.now_us(), _json_members(**args))
        if last and step == self.steps[-1]:
            self.written = True
            self.events.write(self.path)

    def write_if_pending(self):
        if not self.written and self.events.event_count() > 0:
            self.written = True
            self.events.write(self.path)


def _json_members(**args):
    """Trace event args: a JSON object's members, without its braces."""
    return json.dumps(args)[1:-1]


def _reduce_bucket(state, buffer, index, layout, spec, step):
    """Averages one bucket's buffer in place; returns its stats dict."""
    if state._powersgd and spec != "none":
        return _powersgd_allreduce(state, buffer, index, layout, step)
    split = state._split_of(layout) if spec != "none" else None
    if split is not None:
        return _split_allreduce(state, buffer, index, layout, split, spec, step)
    name = state._prepare(index, layout, buffer.numel())
    return state.communicator.allreduce(buffer, name, spec, op="average", step=step)


def _reduce_resumed_iteration(state, stashed, saved, spec, step):
    """The first iteration after load_state_dict, on the communication thread. `stashed` holds
    every bucket of it as (buffer, index, layout, future), in DDP's order; `saved` is the
    checkpoint's layouts (index -> layout). When they differ from these buckets' but hold the
    same parameters, each checkpointed bucket is packed from the gradients (by parameter name),
    reduced as that bucket (its index, layout, name and residuals) and unpacked; otherwise each
    bucket is reduced as it is. Every rank makes the same calls in the same order (sorted
    indices, or DDP's order, which is the same on every rank)."""
    mine = {index: layout for _, index, layout, _ in stashed}

    def parameters(layouts):
        return sorted(parameter for layout in layouts.values() for parameter, _, _ in layout)

    try:
        if saved and saved != mine and parameters(saved) == parameters(mine):
            gradients = {parameter: buffer[offset:offset + numel]
                         for buffer, _, layout, _ in stashed for parameter, offset, numel in layout}
            for index in sorted(saved):
                layout = saved[index]
                first = gradients[layout[0][0]]
                packed = torch.zeros(max(offset + numel for _, offset, numel in layout),
                                     dtype=first.dtype, device=first.device)
                for parameter, offset, numel in layout:
                    packed[offset:offset + numel].copy_(gradients[parameter])
                state.last_stats[index] = _reduce_bucket(state, packed, index, layout, spec, step)
                for parameter, offset, numel in layout:
                    gradients[parameter].copy_(packed[offset:offset + numel])
        else:
            for buffer, index, layout, _ in stashed:
                state.last_stats[index] = _reduce_bucket(state, buffer, index, layout, spec, step)
    except Exception as error:  # every future carries it to DDP's wait
        for _, _, _, future in stashed:
            future.set_exception(error)
        return
    for buffer, _, _, future in stashed:
        future.set_result(buffer)


def hook(state, bucket):
    """DDP communication hook: average bucket.buffer() with gradzip; returns a Future of it."""
    if not state._spans_checked:  # the state was made before torch.distributed was initialised
        _world.refuse_communicator_not_spanning(state.communicator.size, state._process_group)
        state._spans_checked = True
    buffer = bucket.buffer()
    index = bucket.index()
    layout = state._layout_of(bucket)
    if state.momentum_correction:
        state._correct_momentum(buffer, layout)
    spec = "none" if state.iteration < state.warmup else state.spec
    step = state.iteration % 2 ** 32  # keys the random draws (a 32-bit counter word)
    last = bucket.is_last()
    state._iteration_layouts[index] = layout
    if last:
        state.iteration += 1
        state._ddp_layouts, state._iteration_layouts = state._iteration_layouts, {}
    future = torch.futures.Future()
    if state._resume_buckets is not None:  # the first iteration after load_state_dict
        state._resume_buckets.append((buffer, index, layout, future))
        if last:
            stashed, state._resume_buckets = state._resume_buckets, None
            saved, state._resume_layouts = state._resume_layouts, None
            try:
                state._thread.submit(
                    lambda: _reduce_resumed_iteration(state, stashed, saved, spec, step))
            except RuntimeError as error:
                raise RuntimeError("gradzip.torch.hook: this GradzipState was closed; register "
                                   "the hook with an open state") from error
        return future
    timeline = state._timeline if state._timeline is not None and state._timeline.records(step) else None
    if timeline is not None:
        timeline.hook_called(index, step, buffer)

    def communicate():
        try:
            if timeline is None:
                state.last_stats[index] = _reduce_bucket(state, buffer, index, layout, spec, step)
            else:
                begin_us, stats = timeline.events.now_us(), None
                try:
                    with timeline.events.recording(timeline.THREAD_TRACK):
                        stats = _reduce_bucket(state, buffer, index, layout, spec, step)
                    state.last_stats[index] = stats
                finally:
                    timeline.bucket_done(index, step, begin_us, stats, last)
            future.set_result(buffer)
        except Exception as error:  # the future carries it to DDP's wait
            future.set_exception(error)

    try:
        state._thread.submit(communicate)
    except RuntimeError as error:
        raise RuntimeError("gradzip.torch.hook: this GradzipState was closed; register the hook "
                           "with an open state") from error
    return future
