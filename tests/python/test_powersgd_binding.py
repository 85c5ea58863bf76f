"""gradzip.Communicator.powersgd_allreduce (the binding the DDP hook's powersgd spec uses).

Rank r holds (r + 1) * u v^T: every rank's matrix is a multiple of one rank-1 matrix, so their
average is (P + 1) / 2 * u v^T, also rank 1, and PowerSGD of any rank >= 1 recovers it up to f32
rounding (P = M Q spans u; the second column of P projects to zero and is dropped; P P^T M = M).
"""
import numpy as np
import pytest

import gradzip

U = 2.0 ** -24  # f32 unit roundoff
ROWS, COLS, OFFSET, TAIL = 8, 5, 3, 4  # the matrix sits between untouched elements


def rank_one(r):
    u = np.arange(1, ROWS + 1, dtype=np.float64)
    v = np.array([1.0, -2.0, 0.5, 3.0, -1.0])
    return (r + 1) * np.outer(u, v)


def test_rank_one_average_is_recovered(comm, rank, size, digests):
    data = np.full(OFFSET + ROWS * COLS + TAIL, 7.0, dtype=np.float32)
    data[OFFSET:OFFSET + ROWS * COLS] = rank_one(rank).astype(np.float32).ravel()
    stats = comm.powersgd_allreduce(data, "psgd.rank_one", "powersgd:rank=2",
                                    [("psgd.rank_one.m", OFFSET, ROWS, COLS)], 0)
    expected = sum(rank_one(r) for r in range(size)) / size
    result = data[OFFSET:OFFSET + ROWS * COLS].reshape(ROWS, COLS).astype(np.float64)
    # Each value passes through three products of length <= max(ROWS, COLS), a normalisation and
    # two averages, each with relative error below (length + 2) U: 8 (ROWS + COLS) U is a bound.
    bound = 8 * (ROWS + COLS) * U * np.abs(expected).max()
    assert np.abs(result - expected).max() <= bound
    assert (data[:OFFSET] == 7.0).all() and (data[OFFSET + ROWS * COLS:] == 7.0).all()
    assert stats["algorithm"] == "powersgd"
    assert stats["count"] == ROWS * COLS
    assert stats["encoded_message_bytes"] == 4 * 2 * (ROWS + COLS)  # R = 2 columns of P and Q
    assert_same = digests(comm, data.tobytes())
    assert all(row == assert_same[0] for row in assert_same)


def test_matrix_outside_the_tensor_fails_on_every_rank(comm, rank):
    data = np.zeros(ROWS * COLS, dtype=np.float32)
    offset = 1 if rank == 0 else 0  # rank 0's matrix overruns the tensor by one element
    with pytest.raises(gradzip.Error) as caught:
        comm.powersgd_allreduce(data, "psgd.outside", "powersgd:rank=2",
                                [("psgd.outside.m", offset, ROWS, COLS)], 0)
    if rank == 0:
        assert "lies outside the tensor" in str(caught.value)


def test_float16_is_refused(comm):
    with pytest.raises(TypeError, match="float32 CPU tensor"):
        comm.powersgd_allreduce(np.zeros(4, dtype=np.float16), "psgd.f16", "powersgd:rank=1",
                                [("psgd.f16.m", 0, 2, 2)], 0)
