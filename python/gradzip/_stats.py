"""Byte accounting of a gradzip call's stats dict, shared by the DDP hook and the FSDP
reduce-scatter."""


def ring_bytes(stats, element_bytes=4):
    """What the call handed to the network from this rank. A tensor under min_bytes goes through
    the transport's own all-reduce (algorithm "mpi"), which reports no count: a ring's,
    2 (P - 1) / P of the tensor's bytes."""
    if stats["algorithm"] != "mpi":
        return stats["sent_bytes"]
    ranks = stats["ranks"]
    return 2 * (ranks - 1) * stats["count"] * element_bytes // ranks
