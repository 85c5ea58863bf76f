#!/usr/bin/env python3
"""Bar chart and markdown table of ddp_peers.py's results.

    /usr/bin/python3 benchmarks/peers/plot_peers.py TIMING.json [--accuracy ACCURACY.json]
                                                    [--png docs/img/peers.png] [--label TEXT]

TIMING.json gives step time and bytes per step (the emulated-cluster run); ACCURACY.json, when
given, the test accuracy column (a run with a longer step budget, e.g. outside the cluster);
without it the accuracy comes from TIMING.json. Prints the markdown table (speedup and bytes
against ddp_default of the same run) and writes a PNG with two panels per configuration: the
median step time (slowest rank) and the bytes one rank sends per step (log scale).
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend choice)


def load(path):
    with open(path) as f:
        return json.load(f)


def table(timing, accuracy):
    results = [r for r in timing["results"] if "skipped" not in r]
    base = next(r for r in results if r["name"] == "ddp_default")
    scores = {r["name"]: r.get("test_accuracy") for r in (accuracy or timing)["results"]}
    lines = ["| configuration | spec | step time (s) | speedup vs DDP default | MB sent per rank per step "
             "| bytes vs DDP default | link MB/step (measured) | test accuracy (%) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in timing["results"]:
        if "skipped" in r:
            lines.append(f"| {r['name']} | `{r['spec']}` | skipped: {r['skipped']} | | | | | |")
            continue
        link = f"{r['link_tx_bytes_per_step'] / 1e6:.2f}" if r.get("link_tx_bytes_per_step") else "-"
        score = scores.get(r["name"])
        lines.append(
            f"| {r['name']} | `{r['spec']}` | {r['step_time_s']:.3f} | "
            f"{base['step_time_s'] / r['step_time_s']:.2f}x | {r['bytes_per_step'] / 1e6:.2f} | "
            f"{r['bytes_per_step'] / base['bytes_per_step']:.4f} | {link} | "
            f"{'-' if score is None else f'{100 * score:.2f}'} |")
    return "\n".join(lines)


def plot(timing, path, label):
    results = [r for r in timing["results"] if "skipped" not in r]

    def colour(r):
        return "tab:gray" if r["spec"] == "noop" else "tab:blue" if r["kind"] == "pytorch" else "tab:orange"

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    left.bar([r["name"] for r in results], [r["step_time_s"] for r in results],
             color=[colour(r) for r in results])
    left.set_ylabel("median step time, slowest rank (s)")
    left.set_title("step time (grey: no communication, the compute floor)")
    senders = [r for r in results if r["bytes_per_step"] > 0]  # a log axis has no 0
    right.bar([r["name"] for r in senders], [r["bytes_per_step"] / 1e6 for r in senders],
              color=[colour(r) for r in senders])
    right.set_yscale("log")
    right.set_ylabel("MB sent per rank per step (log)")
    right.set_title("bytes per step")
    for axis in (left, right):
        axis.tick_params(axis="x", labelrotation=60)
        for tick in axis.get_xticklabels():
            tick.set_horizontalalignment("right")
    params = timing["parameters"] / 1e6
    figure.suptitle(f"PyTorch DDP (blue) vs gradzip hook (orange): {timing['ranks']} ranks, "
                    f"{params:.1f}M-parameter MLP, global batch {timing['batch']}"
                    + (f", {label}" if label else ""))
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("timing")
    parser.add_argument("--accuracy", default="")
    parser.add_argument("--png", default="docs/img/peers.png")
    parser.add_argument("--label", default="", help="appended to the chart's title (e.g. the links)")
    args = parser.parse_args()
    timing = load(args.timing)
    accuracy = load(args.accuracy) if args.accuracy else None
    if not any(r["name"] == "ddp_default" and "skipped" not in r for r in timing["results"]):
        print(f"plot_peers: {args.timing} has no ddp_default row (the baseline)", file=sys.stderr)
        return 1
    print(table(timing, accuracy))
    plot(timing, args.png, args.label)
    print(f"\nwrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
