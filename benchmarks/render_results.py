#!/usr/bin/env python3
"""Turns the raw data of benchmarks/reproduce.py into docs/results.md's generated sections.

    python3 benchmarks/render_results.py [--data DIR] [--results FILE] [--check]

For every DIR/<suite>.json (default docs/data/reproduce/) it renders a markdown section and puts
it between the markers

    <!-- generated: <suite> (benchmarks/render_results.py; edits here are overwritten) -->
    ...
    <!-- end generated: <suite> -->

in FILE (default docs/results.md), which must hold both markers of every suite it has data for.
Text outside the markers, and the sections of suites without data in DIR, are left alone. With --check nothing is written: it exits 1, naming the
sections, when FILE's generated text differs from what the JSON gives (ctest docs.results_generated
runs this), and 0 when all match.

Every figure is the median over the suite's rounds with the [min-max] spread; ratios (speedups,
fractions of memcpy) are taken within each round, against the baseline measured in that round,
and then summarised. Each section starts with the machine and the command.
"""
import argparse
import json
import os
import statistics
import sys

from plot_convergence import human_bytes  # benchmarks/, next to this script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def begin_marker(suite):
    return f"<!-- generated: {suite} (benchmarks/render_results.py; edits here are overwritten) -->"


def end_marker(suite):
    return f"<!-- end generated: {suite} -->"


def spread(values, digits=2):
    """'median [min-max]' of a list of numbers, or the one value when all are equal."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    middle, low, high = statistics.median(values), min(values), max(values)
    text = f"{middle:.{digits}f}"
    if f"{low:.{digits}f}" != f"{high:.{digits}f}":
        text += f" [{low:.{digits}f}–{high:.{digits}f}]"
    return text


def preamble(record, figures="Figures: median over the rounds [min–max]."):
    m = record["machine"]
    rounds = record["rounds"]
    loads = [r["load_average_before"][0] for r in rounds]
    commit = (m.get("commit") or "?")[:10] + (" (uncommitted changes)" if m.get("dirty") else "")
    # reproduce.py records paths inside the repository relative to it.
    command = " ".join(record["command"]).replace("{json}", "ROUND.json").replace(
        "{out}", "OUT").replace("{seed}", "SEED")
    lines = [
        f"{'Quick run' if record['quick'] else 'Full run'} of `benchmarks/reproduce.sh"
        f"{' --quick' if record['quick'] else ''}` (suite `{record['suite']}`), "
        f"data: `docs/data/reproduce/{record['suite']}.json`.",
        f"Machine: {m.get('cpu_model')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB, "
        f"Linux {m.get('kernel')}, {m.get('mpi')}; commit {commit}, {m.get('date')}.",
        f"{len(rounds)} rounds, interleaved (each round runs every configuration once, in the "
        f"order below); 1-minute load average at the start of the rounds: {spread(loads)}. "
        + figures,
        "",
        "```",
        command,
        "```",
        "",
    ]
    return lines


def by_key(record, key):
    """{key(row): [row of round 0, row of round 1, ...]} in the first round's order."""
    table = {}
    for r in record["rounds"]:
        for row in r["rows"]:
            table.setdefault(key(row), []).append(row)
    return table


def render_codecs(record):
    lines = preamble(record)
    isas = sorted({row.get("isa", "?") for r in record["rounds"] for row in r["rows"]})
    size = record["rounds"][0]["rows"][0]["size"]
    lines += [f"{size} f32 elements of N(0, 1); ISA chosen at run time: {', '.join(isas)}. "
              "`enc / memcpy`: encode throughput over `memcpy`'s in the same round.", ""]
    lines += ["| codec | ratio | enc GB/s | enc / memcpy | dec GB/s | dec / memcpy | rel_error |",
              "|---|---|---|---|---|---|---|"]
    for codec, rows in by_key(record, lambda row: row["codec"]).items():
        lines.append(
            f"| {codec} | {spread([r['ratio'] for r in rows])} "
            f"| {spread([r['encode_gbps'] for r in rows])} "
            f"| {spread([r['encode_gbps'] / r['memcpy_gbps'] for r in rows])} "
            f"| {spread([r['decode_gbps'] for r in rows])} "
            f"| {spread([r['decode_gbps'] / r['memcpy_gbps'] for r in rows])} "
            f"| {statistics.median(r['rel_error'] for r in rows):.3e} |")
    return lines


def render_allreduce(record):
    lines = preamble(record)
    ranks = record["rounds"][0]["rows"][0]["ranks"]
    lines += [f"{ranks} ranks. `vs MPI`: `MPI_Allreduce` of the same data in the same round over "
              "gradzip's time; `vs none`: gradzip's own uncompressed algorithm (`none`) at the "
              "same size in the same round over this row's time. `cosine`: with the exact f64 "
              "sum, and its floor (`none` runs on integer data and must be exact); `check`: "
              "every rank within the error bound, above the floor, byte-identical (all rounds).",
              ""]
    lines += ["| spec | algo | size | time_s | vs MPI | vs none | sent/rank | cosine (floor) | check |",
              "|---|---|---|---|---|---|---|---|---|"]
    none_time = {}
    for i, r in enumerate(record["rounds"]):
        for row in r["rows"]:
            if row["spec"].startswith("none"):
                none_time[(i, row["bytes"])] = row["time_s"]
    table = {}
    for i, r in enumerate(record["rounds"]):
        for row in r["rows"]:
            table.setdefault((row["spec"], row["bytes"]), []).append((i, row))
    for (spec, size), entries in sorted(table.items(), key=lambda item: (item[0][1],)):
        rows = [row for _, row in entries]
        algos = sorted({row["algo"] for row in rows})
        vs_none = [none_time[(i, size)] / row["time_s"] for i, row in entries
                   if (i, size) in none_time and row["time_s"] > 0]
        checked = all("max_abs_error" in row for row in rows)
        ok = checked and all(row["ranks_identical"] and row["max_abs_error"] <= row["error_bound"]
                             and row["cosine"] >= row["min_cosine"] for row in rows)
        exact = all(row.get("error_bound") == 0 for row in rows)  # the bench's `none` rows
        if not checked:
            cosine = "-"
        elif exact:
            cosine = "exact" if all(row["max_abs_error"] == 0 for row in rows) else "NOT exact"
        else:
            cosine = (f"{statistics.median(row['cosine'] for row in rows):.3f} "
                      f"(≥ {max(row['min_cosine'] for row in rows):.3f})")
        lines.append(
            f"| {spec} | {', '.join(algos)} | {human_bytes(size)} "
            f"| {spread([row['time_s'] for row in rows], 4)} "
            f"| {spread([row['speedup_vs_mpi'] for row in rows])} "
            f"| {spread(vs_none)} | {human_bytes(max(row['sent_bytes_per_rank'] for row in rows))} "
            f"| {cosine} | {'pass' if ok else ('FAIL' if checked else '-')} |")
    return lines


def render_overlap(record):
    lines = preamble(record)
    first = record["rounds"][0]["rows"][0]
    lines += [f"{first['ranks']} ranks, model {first['model']} ({first['params']} parameters), "
              f"batch {first['batch']}, buckets {human_bytes(first['bucket_bytes'])}. Per round, "
              "each phase's figure is the median of its timed iterations (slowest rank); "
              "`hidden / comm` = (seq_s − ovl_s) / comm_s: the share of the communication that "
              "backward hid; `first launch`: every overlapped step launched its first bucket "
              "before backward's last mark_ready.", ""]
    lines += ["| spec | compute_s | comm_s | seq_s | ovl_s | ovl / max | ovl / compute | "
              "hidden / comm | sent/rank | ratio | first launch |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for spec, rows in by_key(record, lambda row: row["spec"]).items():
        early = all(v > 0 for row in rows for v in row.get("reducer_last_ready_samples_s", [0]))
        lines.append(
            f"| {spec} | {spread([r['compute_s'] for r in rows], 3)} "
            f"| {spread([r['comm_s'] for r in rows], 3)} "
            f"| {spread([r['sequential_s'] for r in rows], 3)} "
            f"| {spread([r['overlapped_s'] for r in rows], 3)} "
            f"| {spread([r['overlap_vs_max'] for r in rows])} "
            f"| {spread([r['overlap_vs_compute'] for r in rows])} "
            f"| {spread([r['hidden_comm_fraction'] for r in rows])} "
            f"| {human_bytes(max(r['sent_bytes'] for r in rows))} "
            f"| {spread([r['compression_ratio'] for r in rows])} "
            f"| {'before the last mark' if early else 'NOT before the last mark'} |")
    return lines


def mean_std(values, digits):
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def render_convergence(record):
    lines = preamble(record, "Figures: as the table's caption says.")
    final = {}  # (label, seed) -> the CSV line of the last epoch
    for seed, r in enumerate(record["rounds"], start=1):
        for row in r["rows"]:
            key = (row["label"], seed)
            if key not in final or row["epoch"] > final[key]["epoch"]:
                final[key] = row
    labels = list(dict.fromkeys(label for label, _ in final))
    command = record["command"]
    if "--only" in command:  # the order the suite ran them in
        ran = command[command.index("--only") + 1].split(",")
        labels = [label for label in ran if label in labels] + \
                 [label for label in labels if label not in ran]
    seeds = sorted({seed for _, seed in final})
    first = next(iter(final.values()))
    lines += [f"Fashion-MNIST, {first['ranks']} ranks, {first['epoch']} epoch(s), seeds "
              f"{', '.join(map(str, seeds))} (one round each). Accuracy and loss: the test set "
              "after the last epoch, mean ± std over the seeds [min–max]. `bytes vs none`: bytes "
              "each rank sent over the whole run over `none`'s with the same seed (what crosses "
              "the wire, headers and the algorithm's own traffic included; the codec's ratio "
              "alone overstates it for top-k, whose all-gather sends each rank's k pairs to "
              "P − 1 ranks).", ""]
    lines += ["| configuration | spec | test accuracy | test loss | bytes vs none | codec ratio |",
              "|---|---|---|---|---|---|"]
    for label in labels:
        rows = [final[(label, s)] for s in seeds if (label, s) in final]
        accuracy = [r["test_accuracy"] for r in rows]
        relative = [final[(label, s)]["bytes_sent"] / final[("none", s)]["bytes_sent"]
                    for s in seeds if (label, s) in final and ("none", s) in final
                    and final[("none", s)]["bytes_sent"] > 0]
        lines.append(
            f"| {label} | `{rows[0]['spec']}` "
            f"| {mean_std([100 * a for a in accuracy], 2)}% [{100 * min(accuracy):.2f}–"
            f"{100 * max(accuracy):.2f}] | {mean_std([r['test_loss'] for r in rows], 3)} "
            f"| {spread(relative, 4)} | {spread([r['compression_ratio'] for r in rows], 1)} |")
    return lines


RENDERERS = {
    "codecs": render_codecs,
    "allreduce_shm": render_allreduce,
    "allreduce_cluster": render_allreduce,
    "overlap": render_overlap,
    "convergence": render_convergence,
}


def rendered_sections(data_dir):
    sections = {}
    for suite, render in RENDERERS.items():
        path = os.path.join(data_dir, f"{suite}.json")
        if os.path.exists(path):
            with open(path) as f:
                sections[suite] = "\n".join(render(json.load(f)))
    return sections


def splice(text, suite, body):
    """text with the lines between suite's markers replaced by body; None without markers."""
    begin, end = begin_marker(suite), end_marker(suite)
    start = text.find(begin + "\n")
    stop = text.find(end, start if start >= 0 else 0)
    if start < 0 or stop < 0:
        return None
    return text[:start + len(begin) + 1] + body + "\n" + text[stop:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.path.join(ROOT, "docs", "data", "reproduce"))
    parser.add_argument("--results", default=os.path.join(ROOT, "docs", "results.md"))
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    with open(args.results) as f:
        original = f.read()
    text = original
    problems = []
    sections = rendered_sections(args.data)
    for suite, body in sections.items():
        spliced = splice(text, suite, body)
        if spliced is None:
            problems.append(f"{suite}: {args.results} lacks the markers '{begin_marker(suite)}' "
                            f"and '{end_marker(suite)}'")
            continue
        if spliced != text and args.check:
            problems.append(f"{suite}: the generated section differs from what "
                            f"{args.data}/{suite}.json gives (run benchmarks/render_results.py)")
        text = spliced
    for suite in RENDERERS:
        if suite not in sections and begin_marker(suite) in original:
            if args.check:
                problems.append(f"{suite}: {args.results} has its section but there is no "
                                f"{args.data}/{suite}.json")
            else:
                print(f"render_results: {suite}: no {args.data}/{suite}.json, section left as is")
    for problem in problems:
        print(f"render_results: {problem}")
    if problems:
        return 1
    if args.check:
        print(f"render_results: {len(sections)} generated sections match their JSON")
        return 0
    if text != original:
        with open(args.results, "w") as f:
            f.write(text)
    print(f"render_results: {len(sections)} sections rendered into {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
