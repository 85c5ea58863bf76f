#!/usr/bin/env bash
# Checkpoint/restart continuation: a run interrupted after step S and restarted from
# its checkpoint in new processes gives, for the next T steps, exactly the bytes of an
# uninterrupted run at the same world size; loading at another world size is refused.
#
#   run_restart_test.sh MPIRUN RESTART_RUN NP [S] [T]
set -euo pipefail
mpirun_exe=$1 program=$2 ranks=$3 save_step=${4:-20} steps=${5:-100}
scratch=$(mktemp -d /tmp/gradzip-restart.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
launch() {  # launch NP ARGS...: every run has an outer bound, so the test never hangs
  local np=$1; shift
  timeout 300 "$mpirun_exe" --oversubscribe --bind-to none -np "$np" "$program" "$@"
}

launch "$ranks" full "$scratch" "$save_step" "$steps" | sort > "$scratch/full.txt"
launch "$ranks" save "$scratch" "$save_step" "$steps" > "$scratch/save.txt"
launch "$ranks" resume "$scratch" "$save_step" "$steps" | sort > "$scratch/resumed.txt"

expected_lines=$((ranks * steps))
if [[ $(wc -l < "$scratch/full.txt") -ne $expected_lines ]]; then
  echo "FAIL: the uninterrupted run printed $(wc -l < "$scratch/full.txt") hash lines, expected $expected_lines"
  exit 1
fi
if ! diff -q "$scratch/full.txt" "$scratch/resumed.txt" > /dev/null; then
  echo "FAIL: the resumed run differs from the uninterrupted one:"
  diff "$scratch/full.txt" "$scratch/resumed.txt" | head -20
  exit 1
fi
# Every rank must end every step with the same bytes.
distinct=$(awk '{print $4, $6}' "$scratch/full.txt" | sort -u | wc -l)
if [[ $distinct -ne $steps ]]; then
  echo "FAIL: ranks disagree: $distinct distinct (step, hash) pairs for $steps steps"
  exit 1
fi
# The control: the same steps from step S without the checkpoint give other bytes, so the
# comparison above could not pass by accident.
launch "$ranks" cold "$scratch" "$save_step" "$steps" | sort > "$scratch/cold.txt"
if diff -q "$scratch/full.txt" "$scratch/cold.txt" > /dev/null; then
  echo "FAIL: a run without the checkpoint gave the same bytes: the test cannot see a lost state"
  exit 1
fi

# Another world size: refused, naming both sizes.
other=$((ranks + 1))
set +e
launch "$other" resume "$scratch" "$save_step" "$steps" > "$scratch/mismatch.txt" 2>&1
status=$?
set -e
if [[ $status -eq 0 ]] || ! grep -q "rank 0 refused: size_mismatch: .*world of $ranks ranks; this store belongs to a world of $other" "$scratch/mismatch.txt"; then
  echo "FAIL: resuming a $ranks-rank checkpoint at $other ranks was not refused as expected (status $status):"
  head -20 "$scratch/mismatch.txt"
  exit 1
fi
echo "PASS: $steps steps after a restart at step $save_step are byte-identical at $ranks ranks; $other ranks refused"
