#!/usr/bin/env bash
# The earlier demo (scripts/demo.sh is the main job now): install what is needed, build,
# and average one step's ResNet-50 gradients (161 tensors, 25.6M parameters) over 4 ranks with
# every codec, next to MPI_Allreduce of the same gradients: compression ratio, error, time and
# speedup (examples/allreduce_demo.cpp). GRADZIP_DEMO_RANKS=N changes the number of ranks
# (default 4).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/configure-and-build.sh --target gradzip-demo
# Open MPI refuses to run as root without these, and 4 ranks on fewer cores without
# --oversubscribe; --bind-to none lets the ranks share the cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np "${GRADZIP_DEMO_RANKS:-4}" --oversubscribe --bind-to none build/bin/gradzip-demo
