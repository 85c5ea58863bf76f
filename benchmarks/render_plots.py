#!/usr/bin/python3
"""Draws the plots of docs/results.md and README.md from benchmarks/reproduce.py's raw data.

    /usr/bin/python3 benchmarks/render_plots.py [--data DIR] [--img DIR]

From DIR/<suite>.json (default docs/data/reproduce/) into --img (default docs/img/), for each
suite whose JSON is there:
  convergence  accuracy_vs_epoch.png, loss_vs_epoch.png, accuracy_vs_bytes.png,
               loss_vs_bytes.png: per configuration and epoch, the mean over the seeds of the
               test accuracy, the train loss and the cumulative bytes sent per rank
               (benchmarks/plot_convergence.py draws them)
  peers        peers.png: per configuration the median over the rounds of the step time and of
               the bytes per step (benchmarks/peers/plot_peers.py)
  fsdp         fsdp_loss.png: per configuration the validation loss against the step and
               against the cumulative bytes one rank sent (benchmarks/plot_fsdp.py)
  lm, cnn      lm_convergence.png, cnn_convergence.png: per configuration the validation loss
               (lm) or test accuracy (cnn), mean over the seeds, against the step and against the
               cumulative bytes one rank sent (benchmarks/ddp_convergence_report.py)
  cost_model   projection.png: the projected speedup of algo=auto's choice over the dense f32
               and 16-bit all-reduce at 1, 10 and 100 Gbit/s, the median over the rounds
               (benchmarks/model/plot_projection.py)
Needs matplotlib (Debian's python3-matplotlib of /usr/bin/python3). The PNGs are not compared
by any check (matplotlib versions draw differently); the tables beside them are
(benchmarks/render_results.py --check).
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for folder in (HERE, os.path.join(HERE, "peers"), os.path.join(HERE, "model")):
    sys.path.insert(0, folder)

import ddp_convergence_report  # noqa: E402
import plot_convergence  # noqa: E402
import plot_fsdp  # noqa: E402
import plot_peers  # noqa: E402
import plot_projection  # noqa: E402
import render_results  # noqa: E402


def convergence_runs(record):
    """{label: [row per epoch]} with the seeds' mean test accuracy, train loss and bytes sent
    (every seed runs the same epochs; a label missing from a seed is averaged over the rest)."""
    per_label = {}
    for r in record["rounds"]:
        for row in r["rows"]:
            per_label.setdefault(row["label"], {}).setdefault(row["epoch"], []).append(row)
    runs = {}
    for label, epochs in per_label.items():
        rows = []
        for epoch in sorted(epochs):
            seeds = epochs[epoch]
            mean = dict(seeds[0])
            for column in ("test_accuracy", "train_loss", "test_loss", "bytes_sent"):
                mean[column] = statistics.fmean(s[column] for s in seeds)
            rows.append(mean)
        runs[label] = rows
    order = {label: i for i, label in enumerate(plot_convergence.LABEL_ORDER)}
    return dict(sorted(runs.items(), key=lambda item: (order.get(item[0], len(order)), item[0])))


def peers_medians(record):
    """ddp_peers.py's JSON of round 1 with every configuration's step time and bytes per step
    replaced by their medians over the rounds."""
    document = json.loads(json.dumps(record["rounds"][0]["rows"]))
    for result in document["results"]:
        if "skipped" in result:
            continue
        same = [other for r in record["rounds"] for other in r["rows"]["results"]
                if other["name"] == result["name"] and "skipped" not in other]
        result["step_time_s"] = statistics.median(o["step_time_s"] for o in same)
        result["bytes_per_step"] = statistics.median(o["bytes_per_step"] for o in same)
    return document


def projection_rows(record):
    """plot_projection's rows: per (ranks, gbps, spec) the median speedups over the rounds."""
    points = {}
    for r in record["rounds"]:
        for row in r["rows"]["projection"]["rows"]:
            points.setdefault((row["model"], row["ranks"], row["gbps"], row["spec"]), []).append(row)
    rows = []
    for (model, ranks, gbps, spec), same in points.items():
        rows.append({"model": model, "ranks": ranks, "gbps": gbps, "spec": spec,
                     "speedup_vs_f32": statistics.median(p["dense_f32_seconds"] / p["seconds"]
                                                         for p in same),
                     "speedup_vs_f16": statistics.median(p["dense_f16_seconds"] / p["seconds"]
                                                         for p in same)})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.path.join(ROOT, "docs", "data", "reproduce"))
    parser.add_argument("--img", default=os.path.join(ROOT, "docs", "img"))
    args = parser.parse_args()
    os.makedirs(args.img, exist_ok=True)

    def load(suite):
        path = os.path.join(args.data, f"{suite}.json")
        if not os.path.exists(path):
            print(f"render_plots: no {path}, its plots left as they are")
            return None
        with open(path) as f:
            return json.load(f)

    drawn = []
    record = load("convergence")
    if record is not None:
        plot_convergence.plot(convergence_runs(record), args.img)
        drawn += ["accuracy_vs_epoch.png", "loss_vs_epoch.png", "accuracy_vs_bytes.png",
                  "loss_vs_bytes.png"]
    record = load("peers")
    if record is not None:
        plot_peers.plot(peers_medians(record), os.path.join(args.img, "peers.png"),
                        f"1 Gbit/s emulated links, median of {len(record['rounds'])} rounds")
        drawn.append("peers.png")
    record = load("fsdp")
    if record is not None:
        settings = record["rounds"][0]["rows"]["settings"]
        plot_fsdp.plot(plot_fsdp.curves(record, render_results.fsdp_caption),
                       os.path.join(args.img, "fsdp_loss.png"),
                       f"FSDP2, {record['rounds'][0]['rows']['results'][0]['ranks']} ranks, "
                       f"byte-level transformer (width {settings['width']}), AdamW")
        drawn.append("fsdp_loss.png")
    for suite in ("lm", "cnn"):
        record = load(suite)
        if record is not None:
            ddp_convergence_report.plot(record, os.path.join(args.img, f"{suite}_convergence.png"))
            drawn.append(f"{suite}_convergence.png")
    record = load("cost_model")
    if record is not None:
        rows = projection_rows(record)
        model = rows[0]["model"]
        speeds = sorted({row["gbps"] for row in rows})
        plot_projection.plot(rows, os.path.join(args.img, "projection.png"), model, speeds)
        drawn.append("projection.png")
    print(f"render_plots: drew {', '.join(drawn) or 'nothing'} into {args.img}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
