#!/usr/bin/env bash
# Regenerates the generated tables of docs/results.md from fresh runs: every suite of
# benchmarks/reproduce.py (its docstring lists them and what each runs), raw data written to
# docs/data/reproduce/<suite>.json, then benchmarks/render_results.py renders the tables.
#
#   bash benchmarks/reproduce.sh [--quick] [--only SUITE,...] [--rounds N] [--build DIR]
#                                [--data DIR]
#
# Needs a Release build (build/bin/gradzip-bench: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
# && cmake --build build) and root for the emulated-cluster suites (network namespaces).
# --quick: smaller sizes and 3 rounds, about 3 minutes here; the full run (about 40 minutes) is
# what is committed.
# Run nothing else on the machine meanwhile: the figures are wall-clock times.
set -euo pipefail
root_dir="$(cd "$(dirname "$0")/.." && pwd)"
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
exec "${PYTHON:-python3}" "$root_dir/benchmarks/reproduce.py" "$@"
