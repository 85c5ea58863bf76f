"""Shared fixtures of gradzip's Python tests.

Run under mpirun, or under torchrun (or tests/python/torchrun_like.py, which starts processes
the same way; see tests/CMakeLists.txt): every rank runs the same tests in the same order, so the
collectives inside them pair up. Without a launcher they run as one rank.

- comm: one gradzip.Communicator for the session: over MPI_COMM_WORLD under mpirun; under
  torchrun over torch.distributed (transport "torch"), after this file has initialised the
  default process group (gloo, env://) from torchrun's variables.
- rank, size: this process's rank and the rank count (from the communicator).
- process_group: torch.distributed's gloo group: under mpirun made here over loopback
  (tcp://127.0.0.1:PORT, PORT from GRADZIP_TEST_PORT so that ctest's parallel runs do not
  collide), under torchrun the default group made for `comm`.
- gather_digests(comm, data): every rank's SHA-256 of `data` on every rank (a cross-rank
  identity check made with gradzip itself, see its comment).
"""
import hashlib
import os

import numpy as np
import pytest

try:
    # torch before gradzip: with a PyTorch from PyPI, gradzip's module loads the CUDA toolkit's
    # NCCL first and torch's CUDA library then fails to load (a known loader clash, tested on
    # its own); the order does not matter for what these tests check.
    import torch  # noqa: F401
except ImportError:
    pass

import gradzip


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "current_torch: needs a current PyTorch (torch.amp.GradScaler on the CPU); "
        "ctest deselects it (-m 'not current_torch') in the runs with Debian's PyTorch 1.13, so "
        "it never shows as passed there without running")


def launched_by_torchrun():
    """Started by torchrun (or torchrun_like.py): WORLD_SIZE set, no MPI launcher."""
    return not gradzip.launched_by_mpi() and "WORLD_SIZE" in os.environ


@pytest.fixture(scope="session")
def comm():
    if launched_by_torchrun():
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="env://")
        communicator = gradzip.Communicator()
        assert communicator.transport_name == "torch", communicator.transport
        yield communicator
        dist.destroy_process_group()
        return
    yield gradzip.Communicator()


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
    if dist.is_initialized():  # torchrun: the group `comm` was made over
        yield dist.group.WORLD
        return
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
