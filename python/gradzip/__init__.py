"""gradzip: compressed gradient all-reduce for data-parallel training.

    import gradzip
    comm = gradzip.Communicator()      # over MPI (mpirun) or torch.distributed (torchrun)
    comm.allreduce(array, "layer1.weight", "topk:ratio=0.01,ef=on", op="average")

The collectives and codecs are the C++ library's (gradzip._gradzip); gradzip.torch holds the
DDP communication hook.
"""
import importlib.util
import os
import sys

from . import _gradzip, _world
from ._gradzip import Codec, Error, __version__, parse_spec


def _register_nccl_wheel():
    """Offers the nvidia-nccl wheel's libnccl.so.2 (the NCCL a pip-installed PyTorch loads) to
    gradzip's run-time NCCL search, ahead of the dynamic loader's own search: loaded by gradzip
    first, it is the file torch then finds already loaded. torch is not imported."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations:
        return
    paths = [os.path.join(folder, "nccl", "lib", "libnccl.so.2")
             for folder in spec.submodule_search_locations]
    _gradzip.add_nccl_library_candidates([path for path in paths if os.path.isfile(path)])


_register_nccl_wheel()

# Variables an MPI launcher sets in every process it starts (Open MPI, MPICH / Intel MPI's
# Hydra, PMIx-based launchers, Slurm's srun --mpi).
_MPI_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def launched_by_mpi():
    """Whether an MPI launcher started this process (its world then spans the job)."""
    return any(name in os.environ for name in _MPI_LAUNCHER_VARIABLES)


def _torch_distributed_ready():
    distributed = sys.modules.get("torch.distributed")
    return (distributed is not None and distributed.is_available()
            and distributed.is_initialized())


def choose_transport(transport="auto"):
    """"mpi" or "torch": what Communicator(transport=...) runs over.

    auto: "mpi" when an MPI launcher started the process; else "torch" when torch.distributed is
    initialised; else "mpi" (one process on its own: a one-rank world). A process that
    torchrun (or another launcher that sets WORLD_SIZE > 1) started without MPI and before
    torch.distributed.init_process_group is refused by the launch check, naming the fix.
    """
    if transport not in ("auto", "mpi", "torch"):
        raise ValueError(f"transport '{transport}' (accepted: auto, mpi, torch)")
    if transport != "auto":
        return transport
    if launched_by_mpi():
        return "mpi"
    return "torch" if _torch_distributed_ready() else "mpi"


class Communicator(_gradzip.Communicator):
    __doc__ = _gradzip.Communicator.__doc__ + """

gradzip.Communicator(default_spec="none", *, transport="auto", process_group=None, ...):
transport "mpi" runs over MPI_COMM_WORLD (a `process_group` given must have its rank count);
"torch" over torch.distributed: gradzip makes a gloo
group of its own over the ranks of `process_group` (default: the world; collective: every rank
of the job constructs its communicator together, or for a group smaller than the job every rank
of that group), so it works under torchrun with no MPI
launcher, whatever backend the application's group uses. "auto" (the default) picks mpi under
an MPI launcher, else torch when torch.distributed is initialised, else mpi (one process).
`transport_name` says which ("mpi" or "torch"), `transport` describes it.

Refused with gradzip.Error (code "invalid_argument") when the communicator would not span the
ranks torch.distributed reports (a one-rank MPI world in a process started by torchrun before
torch.distributed was initialised): its all-reduces would return each rank's own data."""

    def __init__(self, default_spec="none", *, transport="auto", process_group=None, **kwargs):
        self.transport_name = choose_transport(transport)
        if self.transport_name == "torch":
            from . import _process_group
            timeout_s = _deadline_seconds(kwargs.get("timeout_s", 0.0))
            engine = _process_group.ProcessGroupEngine.over_group(process_group, timeout_s)
            super().__init__(default_spec, engine=engine, **kwargs)
        else:
            super().__init__(default_spec, **kwargs)
            if process_group is not None:  # MPI_COMM_WORLD must be the group's ranks
                _world.refuse_communicator_not_spanning(
                    self.size, process_group, who="gradzip.Communicator(transport='mpi', process_group=...)")
            _world.refuse_singleton_among_torch_ranks(self.size)


def _deadline_seconds(timeout_s):
    """The deadline the C++ side will use (GRADZIP_TIMEOUT_S over timeout_s, else 600 s), for
    the gloo group's own timeout."""
    text = os.environ.get("GRADZIP_TIMEOUT_S")
    if text:
        try:
            return float(text)
        except ValueError:
            return 600.0  # the C++ side refuses the text with its own message
    return float(timeout_s) if timeout_s and timeout_s > 0 else 600.0


__all__ = ["Codec", "Communicator", "Error", "__version__", "choose_transport",
           "launched_by_mpi", "parse_spec"]
