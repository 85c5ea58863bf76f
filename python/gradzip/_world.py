"""Whether a gradzip communicator spans the ranks torch.distributed trains with.

A communicator over MPI (transport "mpi") in a process that torchrun (or any launcher that is
not MPI's) started has an MPI_COMM_WORLD of one rank, so an all-reduce through it would return
each rank's own gradient and the ranks would train unsynchronised with no error. The checks here
refuse that at construction instead. (Under torchrun, gradzip runs over torch.distributed once
the process group is initialised: gradzip.Communicator(transport="auto" or "torch").)

torch.distributed's rank count is the process group's size when torch.distributed is initialised
(the group DDP uses, default: the world), else the WORLD_SIZE variable that torchrun and
init_method="env://" use. torch is never imported here: a process that has not imported it has
no process group to compare with.
"""
import os
import sys

from . import _gradzip

_HOW_TO_LAUNCH = (
    "Under torchrun, call torch.distributed.init_process_group(...) before making the gradzip "
    "communicator (gradzip.Communicator() then runs over torch.distributed, transport 'torch'); "
    "or launch every process with mpirun (for example `mpirun -np 2 python train.py`) for "
    "transport 'mpi'")


def torch_world(process_group=None):
    """(rank count, where it came from) as torch.distributed sees it, or None when unknown."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        group = process_group if process_group is not None else distributed.group.WORLD
        return distributed.get_world_size(group), "torch.distributed's process group"
    text = os.environ.get("WORLD_SIZE")
    if text is None:
        return None
    try:
        size = int(text)
    except ValueError:
        return None  # not a launcher's value; torch.distributed itself would refuse it
    return size, "WORLD_SIZE (as torchrun sets it)"


def _refuse(who, communicator_size, torch_size, source):
    error = _gradzip.Error(
        f"{who}: the gradzip communicator spans {communicator_size} rank(s) but {source} says "
        f"{torch_size}: gradzip would average over other ranks than the training does (with one "
        f"rank, each process only its own gradient: the ranks would train unsynchronised). "
        f"{_HOW_TO_LAUNCH}.")
    error.code = "invalid_argument"
    raise error


def refuse_singleton_among_torch_ranks(communicator_size):
    """gradzip.Communicator(): an MPI world of one rank where torch.distributed reports several
    is a process started without mpirun (each would reduce alone): refused."""
    world = torch_world()
    if world is not None and communicator_size == 1 and world[0] > 1:
        _refuse("gradzip.Communicator", communicator_size, world[0], world[1])


def refuse_communicator_not_spanning(communicator_size, process_group=None,
                                     who="gradzip.torch.GradzipState"):
    """The DDP hook's state, or an MPI communicator given a process group: the communicator must
    have exactly the process group's rank count (when torch.distributed is initialised or
    WORLD_SIZE is set; otherwise nothing to compare)."""
    world = torch_world(process_group)
    if world is not None and world[0] != communicator_size:
        _refuse(who, communicator_size, world[0], world[1])
