#!/usr/bin/env bash
# A fused error-feedback encode against the build before it: `gradzip-bench codecs` of both
# builds interleaved (before, after, before, after, ...), 5 rounds, 16M elements, the EF column.
# BEFORE / AFTER: the two gradzip-bench binaries; OUT: the directory for the JSON and text of
# every run; CODECS: the specs (default: the sign / casts comparison of 2026-12-03).
#   BEFORE=/tmp/bench-before AFTER=/tmp/bench-after OUT=docs/data/X bash benchmarks/fused_ef_compare.sh
set -euo pipefail
out=${OUT:?OUT: the directory for the results}
mkdir -p "$out"
read -r -a codecs <<< "${CODECS:-sign sign:bucket=64 fp16 bf16 topk:ratio=0.01 qsgd:bits=4}"
codec_args=()
for codec in "${codecs[@]}"; do codec_args+=(--codec "$codec"); done
for round in 1 2 3 4 5; do
  for build in before after; do
    binary=$([ "$build" = before ] && echo "$BEFORE" || echo "$AFTER")
    "$binary" codecs --size 16777216 --repeat 5 "${codec_args[@]}" \
      --json "$out/$build-round$round.json" > "$out/$build-round$round.txt"
  done
done
