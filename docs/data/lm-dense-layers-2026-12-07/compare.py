"""Pairs this folder's seed<N>.json (signdense, topk1dense) with the lm suite's rows of the same
seed (docs/data/reproduce/lm.json: sign, topk1, ddp_default): final validation loss per seed,
the difference dense-layers minus plain (negative: keeping those layers dense helped), and the
mean bytes per rank per step. Run from the repository root: python3 <this file>."""
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def results(convergence):
    return {r["label"]: r for r in convergence["results"]}


suite = json.load(open(os.path.join(ROOT, "docs", "data", "reproduce", "lm.json")))
by_seed = {}
for round_ in suite["rounds"]:
    convergence = round_["rows"]["convergence"]
    by_seed[convergence["seed"]] = results(convergence)
pairs = {"sign": "signdense", "topk1": "topk1dense"}
differences = {plain: [] for plain in pairs}
print("seed | config | loss | vs plain | vs DDP | MB/step")
for seed in sorted(by_seed):
    path = os.path.join(HERE, f"seed{seed}.json")
    if not os.path.exists(path):
        continue
    dense = results(json.load(open(path)))
    ddp = by_seed[seed]["ddp_default"]["final"]["validation_loss"]
    for plain, variant in pairs.items():
        a = by_seed[seed][plain]
        b = dense[variant]
        d = b["final"]["validation_loss"] - a["final"]["validation_loss"]
        differences[plain].append(d)
        for label, r, vs in ((plain, a, 0.0), (variant, b, d)):
            loss = r["final"]["validation_loss"]
            print(f"{seed} | {label} | {loss:.4f} | {vs:+.4f} | {loss - ddp:+.4f} | "
                  f"{r['bytes_per_step'] / 1e6:.3f}")
for plain, ds in differences.items():
    if ds:
        spread = statistics.stdev(ds) if len(ds) > 1 else 0.0
        print(f"{pairs[plain]} minus {plain}: {statistics.mean(ds):+.4f} ± {spread:.4f} "
              f"over {len(ds)} seeds")
