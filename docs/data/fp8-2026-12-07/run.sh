#!/usr/bin/env bash
# The fp8 codec beside the casts and 8-bit qsgd, measured in one run on this machine:
#   codecs/round<R>.json       gradzip-bench codecs, 4 Mi f32 elements, 5 rounds
#                              (with its memcpy baseline of the same run)
#   allreduce/round<R>.json    gradzip-bench allreduce --check, 4 ranks over loopback, 5 rounds
#   convergence/<label>_s<S>.csv  train_fashion_mnist, 4 ranks, 5 epochs, seeds 1-3 (the
#                              configurations of benchmarks/convergence.sh, plus fp8)
# then summary.py writes summary.md from these files. Configurations alternate within each
# round, so drift on the shared machine falls on all of them.
#
#   bash docs/data/fp8-2026-12-07/run.sh [BUILD] [all|bench|convergence]
#     BUILD: a build tree (default build); the second argument runs one stage (default all).
#     Each stage writes the commit it measured to commit-<stage>.txt.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
build="${1:-$root/build}"
stage="${2:-all}"
case "$stage" in all|bench|convergence) ;; *) echo "run.sh: stage is all, bench or convergence" >&2; exit 2 ;; esac
bench="$build/bin/gradzip-bench"
train="$build/bin/train_fashion_mnist"
data="${GRADZIP_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}"
[[ -x "$bench" && -x "$train" ]] || { echo "run.sh: build gradzip-bench and train_fashion_mnist in $build first" >&2; exit 2; }
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mpi=(mpirun -np 4 --oversubscribe --bind-to none)
codecs=(none fp16 bf16 qsgd:bits=8 fp8 fp8:format=e5m2)
mkdir -p "$here/codecs" "$here/allreduce" "$here/convergence" "$here/logs"

if [[ $stage != convergence ]]; then
git -C "$root" rev-parse HEAD > "$here/commit-bench.txt"
for round in 1 2 3 4 5; do
  args=()
  # Alternate the order between rounds.
  if ((round % 2)); then order=("${codecs[@]}"); else order=(); for ((i=${#codecs[@]}-1; i>=0; i--)); do order+=("${codecs[i]}"); done; fi
  for c in "${order[@]}"; do args+=(--codec "$c"); done
  "$bench" codecs --size 4194304 "${args[@]}" --json "$here/codecs/round$round.json" > "$here/logs/codecs$round.log"
  "${mpi[@]}" "$bench" allreduce --size 65536 --size 4194304 "${args[@]}" --check \
    --json "$here/allreduce/round$round.json" > "$here/logs/allreduce$round.log"
  echo "round $round of 5 done"
done
fi

if [[ $stage != bench ]]; then
git -C "$root" rev-parse HEAD > "$here/commit-convergence.txt"
declare -A spec_of=([none]=none [fp16]=fp16 [bf16]=bf16 [qsgd8]=qsgd:bits=8 [fp8]=fp8 [fp8_e5m2]=fp8:format=e5m2)
for seed in 1 2 3; do
  for label in none fp16 bf16 qsgd8 fp8 fp8_e5m2; do
    "${mpi[@]}" "$train" --data "$data" --spec "${spec_of[$label]}" --label "$label" --epochs 5 \
      --seed "$seed" --momentum-correction off --csv "$here/convergence/${label}_s$seed.csv" \
      > "$here/logs/train_${label}_s$seed.log" 2>&1
    echo "convergence $label seed $seed: $(tail -n 1 "$here/convergence/${label}_s$seed.csv")"
  done
done
fi
python3 "$here/summary.py"
