#!/usr/bin/env python3
"""Turns the raw data of benchmarks/reproduce.py into the generated sections of docs/results.md
and README.md.

    python3 benchmarks/render_results.py [--data DIR] [--results FILE] [--readme FILE] [--check]

For every DIR/<suite>.json (default docs/data/reproduce/) it renders a markdown section and puts
it between the markers

    <!-- generated: <suite> (benchmarks/render_results.py; edits here are overwritten) -->
    ...
    <!-- end generated: <suite> -->

in FILE (--results, default docs/results.md: every suite, in full) and, for the suites the
README quotes (RENDERERS and README_RENDERERS below), in README.md (--readme: short tables of the
same figures). A file must hold both markers of every suite it has a renderer and data for. Text
outside the markers, and the sections of suites without data in DIR, are left alone. With
--check nothing is written: it exits 1, naming the sections, when a file's generated text
differs from what the JSON gives (ctest lint.results_generated runs this), and 0 when all match.

Every figure is the median over the suite's rounds with the [min-max] spread; ratios (speedups,
fractions of memcpy) are taken within each round, against the baseline measured in that round,
and then summarised. Each results.md section starts with the machine and the command.
"""
import argparse
import json
import os
import statistics
import sys

import ddp_convergence_report  # benchmarks/, next to this script
from plot_convergence import human_bytes
from spread_text import mean_std, spread

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def begin_marker(suite):
    return f"<!-- generated: {suite} (benchmarks/render_results.py; edits here are overwritten) -->"


def end_marker(suite):
    return f"<!-- end generated: {suite} -->"


def preamble(record, figures="Figures: median over the rounds [min–max]."):
    m = record["machine"]
    rounds = record["rounds"]
    loads = [r["load_average_before"][0] for r in rounds]
    commit = (m.get("commit") or "?")[:10] + (" (uncommitted changes)" if m.get("dirty") else "")
    # reproduce.py records paths inside the repository relative to it.
    steps = record["command"] if isinstance(record["command"][0], list) else [record["command"]]
    command = "\n".join(" ".join(step) for step in steps).replace("{json}", "ROUND.json").replace(
        "{out}", "OUT").replace("{seed}", "SEED").replace("{scratch}", "SCRATCH")
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
    # Runs since the error-feedback column was added have ef_encode_gbps.
    feedback = all("ef_encode_gbps" in row for r in record["rounds"] for row in r["rows"])
    lines += [f"{size} f32 elements of N(0, 1); ISA chosen at run time: {', '.join(isas)}. "
              "`enc / memcpy`: encode throughput over `memcpy`'s in the same round."
              + (" `EF enc`: the encode with error feedback that the collectives run for ef=on "
                 "(g + e, encode, decode, e = g + e − D), whatever the spec's own ef= says."
                 if feedback else ""), ""]
    lines += ["| codec | ratio | enc GB/s | enc / memcpy | dec GB/s | dec / memcpy | "
              + ("EF enc GB/s | EF enc / memcpy | " if feedback else "") + "rel_error |",
              "|---|---|---|---|---|---|---|" + ("---|---|" if feedback else "")]
    for codec, rows in by_key(record, lambda row: row["codec"]).items():
        ef = (f"| {spread([r['ef_encode_gbps'] for r in rows])} "
              f"| {spread([r['ef_encode_gbps'] / r['memcpy_gbps'] for r in rows])} "
              if feedback else "")
        lines.append(
            f"| {codec} | {spread([r['ratio'] for r in rows])} "
            f"| {spread([r['encode_gbps'] for r in rows])} "
            f"| {spread([r['encode_gbps'] / r['memcpy_gbps'] for r in rows])} "
            f"| {spread([r['decode_gbps'] for r in rows])} "
            f"| {spread([r['decode_gbps'] / r['memcpy_gbps'] for r in rows])} "
            + ef + f"| {statistics.median(r['rel_error'] for r in rows):.3e} |")
    return lines


def render_allreduce(record):
    lines = preamble(record)
    ranks = record["rounds"][0]["rows"][0]["ranks"]
    # The link of --link-gbps: the time / wire column exists only for runs given one.
    wired = sorted({row["link_gbps"] for r in record["rounds"] for row in r["rows"]
                    if row.get("link_gbps")})
    lines += [f"{ranks} ranks. `vs MPI`: `MPI_Allreduce` of the same data in the same round over "
              "gradzip's time; `vs none`: gradzip's own uncompressed algorithm (`none`) at the "
              "same size in the same round over this row's time. `cosine`: with the exact f64 "
              "sum, and its floor (`none` runs on integer data and must be exact); `check`: "
              "every rank within the error bound, above the floor, byte-identical (all rounds)."
              + (" `time / wire`: time_s over the time the busiest rank's bytes take at the "
                 f"link's nominal {wired[0]:g} Gbit/s (1: the speed of its bytes)." if wired else ""),
              ""]
    lines += ["| spec | algo | size | time_s | vs MPI | vs none | sent/rank | "
              + ("time / wire | " if wired else "") + "cosine (floor) | check |",
              "|---|---|---|---|---|---|---|---|---|" + ("---|" if wired else "")]
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
            + (f"| {spread([row.get('time_over_wire') for row in rows])} " if wired else "")
            + f"| {cosine} | {'pass' if ok else ('FAIL' if checked else '-')} |")
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


def convergence_final(record):
    """({(label, seed): the CSV line of its last epoch}, labels in the order the suite ran them,
    seeds)."""
    final = {}
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
    return final, labels, sorted({seed for _, seed in final})


def render_convergence(record):
    lines = preamble(record, "Figures: as the table's caption says.")
    final, labels, seeds = convergence_final(record)
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


PEERS_CAPTIONS = {
    "no_communication": "no communication at all (`noop_hook`)",
    "ddp_default": "DDP default all-reduce (gloo)",
    "ddp_fp16_hook": "DDP + PyTorch `fp16_compress_hook`",
    "ddp_powersgd_hook": "DDP + PyTorch PowerSGD hook, rank 4 (chained)",
}


def peers_rows(record):
    """{configuration: [(round index, its result), ...]} in the run's order, and per round the
    ddp_default result (the baseline of speedups and bytes)."""
    table, baseline = {}, {}
    for i, r in enumerate(record["rounds"]):
        for result in r["rows"]["results"]:
            if "skipped" in result:
                continue
            table.setdefault(result["name"], []).append((i, result))
            if result["name"] == "ddp_default":
                baseline[i] = result
    return table, baseline


def peers_caption(name, result):
    if name in PEERS_CAPTIONS:
        return PEERS_CAPTIONS[name]
    return f"gradzip `{result['spec']}`"


def peers_setup(record):
    first = record["rounds"][0]["rows"]
    timed = f"steps {first['warmup']}–{first['warmup'] + first['timed'] - 1}"
    return (f"PyTorch {first.get('torch', '?')} DDP (gloo), {first['ranks']} ranks, each in its "
            f"own network namespace behind a 1 Gbit/s link (gloo and gradzip's MPI both over "
            f"the links), on {record['machine']['cores']} cores shared by the ranks; a "
            f"{first['parameters'] / 1e6:.1f}M-parameter MLP (784-"
            f"{'-'.join(map(str, first['hidden']))}-10) on Fashion-MNIST, global batch "
            f"{first['batch']}, the first {first['dense_steps']} steps of every compressed "
            f"configuration dense")


def render_peers(record):
    lines = preamble(record)
    table, baseline = peers_rows(record)
    first = record["rounds"][0]["rows"]
    lines += [peers_setup(record) + f". Step time: per round the median of {timed_steps(first)}"
              " of the slowest rank's step (forward, backward with its communication, optimizer "
              "step); `speedup`: DDP default's step over this one's, in the same round. `MB/step`: "
              "what one rank hands to the network per step (gradzip: the hook's stats; PyTorch: "
              "by formula, gloo's ring sends 2(P−1)/P × the tensor's bytes); `link MB/step`: what "
              "the rank's link interface transmitted (TCP/IP headers and barriers included). "
              "`algorithms`: what algo=auto ran for the buckets' calls in the timed steps "
              "(`mpi`: MPI's own all-reduce, for parameters under `min_bytes`). `replicas`: every "
              "rank ended with the same parameters.", ""]
    lines += ["| configuration | step (s) | speedup | MB/step | bytes vs default | link MB/step | "
              "algorithms | replicas |",
              "|---|---|---|---|---|---|---|---|"]
    for name, entries in table.items():
        results = [result for _, result in entries]
        speedups = [baseline[i]["step_time_s"] / result["step_time_s"] for i, result in entries
                    if i in baseline and result["step_time_s"] > 0]
        relative = [result["bytes_per_step"] / baseline[i]["bytes_per_step"] for i, result in entries
                    if i in baseline and baseline[i]["bytes_per_step"] > 0]
        links = [result["link_tx_bytes_per_step"] / 1e6 for result in results
                 if result.get("link_tx_bytes_per_step") is not None]
        algorithms = sorted({a for result in results for a in (result.get("algorithms") or {})})
        identical = [result["replicas_identical"] for result in results]
        lines.append(
            f"| {peers_caption(name, results[0])} | {spread([r['step_time_s'] for r in results], 3)} "
            f"| {spread(speedups)} | {spread([r['bytes_per_step'] / 1e6 for r in results])} "
            f"| {spread(relative, 4)} | {spread(links)} | {', '.join(algorithms) or '-'} "
            f"| {'identical' if all(identical) else ('differ' if not any(identical) else 'MIXED')} |")
    return lines


def fsdp_caption(result):
    if result["spec"] is not None:
        return f"gradzip `{result['spec']}`"
    return ("FSDP's native hybrid sharding (gloo)" if result["nodes"] > 1
            else "FSDP's own reduce-scatter (gloo)")


def fsdp_rows(record, against="fsdp_default"):
    """[(caption, [result of each round], [speedup over configuration `against` in each round],
    [bytes over fsdp_default's in each round])] in the run's order."""
    table, baseline, reference = {}, {}, {}
    for i, r in enumerate(record["rounds"]):
        for result in r["rows"]["results"]:
            table.setdefault(result["configuration"], []).append((i, result))
            if result["configuration"] == "fsdp_default":
                baseline[i] = result
            if result["configuration"] == against:
                reference[i] = result
    rows = []
    for entries in table.values():
        results = [result for _, result in entries]
        speedups = [reference[i]["step_time_s"] / result["step_time_s"] for i, result in entries
                    if i in reference and result["step_time_s"]]
        relative = [result["bytes_per_step"] / baseline[i]["bytes_per_step"] for i, result in entries
                    if i in baseline and baseline[i]["bytes_per_step"]]
        rows.append((fsdp_caption(results[0]), results, speedups, relative))
    return rows


def fsdp_bytes_note(hybrid):
    """How the FSDP row's bytes are counted, and what gloo actually sends."""
    if hybrid:
        return ("FSDP: a ring all-reduce's 2 (N − 1) / N of the shard, gloo's all-reduce; the "
                "reduce-scatter inside the node is FSDP's own in every row and not counted")
    return ("FSDP: a ring reduce-scatter's (P − 1) / P of its input, what NCCL sends. PyTorch's "
            "gloo backend reduce-scatters on CPU by an all-reduce of the whole input and a slice, "
            "about twice those bytes, so FSDP's own step here carries that extra traffic; `vs "
            "none`, the speedup over gradzip's uncompressed reduce-scatter (a ring, the formula's "
            "bytes), is what compression gains over the same algorithm")


def fsdp_setup(record):
    first = record["rounds"][0]["rows"]
    settings = first["settings"]
    ranks = first["results"][0]["ranks"]
    nodes = settings["nodes"]
    where = (f"{ranks} ranks, each in its own network namespace behind a 1 Gbit/s link" if nodes == 1
             else f"{nodes} nodes of {ranks // nodes} ranks (a node's ranks share its namespace "
                  f"and loopback; 1 Gbit/s between nodes)")
    return (f"PyTorch {first.get('torch', '?')} FSDP2 (`fully_shard`, gloo), {where}, on "
            f"{record['machine']['cores']} cores shared by the ranks; a byte-level transformer "
            f"({settings['layers']} blocks, width {settings['width']}, {settings['heads']} heads, "
            f"context {settings['context']}) on {first['corpus_bytes'] / 1e3:.0f} KB of licence "
            f"text, AdamW, global batch {settings['batch']}, {settings['steps']} steps")


def render_fsdp(record):
    lines = preamble(record)
    first = record["rounds"][0]["rows"]
    settings = first["settings"]
    hybrid = settings["nodes"] > 1
    reduced = ("the all-reduce of the shards across nodes" if hybrid else "the reduce-scatter")
    evals = [step for step, _ in first["results"][0]["valid_loss"]]
    lines += [fsdp_setup(record) + f". Step time: per round the median of steps "
              f"{settings['warmup']}–{settings['steps'] - 1} of the slowest rank's step (forward, "
              f"backward with the gradient reduction, clipping, AdamW); `speedup`: FSDP's own "
              f"step over this one's, in the same round; `vs none`: gradzip `none`'s step over "
              f"this one's. `MiB/step`: what one rank hands to the network per step in "
              f"{reduced} (gradzip: its stats; {fsdp_bytes_note(hybrid)}); the parameter "
              f"all-gathers are FSDP's own in every row and not counted. Validation loss (nats "
              f"per byte, 16 held-out batches) after the steps given; the runs are "
              f"deterministic, so the rounds agree on it.", ""]
    header = ("| configuration | step (s) | speedup | vs none | MiB/step | bytes vs FSDP |" +
              "".join(f" valid loss @{step} |" for step in evals))
    lines += [header, "|" + "---|" * (6 + len(evals))]
    against_none = {caption: speedups for caption, _, speedups, _ in fsdp_rows(record, "gradzip_none")}
    for caption, results, speedups, relative in fsdp_rows(record):
        losses = "".join(f" {loss:.4f} |" for _, loss in results[0]["valid_loss"])
        lines.append(
            f"| {caption} | {spread([r['step_time_s'] for r in results], 3)} | {spread(speedups)} "
            f"| {spread(against_none[caption])} "
            f"| {spread([r['bytes_per_step'] / 2 ** 20 for r in results])} | {spread(relative, 4)} "
            f"|{losses}")
    return lines


def quantile(values, q):
    """The q-quantile of values as gradzip-bench model reports it (sorted[min(n-1, n*q)])."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def error_summary(record, keep=lambda row: True):
    """(rows per round, [median |error| per round], [90th percentile per round], [max per round])
    over the validation rows that `keep` accepts."""
    medians, p90s, maxima, counts = [], [], [], []
    for r in record["rounds"]:
        errors = [abs(row["error"]) for row in r["rows"]["validation"]["rows"] if keep(row)]
        if errors:
            counts.append(len(errors))
            medians.append(100 * quantile(errors, 0.5))
            p90s.append(100 * quantile(errors, 0.9))
            maxima.append(100 * max(errors))
    return counts, medians, p90s, maxima


# Projection points the tables show: rank counts and link speeds.
PROJECTION_RANKS = [8, 64, 1024, 4096]
BREAK_EVEN_RANKS = [2, 8, 64, 1024, 4096]


def gbps_cell(values):
    """Break-even speeds (Gbit/s) over the rounds: 0 is 'never', None (JSON null) '>1e5'."""
    if all(v == 0 for v in values):
        return "never"
    if all(v is None for v in values):
        return ">1e5"
    finite = [v for v in values if v]
    return spread(finite, 0) if max(finite) >= 10 else spread(finite, 1)


def projection_tables(record, ranks_shown, gbps_shown):
    """Markdown rows: speedup of algo=auto's choice over dense f32 / f16 at each link speed in
    gbps_shown and rank count; then the break-even speeds."""
    rounds = [r["rows"] for r in record["rounds"]]
    specs = list(dict.fromkeys(row["spec"] for row in rounds[0]["projection"]["rows"]))
    model = rounds[0]["projection"]["rows"][0]["model"]
    lines = []
    for gbps in gbps_shown:
        lines += ["", f"{model}, {gbps:g} Gbit/s: speedup over the dense f32 / the dense 16-bit "
                  "all-reduce [the algorithm algo=auto runs]:", "",
                  "| P | " + " | ".join(specs) + " |", "|---|" + "---|" * len(specs)]
        for ranks in ranks_shown:
            cells = []
            for spec in specs:
                points = [row for doc in rounds for row in doc["projection"]["rows"]
                          if row["spec"] == spec and row["ranks"] == ranks and row["gbps"] == gbps]
                if not points:
                    cells.append("-")
                    continue
                f32 = [p["dense_f32_seconds"] / p["seconds"] for p in points]
                f16 = [p["dense_f16_seconds"] / p["seconds"] for p in points]
                algorithms = sorted({p["algorithm"] for p in points})
                cells.append(f"{statistics.median(f32):.2f} / {statistics.median(f16):.2f} "
                             f"[{', '.join(algorithms)}]")
            lines.append(f"| {ranks} | " + " | ".join(cells) + " |")
    lines += ["", f"{model}: break-even link speed (Gbit/s) against the dense f32 / the dense "
              "16-bit all-reduce; above it the codec no longer pays ('never': not even at 0.01 "
              "Gbit/s; fp16 *is* the 16-bit baseline):", "",
              "| P | " + " | ".join(specs) + " |", "|---|" + "---|" * len(specs)]
    for ranks in BREAK_EVEN_RANKS:
        cells = []
        for spec in specs:
            points = [row for doc in rounds for row in doc["break_even"]
                      if row["spec"] == spec and row["ranks"] == ranks]
            cells.append(f"{gbps_cell([p['vs_f32_gbps'] for p in points])} / "
                         f"{gbps_cell([p['vs_f16_gbps'] for p in points])}" if points else "-")
        lines.append(f"| {ranks} | " + " | ".join(cells) + " |")
    return lines


def render_cost_model(record):
    lines = preamble(record, "Figures: the median over the rounds [min–max] of each round's "
                     "own figure (every round measures its rows and γ afresh).")
    first = record["rounds"][0]["rows"]["validation"]
    lines += [f"Validation: the model against every all-reduce row measured in the round "
              f"(P = 2, 3, 4; 1 Gbit/s emulated links). The link is not fitted: β is the tc rate "
              f"× TCP's payload share ({first['link_efficiency']:.4f}), α = "
              f"{first['link_latency_us']:g} µs; γ is measured in the same process on a tensor "
              f"of the row's size, × P / {first['cores']:g} when P ranks share the "
              f"{first['cores']:g} cores. |model − measured| / measured:", "",
              "| rows | count | median | 90th percentile | worst |", "|---|---|---|---|---|"]
    groups = [
        ("all", lambda row: True),
        ("≥ 1 MiB", lambda row: row["bytes"] >= 2 ** 20),
        ("P = 2", lambda row: row["ranks"] == 2),
        ("P = 3, 4 (ranks share the cores)", lambda row: row["ranks"] > 2),
    ]
    algorithms = list(dict.fromkeys(row["algo"] for row in first["rows"]))
    groups += [(f"algorithm {a}", lambda row, a=a: row["algo"] == a) for a in algorithms]
    for label, keep in groups:
        counts, medians, p90s, maxima = error_summary(record, keep)
        if counts:
            lines.append(f"| {label} | {max(counts)} | {spread(medians, 0)}% | {spread(p90s, 0)}% "
                         f"| {spread(maxima, 0)}% |")
    lines += ["", "<details><summary>Every row (round 1; error = (model − measured) / measured)"
              "</summary>", "", "| spec | algo | P | size | measured (s) | model (s) | error |",
              "|---|---|---|---|---|---|---|"]
    for row in first["rows"]:
        lines.append(f"| {row['spec']} | {row['algo']} | {row['ranks']} | {human_bytes(row['bytes'])} "
                     f"| {row['measured_s']:.3e} | {row['model_s']:.3e} | {100 * row['error']:+.0f}% |")
    lines += ["", "</details>", "",
              f"Projection (α = {record['rounds'][0]['rows']['projection']['latency_us']:g} µs, γ "
              "of this CPU; the validation above used α = "
              f"{first['link_latency_us']:g} µs at P ≤ 4, so every row beyond P = 4 is the "
              "model extrapolated, not a measurement): the time of the algorithm algo=auto runs for each codec "
              "(choose_allreduce with this model: the codec's default unless another of its auto "
              "candidates is predicted at least 15% faster) against the cheapest dense f32 and "
              "dense 16-bit all-reduce (ring, SRA, rhd or tree: what a tuned library gives). "
              "Median over the rounds."]
    lines += projection_tables(record, PROJECTION_RANKS, [1, 10, 100])
    return lines


def render_ddp_convergence(record):
    return preamble(record, "Figures: as the table's caption says.") + ddp_convergence_report.render(record)


def timed_steps(first):
    return f"steps {first['warmup']}–{first['warmup'] + first['timed'] - 1}"


RENDERERS = {
    "codecs": render_codecs,
    "allreduce_shm": render_allreduce,
    "allreduce_cluster": render_allreduce,
    "overlap": render_overlap,
    "convergence": render_convergence,
    "peers": render_peers,
    "fsdp": render_fsdp,
    "fsdp_hybrid": render_fsdp,
    "cost_model": render_cost_model,
    "lm": render_ddp_convergence,
    "cnn": render_ddp_convergence,
}


# README.md's headline sections: short tables quoting the same JSON as docs/results.md's.
def readme_convergence(record):
    final, labels, seeds = convergence_final(record)
    first = next(iter(final.values()))
    lines = [f"{'Quick run' if record['quick'] else 'Full run'}, "
             f"{first['ranks']} ranks, {first['epoch']} epoch(s), seeds "
             f"{', '.join(map(str, seeds))}; data `docs/data/reproduce/convergence.json`, "
             f"{record['machine']['date'][:10]}.", "",
             "| spec | test accuracy | bytes sent vs `none` |", "|---|---|---|"]
    for label in labels:
        rows = [final[(label, s)] for s in seeds if (label, s) in final]
        relative = [final[(label, s)]["bytes_sent"] / final[("none", s)]["bytes_sent"]
                    for s in seeds if (label, s) in final and ("none", s) in final
                    and final[("none", s)]["bytes_sent"] > 0]
        factor = statistics.median(relative) if relative else None
        fewer = f" ({1 / factor:.1f}× fewer)" if factor and factor < 0.5 else ""
        # Below twice chance (10 classes) on every seed: it did not train.
        diverged = " (diverged)" if all(r["test_accuracy"] < 0.2 for r in rows) else ""
        lines.append(f"| `{rows[0]['spec']}` | {mean_std([100 * r['test_accuracy'] for r in rows], 2)}%{diverged} "
                     f"| {spread(relative, 4)}{fewer} |")
    return lines


def readme_peers(record):
    table, baseline = peers_rows(record)
    first = record["rounds"][0]["rows"]
    lines = [f"{'Quick run' if record['quick'] else 'Full run'}: " + peers_setup(record) +
             f"; {len(record['rounds'])} rounds, each running every configuration once, median "
             f"[min–max] over the rounds of the step time ({timed_steps(first)}, slowest rank). "
             f"Data `docs/data/reproduce/peers.json`, {record['machine']['date'][:10]}.", "",
             "| configuration | step (s) | speedup vs default | MB/rank/step |", "|---|---:|---:|---:|"]
    for name, entries in table.items():
        results = [result for _, result in entries]
        speedups = [baseline[i]["step_time_s"] / result["step_time_s"] for i, result in entries
                    if i in baseline and result["step_time_s"] > 0]
        lines.append(f"| {peers_caption(name, results[0])} "
                     f"| {spread([r['step_time_s'] for r in results], 2)} | {spread(speedups)} "
                     f"| {spread([r['bytes_per_step'] / 1e6 for r in results])} |")
    return lines


def readme_cost_model(record):
    counts, medians, p90s, maxima = error_summary(record)
    big = error_summary(record, lambda row: row["bytes"] >= 2 ** 20)
    lines = [f"{'Quick run' if record['quick'] else 'Full run'}; data "
             f"`docs/data/reproduce/cost_model.json`, {record['machine']['date'][:10]}. The model "
             f"against all {max(counts)} measured all-reduce rows (P = 2, 3, 4, 4 KiB to "
             f"the largest size, every algorithm; {len(record['rounds'])} rounds): |error| median "
             f"{spread(medians, 0)}%, 90th percentile {spread(p90s, 0)}%, worst {spread(maxima, 0)}% "
             f"(rows of 1 MiB and more: median {spread(big[1], 0)}%, 90th percentile "
             f"{spread(big[2], 0)}%, worst {spread(big[3], 0)}%), with α = "
             f"{record['rounds'][0]['rows']['validation']['link_latency_us']:g} µs. Projected, "
             f"an extrapolation from P ≤ 4 with α = "
             f"{record['rounds'][0]['rows']['projection']['latency_us']:g} µs, with what algo=auto "
             "would run, against the cheapest dense f32 / 16-bit all-reduce:"]
    lines += projection_tables(record, [8, 1024], [1, 10])
    return lines


def readme_fsdp(record):
    lines = [f"{'Quick' if record['quick'] else 'Full'} run: {fsdp_setup(record)}; "
             f"{len(record['rounds'])} rounds, median [min–max] of the step time. Data "
             f"`docs/data/reproduce/{record['suite']}.json`, {record['machine']['date'][:10]}.", "",
             "| configuration | step (s) | speedup vs FSDP | vs gradzip `none` | MiB/rank/step "
             "| final valid loss |",
             "|---|---:|---:|---:|---:|---:|"]
    against_none = {caption: speedups for caption, _, speedups, _ in fsdp_rows(record, "gradzip_none")}
    for caption, results, speedups, _ in fsdp_rows(record):
        lines.append(f"| {caption} | {spread([r['step_time_s'] for r in results])} "
                     f"| {spread(speedups)} | {spread(against_none[caption])} "
                     f"| {spread([r['bytes_per_step'] / 2 ** 20 for r in results])} "
                     f"| {results[0]['valid_loss'][-1][1]:.4f} |")
    return lines


README_RENDERERS = {
    "convergence": readme_convergence,
    "peers": readme_peers,
    "fsdp": readme_fsdp,
    "fsdp_hybrid": readme_fsdp,
    "cost_model": readme_cost_model,
    "lm": ddp_convergence_report.readme,
    "cnn": ddp_convergence_report.readme,
}


def rendered_sections(data_dir, renderers):
    sections = {}
    for suite, render in renderers.items():
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


def render_file(path, renderers, data_dir, check):
    """Splices `renderers`' sections into the file at `path` (with --check: compares only).
    Returns (problems, sections rendered)."""
    with open(path) as f:
        original = f.read()
    text = original
    problems = []
    sections = rendered_sections(data_dir, renderers)
    for suite, body in sections.items():
        spliced = splice(text, suite, body)
        if spliced is None:
            problems.append(f"{suite}: {path} lacks the markers '{begin_marker(suite)}' "
                            f"and '{end_marker(suite)}'")
            continue
        if spliced != text and check:
            problems.append(f"{suite}: {path}'s generated section differs from what "
                            f"{data_dir}/{suite}.json gives (run benchmarks/render_results.py)")
        text = spliced
    for suite in renderers:
        if suite not in sections and begin_marker(suite) in original:
            if check:
                problems.append(f"{suite}: {path} has its section but there is no "
                                f"{data_dir}/{suite}.json")
            else:
                print(f"render_results: {suite}: no {data_dir}/{suite}.json, section of {path} "
                      "left as is")
    if not check and not problems and text != original:
        with open(path, "w") as f:
            f.write(text)
    return problems, len(sections)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.path.join(ROOT, "docs", "data", "reproduce"))
    parser.add_argument("--results", default=os.path.join(ROOT, "docs", "results.md"))
    parser.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    problems, counts = [], []
    for path, renderers in ((args.results, RENDERERS), (args.readme, README_RENDERERS)):
        found, count = render_file(path, renderers, args.data, args.check)
        problems += found
        counts.append(f"{count} in {os.path.relpath(path, ROOT)}")
    for problem in problems:
        print(f"render_results: {problem}")
    if problems:
        return 1
    print(f"render_results: generated sections {'match their JSON' if args.check else 'rendered'}: "
          f"{', '.join(counts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
