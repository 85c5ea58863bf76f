#!/usr/bin/env bash
# Regenerates the generated tables of docs/results.md from fresh runs: every suite of
# benchmarks/reproduce.py (its docstring lists them and what each runs), raw data written to
# docs/data/reproduce/<suite>.json, then benchmarks/render_results.py renders the tables.
#
#   bash benchmarks/reproduce.sh [--quick] [--only SUITE,...] [--rounds N] [--build DIR]
#                                [--data DIR]
#
# Needs a Release build (build/bin/gradzip-bench: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
# && cmake --build build), root for the emulated-cluster suites (network namespaces) and, for the
# peers suite, a Python with torch (scripts/install-deps.sh --torch-venv makes one).
# --quick: smaller sizes and 3 rounds, about 6 minutes here; the full run (about 75 minutes) is
# what is committed.
# Run nothing else on the machine meanwhile: the figures are wall-clock times.
set -euo pipefail
root_dir="$(cd "$(dirname "$0")/.." && pwd)"
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Debian's /usr/bin/python3 has python3-matplotlib (scripts/install-deps.sh) for the plots.
if [ -z "${PYTHON:-}" ]; then
  if [ -x /usr/bin/python3 ]; then PYTHON=/usr/bin/python3; else PYTHON=python3; fi
fi
exec "$PYTHON" "$root_dir/benchmarks/reproduce.py" "$@"
