#!/usr/bin/env bash
# gradzip's main job, as the README's first quick-start command: install what is needed,
# build, and run the codec benchmark (compression ratio, throughput against memcpy measured in
# the same run, and error of every codec). Becomes a multi-rank all-reduce demo once the
# collectives land.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/configure-and-build.sh
./build/bin/gradzip-bench codecs "$@"
