#!/bin/bash
# Five rounds of gradzip-bench allreduce at 4 ranks, the old and the new build interleaved in
# each round. Usage: run_bench.sh OLD_GRADZIP_BENCH NEW_GRADZIP_BENCH OUT_DIR
set -u
old=$1 new=$2 out=$3
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for round in 1 2 3 4 5; do
  for version in old new; do
    if [ "$version" = old ]; then bench=$old; else bench=$new; fi
    mpirun -np 4 --oversubscribe --bind-to none "$bench" allreduce --size 65536 --size 4194304 \
      --iters 20 --json "$out/allreduce-$version-$round.json" > /dev/null
  done
done
