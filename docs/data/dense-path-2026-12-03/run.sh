#!/usr/bin/env bash
# MPI_Allreduce against MPI_Iallreduce + MPI_Wait (what MpiTransport::allreduce_f32_sum runs), 4
# ranks on shared memory, Open MPI's default libnbc algorithm choice against its ring
# (coll_libnbc_iallreduce_algorithm=1), interleaved, 5 rounds. Each line: best of 6 x 4 calls.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mpicc -O2 "$here/allreduce_probe.c" -o /tmp/allreduce_probe
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for round in 1 2 3 4 5; do
  for n in 262144 2359296 16777216; do
    for alg in 0 1; do
      echo -n "round $round libnbc_algorithm $alg "
      mpirun -np 4 --oversubscribe --bind-to none --mca coll_libnbc_iallreduce_algorithm $alg \
        /tmp/allreduce_probe $n
    done
  done
done
