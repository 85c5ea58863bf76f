#!/usr/bin/env bash
# Sign's fused error feedback against the build before it: `gradzip-bench codecs` of both
# builds interleaved (before, after, before, after, ...), 5 rounds, 16M elements, the EF column.
# BEFORE / AFTER: the two gradzip-bench binaries (commit 3d3e63d's and this change's).
set -euo pipefail
out=$(cd "$(dirname "$0")" && pwd)
for round in 1 2 3 4 5; do
  for build in before after; do
    binary=$([ "$build" = before ] && echo "$BEFORE" || echo "$AFTER")
    "$binary" codecs --size 16777216 --repeat 5 --codec sign --codec sign:bucket=64 \
      --codec fp16 --codec bf16 \
      --codec topk:ratio=0.01 --codec qsgd:bits=4 --json "$out/$build-round$round.json" \
      > "$out/$build-round$round.txt"
  done
done
