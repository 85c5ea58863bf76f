#!/usr/bin/env bash
# Convergence of data-parallel Fashion-MNIST training under each codec: runs
# train_fashion_mnist once per configuration (same seed, same ranks, same epochs), then
# benchmarks/plot_convergence.py turns the CSVs into a table and plots.
#
#   bash benchmarks/convergence.sh [--quick] [--epochs N] [--ranks N] [--out DIR]
#                                  [--build DIR] [--only LABEL,...] [--seed S]
#
#   --quick        1 epoch, configurations none and topk1_ef only (for tests)
#   --epochs N     epochs per configuration (default 5; 1 with --quick)
#   --ranks N      MPI ranks (default 4)
#   --out DIR      results (default build/convergence): DIR/csv/<label>.csv, DIR/logs/<label>.log,
#                  DIR/table.md and DIR/*.png
#   --build DIR    the build tree holding bin/train_fashion_mnist (default build); nothing is built
#   --only L,...   run only these labels (their old CSVs are replaced, other CSVs in DIR/csv are kept
#                  and appear in the table); without --only, DIR/csv and DIR/logs are emptied first
#   --seed S       the seed every configuration uses (default 1)
#   --check-accuracy LABEL MIN
#                  after the table, fail (exit 1) unless LABEL's final test accuracy is >= MIN
#                  (in [0, 1]); the real figure is printed either way (plot_convergence.py)
#   --check-relative LABEL REF FRACTION
#                  likewise, against FRACTION times REF's final test accuracy (e.g. topk1_ef
#                  none 0.95)
#   --check-loss LABEL REF FACTOR
#                  fail unless LABEL's final test loss is <= FACTOR times REF's; every check may
#                  be repeated
#
# Configurations (label: codec spec):
#   none: none            fp16: fp16                    bf16: bf16
#   qsgd4: qsgd:bits=4    qsgd2: qsgd:bits=2            sign_ef: sign:ef=on
#   sign_noef: sign:ef=off                              topk1_ef: topk:ratio=0.01,ef=on
#   topk1_noef: topk:ratio=0.01,ef=off                  topk01_ef: topk:ratio=0.001,ef=on
#   randk1_ef: randk:ratio=0.01,ef=on                   powersgd4: powersgd:rank=4
#   terngrad: terngrad                                  terngrad_ef: terngrad:ef=on
#   topk1_ef_warm: topk:ratio=0.01,ef=on,warmup=125,ramp=250 (DGC-style: half an epoch dense,
#                  then the ratio falls from 25% to 1% over one epoch)
#   sign_ef_mc, topk1_ef_mc, topk01_ef_mc, randk1_ef_mc: as without _mc, with momentum
#                  correction (each rank's momentum goes through the Reducer, DGC)
#
# The dataset directory is $GRADZIP_FASHION_MNIST_DIR, else /usr/share/datasets/fashion-mnist
# (Debian's dataset-fashion-mnist). mpirun is $MPIEXEC if set; Python is $PYTHON if set, else
# the first of python3 and /usr/bin/python3 that has matplotlib. A configuration that fails is
# reported with the tail of its log; the others still run, the table is still made, and the
# script exits 1.
set -euo pipefail

root_dir="$(cd "$(dirname "$0")/.." && pwd)"
labels=(none fp16 bf16 qsgd4 qsgd2 sign_ef sign_noef topk1_ef topk1_noef topk01_ef randk1_ef powersgd4
        topk1_ef_warm sign_ef_mc topk1_ef_mc topk01_ef_mc randk1_ef_mc terngrad terngrad_ef)
declare -A spec_of=(
  [none]=none
  [fp16]=fp16
  [bf16]=bf16
  [qsgd4]=qsgd:bits=4
  [qsgd2]=qsgd:bits=2
  [sign_ef]=sign:ef=on
  [sign_noef]=sign:ef=off
  [topk1_ef]=topk:ratio=0.01,ef=on
  [topk1_noef]=topk:ratio=0.01,ef=off
  [topk01_ef]=topk:ratio=0.001,ef=on
  [randk1_ef]=randk:ratio=0.01,ef=on
  [powersgd4]=powersgd:rank=4
  [topk1_ef_warm]=topk:ratio=0.01,ef=on,warmup=125,ramp=250
  [sign_ef_mc]=sign:ef=on
  [topk1_ef_mc]=topk:ratio=0.01,ef=on
  [topk01_ef_mc]=topk:ratio=0.001,ef=on
  [randk1_ef_mc]=randk:ratio=0.01,ef=on
  [terngrad]=terngrad
  [terngrad_ef]=terngrad:ef=on
)
# Labels ending in _mc train with momentum correction (--momentum-correction on).
momentum_correction_of() { [[ $1 == *_mc ]] && echo on || echo off; }

quick=0
epochs=
ranks=4
out=build/convergence
build=build
only=
seed=1
check=()

# The comment block above, without the '#'.
usage() { sed -n '2,/^set -euo pipefail/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "convergence: $*" >&2; exit 2; }

while (($#)); do
  case "$1" in
    --quick) quick=1; shift ;;
    --epochs) epochs="${2:?--epochs needs a value}"; shift 2 ;;
    --ranks) ranks="${2:?--ranks needs a value}"; shift 2 ;;
    --out) out="${2:?--out needs a value}"; shift 2 ;;
    --build) build="${2:?--build needs a value}"; shift 2 ;;
    --only) only="${2:?--only needs a value}"; shift 2 ;;
    --seed) seed="${2:?--seed needs a value}"; shift 2 ;;
    --check-accuracy)
      check+=(--check-accuracy "${2:?--check-accuracy needs LABEL MIN}" "${3:?--check-accuracy needs LABEL MIN}")
      shift 3 ;;
    --check-relative)
      check+=(--check-relative "${2:?--check-relative needs LABEL REF FRACTION}"
              "${3:?--check-relative needs LABEL REF FRACTION}" "${4:?--check-relative needs LABEL REF FRACTION}")
      shift 4 ;;
    --check-loss)
      check+=(--check-loss "${2:?--check-loss needs LABEL REF FACTOR}"
              "${3:?--check-loss needs LABEL REF FACTOR}" "${4:?--check-loss needs LABEL REF FACTOR}")
      shift 4 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done

if [[ -z "$epochs" ]]; then
  if ((quick)); then epochs=1; else epochs=5; fi
fi
[[ "$epochs" =~ ^[1-9][0-9]*$ ]] || die "--epochs must be a positive integer, got '$epochs'"
[[ "$ranks" =~ ^[1-9][0-9]*$ ]] || die "--ranks must be a positive integer, got '$ranks'"
[[ "$seed" =~ ^[0-9]+$ ]] || die "--seed must be a non-negative integer, got '$seed'"

if [[ -n "$only" ]]; then
  IFS=',' read -r -a selected <<<"$only"
  ((${#selected[@]} > 0)) || die "--only needs at least one label"
  for label in "${selected[@]}"; do
    [[ -n "${spec_of[$label]+set}" ]] || die "unknown label '$label' (known: ${labels[*]})"
  done
elif ((quick)); then
  selected=(none topk1_ef)
else
  selected=("${labels[@]}")
fi

# Relative paths are taken from the repository root, as the defaults are.
[[ "$out" = /* ]] || out="$root_dir/$out"
[[ "$build" = /* ]] || build="$root_dir/$build"
train="$build/bin/train_fashion_mnist"
plot="$root_dir/benchmarks/plot_convergence.py"
mpiexec="${MPIEXEC:-mpirun}"
data_dir="${GRADZIP_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}"

[[ -x "$train" ]] \
  || die "$train not found or not executable; build the train_fashion_mnist target first (this script builds nothing)"
command -v "$mpiexec" >/dev/null || die "'$mpiexec' not found (Open MPI's mpirun, or set MPIEXEC)"
# The plots need matplotlib; Debian's python3-matplotlib serves /usr/bin/python3, which a python3
# earlier on PATH (pyenv, a venv) may not see. Checked now, not after the runs.
python=
for candidate in ${PYTHON:-python3 /usr/bin/python3}; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import matplotlib' 2>/dev/null; then
    python="$candidate"
    break
  fi
done
[[ -n "$python" ]] || die "no Python with matplotlib (tried: ${PYTHON:-python3 /usr/bin/python3});" \
  "install python3-matplotlib or set PYTHON"
data_hint="install dataset-fashion-mnist or set GRADZIP_FASHION_MNIST_DIR"
[[ -d "$data_dir" ]] || die "dataset directory $data_dir not found; $data_hint"
for file in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  [[ -f "$data_dir/$file.gz" || -f "$data_dir/$file" ]] \
    || die "dataset file $data_dir/$file(.gz) missing; $data_hint"
done

mkdir -p "$out/csv" "$out/logs"
if [[ -z "$only" ]]; then
  # A fresh experiment: CSVs of an earlier run (other epochs, other labels) would mix into the table.
  rm -f "$out"/csv/*.csv "$out"/logs/*.log
fi

if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

echo "convergence: ${#selected[@]} configuration(s) [${selected[*]}], $ranks ranks, $epochs epoch(s)," \
  "seed $seed, data $data_dir, results in $out"
failed=()
for label in "${selected[@]}"; do
  spec="${spec_of[$label]}"
  csv="$out/csv/$label.csv"
  log="$out/logs/$label.log"
  rm -f "$csv"  # a failed run must not leave an old CSV behind to be plotted as if it were new
  echo "convergence: [$label] $spec ..."
  start=$SECONDS
  status=0
  "$mpiexec" -np "$ranks" --oversubscribe --bind-to none \
    "$train" --data "$data_dir" --spec "$spec" --label "$label" --epochs "$epochs" \
    --seed "$seed" --momentum-correction "$(momentum_correction_of "$label")" \
    --csv "$csv" >"$log" 2>&1 || status=$?
  elapsed=$((SECONDS - start))
  if ((status != 0)) || [[ ! -s "$csv" ]]; then
    if ((status != 0)); then
      echo "convergence: [$label] FAILED (exit $status after ${elapsed}s); last lines of $log:" >&2
    else
      echo "convergence: [$label] FAILED: exit 0 but no CSV at $csv; last lines of $log:" >&2
    fi
    tail -n 20 "$log" | sed 's/^/    /' >&2
    failed+=("$label")
    continue
  fi
  echo "convergence: [$label] done in ${elapsed}s; last row: $(tail -n 1 "$csv")"
done

plot_status=0
if compgen -G "$out/csv/*.csv" >/dev/null; then
  "$python" "$plot" "$out" "${check[@]}" || plot_status=$?
else
  echo "convergence: no CSV in $out/csv, nothing to tabulate" >&2
  plot_status=1
fi

if ((${#failed[@]} > 0)); then
  echo "convergence: ${#failed[@]} configuration(s) failed: ${failed[*]} (logs in $out/logs)" >&2
  exit 1
fi
if ((plot_status != 0)); then
  echo "convergence: plot_convergence.py failed (exit $plot_status)" >&2
  exit 1
fi
echo "convergence: table in $out/table.md, plots in $out/*.png"
