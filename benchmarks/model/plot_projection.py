#!/usr/bin/python3
"""Plots `gradzip-bench model --csv` output: the projected speedup of each codec over the dense
f32 and the dense 16-bit all-reduce against the rank count, one line per codec, one column per
link speed, for one model size.

    /usr/bin/python3 benchmarks/model/plot_projection.py projection.csv docs/img/projection.png \
        [--model bert-large] [--gbps 1,10,100]

Needs matplotlib (the Debian python3-matplotlib of /usr/bin/python3).
"""
import argparse
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(rows, png_path, model, speeds):
    """rows: dicts with ranks, gbps, spec, speedup_vs_f32 and speedup_vs_f16 (numbers) of one
    model; one column per link speed in `speeds`, the f32 baseline above, 16-bit below."""
    specs = list(dict.fromkeys(r["spec"] for r in rows))
    figure, axes = plt.subplots(2, len(speeds), figsize=(4.2 * len(speeds), 7), sharex=True,
                                squeeze=False)
    for column, gbps in enumerate(speeds):
        for row_index, (key, baseline) in enumerate((("speedup_vs_f32", "dense f32"),
                                                     ("speedup_vs_f16", "dense 16-bit"))):
            axis = axes[row_index][column]
            for spec in specs:
                points = sorted((int(r["ranks"]), float(r[key])) for r in rows
                                if r["spec"] == spec and abs(float(r["gbps"]) - gbps) < 1e-9)
                if points:
                    axis.plot([p for p, _ in points], [s for _, s in points], marker="o",
                              markersize=3, label=spec)
            axis.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_title(f"{gbps:g} Gbit/s: speedup over {baseline}", fontsize=9)
            axis.grid(True, which="both", linewidth=0.3)
            if row_index == 1:
                axis.set_xlabel("ranks P")
    axes[0][0].legend(fontsize=7)
    figure.suptitle(f"Projected all-reduce speedup, {model} gradients, with the algorithm "
                    "algo=auto runs (gradzip-bench model; gamma of this CPU)", fontsize=10)
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv_path")
    parser.add_argument("png_path")
    parser.add_argument("--model", default="bert-large")
    parser.add_argument("--gbps", default="1,10,100")
    args = parser.parse_args()
    rows = [r for r in csv.DictReader(open(args.csv_path)) if r["model"] == args.model]
    if not rows:
        sys.exit(f"plot_projection: no rows for model '{args.model}' in {args.csv_path}")
    plot(rows, args.png_path, args.model, [float(g) for g in args.gbps.split(",")])


if __name__ == "__main__":
    main()
