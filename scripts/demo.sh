#!/usr/bin/env bash
# gradzip's main job, as the README's first quick-start command: install what is needed, build,
# and train a 784-512-256-10 MLP on the real Fashion-MNIST with 4 data-parallel MPI ranks twice,
# uncompressed (`none`) and with top-k 1% + error feedback through gradzip's Reducer
# (examples/train_fashion_mnist.cpp), then print test accuracy, bytes sent per rank and time
# side by side. Both runs use momentum correction (each rank's momentum goes through the
# Reducer, as Deep Gradient Compression does; for `none` it is plain momentum SGD). GRADZIP_DEMO_RANKS=N changes the ranks (default 4), GRADZIP_DEMO_EPOCHS=N the
# epochs (default 2). scripts/allreduce-demo.sh is the earlier demo: one step of ResNet-50
# gradients with every codec next to MPI_Allreduce.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/configure-and-build.sh --target train_fashion_mnist
# Open MPI refuses to run as root without these, and 4 ranks on fewer cores without
# --oversubscribe; --bind-to none lets the ranks share the cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ranks=${GRADZIP_DEMO_RANKS:-4}
epochs=${GRADZIP_DEMO_EPOCHS:-2}
out=build/demo
mkdir -p "$out"
for run in "none none" "topk1_ef topk:ratio=0.01,ef=on"; do
  read -r label spec <<<"$run"
  echo "== $ranks ranks, $epochs epochs, spec '$spec'"
  mpirun -np "$ranks" --oversubscribe --bind-to none build/bin/train_fashion_mnist \
    --spec "$spec" --label "$label" --epochs "$epochs" --momentum-correction on \
    --csv "$out/$label.csv"
done
# Side by side, from the two CSVs' last rows.
python3 - "$out/none.csv" "$out/topk1_ef.csv" <<'PY'
import csv, sys
rows = []
for path in sys.argv[1:]:
    with open(path, newline="") as f:
        rows.append(list(csv.DictReader(f))[-1])
print()
print(f"{'spec':<26} {'test accuracy':>13} {'bytes sent/rank':>16} {'ratio':>7} {'time':>8}")
for r in rows:
    print(f"{r['spec']:<26} {100 * float(r['test_accuracy']):>12.2f}% {int(r['bytes_sent']) / 2**20:>12.1f} MiB"
          f" {float(r['compression_ratio']):>6.1f}x {float(r['wall_seconds']):>7.1f}s")
base, topk = rows
print(f"\ntop-k 1% + EF sent {int(base['bytes_sent']) / max(int(topk['bytes_sent']), 1):.1f}x fewer bytes; "
      f"accuracy {100 * (float(topk['test_accuracy']) - float(base['test_accuracy'])):+.2f} points against none")
PY
