"""gradzip under PyTorch's FSDP2 (torch.distributed.fsdp.fully_shard): a compressed
reduce-scatter.

    from torch.distributed.fsdp import fully_shard
    import gradzip.torch
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    state = gradzip.torch.compress_fsdp(model, spec="qsgd:bits=4,ef=on")

FSDP2 reduce-scatters each parameter group's gradients (one group per fully_shard call with
parameters) once per backward. compress_fsdp installs gradzip's reduce-scatter on every such
module (FSDPModule.set_custom_reduce_scatter), so what each rank sends for its peers' shards is
compressed; everything else (all-gathers, the optimizer on the shards) stays FSDP's.

- The call: FSDP hands over its reduce-scatter input, laid out as world_size rows (row r: rank
  r's shard of every parameter of the group, each padded to equal rows), and expects row
  `rank` reduced in the output. gradzip reduce-scatters it under the group's name ("fsdp." +
  the module's name + a digest of its parameter names and sizes), whose error-feedback residual
  is this rank's whole contribution (the unsharded gradient, padded).
- Reductions: FSDP is told to hand over sums only (set_force_sum_reduction_for_comms) and divides
  by the data-parallel size itself, before (reduce_dtype float16) and after, as it does for
  NCCL's zero-copy sums. So average, set_gradient_divide_factor and the reduce dtype
  (MixedPrecisionPolicy(reduce_dtype=...): float32, bfloat16 or float16) behave as FSDP
  documents. A reduce-scatter asked for another operation is refused (gradzip.Error).
- min_bytes: a parameter whose full gradient is under the spec's min_bytes (65536 bytes by
  default: biases, norms) is reduced uncompressed, packed with the group's other small ones in
  one call ("<group>.uncompressed"), like the DDP hook does per bucket; the other parameters go
  in one compressed call, whose residual covers them only.
- warmup=N: every group's first N reduce-scatters run uncompressed (spec "none"), in the same
  calls as later ones.
- Random draws (stochastic rounding, random-k) are keyed by the group's name and its call
  count, which state_dict() keeps, so a resumed job draws what the uninterrupted one would.
- state_dict() / load_state_dict(): the call counts, every residual of every group exactly as
  the algorithms keep it (the worker's and the ring's per-hop ones) with the group's layout, and
  each parameter's residual (its padded unsharded gradient's) for a model wrapped differently.
  A group of the same layout is restored exactly; any other group assembles its residual from
  its parameters' slices (same world size), so no residual mass is lost.
- Every rank must call compress_fsdp with the same model structure and spec. The communicator
  must span the FSDP shard group (the replicate group for hybrid sharding) with the same rank
  numbering (checked: gradzip.Error). The default communicator runs over that group (transport
  "torch" for a group smaller than the job: only its members make it).
- Hybrid sharding, compressed across nodes: shard over a 1-D mesh inside each node and pass
  replicate_group= (the process group, or the 1-D DeviceMesh, of the ranks holding the same
  shard on the other nodes). FSDP's own reduce-scatter then runs inside the node (fast links,
  uncompressed) and gradzip all-reduces each reduced shard across the replicate group with the
  spec (FSDPModule.set_all_reduce_hook), residuals per group as above (of the shard). FSDP then
  divides by shard size x replicate size (set_gradient_divide_factor, unless one was set).
  PyTorch's native hybrid sharding (fully_shard over a 2-D mesh) is refused: its all-reduce
  across the replicate dimension is FSDP's own and would not be compressed.
- powersgd needs whole gradient matrices and is refused here; with FSDP's own reduce-scatter
  and gradzip's DDP hook it runs under DDP.

Tested on CPU with gloo under torchrun; on CUDA tensors the same calls run gradzip's CUDA path
(written, not yet run on a GPU).
"""
import hashlib

import numpy as np
import torch

from . import _gradzip, _world
from . import Communicator
from ._stats import ring_bytes

try:  # FSDP2's comm interface (PyTorch 2.6 and later); duck-typed without it
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatterBase
except ImportError:  # pragma: no cover - older PyTorch has no set_custom_reduce_scatter either
    _ReduceScatterBase = object


def _error(message, code="invalid_argument"):
    error = _gradzip.Error(message)
    error.code = code
    return error


class _Entry:
    """One parameter of a group: its name, the elements of its shard in each row of the
    reduce-scatter input (padded), and its full gradient's elements (min_bytes applies to those)."""
    __slots__ = ("name", "shard_numel", "numel")

    def __init__(self, name, shard_numel, numel):
        self.name, self.shard_numel, self.numel = name, int(shard_numel), int(numel)

    def key(self):
        return (self.name, self.shard_numel, self.numel)


class _Group:
    """A fully_shard'ed module's parameter group: its name, its parameters in FSDP's order, and
    how they divide by min_bytes (column ranges of one row of the reduce-scatter input)."""

    def __init__(self, module_name, entries, spec):
        self.entries = tuple(entries)
        self.layout = tuple(entry.key() for entry in self.entries)
        digest = hashlib.sha1("|".join(f"{n}:{s}:{k}" for n, s, k in self.layout).encode()).hexdigest()[:12]
        self.name = f"fsdp.{module_name or 'root'}.{digest}"
        self.row_numel = sum(entry.shard_numel for entry in self.entries)
        columns, at = [], 0
        for entry in self.entries:
            columns.append((entry, at, at + entry.shard_numel))
            at += entry.shard_numel
        self.columns = tuple(columns)
        compressing = spec.split(":")[0] != "none"
        small = [c for c in columns if compressing and _gradzip.sent_uncompressed(spec, c[0].numel)]
        self.small = tuple(small)
        self.large = tuple(c for c in columns if c not in small) if compressing else self.columns
        # The compressed call's residual covers the large columns only, packed in order.
        self.large_row_numel = sum(end - begin for _, begin, end in self.large)


def _gather_columns(rows, columns):
    """The column ranges `columns` of every row of `rows` (2-D), packed: a new contiguous
    (rows, sum of widths) tensor."""
    return torch.cat([rows[:, begin:end] for _, begin, end in columns], dim=1).contiguous()


class FSDPState:
    """What compress_fsdp installs: the spec, the communicator, the groups and their call counts.

    Not made directly: compress_fsdp(model, ...) returns it."""

    def __init__(self, model, spec, warmup, communicator, process_group, replicate_group):
        import torch.distributed as dist
        self.spec = _gradzip.parse_spec(spec)
        if self.spec.split(":")[0] == "powersgd":
            raise _error("gradzip.torch.compress_fsdp: powersgd compresses whole gradient matrices, "
                         "which FSDP's reduce-scatter never holds (it sends row blocks of every "
                         "parameter); use it with DDP (gradzip.torch.GradzipState), or an element "
                         "codec (fp16, bf16, qsgd, sign, terngrad, topk, randk) here", "unsupported")
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        self.warmup = int(warmup)
        modules = _fsdp_modules(model)
        if not modules:
            raise ValueError("gradzip.torch.compress_fsdp: the model has no fully_shard'ed module "
                             "with parameters (call torch.distributed.fsdp.fully_shard first)")
        for module_name, _, param_group in modules:
            if param_group._is_hsdp:
                raise _error(f"gradzip.torch.compress_fsdp: module '{module_name or 'root'}' is "
                             "sharded over a 2-D mesh (PyTorch's native hybrid sharding), whose "
                             "all-reduce across the replicate dimension is FSDP's own and would "
                             "not be compressed: shard over the 1-D mesh inside the node and pass "
                             "replicate_group= (the other dimension)")
        shard_group = modules[0][2].mesh_info.shard_process_group
        self.hybrid = replicate_group is not None
        if self.hybrid:
            if hasattr(replicate_group, "get_group"):  # a 1-D DeviceMesh
                replicate_group = replicate_group.get_group()
            if process_group is not None and process_group is not replicate_group:
                raise ValueError("gradzip.torch.compress_fsdp: with replicate_group=, gradzip "
                                 "reduces over that group; leave process_group unset")
            process_group = replicate_group
            # Each replicate group must join the same shard of every node: the same rank in
            # equal shard groups.
            mine = (dist.get_rank(shard_group), dist.get_world_size(shard_group))
            seen = [None] * dist.get_world_size(replicate_group)
            dist.all_gather_object(seen, mine, group=replicate_group)
            if any(entry != mine for entry in seen):
                raise _error("gradzip.torch.compress_fsdp: the replicate group's ranks hold "
                             f"different shards (their (shard rank, shard size): {seen}); pass "
                             "the group of the ranks with this rank's position on the other nodes")
            self.shard = mine
        else:
            if process_group is None:
                process_group = shard_group
            self.shard = None
        if communicator is None:  # a group smaller than the job: over torch.distributed
            spans_job = dist.get_world_size(process_group) == dist.get_world_size()
            communicator = Communicator(transport="auto" if spans_job else "torch",
                                        process_group=process_group)
        self.communicator = communicator
        _world.refuse_communicator_not_spanning(self.communicator.size, process_group,
                                                who="gradzip.torch.compress_fsdp")
        # The communicator must be the group gradzip reduces over, rank for rank: FSDP's shard
        # group (the replicate group under hybrid sharding). Checked here, on every rank alike.
        self._checked_group = None
        self._check_group(replicate_group if self.hybrid else shard_group)
        names = {id(parameter): name for name, parameter in model.named_parameters()}
        self.groups = []
        self._closed = False
        self._calls = {}  # group name -> calls run (keys the random draws)
        self.last_stats = {}  # group name -> the stats dict of its latest call
        replicas = self.communicator.size if self.hybrid else 1
        for module_name, module, param_group in modules:
            entries = []
            for fsdp_param in param_group.fsdp_params:
                name = names.get(id(fsdp_param.sharded_param))
                if name is None:
                    raise ValueError("gradzip.torch.compress_fsdp: a sharded parameter is not among "
                                     "the model's named_parameters() (pass the root module)")
                entries.append(_Entry(name, fsdp_param.padded_sharded_param_size.numel(),
                                      fsdp_param._orig_size.numel()))
            group = _Group(module_name, entries, self.spec)
            self.groups.append(group)
            self._calls[group.name] = 0
            module.set_force_sum_reduction_for_comms(True)
            if self.hybrid:
                if param_group.gradient_divide_factor is None:
                    module.set_gradient_divide_factor(float(dist.get_world_size(shard_group) * replicas))
                module.set_all_reduce_hook(_AllReduceHook(self, group))
            else:
                module.set_custom_reduce_scatter(_GradzipReduceScatter(self, group))
        if len({group.name for group in self.groups}) != len(self.groups):
            raise ValueError("gradzip.torch.compress_fsdp: two fully_shard'ed modules hold the same "
                             "parameters")
        # rows of what one call reduces: the world's contributions, or the one shard (hybrid)
        self.rows = 1 if self.hybrid else self.communicator.size

    # ---- lifecycle -----------------------------------------------------------------------------

    def close(self):
        """Forgets the groups' residuals; the reduce-scatter refuses afterwards (gradzip.Error).
        Idempotent."""
        if not self._closed:
            for group in self.groups:
                self.communicator.drop_residuals(group.name)
            self._closed = True

    @property
    def closed(self):
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
        return False

    # ---- the reduce-scatter --------------------------------------------------------------------

    def _check_group(self, group):
        if group is self._checked_group:
            return
        import torch.distributed as dist
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if size != self.communicator.size or rank != self.communicator.rank:
            raise _error(f"gradzip.torch.compress_fsdp: gradzip reduces over a group of {size} "
                         f"rank(s) where this process is rank {rank}, but the gradzip communicator "
                         f"is rank {self.communicator.rank} of {self.communicator.size}: pass a "
                         "communicator spanning that group (FSDP's shard group, or the replicate "
                         "group) in its rank order")
        self._checked_group = group

    def _begin(self, group):
        if self._closed:
            raise _error("gradzip.torch.compress_fsdp: this state was closed; FSDP still calls its "
                         "reduce-scatter (install a new one)")
        step = self._calls[group.name]
        return step, ("none" if step < self.warmup else self.spec), step % 2 ** 32

    def _finish(self, group, step, stats, small_stats, element_bytes):
        """The group's stats dict: the compressed call's (else the uncompressed one's), its
        sent_bytes covering both calls (a transport all-reduce counted as a ring)."""
        calls = [s for s in (stats, small_stats) if s is not None]
        stats = dict(calls[0], sent_bytes=sum(ring_bytes(s, element_bytes) for s in calls))
        if small_stats is not None:
            uncompressed = sum(entry.numel for entry, _, _ in group.small)
            stats["note"] = (stats["note"] + "; " if stats["note"] else "") + (
                f"{len(group.small)} parameters under min_bytes ({uncompressed} elements) uncompressed")
        self._calls[group.name] = step + 1
        self.last_stats[group.name] = stats
        return stats

    def reduce_scatter(self, group, output, contribution, op):
        """Row `rank` of the sum over ranks of `contribution` (world_size rows, flat) into
        `output`."""
        import torch.distributed as dist
        if op != dist.ReduceOp.SUM:
            raise _error(f"gradzip.torch.compress_fsdp: FSDP asked for reduce op {op}; gradzip's "
                         "reduce-scatter sums (compress_fsdp sets set_force_sum_reduction_for_comms"
                         "(True), so that FSDP divides itself: something turned it off)")
        world, rank = self.communicator.size, self.communicator.rank
        if contribution.numel() != world * group.row_numel or output.numel() != group.row_numel:
            raise _error(f"gradzip.torch.compress_fsdp: group '{group.name}' expects a "
                         f"reduce-scatter of {world} x {group.row_numel} elements into "
                         f"{group.row_numel}, got {contribution.numel()} into {output.numel()} "
                         "(parameters without gradients in this backward are not supported; "
                         "FSDP's set_reduce_scatter_unused_params(True) keeps the layout)")
        rows = contribution.view(world, group.row_numel)
        collective = self.communicator.reduce_scatter
        return self._reduce(group, rows, rank, output.view(group.row_numel), collective)

    def all_reduce_shard(self, group, shard):
        """Hybrid sharding: `shard` (this rank's node-reduced shard of the group, flat) summed in
        place across the replicate group."""
        if shard.numel() != group.row_numel:
            raise _error(f"gradzip.torch.compress_fsdp: group '{group.name}' expects a shard of "
                         f"{group.row_numel} elements, got {shard.numel()} (parameters without "
                         "gradients in this backward are not supported)")
        flat = shard.view(group.row_numel)
        return self._reduce(group, flat.view(1, group.row_numel), 0, flat,
                            self.communicator.allreduce)

    def _reduce(self, group, rows, mine, out, collective):
        """One call of the group: `collective(flat, name, spec, step=)` (the communicator's
        reduce-scatter or all-reduce, whose result for this rank is row `mine` of `rows`) over
        `rows` (rows x group.row_numel), that row written to `out`. With parameters under
        min_bytes, their columns go packed in an uncompressed call and the others' in the
        compressed one; otherwise one call (warm-up calls too: the residual keeps its shape)."""
        step, spec, key = self._begin(group)
        small_stats, stats = None, None
        if not group.small:
            stats = collective(rows.view(-1), group.name, spec, step=key)
            if out.data_ptr() != rows[mine].data_ptr():
                out.copy_(rows[mine])
        else:
            if group.large:
                large = _gather_columns(rows, group.large)
                stats = collective(large.view(-1), group.name, spec, step=key)
                _scatter_columns(large[mine], out, group.large)
            small = _gather_columns(rows, group.small)
            small_stats = collective(small.view(-1), f"{group.name}.uncompressed", "none", step=key)
            _scatter_columns(small[mine], out, group.small)
        return self._finish(group, step, stats, small_stats, rows.element_size())

    # ---- checkpoints ---------------------------------------------------------------------------

    def _parameter_residuals(self):
        """Each compressed parameter's residual, every residual of its group folded in, by name:
        of the padded unsharded gradient (world_size rows of its shard, flat), or under hybrid
        sharding of this rank's shard."""
        residuals = {}
        for group in self.groups:
            if not group.large:
                continue
            folded = self.communicator.folded_residual(group.name, self.rows * group.large_row_numel)
            if folded is None:
                continue
            rows = folded.reshape(self.rows, group.large_row_numel)
            at = 0
            for entry, begin, end in group.large:
                residuals[entry.name] = rows[:, at:at + end - begin].reshape(-1).copy()
                at += end - begin
        return residuals

    def state_dict(self):
        """The settings, call counts and residuals (NumPy arrays), changing nothing. Take it
        between iterations (after backward, no reduce-scatter under way).

        "calls": group name -> reduce-scatters run; "groups": group name -> {"layout", "residual"
        (the worker's, or None where the algorithm keeps none on this rank), "placed": {residual
        name: (offset, values)}}; "residuals": parameter name
        -> its residual, every residual folded in; "world_size" (the communicator's); "shard"
        (hybrid sharding: this rank's (shard rank, shard size), else None); "auto_model": algo=auto's
        measured model inputs."""
        groups = {}
        for group in self.groups:
            # An algorithm may keep only placed residuals on a rank (the tree's root has no
            # worker residual): the group is saved whenever it holds either.
            worker = self.communicator.residual(group.name)
            placed = {key: (offset, self.communicator.residual(key))
                      for key, offset in self.communicator.placed_residuals(group.name)}
            if worker is None and not placed:
                continue
            groups[group.name] = {"layout": group.layout, "residual": worker, "placed": placed}
        return {"spec": self.spec, "warmup": self.warmup, "world_size": self.communicator.size,
                "shard": self.shard,
                "calls": dict(self._calls), "groups": groups,
                "residuals": self._parameter_residuals(),
                "auto_model": self.communicator.auto_model_state()}

    def load_state_dict(self, state):
        """Restores what state_dict() returned (same spec and world size): a group of a saved
        layout gets its residuals and call count exactly; any other group its parameters'
        residual slices (zeros for a parameter the checkpoint has none of) and the largest saved
        call count. What the groups held before is dropped first."""
        if _gradzip.parse_spec(state["spec"]) != self.spec:
            raise ValueError(f"gradzip.torch.compress_fsdp: the checkpoint's spec '{state['spec']}' "
                             f"is not this state's '{self.spec}'")
        if int(state["world_size"]) != self.communicator.size:
            raise ValueError(f"gradzip.torch.compress_fsdp: the checkpoint is of {state['world_size']} "
                             f"ranks, this job has {self.communicator.size}")
        saved_shard = state.get("shard")
        if (tuple(saved_shard) if saved_shard is not None else None) != self.shard:
            raise ValueError(f"gradzip.torch.compress_fsdp: the checkpoint's shard (rank, size) "
                             f"{saved_shard} is not this rank's {self.shard}")
        world = self.rows
        saved_calls = {str(name): int(count) for name, count in state["calls"].items()}
        latest = max(saved_calls.values(), default=0)
        for group in self.groups:
            self.communicator.drop_residuals(group.name)
            self.communicator.drop_residuals(f"{group.name}.uncompressed")
            saved = state["groups"].get(group.name)
            layout = None if saved is None else tuple(
                (str(n), int(s), int(k)) for n, s, k in saved["layout"])
            if saved is not None and layout == group.layout:
                if saved["residual"] is not None:
                    self.communicator.set_residual(group.name, np.asarray(saved["residual"], np.float32))
                for key, (offset, values) in saved["placed"].items():
                    self.communicator.set_residual(key, np.asarray(values, np.float32),
                                                   placed_in=group.name, offset=int(offset))
                self._calls[group.name] = saved_calls.get(group.name, latest)
                continue
            self._calls[group.name] = saved_calls.get(group.name, latest)
            if not group.large:
                continue
            rows = np.zeros((world, group.large_row_numel), dtype=np.float32)
            at, carried = 0, False
            for entry, begin, end in group.large:
                values = state["residuals"].get(entry.name)
                if values is not None:
                    values = np.asarray(values, np.float32)
                    if values.size != world * (end - begin):
                        raise ValueError(
                            f"gradzip.torch.compress_fsdp: the checkpoint's residual of "
                            f"'{entry.name}' has {values.size} elements, this job's padded "
                            f"gradient {world * (end - begin)}")
                    rows[:, at:at + end - begin] = values.reshape(world, end - begin)
                    carried = True
                at += end - begin
            if carried:
                self.communicator.set_residual(group.name, rows.reshape(-1))
        if state.get("auto_model") is not None:
            self.communicator.adopt_auto_model_state(state["auto_model"])


def _scatter_columns(packed_row, out, columns):
    at = 0
    for _, begin, end in columns:
        out[begin:end].copy_(packed_row[at:at + end - begin])
        at += end - begin


class _AllReduceHook:
    """FSDPModule.set_all_reduce_hook's callable for one group (hybrid sharding)."""

    def __init__(self, state, group):
        self._state = state
        self._group = group

    def __call__(self, reduce_output):
        self._state.all_reduce_shard(self._group, reduce_output)


class _GradzipReduceScatter(_ReduceScatterBase):
    """FSDP2's ReduceScatter interface over one group of an FSDPState."""

    def __init__(self, state, group):
        self._state = state
        self._group = group

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        self._state._check_group(group)
        self._state.reduce_scatter(self._group, output_tensor, input_tensor, op)
        if not async_op:
            return None
        future = torch.futures.Future()  # done: the call above is synchronous
        future.set_result([output_tensor])
        return torch._C._distributed_c10d._create_work_from_future(future)


def _fsdp_modules(model):
    """(module name, module, its FSDP parameter group) of every fully_shard'ed module with
    parameters, in named_modules() order."""
    from torch.distributed.fsdp import FSDPModule
    found = []
    for name, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        groups = module._get_fsdp_state()._fsdp_param_groups
        if len(groups) > 1:
            raise ValueError(f"gradzip.torch.compress_fsdp: module '{name or 'root'}' has "
                             f"{len(groups)} parameter groups (per-parameter meshes); FSDP takes a "
                             "custom reduce-scatter only for one")
        if groups:
            found.append((name, module, groups[0]))
    return found


def compress_fsdp(model, spec="none", *, warmup=0, communicator=None, process_group=None,
                  replicate_group=None):
    """Installs gradzip on every fully_shard'ed module of `model` that holds parameters: its
    compressed reduce-scatter, or with replicate_group its compressed all-reduce of the shards
    across nodes (hybrid sharding); returns the FSDPState (state_dict(), load_state_dict(),
    close()).

    model: the root module, after fully_shard was applied (its named_parameters() name the
        residuals). spec: a gradzip compression spec, e.g. "qsgd:bits=4,ef=on". warmup: each
        group's first calls run uncompressed. replicate_group: a process group or 1-D
        DeviceMesh of the ranks holding this rank's shard on the other nodes (the modules
        sharded over a 1-D mesh inside the node). communicator: a gradzip.Communicator spanning
        the group gradzip reduces over (default: a new one over `process_group`, which defaults
        to the first module's shard group, or replicate_group). Every rank calls it alike."""
    return FSDPState(model, spec, warmup, communicator, process_group, replicate_group)
