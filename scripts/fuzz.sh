#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang (ASan + UBSan + coverage) in their own
# build folder and runs each one for N seconds over a copy of its seed corpus.
#
#   scripts/fuzz.sh [--seconds N] [--build DIR] [--jobs J]
#     --seconds N   run time per target, libFuzzer's -max_total_time [30]
#     --build DIR   build folder [build-fuzz]; crashing inputs are kept in DIR/crashes/<target>/
#     --jobs J      parallel compile jobs [nproc]
#
# Exits non-zero when a target crashes (an abort from the target's own checks, a sanitizer
# report, an uncaught exception, a timeout or an out-of-memory), after running every target.
# A crashing input found here belongs in tests/unit/test_fuzz_regressions.cpp.
# Reproduce one: DIR/bin/fuzz_decode DIR/crashes/fuzz_decode/crash-<sha1>
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

seconds=30
build=build-fuzz
jobs=$(nproc)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: --seconds takes a whole number" >&2; exit 2; }
case "$build" in /*) ;; *) build="$root/$build" ;; esac

CC=${CC:-clang} CXX=${CXX:-clang++}
command -v "$CXX" >/dev/null || { echo "fuzz.sh: $CXX not found (needs clang with libFuzzer)" >&2; exit 2; }

start=$(date +%s)
CC="$CC" CXX="$CXX" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DGRADZIP_BUILD_FUZZERS=ON -DGRADZIP_BUILD_TESTS=OFF -DGRADZIP_BUILD_BENCHMARKS=OFF \
  -DGRADZIP_WITH_CUDA=OFF -DGRADZIP_WITH_MPI=OFF -DGRADZIP_WITH_PYTHON=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target fuzz_decode fuzz_wire_header
echo "fuzz.sh: build took $(( $(date +%s) - start )) s"

status=0
for target in fuzz_decode fuzz_wire_header; do
  corpus_name=${target#fuzz_}
  work="$build/corpus/$target"
  crashes="$build/crashes/$target"
  rm -rf "$work"
  mkdir -p "$work" "$crashes"
  cp "$root/tests/fuzz/corpus/$corpus_name/"* "$work/"
  echo "fuzz.sh: $target for ${seconds} s over $(ls "$work" | wc -l) seed inputs"
  # -max_len: room above the largest seed (a 4096-element `none` message is 16 KiB).
  # The corpus copy grows with what the run finds; the checked-in seeds stay as they are.
  if ! ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "$build/bin/$target" -max_total_time="$seconds" -max_len=20000 -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$crashes/" -print_final_stats=1 "$work" >"$build/$target.log" 2>&1; then
    echo "fuzz.sh: $target FAILED; log: $build/$target.log; inputs:" >&2
    ls "$crashes" >&2
    tail -n 40 "$build/$target.log" >&2
    status=1
  else
    grep -E '^(stat::number_of_executed_units|stat::new_units_added|#[0-9]+.*DONE)' \
      "$build/$target.log" | sed "s/^/fuzz.sh: $target: /" || true
  fi
done
echo "fuzz.sh: total $(( $(date +%s) - start )) s"
exit $status
