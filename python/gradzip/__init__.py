"""gradzip: compressed gradient all-reduce for data-parallel training.

    import gradzip
    comm = gradzip.Communicator()                  # over MPI_COMM_WORLD (run under mpirun)
    comm.allreduce(array, "layer1.weight", "topk:ratio=0.01,ef=on", op="average")

The collectives and codecs are the C++ library's (gradzip._gradzip); gradzip.torch holds the
DDP communication hook.
"""
from . import _gradzip, _world
from ._gradzip import Codec, Error, __version__, parse_spec


class Communicator(_gradzip.Communicator):
    __doc__ = _gradzip.Communicator.__doc__ + """

Refused with gradzip.Error (code "invalid_argument") in a process whose MPI world is one rank
while torch.distributed reports several (its process group, or WORLD_SIZE as torchrun sets it):
such a process was started without mpirun, and its all-reduces would return its own data."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _world.refuse_singleton_among_torch_ranks(self.size)


__all__ = ["Codec", "Communicator", "Error", "__version__", "parse_spec"]
