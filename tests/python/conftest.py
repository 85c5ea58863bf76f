"""Shared fixtures of gradzip's Python tests.

Run under mpirun (see tests/CMakeLists.txt): every rank runs the same tests in the same order,
so the collectives inside them pair up. Without mpirun they run as one rank.

- comm: one gradzip.Communicator over MPI_COMM_WORLD for the session.
- rank, size: this process's rank and the rank count (from the communicator).
- process_group: torch.distributed's gloo group over loopback (tcp://127.0.0.1:PORT, PORT from
  GRADZIP_TEST_PORT so that ctest's parallel runs do not collide), created once per session.
- gather_digests(comm, data): every rank's SHA-256 of `data` on every rank (a cross-rank
  identity check made with gradzip itself, see its comment).
"""
import hashlib
import os

import numpy as np
import pytest

import gradzip


@pytest.fixture(scope="session")
def comm():
    return gradzip.Communicator()


@pytest.fixture(scope="session")
def rank(comm):
    return comm.rank


@pytest.fixture(scope="session")
def size(comm):
    return comm.size


@pytest.fixture(scope="session")
def process_group(comm):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    env_rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    env_size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    assert (env_rank, env_size) == (comm.rank, comm.size), "MPI and Open MPI's environment disagree"
    port = int(os.environ.get("GRADZIP_TEST_PORT", "29631"))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=env_rank,
                            world_size=env_size)
    yield dist.group.WORLD
    dist.destroy_process_group()
    del torch


def gather_digests(comm, data):
    """Every rank's SHA-256 digest of `data` (bytes-like), as a list indexed by rank.

    Why this is exact: each rank writes its digest as 16 integers of 16 bits into its own row of
    a (size, 16) float32 zero matrix and all-reduces it with op sum and spec none. Each element of
    the sum is one integer below 2^16 plus zeros: every partial sum is exactly representable in
    float32 whatever the order of additions, so every rank receives every rank's digest exactly.
    Equal digests mean equal bytes (up to a SHA-256 collision).
    """
    digest = np.frombuffer(hashlib.sha256(bytes(data)).digest(), dtype=np.uint16)
    table = np.zeros((comm.size, digest.size), dtype=np.float32)
    table[comm.rank] = digest.astype(np.float32)
    comm.allreduce(table, "test.gather_digests", "none", op="sum")
    return [bytes(row.astype(np.uint16).tobytes()) for row in table]


@pytest.fixture
def digests():
    return gather_digests
