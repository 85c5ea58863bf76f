"""gradzip's "torch" transport (torch.distributed, gloo) at the running rank count.

Runs under mpirun (the process_group fixture then initialises torch.distributed over loopback)
and under torchrun: either way a communicator made with transport="torch" moves its bytes over a
gloo group of its own. What it must give: the same exact results as MPI for every algorithm
(including the ones that split the transport: hierarchical), identical bytes on every rank, the
call check's refusal of mismatched calls, deadlines instead of hangs, and a clear error for a
message longer than its receive buffer.
"""
import ctypes
import sys
import time

import numpy as np
import pytest

import gradzip

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from gradzip import _lifecycle, _process_group  # noqa: E402

from test_allreduce import assert_same_on_every_rank, exact_reference, small_ints  # noqa: E402


@pytest.fixture(scope="module")
def over_torch(process_group):
    return gradzip.Communicator(transport="torch")


def test_the_communicator_says_what_it_runs_over(over_torch, rank, size):
    assert over_torch.transport_name == "torch"
    assert over_torch.transport == f"torch.distributed (gloo) rank {rank} of {size}"
    assert (over_torch.rank, over_torch.size) == (rank, size)
    assert over_torch.timeout_s == 600.0  # the default deadline (no GRADZIP_TIMEOUT_S in ctest)
    with pytest.raises(ValueError, match="transport 'nccl'"):
        gradzip.Communicator(transport="nccl")


def test_an_mpi_communicator_takes_only_a_process_group_of_its_rank_count(process_group, rank, size):
    # Over MPI the communicator spans MPI_COMM_WORLD: a process group with the same rank count
    # (the world) is accepted, one with fewer ranks refused on every rank (a rank outside the
    # group sees a size of -1 there, also refused).
    if not gradzip.launched_by_mpi():
        pytest.skip("transport 'mpi' over more than one rank needs an MPI launcher")
    comm = gradzip.Communicator(transport="mpi", process_group=process_group)
    assert (comm.transport_name, comm.size) == ("mpi", size)
    if size > 1:
        fewer = dist.new_group(list(range(size - 1)))
        with pytest.raises(gradzip.Error, match=f"spans {size} rank"):
            gradzip.Communicator(transport="mpi", process_group=fewer)


# Every algorithm, exact with codec none and with fp16 on small integers (see small_ints): the
# hierarchical ones split the transport into node and cross-node groups (ranks_per_node=1: one
# rank per node; 0: nodes by host name, here one node).
@pytest.mark.parametrize("spec", [
    "none:algo=ring", "none:algo=sra", "none:algo=rhd", "none:algo=tree",
    "fp16:algo=ring", "fp16:algo=sra", "fp16:algo=rhd", "fp16:algo=tree",
    "none:algo=hier,ranks_per_node=1", "fp16:algo=hier,ranks_per_node=0",
    "randk:ratio=1,values=fp32", "none"])
@pytest.mark.parametrize("op", ["sum", "average"])
def test_every_algorithm_is_exact_over_torch(over_torch, rank, size, digests, spec, op):
    n = 50_000
    data = small_ints(rank, size, n)
    stats = over_torch.allreduce(data, f"torch.{spec}.{op}", spec, op=op)
    assert_same_on_every_rank(over_torch, digests, data)
    np.testing.assert_array_equal(data, exact_reference(size, n, op))
    if size > 1 and spec != "none":
        assert stats["sent_bytes"] > 0, stats


def test_sparse_allreduce_over_torch_is_the_sum_of_each_ranks_top_k(over_torch, rank, size, digests):
    # Distinct magnitudes per rank (|x| = index + 1, scaled by the rank), so each rank's top k
    # is unique and the sum of what every rank sends is exact.
    n, k = 20_000, 200
    inputs = [((np.arange(n) % 2 * 2 - 1) * (np.arange(n) + 1) * (r + 1)).astype(np.float32)
              for r in range(size)]
    data = inputs[rank].copy()
    over_torch.allreduce(data, "torch.topk", "topk:k=200,algo=sparse,min_bytes=0,ef=off")
    expected = np.zeros(n, dtype=np.float32)
    for x in inputs:
        top = np.argsort(-np.abs(x), kind="stable")[:k]
        expected[top] += x[top]
    assert_same_on_every_rank(over_torch, digests, data)
    np.testing.assert_array_equal(data, expected)


def test_mismatched_calls_fail_on_every_rank_over_torch(over_torch, rank, size):
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    count = 1000 if rank == 0 else 1001
    with pytest.raises(gradzip.Error) as raised:
        over_torch.allreduce(np.ones(count, dtype=np.float32), "torch.mismatch", "none")
    assert "1000" in str(raised.value) and "1001" in str(raised.value), str(raised.value)
    # The communicator goes on: the next matched call is exact.
    data = small_ints(rank, size, 100)
    over_torch.allreduce(data, "torch.after-mismatch", "none")
    np.testing.assert_array_equal(data, exact_reference(size, 100, "sum"))


def test_a_missing_rank_times_out_instead_of_hanging(process_group, rank, size):
    if size == 1:
        pytest.skip("needs a rank to wait for")
    # A communicator of its own (a timeout leaves its transport dead). Rank 0 calls; the others
    # do not, until rank 0 has timed out.
    doomed = gradzip.Communicator(transport="torch", timeout_s=2.0, on_timeout="throw")
    assert doomed.timeout_s == 2.0
    if rank == 0:
        start = time.monotonic()
        with pytest.raises(gradzip.Error) as raised:
            doomed.allreduce(np.ones(10, dtype=np.float32), "torch.alone", "none")
        waited = time.monotonic() - start
        assert raised.value.code == "timeout", str(raised.value)
        assert 1.5 <= waited <= 30, waited
        # Dead afterwards: refused at once, without waiting again.
        start = time.monotonic()
        with pytest.raises(gradzip.Error, match="timed out"):
            doomed.allreduce(np.ones(10, dtype=np.float32), "torch.alone.again", "none")
        assert time.monotonic() - start < 1.0
    dist.barrier()


def test_engine_refuses_a_message_longer_than_its_receive_buffer(process_group, rank, size):
    if size == 1:
        pytest.skip("needs a peer")
    engine = _process_group.ProcessGroupEngine.over_group(None, 30.0)
    if rank == 0:
        long_message = bytearray(range(100))
        engine.wait(engine.isend(1, 7, memoryview(long_message)), 30.0)
        fitting = bytearray(b"fits")
        engine.wait(engine.isend(1, 7, memoryview(fitting)), 30.0)
    elif rank == 1:
        short = bytearray(50)
        handle = engine.irecv(0, 7, memoryview(short))
        with pytest.raises(_process_group.MessageTooLong, match="100 bytes from rank 0"):
            engine.wait(handle, 30.0)
        assert short == bytearray(50), "nothing may be written into a buffer too short"
        # The stream stays in step: the next message of the same tag arrives whole.
        buffer = bytearray(16)
        assert engine.wait(engine.irecv(0, 7, memoryview(buffer)), 30.0) == 4
        assert bytes(buffer[:4]) == b"fits"
    engine.barrier(30.0)


def test_engine_matches_receives_in_posting_order_whatever_the_wait_order(process_group, rank, size):
    if size == 1:
        pytest.skip("needs a peer")
    engine = _process_group.ProcessGroupEngine.over_group(None, 30.0)
    if rank == 0:
        sends = [engine.isend(1, 3, memoryview(bytearray([i]) * (i + 1))) for i in range(4)]
        for handle in reversed(sends):  # a send's wait never waits for the receiver
            engine.wait(handle, 30.0)
    elif rank == 1:
        buffers = [bytearray(8) for _ in range(4)]
        handles = [engine.irecv(0, 3, memoryview(b)) for b in buffers]
        sizes = [engine.wait(h, 30.0) for h in reversed(handles)]
        assert sizes == [4, 3, 2, 1]
        for i, buffer in enumerate(buffers):
            assert bytes(buffer[:i + 1]) == bytes([i]) * (i + 1)
    engine.barrier(30.0)


def test_finished_works_keep_the_last_capacity_works_and_outlive_exit():
    held = _lifecycle.FinishedWorks(capacity=4)
    works = [object() for _ in range(6)]
    for i, work in enumerate(works):
        held.keep(work, f"tensor {i}")
    assert len(held) == 4
    assert [entry[0] for entry in held._ring] == works[2:], "the oldest leave first"
    assert held._ring[-1][1] == ("tensor 5",)
    before = sys.getrefcount(held._ring)
    _lifecycle.leak_finished_works()  # what interpreter exit does after stopping the workers
    after = sys.getrefcount(held._ring)  # outside the assert: pytest's rewrite holds one more
    assert after == before + 1, "the ring must get one reference that is never released"


def test_engine_keeps_its_finished_works_referenced(process_group, rank, size):
    # gloo's thread must never hold the last reference to a finished work (see
    # _lifecycle.FinishedWorks): each finished collective, receive and send stays in the ring.
    engine = _process_group.ProcessGroupEngine.over_group(None, 30.0)
    data = bytearray(np.arange(4, dtype=np.float32).tobytes())
    engine.allreduce_f32_sum(memoryview(data), 30.0)
    assert np.frombuffer(data, dtype=np.float32).tolist() == [size * v for v in range(4)]
    work, tensors = engine._finished._ring[-1]
    assert tensors[0].numel() == 4 and tensors[0].dtype == torch.float32
    for _ in range(70):
        engine.barrier(30.0)
    assert len(engine._finished) == 64, "bounded: the oldest works leave the ring"
    if size > 1:
        peer = (rank + 1) % size
        source = (rank - 1) % size
        received = bytearray(8)
        handle = engine.irecv(source, 5, memoryview(received))
        engine.wait(engine.isend(peer, 5, memoryview(bytearray(b"abc"))), 30.0)
        assert engine.wait(handle, 30.0) == 3 and bytes(received[:3]) == b"abc"
        address = ctypes.addressof((ctypes.c_char * len(received)).from_buffer(received))
        kept = [t[0] for _, t in engine._finished._ring if t]
        assert any(t.data_ptr() == address and t.numel() == 3 for t in kept), \
            "the data receive (a tensor over the caller's buffer) stays referenced"
    engine.barrier(30.0)
