#!/usr/bin/env python3
"""Digests of every codec x algorithm's all-reduce and reduce-scatter results on fixed inputs: run
it under mpirun with two builds (PYTHONPATH=<build>/python) and compare the outputs to show that a
refactor changed no byte (scripts/prove_refactor.py does so for ranks 1 to 4).

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=build/python \\
        mpirun -np 4 --oversubscribe /usr/bin/python3 scripts/result_digests.py > new.txt

Rank 0 prints one line per (collective, spec, op, call): the SHA-256 of the result bytes on every
rank (they must agree for an all-reduce; a reduce-scatter's differ, each rank holding its shard),
of each rank's residuals after the call, the algorithm the stats name and the bytes rank 0 sent,
or the error a spec gets. Three calls per spec, so error feedback's residuals, warm-up and ramps
take part. The specs cover every codec, the pipelined segments, the dense fallback, warm-up and
the top-k ramp; the algorithms every row of algo=.
"""
import hashlib

import numpy as np

import gradzip

CODECS = ["none", "fp16", "bf16", "qsgd:bits=4", "qsgd:bits=2,ef=on", "sign", "sign:ef=off",
          "topk:ratio=0.01", "topk:ratio=0.05,approx=on", "topk:ratio=0.01,values=fp16",
          "randk:ratio=0.05", "terngrad", "qsgd:bits=8,segment=4096", "fp16:segment=0",
          "topk:ratio=0.01,ramp=2", "sign:warmup=1", "topk:ratio=0.02,fallback=dense"]
ALGORITHMS = ["auto", "ring", "sra", "sparse", "rhd", "tree", "hier,ranks_per_node=1"]


def digest(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


def main():
    comm = gradzip.Communicator(transport="mpi", link_latency_us=20, link_gbps=10)
    # fallback=dense compares the model's predictions of the dense and the compressed path, which
    # read the encode rate measured at run time: on the link above the two are close enough at some
    # rank counts for two runs of the same code to choose differently. Its specs run on links where
    # the choice is decisive instead: one where the dense path surely wins (the fallback, with the
    # residual added, is digested) and one where the compressed path does.
    fallback_links = [("fast link", gradzip.Communicator(transport="mpi", link_latency_us=1,
                                                         link_gbps=10000)),
                      ("slow link", gradzip.Communicator(transport="mpi", link_latency_us=1000,
                                                         link_gbps=0.01))]
    rank, size = comm.rank, comm.size
    lines = []
    for codec in CODECS:
        targets = fallback_links if "fallback=dense" in codec else [("", comm)]
        for algorithm in ALGORITHMS:
            if codec.startswith("randk") and algorithm not in ("auto", "ring", "sra"):
                continue
            spec = f"{codec},algo={algorithm},min_bytes=0" if ":" in codec else \
                f"{codec}:algo={algorithm},min_bytes=0"
            for label, target in targets:
                for op in ("sum", "average"):
                    name = f"digest.{spec}.{op}"
                    for call in range(3):
                        x = np.random.default_rng(1000 * rank + call).standard_normal(50_021).astype(np.float32)
                        results, residuals, outcome = digested_call(
                            target, target.allreduce, x, name, spec, op, call, lambda: x)
                        where = f" ({label})" if label else ""
                        lines.append(f"{spec}{where} {op} call {call}: result {sorted(set(results))} "
                                     f"residuals {residuals} {outcome}")
    for codec in CODECS:
        spec = f"{codec},min_bytes=0" if ":" in codec else f"{codec}:min_bytes=0"
        for op in ("sum", "average"):
            name = f"digest.reduce_scatter.{spec}.{op}"
            for call in range(3):
                x = np.random.default_rng(7000 + 1000 * rank + call).standard_normal(50_021).astype(np.float32)
                shards, residuals, outcome = digested_call(
                    comm, comm.reduce_scatter, x, name, spec, op, call,
                    lambda: x[comm.shard_begin(x.size, rank):comm.shard_begin(x.size, rank + 1)])
                lines.append(f"reduce_scatter {spec} {op} call {call}: shards {shards} "
                             f"residuals {residuals} {outcome}")
    if rank == 0:
        print(f"{size} ranks")
        print("\n".join(lines))


def digested_call(comm, collective, x, name, spec, op, call, result_of):
    """Runs collective(x, name, spec, op=op) and returns every rank's digest of result_of() (x
    itself after a failed call), every rank's digest of its residual of `name` ("-": none) and
    what the call did: its algorithm and bytes sent, or the first line of its error."""
    try:
        stats = collective(x, name, spec, op=op)
        outcome = f"{stats['algorithm']} sent {stats['sent_bytes']}"
        result = result_of()
    except gradzip.Error as error:
        outcome = f"error {str(error).splitlines()[0][:80]}"
        result = x
    results = comm_gather_digest(comm, digest(result), f"{name}.{call}")
    residual = comm.residual(name)
    mine = digest(residual) if residual is not None else "-"
    return results, comm_gather_digest(comm, mine, f"{name}.{call}.residual"), outcome


def comm_gather_digest(comm, text, name):
    """Every rank's 16-hex-digit text, gathered with an uncompressed all-reduce (sum of one-hot
    rows of the digit values)."""
    rows = np.zeros((comm.size, 16), dtype=np.float32)
    if text != "-":
        rows[comm.rank] = [int(c, 16) + 1 for c in text]
    flat = rows.reshape(-1)
    comm.allreduce(flat, name + ".gather", "none", op="sum")
    out = []
    for row in flat.reshape(comm.size, 16):
        out.append("-" if row[0] == 0 else "".join("0123456789abcdef"[int(v) - 1] for v in row))
    return out


if __name__ == "__main__":
    main()
