#!/bin/bash
# The codec-descriptor change, old build (094caf4) against new, interleaved: ten rounds of
# gradzip-bench codecs (4 Mi elements, one process) and of gradzip-bench allreduce (4 ranks,
# shared memory, 64 KiB and 4 MiB), then ten rounds of TernGrad against qsgd:bits=2 in the new build.
# Usage: run_bench.sh OLD_GRADZIP_BENCH NEW_GRADZIP_BENCH OUT_DIR
set -u
old=$1 new=$2 out=$3
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
codecs=(--codec none --codec fp16 --codec qsgd:bits=4 --codec qsgd:bits=2 --codec sign
        --codec topk:ratio=0.01 --codec randk:ratio=0.01)
for round in $(seq 1 10); do
  for version in old new; do
    if [ "$version" = old ]; then bench=$old; else bench=$new; fi
    "$bench" codecs --size 4194304 "${codecs[@]}" --json "$out/codecs-$version-$round.json" > /dev/null
    mpirun -np 4 --oversubscribe --bind-to none "$bench" allreduce --size 65536 --size 4194304 \
      --iters 20 --json "$out/allreduce-$version-$round.json" > /dev/null
  done
done
for round in $(seq 1 10); do
  "$new" codecs --size 4194304 --codec terngrad --codec qsgd:bits=2 \
    --json "$out/terngrad-codecs-$round.json" > /dev/null
  mpirun -np 4 --oversubscribe --bind-to none "$new" allreduce --size 65536 --size 4194304 \
    --codec terngrad:min_bytes=0 --codec qsgd:bits=2,min_bytes=0 --iters 20 \
    --json "$out/terngrad-allreduce-$round.json" > /dev/null
done
