"""gradzip.Communicator.allreduce and gradzip.Codec from Python, at the running rank count.

Inputs are deterministic functions of (rank, index), so every rank computes every rank's input
and the exact sum locally. Integer-valued inputs keep the reference sums exact in float32.
"""
import math
import os
import tempfile

import numpy as np
import pytest

import gradzip

U = 2.0 ** -24  # f32 unit roundoff


def small_ints(r, p, n):
    """Rank r's input for the exact tests: P * (integer in [-7, 7]), so that every partial sum,
    every x/P and the average (an integer) are exact in f32, and |sum| <= 7 P^2 is exact in f16
    (< 2048) and bf16 (<= 256 for P <= 6)."""
    i = np.arange(n, dtype=np.int64)
    return (p * (((i * 7 + r * 13) % 15) - 7)).astype(np.float32)


def exact_reference(p, n, op):
    total = sum(small_ints(r, p, n) for r in range(p))
    return total / p if op == "average" else total  # both exact: see small_ints


def assert_same_on_every_rank(comm, digests, array):
    rows = digests(comm, np.ascontiguousarray(array).tobytes())
    assert all(row == rows[0] for row in rows), "ranks ended the collective with different bytes"


@pytest.mark.parametrize("op", ["sum", "average"])
# 40 000 elements: past min_bytes, one of algo=auto's exact algorithms for codec none (the cost
# model picks among ring, SRA, halving/doubling and the tree)
@pytest.mark.parametrize("n", [0, 1, 1000, 40_000])
def test_none_numpy_f32_is_exact(comm, rank, size, digests, op, n):
    data = small_ints(rank, size, n)
    stats = comm.allreduce(data, f"np.none.{op}.{n}", "none", op=op)
    assert_same_on_every_rank(comm, digests, data)
    np.testing.assert_array_equal(data, exact_reference(size, n, op))
    assert stats["count"] == n and stats["ranks"] == size
    if 4 * n < 65536:
        assert stats["algorithm"] == "mpi"
    else:
        assert stats["algorithm"] in ("ring", "sra", "rhd", "tree"), stats


@pytest.mark.parametrize("op", ["sum", "average"])
def test_none_numpy_f16_is_exact(comm, rank, size, digests, op):
    n = 33_000
    data = small_ints(rank, size, n).astype(np.float16)
    comm.allreduce(data, f"np16.none.{op}", "none", op=op)
    assert_same_on_every_rank(comm, digests, data)
    np.testing.assert_array_equal(data, exact_reference(size, n, op).astype(np.float16))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "average"])
def test_none_torch_is_exact(comm, rank, size, digests, dtype, op):
    torch = pytest.importorskip("torch")
    n = 20_000
    kind = getattr(torch, dtype)
    tensor = torch.from_numpy(small_ints(rank, size, n)).to(kind)
    comm.allreduce(tensor, f"torch.none.{dtype}.{op}", "none", op=op)
    assert_same_on_every_rank(comm, digests, tensor.view(torch.int16 if dtype != "float32" else torch.int32).numpy())
    expected = torch.from_numpy(exact_reference(size, n, op)).to(kind)
    assert torch.equal(tensor, expected)


def lossy_input(r, n):
    """Rank r's input for the lossy codecs: a permutation of 1..n with random signs (distinct
    magnitudes, so top-k's choice is unique; integers < 2^24, so sums are exact)."""
    rng = np.random.default_rng(1000 + r)
    return (rng.permutation(n) + 1).astype(np.float32) * rng.choice([-1.0, 1.0], n).astype(np.float32)


def averaged(comm, rank, size, digests, inputs, name, spec):
    """Averages inputs[rank] over the ranks with `spec`, checks that every rank holds the same
    bytes, and returns (result, exact average, A = sum_r |x_r / P|, M = max_r |x_r| / P)."""
    data = inputs[rank].copy()
    comm.allreduce(data, name, spec, op="average")
    assert_same_on_every_rank(comm, digests, data)
    exact = sum(x.astype(np.float64) / size for x in inputs)
    a = sum(np.abs(x.astype(np.float64)) / size for x in inputs)
    m = max(np.max(np.abs(x)) for x in inputs) / size
    return data, exact, a, m


def test_fp16_average_within_derived_bound(comm, rank, size, digests):
    # Ring with fp16 (docs/algorithms.md): per element |err| <= P * 2^-11 * A_i (first order)
    # with A_i = sum_r |x_r,i / P| (the average divides before it encodes); we allow (P + 1)
    # roundings plus P - 1 f32 adds, and 2^-25 per rounding for f16's subnormal range.
    n = 50_000
    inputs = [lossy_input(r, n) / 1000 for r in range(size)]
    data, exact, a, _ = averaged(comm, rank, size, digests, inputs, "np.fp16", "fp16:algo=ring")
    bound = (size + 1) * 2.0 ** -11 * a * 1.01 + (size - 1) * U * a + (size + 1) * 2.0 ** -25
    err = np.abs(data - exact)
    assert np.all(err <= bound), f"max excess {np.max(err - bound)}"
    assert np.max(err) > 0  # fp16 did round (the test would otherwise prove nothing)


def test_qsgd_average_within_derived_bound(comm, rank, size, digests):
    # SRA with qsgd:bits=8 (s = 127), M and A of the divided contributions x_r / P: the P worker
    # compressions err by <= scale/s <= M/s each; the owner's compression of the sum errs by
    # <= (its bucket's max |sum|)/s <= (max_j A_j + P*M/s)/s (docs/algorithms.md's Â_i: qsgd's
    # scale is its 512-element bucket's max, not the element's own value).
    # Plus P - 1 f32 adds (u * A each, at most).
    n = 50_000
    s = 127.0
    inputs = [lossy_input(r, n) for r in range(size)]
    data, exact, a, m = averaged(comm, rank, size, digests, inputs, "np.qsgd", "qsgd:bits=8,algo=sra")
    bound = (size * m / s + (np.max(a) + size * m / s) / s) * 1.001 + size * U * (np.max(a) + m)
    err = np.abs(data - exact)
    assert np.all(err <= bound), f"max excess {np.max(err - bound)}"


def test_topk_ef_is_the_exact_sum_of_each_ranks_top_k(comm, rank, size, digests):
    # Sparse all-reduce: the result is sum_r D(C(x_r)), exact here (distinct integer magnitudes:
    # each rank's top k is unique; the kept values are integers, their sums exact). With ef=on the
    # residual is x_r minus what was sent; a second call on zeros sends the top k of the residual.
    n = 30_000
    k = math.ceil(0.01 * n)
    inputs = [lossy_input(r, n) for r in range(size)]

    def top_k(x):
        kept = np.zeros_like(x)
        index = np.argsort(-np.abs(x), kind="stable")[:k]
        kept[index] = x[index]
        return kept

    name = "np.topk.ef"
    data = inputs[rank].copy()
    comm.allreduce(data, name, "topk:ratio=0.01,ef=on,algo=sparse", op="sum")
    first = data.copy()
    residual_after_first = comm.residual(name)
    data = np.zeros(n, dtype=np.float32)
    comm.allreduce(data, name, "topk:ratio=0.01,ef=on,algo=sparse", op="sum")
    second = data.copy()
    assert_same_on_every_rank(comm, digests, np.concatenate([first, second]))

    np.testing.assert_array_equal(first, sum(top_k(x) for x in inputs))
    mine = inputs[rank]
    np.testing.assert_array_equal(residual_after_first, mine - top_k(mine))
    np.testing.assert_array_equal(second, sum(top_k(x - top_k(x)) for x in inputs))
    assert name in comm.residual_names()


def test_sign_average_within_derived_bound(comm, rank, size, digests):
    # SRA with sign (ef on): |err| <= 2 P M + 2 Y, Y = A_i + 2 P M (ε(Y) <= 2Y per compression),
    # M and A_i of the divided contributions.
    n = 40_000
    inputs = [lossy_input(r, n) for r in range(size)]
    data, exact, a, m = averaged(comm, rank, size, digests, inputs, "np.sign", "sign:algo=sra")
    bound = (2 * size * m + 2 * (a + 2 * size * m)) * 1.001
    assert np.all(np.abs(data - exact) <= bound)
    assert np.all(np.isfinite(data))
    # That bound is above |exact|: an all-zero result would meet it. The cosine floor does not
    # (compressors/codec_descriptor.h, allreduce_cosine_floor): sign decodes each 512-element
    # bucket to +-mean|x|, so one compression of x has cosine c = sqrt(sum_b 512 m_b^2) / |x|
    # (about sqrt(3)/2 for these uniform magnitudes); SRA encodes an element twice, and the
    # floor is c^2 / sqrt(2) / 2.
    floor = 0.5 * min(sign_cosine(x) for x in inputs) ** 2 / math.sqrt(2)
    norms = np.linalg.norm(data) * np.linalg.norm(exact)
    cosine = np.dot(data, exact) / norms if norms > 0 else 0.0  # a zero vector: no direction
    assert cosine >= floor > 0.25, (cosine, floor)


def sign_cosine(x, bucket=512):
    """cos(D(E(x)), x) of one sign compression: each bucket decodes to +-mean|x|."""
    x = x.astype(np.float64)
    kept = sum(np.sum(np.abs(x[b:b + bucket])) ** 2 / len(x[b:b + bucket])
               for b in range(0, len(x), bucket))
    return math.sqrt(kept / np.dot(x, x))


# ---- bad input -----------------------------------------------------------------------------------

def test_bad_inputs_raise_before_any_communication(comm):
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="non-contiguous"):
        comm.allreduce(torch.zeros(64, 64)[:, ::2], "bad", "none")
    with pytest.raises(ValueError, match="C-contiguous"):
        comm.allreduce(np.zeros((64, 64), dtype=np.float32)[:, ::2], "bad", "none")
    with pytest.raises(TypeError, match="torch.int32"):
        comm.allreduce(torch.zeros(16, dtype=torch.int32), "bad", "none")
    with pytest.raises(TypeError, match="element format"):
        comm.allreduce(np.zeros(16, dtype=np.float64), "bad", "none")
    with pytest.raises(TypeError, match="list"):
        comm.allreduce([1.0, 2.0], "bad", "none")
    with pytest.raises(gradzip.Error) as raised:
        comm.allreduce(np.zeros(16, dtype=np.float32), "bad", "nosuchcodec")
    assert raised.value.code == "invalid_spec"
    assert isinstance(raised.value, RuntimeError)
    with pytest.raises(gradzip.Error) as raised:
        gradzip.parse_spec("topk:ratio=2")
    assert raised.value.code == "invalid_spec"


# ---- Codec ---------------------------------------------------------------------------------------

def test_codec_none_round_trip_is_exact():
    x = lossy_input(0, 10_001) / 7
    codec = gradzip.Codec("none")
    message = codec.encode(x)
    assert len(message) == codec.max_encoded_bytes(x.size) == 32 + 4 * x.size
    out = np.empty_like(x)
    codec.decode(message, out)
    np.testing.assert_array_equal(out, x)
    acc = np.ones_like(x)
    codec.decode_add(message, acc)
    np.testing.assert_array_equal(acc, x + np.float32(1))


def test_codec_qsgd_round_trip_within_bound():
    # One compression: |err| <= scale / s per element, scale = max |x| of its bucket (512), s = 127.
    n, bucket, s = 10_001, 512, 127.0
    x = lossy_input(1, n) / 3
    codec = gradzip.Codec("qsgd:bits=8,bucket=512")
    message = codec.encode(x, seed=5, step=2, tensor_id=9)
    assert len(message) == 32 + 4 * math.ceil(n / bucket) + n  # e(m) for b = 8
    out = np.empty_like(x)
    codec.decode(message, out)
    scales = np.repeat([np.max(np.abs(x[i:i + bucket])) for i in range(0, n, bucket)], bucket)[:n]
    err = np.abs(out.astype(np.float64) - x)
    assert np.all(err <= scales / s * (1 + 1e-6))
    assert np.max(err) > 0
    again = np.empty_like(x)
    codec.decode(codec.encode(x, seed=5, step=2, tensor_id=9), again)
    np.testing.assert_array_equal(again, out)  # same key, same random stream


# ---- residual checkpoints ------------------------------------------------------------------------

def test_save_and_load_residuals_round_trip(comm, rank, size):
    n = 30_000
    name = "np.topk.checkpoint"
    data = lossy_input(rank, n)
    comm.allreduce(data, name, "topk:ratio=0.01,ef=on,algo=sparse", op="average")
    saved = comm.residual(name)
    assert saved is not None and np.count_nonzero(saved) > 0
    with tempfile.TemporaryDirectory(prefix=f"gradzip-rank{rank}-") as folder:
        path = os.path.join(folder, f"residuals.rank{rank}.of{size}.bin")
        comm.save_residuals(path)
        assert os.path.getsize(path) > 4 * n
        comm.set_residual(name, np.zeros(n, dtype=np.float32))
        assert np.count_nonzero(comm.residual(name)) == 0
        comm.load_residuals(path)
    np.testing.assert_array_equal(comm.residual(name), saved)
    assert comm.residual("no.such.residual") is None


def test_given_link_drives_algo_auto(rank, size):
    # A latency-bound link (200 us start-ups, 100 Gbit/s): for 4096 qsgd elements the tree's
    # 2 log2 P start-ups beat SRA's collectives by far; a slow one (0.01 Gbit/s): SRA's few bytes
    # beat the tree's f32 vectors. stats["note"] gives the model's times and the link.
    if size < 2:
        pytest.skip("one rank has no link")
    fast = gradzip.Communicator(link_latency_us=200, link_gbps=100)
    slow = gradzip.Communicator(link_latency_us=1, link_gbps=0.01)
    data = lossy_input(rank, 4096)
    got_fast = fast.allreduce(data.copy(), "link.fast", "qsgd:bits=4,min_bytes=0")
    got_slow = slow.allreduce(data.copy(), "link.slow", "qsgd:bits=4,min_bytes=0")
    assert got_fast["algorithm"] == "tree", got_fast["note"]
    assert got_slow["algorithm"] == "sra", got_slow["note"]
    assert "(link 0.2 ms, " in got_fast["note"], got_fast["note"]
    with pytest.raises(gradzip.Error, match="link_gbps"):
        gradzip.Communicator(link_latency_us=5)


def test_fallback_dense_sends_dense_on_a_fast_link_and_compresses_on_a_slow_one(rank, size):
    # fallback=dense: on a link the model is told is very fast (400 Gbit/s) encoding sign with
    # error feedback costs more than sending f32, so the tensor goes through the transport's
    # sum (exact for these integers: the first call has no residual yet); on 0.01 Gbit/s sign's
    # 1/32 of the bytes wins and the tensor compresses. stats say which ran and why.
    if size < 2:
        pytest.skip("one rank has no link: the model, and so the fallback, is not used")
    n = 40_000
    fast = gradzip.Communicator(link_latency_us=1, link_gbps=400)
    data = small_ints(rank, size, n)
    stats = fast.allreduce(data, "fallback.fast", "sign:fallback=dense,min_bytes=0")
    assert stats["fallback"] is True, stats["note"]
    assert stats["algorithm"] == "mpi"
    assert "fallback=dense: dense " in stats["note"], stats["note"]
    np.testing.assert_array_equal(data, exact_reference(size, n, "sum"))
    slow = gradzip.Communicator(link_latency_us=1, link_gbps=0.01)
    data = small_ints(rank, size, n)
    stats = slow.allreduce(data, "fallback.slow", "sign:fallback=dense,min_bytes=0")
    assert stats["fallback"] is False, stats["note"]
    assert stats["algorithm"] != "mpi", stats["note"]
    assert ", dense " in stats["note"], stats["note"]
    assert stats["sent_bytes"] < 4 * n


def test_released_residuals_are_said_and_the_window_is_settable(capfd, rank, size):
    # A name's residual released after a window of calls without it is said on stderr (once);
    # release_unused_after_calls=0 keeps it however many other calls come.
    # The algorithm is pinned: algo=auto may pick the tree on a slow measured link, whose
    # residual on the root has another name and which keeps none on the other ranks.
    transport = "torch" if gradzip.choose_transport() == "torch" else "mpi"
    for window, released in ((2, True), (0, False)):
        comm = gradzip.Communicator(transport=transport, release_unused_after_calls=window)
        comm.allreduce(small_ints(rank, size, 40_000), "np.release.kept",
                       "topk:ratio=0.01,ef=on,algo=sparse,min_bytes=0")
        assert "np.release.kept" in comm.residual_names()
        capfd.readouterr()
        for _ in range(5):
            comm.allreduce(small_ints(rank, size, 8), "np.release.metric", "none")
        err = capfd.readouterr().err
        assert ("np.release.kept" not in comm.residual_names()) == released
        assert ("warning: released the error-feedback residuals of 'np.release.kept'" in err) == released, err
