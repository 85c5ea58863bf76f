#!/usr/bin/env bash
# Configures and builds gradzip into ./build (Release). Used by demo.sh and test.sh.
#   configure-and-build.sh [--target NAME]... [CMAKE_CONFIGURE_ARGS...]
# --target builds only the named targets (and what they need); without it, everything.
# Compiles through ccache when it is installed (scripts/install-deps.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
while (($#)) && [[ $1 == --target ]]; do
  targets+=(--target "${2:?--target needs a name}")
  shift 2
done
launchers=()
if command -v ccache > /dev/null; then
  # The compiler cache (~/.cache/ccache). Paths under this checkout are hashed relative to it, so
  # a fresh clone elsewhere reuses what an earlier build compiled; ccache checks each result
  # against the preprocessed source and the compiler, so a change is never served stale.
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
  launchers=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
             -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${launchers[@]}" "$@"
cmake --build build -j "$(nproc)" "${targets[@]}"
