#!/usr/bin/env bash
# Configures and builds gradzip into ./build (Release). Used by demo.sh and test.sh.
#   configure-and-build.sh [--target NAME]... [CMAKE_CONFIGURE_ARGS...]
# --target builds only the named targets (and what they need); without it, everything.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
while (($#)) && [[ $1 == --target ]]; do
  targets+=(--target "${2:?--target needs a name}")
  shift 2
done
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$(nproc)" "${targets[@]}"
