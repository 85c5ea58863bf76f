"""Pairs this folder's seed<N>.json (signdense, topk1dense) with the lm suite's rows of the same
seed (docs/data/reproduce/lm.json, read through benchmarks/ddp_convergence_report.Summary: sign,
topk1, ddp_default): final validation loss per seed, the difference dense-layers minus plain
(negative: keeping those layers dense helped), and the mean bytes per rank per step. Run from the
repository root: python3 <this file>."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from ddp_convergence_report import Summary  # noqa: E402
from spread_text import mean_std  # noqa: E402

suite = Summary(json.load(open(os.path.join(ROOT, "docs", "data", "reproduce", "lm.json"))))
pairs = {"sign": "signdense", "topk1": "topk1dense"}
differences = {plain: [] for plain in pairs}
print("seed | config | loss | vs plain | vs DDP | MB/step")
for seed in suite.seeds:
    path = os.path.join(HERE, f"seed{seed}.json")
    if not os.path.exists(path):
        continue
    dense = {r["label"]: r for r in json.load(open(path))["results"]}
    ddp = suite.final("ddp_default", seed)
    for plain, variant in pairs.items():
        rows = ((plain, suite.results[plain][seed]), (variant, dense[variant]))
        plain_loss = suite.final(plain, seed)
        differences[plain].append(dense[variant]["final"]["validation_loss"] - plain_loss)
        for label, r in rows:
            loss = r["final"]["validation_loss"]
            print(f"{seed} | {label} | {loss:.4f} | {loss - plain_loss:+.4f} | {loss - ddp:+.4f} | "
                  f"{r['bytes_per_step'] / 1e6:.3f}")
for plain, ds in differences.items():
    if ds:
        print(f"{pairs[plain]} minus {plain}: {mean_std(ds, 4)} over {len(ds)} seeds")
