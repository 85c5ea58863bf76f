#!/usr/bin/env python3
"""Tables and plots of the DDP-hook convergence suites (benchmarks/reproduce.py's lm and cnn).

A suite's record has one round per seed; a round's rows are ddp_train.py's --timing JSON (the
configurations' step times in the emulated cluster) with the seed's convergence run attached
as "convergence" (curves, final metrics, bytes per step). render_results.py calls render() for
docs/results.md and readme() for README.md; render_plots.py calls plot().

Time to target: the target is the metric DDP's default all-reduce reaches at the last
evaluation at or before three quarters of its steps, the worst over the seeds, so that DDP's
default reaches it in every seed with a quarter of the run to spare and a configuration that
learns a little slower can still reach it. A configuration's steps to the target (per seed: the first
evaluation at least as good; evaluations come every eval_every steps, so the count is rounded
up to one) times its step time in the emulated cluster (median over the rounds) is its time to
the target; a remedy that runs its first steps uncompressed (_warm, _fv) pays gradzip `none`'s
step time for those. The two are measured apart (the convergence runs on loopback, the step
times behind 1 Gbit/s links) and combined here; a configuration that misses the target in some
seed is shown as reaching it in k of 3.
"""
import math
import statistics

from spread_text import mean_std, spread  # benchmarks/, next to this module

CAPTIONS = {
    "ddp_default": "DDP default all-reduce (gloo)",
    "torch_fp16": "PyTorch `fp16_compress_hook`",
    "torch_powersgd4": "PyTorch PowerSGD hook, rank 4",
}
REMEDY_CAPTIONS = {
    "mc": "momentum correction",
    "warm": "dense warm-up",
    "fv": "momentum correction + frozen-variance AdamW after a dense warm-up",
}


def caption(result):
    """A configuration as the tables name it."""
    if result["label"] in CAPTIONS:
        return CAPTIONS[result["label"]]
    remedy = result["label"].partition("_")[2]
    text = f"gradzip `{result['spec']}`"
    return text + (f" + {REMEDY_CAPTIONS[remedy]}" if remedy else "")


def seeds_of(record):
    """[(seed, convergence JSON, timing JSON)] per round."""
    return [(r["rows"]["convergence"]["seed"], r["rows"]["convergence"], r["rows"]) for r in record["rounds"]]


def better(metric_value, target, higher_is_better):
    return metric_value >= target if higher_is_better else metric_value <= target


class Summary:
    """The suite's figures per configuration, in the order the runs made them."""

    def __init__(self, record):
        runs = seeds_of(record)
        first = runs[0][1]
        self.workload = first["workload"]
        self.metric = first["metric"]
        self.higher = first["higher_is_better"]
        self.steps = first["steps"]
        self.first = first
        self.seeds = [seed for seed, _, _ in runs]
        self.labels = [r["label"] for r in first["results"]]
        self.results = {}  # label -> {seed: convergence result}
        self.step_times = {}  # label -> [step time per round]
        for seed, convergence, timing in runs:
            for result in convergence["results"]:
                self.results.setdefault(result["label"], {})[seed] = result
            for result in timing["results"]:
                self.step_times.setdefault(result["label"], []).append(result["step_time_s"])
        self.target = self._target()

    def final(self, label, seed, key=None):
        """The final value of `key` (default: the metric); NaN when the run diverged."""
        result = self.results[label].get(seed)
        if result is None or result["diverged"] or result["final"] is None:
            return math.nan
        return result["final"][key or self.metric]

    def _target_point(self, seed):
        """DDP default's last evaluation at or before three quarters of the steps."""
        curve = self.results["ddp_default"][seed]["curve"]
        return [p for p in curve if p["step"] <= 0.75 * self.steps][-1]

    def _target(self):
        values = [self._target_point(seed)[self.metric] for seed in self.seeds]
        return min(values) if self.higher else max(values)

    def paired_difference(self, label, scale):
        """Per seed, the final metric minus DDP default's of the same seed (same initial model,
        same data order), times scale."""
        return [scale * (self.final(label, s) - self.final("ddp_default", s)) for s in self.seeds]

    def target_step(self):
        return self._target_point(self.seeds[0])["step"]

    def steps_to_target(self, label, seed):
        result = self.results[label].get(seed)
        if result is None:
            return None
        for point in result["curve"]:
            if math.isfinite(point[self.metric]) and better(point[self.metric], self.target, self.higher):
                return point["step"]
        return None

    def bytes_ratio(self, label):
        """Per seed: bytes per step over DDP default's."""
        return [self.results[label][s]["bytes_per_step"] / self.results["ddp_default"][s]["bytes_per_step"]
                for s in self.seeds if s in self.results[label]]

    def step_time(self, label):
        times = self.step_times.get(label)
        return statistics.median(times) if times else None

    def time_to_target(self, label):
        """[seconds per seed that reached the target], and how many seeds there were."""
        step_time, dense_time = self.step_time(label), self.step_time("none")
        dense_steps = 0
        if label.endswith(("_warm", "_fv")):
            dense_steps = self.first["remedy_warmup"]
        seconds = []
        for seed in self.seeds:
            steps = self.steps_to_target(label, seed)
            if steps is None or step_time is None:
                continue
            dense = min(steps, dense_steps)
            seconds.append(dense * (dense_time or step_time) + (steps - dense) * step_time)
        return seconds, len(self.seeds)


def setup(summary, record):
    first = summary.first
    machine = record["machine"]
    if summary.workload == "lm":
        what = (f"{first['description']}; AdamW, warm-up and cosine schedule, clipping at norm 1, "
                f"global batch {first['batch']}, {first['steps']} steps")
    else:
        what = f"{first['description']}; SGD with momentum 0.9, cosine schedule, global batch {first['batch']}, {first['steps']} steps"
    return (f"{first['ranks']} ranks under torchrun (PyTorch {first['torch']}, gloo on loopback; gradzip "
            f"over torch.distributed), {first['parameters'] / 1e6:.2f}M parameters: {what}; seeds "
            f"{', '.join(map(str, summary.seeds))}, one round each, on {machine['cores']} cores")


def metric_columns(summary):
    if summary.workload == "lm":
        return ["validation loss (nats/byte)", "bits per byte"], [
            lambda label, seed: summary.final(label, seed),
            lambda label, seed: summary.final(label, seed, "bits_per_byte")], [4, 3], [1, 1]
    return ["test accuracy (%)", "test loss"], [
        lambda label, seed: summary.final(label, seed),
        lambda label, seed: summary.final(label, seed, "test_loss")], [2, 3], [100, 1]


def time_cell(summary, label):
    seconds, count = summary.time_to_target(label)
    if not seconds:
        return "not reached"
    text = f"{statistics.fmean(seconds):.0f}"
    if len(seconds) < count:
        text += f" ({len(seconds)} of {count} seeds)"
    return text


def speedup_cell(summary, label):
    seconds, count = summary.time_to_target(label)
    reference, _ = summary.time_to_target("ddp_default")
    if not seconds or not reference or len(seconds) < count:
        return "–"
    return f"{statistics.fmean(reference) / statistics.fmean(seconds):.2f}×"


def render(record):
    """docs/results.md's section: the setup, the final metrics, bytes, step time, time to target."""
    summary = Summary(record)
    names, getters, digits, scales = metric_columns(summary)
    target_name = "validation loss" if summary.workload == "lm" else "test accuracy"
    target = summary.target * (100 if summary.higher else 1)
    lines = [setup(summary, record) + ". Final metrics: mean ± std over the seeds. `bytes vs "
             "DDP`: what one rank hands to the network per step over DDP default's (gradzip: the "
             "hook's counts, dense warm-up steps included; PyTorch: the ring formula), median "
             "over the seeds. Step time: the same configurations behind 1 Gbit/s links "
             "(benchmarks/emulated_cluster.sh, 4 ranks, gradzip over MPI), the median over the "
             "rounds of the slowest rank's median step. Time to target: steps to reach the "
             f"{target_name} DDP's default reaches at step {summary.target_step()} "
             f"({target:.{digits[0]}f}, the worst of the seeds) times the step time (see "
             "benchmarks/ddp_convergence_report.py), mean over the seeds that reach it; `vs DDP`: "
             "DDP default's time to target over this one's. `Δ vs DDP`: the final metric minus "
             "DDP default's with the same seed (same initial model and data order), mean ± std "
             "over the seeds: the seeds' common part cancels.", ""]
    lines += ["| configuration | " + " | ".join(names) + " | Δ vs DDP | bytes vs DDP | step (s) | "
              "time to target (s) | vs DDP |", "|---|" + "---|" * (len(names) + 5)]
    for label in summary.labels:
        result = summary.results[label][summary.seeds[0]]
        cells = [mean_std([scale * get(label, s) for s in summary.seeds], d)
                 for get, d, scale in zip(getters, digits, scales)]
        step_time = summary.step_time(label)
        lines.append(f"| {caption(result)} | " + " | ".join(cells)
                     + f" | {mean_std(summary.paired_difference(label, scales[0]), digits[0])}"
                     + f" | {spread(summary.bytes_ratio(label), 4)} "
                     + f"| {spread(summary.step_times.get(label, []), 3) if step_time else '–'} "
                     + f"| {time_cell(summary, label)} | {speedup_cell(summary, label)} |")
    return lines


def readme(record):
    """README.md's short table: final metric, bytes, time to target."""
    summary = Summary(record)
    names, getters, digits, scales = metric_columns(summary)
    target = summary.target * (100 if summary.higher else 1)
    lines = [f"{'Quick' if record['quick'] else 'Full'} run: {setup(summary, record)}. Mean ± "
             f"std over the seeds; `Δ vs DDP` paired by seed (same initial model and data order). "
             f"Target: {target:.{digits[0]}f}, what DDP's default reaches at step "
             f"{summary.target_step()} in every seed; time to target with the step time behind "
             f"1 Gbit/s links. Data `docs/data/reproduce/{record['suite']}.json`, "
             f"{record['machine']['date'][:10]}.",
             "", f"| configuration | {names[0]} | Δ vs DDP | bytes vs DDP | time to target (s) | vs DDP |",
             "|---|---:|---:|---:|---:|---:|"]
    for label in summary.labels:
        result = summary.results[label][summary.seeds[0]]
        lines.append(f"| {caption(result)} "
                     f"| {mean_std([scales[0] * getters[0](label, s) for s in summary.seeds], digits[0])} "
                     f"| {mean_std(summary.paired_difference(label, scales[0]), digits[0])} "
                     f"| {spread(summary.bytes_ratio(label), 4)} | {time_cell(summary, label)} "
                     f"| {speedup_cell(summary, label)} |")
    return lines


def plot(record, path):
    """Two panels: the metric's mean over the seeds against the step and against the
    cumulative MB one rank sent (bytes per step times steps)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = Summary(record)
    figure, (by_step, by_bytes) = plt.subplots(1, 2, figsize=(12, 4.6))
    styles = ["-", "--", ":", "-."]
    for i, label in enumerate(summary.labels):
        curves = [summary.results[label][s]["curve"] for s in summary.seeds if s in summary.results[label]]
        length = min(len(c) for c in curves)
        steps = [curves[0][j]["step"] for j in range(length)]
        values = [statistics.fmean(c[j][summary.metric] for c in curves) for j in range(length)]
        per_step = statistics.fmean(summary.results[label][s]["bytes_per_step"] for s in summary.seeds
                                    if s in summary.results[label])
        name = caption(summary.results[label][summary.seeds[0]]).replace("`", "")
        style = dict(linestyle=styles[i // 10 % len(styles)], marker="o", markersize=3, label=name)
        by_step.plot(steps, values, **style)
        by_bytes.plot([s * per_step / 1e6 for s in steps], values, **style)
    ylabel = "validation loss (nats per byte)" if summary.workload == "lm" else "test accuracy"
    for axis in (by_step, by_bytes):
        axis.set_ylabel(ylabel)
        axis.axhline(summary.target, color="grey", linewidth=0.8)
        axis.grid(alpha=0.3)
    by_step.set_xlabel("step")
    by_bytes.set_xlabel("MB sent per rank (cumulative)")
    by_bytes.set_xscale("log")
    if summary.workload == "lm":
        for axis in (by_step, by_bytes):
            axis.set_ylim(top=min(4.0, axis.get_ylim()[1]))
    else:
        for axis in (by_step, by_bytes):
            axis.set_ylim(bottom=max(0.5, axis.get_ylim()[0]))
    by_bytes.legend(fontsize=6, loc="best")
    figure.suptitle(f"{summary.workload}: mean over seeds {', '.join(map(str, summary.seeds))} "
                    "(grey: the time-to-target line)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
