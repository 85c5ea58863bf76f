#!/usr/bin/env python3
"""Table and plots of the Fashion-MNIST convergence runs that benchmarks/convergence.sh makes.

    python3 benchmarks/plot_convergence.py OUT [--check-accuracy LABEL MIN]...
                                               [--check-relative LABEL REF FRACTION]...
                                               [--check-loss LABEL REF FACTOR]...

Reads every OUT/csv/*.csv (one per configuration, written by rank 0 of train_fashion_mnist, one
row per epoch), writes OUT/table.md and prints it, and writes OUT/accuracy_vs_epoch.png,
OUT/loss_vs_epoch.png, OUT/accuracy_vs_bytes.png and OUT/loss_vs_bytes.png.

--check-accuracy LABEL MIN prints LABEL's final test accuracy (a fraction, as in the CSV) and exits
1 when it is below MIN or when LABEL has no CSV. --check-relative LABEL REF FRACTION does the same
against FRACTION times REF's final test accuracy (a compressed run against `none` trained the same
way), and --check-loss LABEL REF FACTOR requires LABEL's final test loss <= FACTOR times REF's.
Each may be given several times; every check is printed, and any failure exits 1. A malformed CSV is an error (exit 1) that names
the file, the line and what is wrong.
"""

import argparse
import csv
import math
import os
import sys

HEADER = ["label", "spec", "ranks", "epoch", "step", "train_loss", "test_loss",
          "test_accuracy", "bytes_sent", "compression_ratio", "wall_seconds"]

# Accuracy plots start here; a run that ends below it is marked as diverged.
DIVERGED_ACCURACY = 0.70

# convergence.sh's order; labels not listed here follow in alphabetical order.
LABEL_ORDER = ["none", "fp16", "bf16", "qsgd4", "qsgd2", "sign_ef", "sign_noef", "topk1_ef",
               "topk1_noef", "topk01_ef", "randk1_ef", "powersgd4", "topk1_ef_warm",
               "sign_ef_mc", "topk1_ef_mc", "topk01_ef_mc", "randk1_ef_mc"]


class CsvError(Exception):
    pass


def _number(text, column, where, kind=float, allow_non_finite=False):
    try:
        value = kind(text)
    except ValueError:
        raise CsvError(f"{where}: {column} '{text}' is not a{'n integer' if kind is int else ' number'}")
    if not allow_non_finite and not math.isfinite(value):
        raise CsvError(f"{where}: {column} is {text}, expected a finite number")
    return value


def read_run(path):
    """One configuration's rows, checked: the fixed header, 11 fields a row, numbers in range,
    one label (the file's name) and one spec and rank count, epochs increasing, cumulative
    columns not decreasing. Losses may be nan/inf (a diverged run is a result, not a bad file)."""
    stem = os.path.splitext(os.path.basename(path))[0]
    with open(path, newline="", encoding="utf-8") as f:
        lines = list(csv.reader(f))
    if not lines:
        raise CsvError(f"{path}: empty file, expected the header {','.join(HEADER)}")
    header = [name.strip() for name in lines[0]]
    if header != HEADER:
        raise CsvError(f"{path}:1: header is\n    {','.join(lines[0])}\n  expected\n    {','.join(HEADER)}")
    rows = []
    for number, fields in enumerate(lines[1:], start=2):
        where = f"{path}:{number}"
        if not fields:
            continue  # a blank line, e.g. at the end
        if len(fields) != len(HEADER):
            raise CsvError(f"{where}: {len(fields)} fields, expected {len(HEADER)} "
                           "(is a spec with commas unquoted?)")
        row = dict(zip(HEADER, fields))
        row["ranks"] = _number(row["ranks"], "ranks", where, int)
        row["epoch"] = _number(row["epoch"], "epoch", where, int)
        row["step"] = _number(row["step"], "step", where, int)
        for column in ("train_loss", "test_loss"):
            row[column] = _number(row[column], column, where, allow_non_finite=True)
        for column in ("test_accuracy", "bytes_sent", "compression_ratio", "wall_seconds"):
            row[column] = _number(row[column], column, where)
        if row["label"] != stem:
            raise CsvError(f"{where}: label '{row['label']}' differs from the file's name '{stem}'")
        if row["ranks"] < 1 or row["epoch"] < 0 or row["step"] < 0:
            raise CsvError(f"{where}: ranks must be >= 1, epoch and step >= 0")
        if not 0.0 <= row["test_accuracy"] <= 1.0:
            raise CsvError(f"{where}: test_accuracy {row['test_accuracy']} is outside [0, 1]")
        if row["bytes_sent"] < 0 or row["wall_seconds"] < 0 or row["compression_ratio"] <= 0:
            raise CsvError(f"{where}: bytes_sent and wall_seconds must be >= 0, compression_ratio > 0")
        if rows:
            previous = rows[-1]
            for column in ("spec", "ranks"):
                if row[column] != previous[column]:
                    raise CsvError(f"{where}: {column} '{row[column]}' differs from the row above "
                                   f"('{previous[column]}')")
            if row["epoch"] <= previous["epoch"]:
                raise CsvError(f"{where}: epoch {row['epoch']} is not above the row above's "
                               f"{previous['epoch']}")
            for column in ("step", "bytes_sent", "wall_seconds"):
                if row[column] < previous[column]:
                    raise CsvError(f"{where}: {column} {row[column]} is below the row above's "
                                   f"{previous[column]} (it is cumulative)")
        rows.append(row)
    if not rows:
        raise CsvError(f"{path}: a header but no rows")
    return rows


def read_runs(out):
    csv_dir = os.path.join(out, "csv")
    if not os.path.isdir(csv_dir):
        raise CsvError(f"{csv_dir} not found (run benchmarks/convergence.sh first)")
    names = sorted(name for name in os.listdir(csv_dir) if name.endswith(".csv"))
    runs = {}
    for name in names:
        rows = read_run(os.path.join(csv_dir, name))
        runs[rows[0]["label"]] = rows
    order = {label: i for i, label in enumerate(LABEL_ORDER)}
    return dict(sorted(runs.items(), key=lambda item: (order.get(item[0], len(order)), item[0])))


def human_bytes(count):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024


def table(runs):
    baseline = runs["none"][-1]["test_accuracy"] if "none" in runs else None
    lines = ["| label | spec | final test accuracy (%) | gap to none (points) | bytes sent per rank "
             "| compression ratio | wall time (s) | epochs |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for label, rows in runs.items():
        last = rows[-1]
        accuracy = 100.0 * last["test_accuracy"]
        gap = "n/a" if baseline is None else f"{accuracy - 100.0 * baseline:+.2f}"
        lines.append(f"| {label} | `{last['spec']}` | {accuracy:.2f} | {gap} | "
                     f"{human_bytes(last['bytes_sent'])} | {last['compression_ratio']:.1f}x | "
                     f"{last['wall_seconds']:.1f} | {last['epoch']} |")
    ranks = sorted({rows[-1]["ranks"] for rows in runs.values()})
    caption = (f"Fashion-MNIST, {'/'.join(map(str, ranks))} ranks; the last row of each CSV. "
               "Gap: accuracy minus `none`'s; bytes and ratio are cumulative over the run. "
               "Labels ending in _mc trained with momentum correction.")
    return caption + "\n\n" + "\n".join(lines) + "\n"


def plot(runs, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    # tab20 holds ten dark/light pairs: the dark ones first, then the light ones.
    colors = plt.get_cmap("tab20").colors
    ranks = "/".join(map(str, sorted({rows[-1]["ranks"] for rows in runs.values()})))
    figures = [
        ("accuracy_vs_epoch.png", "epoch", "test_accuracy", "Test accuracy against epoch"),
        ("loss_vs_epoch.png", "epoch", "train_loss", "Train loss against epoch"),
        ("accuracy_vs_bytes.png", "bytes_sent", "test_accuracy", "Test accuracy against bytes sent"),
        ("loss_vs_bytes.png", "bytes_sent", "train_loss", "Train loss against bytes sent"),
    ]
    axis_names = {"epoch": "epoch", "bytes_sent": "cumulative bytes sent per rank (log scale)",
                  "test_accuracy": "test accuracy (%)", "train_loss": "mean train loss"}
    for file_name, x_column, y_column, title in figures:
        fig, ax = plt.subplots(figsize=(8, 5.5))
        for i, (label, rows) in enumerate(runs.items()):
            points = [(row[x_column], row[y_column]) for row in rows
                      if math.isfinite(row[y_column]) and (x_column != "bytes_sent" or row[x_column] > 0)]
            if not points:
                continue
            xs = [x for x, _ in points]
            ys = [100.0 * y if y_column == "test_accuracy" else y for _, y in points]
            style = "--" if label.endswith("_noef") else "-"
            diverged = rows[-1]["test_accuracy"] < DIVERGED_ACCURACY
            ax.plot(xs, ys, style, marker="o", markersize=3, color=colors[(2 * i) % 20 + (i // 10) % 2],
                    label=f"{label} ({rows[-1]['spec']})" + (" diverged: below the chart" if diverged else ""))
        if x_column == "bytes_sent":
            ax.set_xscale("log")
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if y_column == "train_loss":
            ax.set_yscale("log")  # a diverged run (signSGD without EF) stays on the chart
        else:
            # Keep the useful range readable: a run that diverged (final accuracy under
            # DIVERGED_ACCURACY) falls below it and says so in the legend.
            ax.set_ylim(bottom=100.0 * DIVERGED_ACCURACY)
        ax.set_xlabel(axis_names[x_column])
        ax.set_ylabel(axis_names[y_column])
        ax.set_title(f"{title} (Fashion-MNIST, {ranks} ranks)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        fig.savefig(os.path.join(out, file_name), dpi=120)
        plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="convergence.sh's --out directory (holds csv/)")
    parser.add_argument("--check-accuracy", nargs=2, metavar=("LABEL", "MIN"), action="append",
                        default=[],
                        help="exit 1 unless LABEL's final test accuracy (a fraction) is >= MIN "
                             "(repeatable)")
    parser.add_argument("--check-relative", nargs=3, metavar=("LABEL", "REF", "FRACTION"),
                        action="append", default=[],
                        help="exit 1 unless LABEL's final test accuracy is >= FRACTION times "
                             "REF's (repeatable)")
    parser.add_argument("--check-loss", nargs=3, metavar=("LABEL", "REF", "FACTOR"),
                        action="append", default=[],
                        help="exit 1 unless LABEL's final test loss is <= FACTOR times REF's "
                             "(repeatable)")
    args = parser.parse_args()

    def fraction(option, text):
        try:
            value = float(text)
        except ValueError:
            parser.error(f"{option} '{text}' is not a number")
        if not 0.0 <= value <= 1.0:
            parser.error(f"{option} is a fraction in [0, 1] (e.g. 0.80), got {value}")
        return value

    def factor(text):
        try:
            value = float(text)
        except ValueError:
            parser.error(f"--check-loss FACTOR '{text}' is not a number")
        if not value >= 1.0:
            parser.error(f"--check-loss FACTOR is at least 1 (e.g. 1.25), got {value}")
        return value

    checks = [("accuracy", label, None, fraction("--check-accuracy MIN", minimum))
              for label, minimum in args.check_accuracy]
    checks += [("accuracy", label, reference, fraction("--check-relative FRACTION", share))
               for label, reference, share in args.check_relative]
    checks += [("loss", label, reference, factor(times))
               for label, reference, times in args.check_loss]

    try:
        runs = read_runs(args.out)
    except (CsvError, OSError) as error:
        print(f"plot_convergence: {error}", file=sys.stderr)
        return 1
    if not runs:
        print(f"plot_convergence: no CSV in {os.path.join(args.out, 'csv')}", file=sys.stderr)
        return 1

    text = table(runs)
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text, end="")
    # The checks first: their verdicts are printed even when the plots cannot be made.
    status = max([check_final(runs, args.out, *check) for check in checks], default=0)
    try:
        plot(runs, args.out)
    except ImportError as error:
        print(f"plot_convergence: no plots: {error} in {sys.executable} (Debian's "
              "python3-matplotlib serves /usr/bin/python3; run the script with that)", file=sys.stderr)
        return 1
    print(f"plot_convergence: wrote {os.path.join(args.out, 'table.md')} and 4 PNGs "
          f"({len(runs)} configuration(s))")
    return status


def check_final(runs, out, kind, label, reference, value):
    """kind "accuracy": 0 when label's final test accuracy is >= value (reference None) or >=
    value times reference's; kind "loss": 0 when label's final test loss is <= value times
    reference's. 1 (with the reason) otherwise."""
    for needed in [label] + ([reference] if reference is not None else []):
        if needed not in runs:
            print(f"plot_convergence: check FAILED: no CSV for label '{needed}' in "
                  f"{os.path.join(out, 'csv')} (found: {', '.join(runs)})", file=sys.stderr)
            return 1
    last = runs[label][-1]
    if kind == "loss":
        loss = last["test_loss"]
        reference_loss = runs[reference][-1]["test_loss"]
        maximum = value * reference_loss
        passed = loss <= maximum
        print(f"plot_convergence: check {'ok' if passed else 'FAILED'}: '{label}' final test loss "
              f"{loss:.4f} after {last['epoch']} epoch(s), required <= {maximum:.4f} = "
              f"{value:.4f} x {reference}'s {reference_loss:.4f}",
              file=sys.stdout if passed else sys.stderr)
        return 0 if passed else 1
    accuracy = last["test_accuracy"]
    if reference is None:
        minimum, rule = value, f"{value:.4f}"
    else:
        reference_accuracy = runs[reference][-1]["test_accuracy"]
        minimum = value * reference_accuracy
        rule = f"{minimum:.4f} = {value:.4f} x {reference}'s {reference_accuracy:.4f}"
    passed = accuracy >= minimum
    print(f"plot_convergence: check {'ok' if passed else 'FAILED'}: '{label}' final test accuracy "
          f"{accuracy:.4f} ({100.0 * accuracy:.2f}%) after {last['epoch']} epoch(s), required >= "
          f"{rule}", file=sys.stdout if passed else sys.stderr)
    return 0 if passed else 1

if __name__ == "__main__":
    sys.exit(main())
