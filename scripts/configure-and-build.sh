#!/usr/bin/env bash
# Configures and builds gradzip into ./build (Release). Extra arguments go to cmake's configure
# step, e.g. -DGRADZIP_WITH_CUDA=OFF. Used by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$(nproc)"
