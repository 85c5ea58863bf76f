#!/usr/bin/env bash
# fallback=dense measured: the ResNet-50 demo (build/bin/gradzip-demo, examples/allreduce_demo.cpp)
# with every codec's defaults and with `--options fallback=dense`, interleaved (plain, fallback,
# plain, fallback, ...) for ROUNDS rounds, 4 ranks over shared memory; and, with --cluster, once
# each inside benchmarks/emulated_cluster.sh (4 namespaces, 1 Gbit/s links), where compression
# must keep running. Raw JSON (gradzip-demo --json) and logs go to OUT; then
# benchmarks/fallback_summary.py OUT prints the table docs/results.md shows.
#
#   bash benchmarks/fallback_demo.sh OUT [--rounds N] [--cluster]
#
# Needs a build with gradzip-demo (scripts/configure-and-build.sh --target gradzip-demo) and, for
# --cluster, root. Run nothing else meanwhile: the figures are wall-clock times.
set -euo pipefail
root_dir="$(cd "$(dirname "$0")/.." && pwd)"
out=${1:?usage: fallback_demo.sh OUT [--rounds N] [--cluster]}
shift
rounds=5
cluster=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --cluster) cluster=1; shift ;;
    *) echo "fallback_demo.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
demo="$root_dir/build/bin/gradzip-demo"
[ -x "$demo" ] || { echo "fallback_demo.sh: $demo is missing; build it first" >&2; exit 1; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
{ lscpu | grep -E '^Model name|^CPU\(s\)' ; uname -r; mpirun --version | head -1;
  git -C "$root_dir" rev-parse HEAD; date -u; } > "$out/machine.txt"
for round in $(seq 1 "$rounds"); do
  for config in plain fallback; do
    options=()
    [ "$config" = fallback ] && options=(--options fallback=dense)
    echo "== shared memory, round $round, $config" | tee -a "$out/shm.log"
    mpirun -np 4 --oversubscribe --bind-to none "$demo" "${options[@]}" \
      --json "$out/shm-$config-round$round.json" >> "$out/shm.log" 2>&1
  done
done
if [ "$cluster" = 1 ]; then
  for config in plain fallback; do
    options=()
    [ "$config" = fallback ] && options=(--options fallback=dense)
    echo "== emulated 1 Gbit/s, $config" | tee -a "$out/cluster.log"
    bash "$root_dir/benchmarks/emulated_cluster.sh" --ranks 4 --rate 1gbit --exec -- "$demo" \
      "${options[@]}" --json "$out/cluster-$config.json" >> "$out/cluster.log" 2>&1
  done
fi
echo "raw data in $out"
