#!/usr/bin/env bash
# The long bounded-resources run (docs/reliability.md): 10^4 steps of a Reducer and
# of direct Communicator calls whose tensor set changes every 1000 steps, at 4 ranks; every rank
# checks that the communicator's residuals follow the live set and that its resident memory
# does not drift after warm-up (tests/lifecycle/soak_memory.cpp). ctest runs a short version
# (lifecycle.soak_short.np2).
#
#   scripts/soak.sh [--build DIR] [--ranks N] [--steps S] [--change-every C]
#     --build DIR       a configured build folder [build]; soak_memory is built there
#     --ranks N         [4]
#     --steps S         [10000]
#     --change-every C  [1000]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build ranks=4 steps=10000 change_every=1000
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --change-every) change_every="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "soak.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -f "$build/CMakeCache.txt" ]] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build" --target soak_memory -j "$(nproc)" > /dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun --oversubscribe --bind-to none -np "$ranks" "$build/bin/soak_memory" "$steps" "$change_every"
