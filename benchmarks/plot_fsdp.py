#!/usr/bin/env python3
"""Validation-loss curves of benchmarks/reproduce.py's fsdp suite (fsdp_train.py's rounds).

    plot(record, path, title)

Two panels, one line per configuration: the validation loss (nats per byte) against the step,
and against the cumulative MiB one rank handed to the network in the gradient reduction (the
step times that configuration's bytes per step, the median over the rounds). The runs are
deterministic, so every round has the same losses; the first round's are drawn.
"""
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend choice)


def curves(record, caption):
    """[(caption, [(step, valid loss)], median bytes per step)] in the run's order; `caption`
    names a configuration's result."""
    table = {}
    for r in record["rounds"]:
        for result in r["rows"]["results"]:
            table.setdefault(result["configuration"], []).append(result)
    return [(caption(results[0]), results[0]["valid_loss"],
             statistics.median(result["bytes_per_step"] for result in results))
            for results in table.values()]


def plot(lines, path, title):
    figure, (by_step, by_bytes) = plt.subplots(1, 2, figsize=(11, 4.2))
    for caption, losses, bytes_per_step in lines:
        steps = [step for step, _ in losses]
        values = [loss for _, loss in losses]
        label = caption.replace("`", "")
        by_step.plot(steps, values, marker="o", label=label)
        by_bytes.plot([step * bytes_per_step / 2 ** 20 for step in steps], values, marker="o",
                      label=label)
    by_step.set_xlabel("step")
    by_bytes.set_xlabel("MiB sent per rank in the gradient reduction (cumulative)")
    by_bytes.set_xscale("symlog", linthresh=1.0)
    for axes in (by_step, by_bytes):
        axes.set_ylabel("validation loss (nats per byte)")
        axes.grid(True, alpha=0.3)
    by_step.legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
