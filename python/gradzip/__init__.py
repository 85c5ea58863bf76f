"""gradzip: compressed gradient all-reduce for data-parallel training.

    import gradzip
    comm = gradzip.Communicator()                  # over MPI_COMM_WORLD (run under mpirun)
    comm.allreduce(array, "layer1.weight", "topk:ratio=0.01,ef=on", op="average")

The collectives and codecs are the C++ library's (gradzip._gradzip); gradzip.torch holds the
DDP communication hook.
"""
from ._gradzip import Codec, Communicator, Error, __version__, parse_spec

__all__ = ["Codec", "Communicator", "Error", "__version__", "parse_spec"]
