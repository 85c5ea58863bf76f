#!/usr/bin/python3
"""Draws a gradzip timeline (the Reducer's or the DDP hook's Chrome trace JSON, one file per
rank) as a Gantt chart, and merges the ranks' files into one trace for ui.perfetto.dev.

    /usr/bin/python3 benchmarks/plot_timeline.py TRACE.rank0.json [TRACE.rank1.json ...]
        [--png OUT.png] [--merged OUT.json] [--title TEXT]

Each file holds one rank (otherData.rank) with timestamps in microseconds since its own
origin (otherData.origin_epoch_us, on the system clock): the ranks are lined up on that clock
and drawn from the earliest event. One row per rank and track: the training loop's (the step
and wait spans, a tick per mark_ready, a triangle per bucket launch) and one per lane, whose
task spans are drawn pale, each call in them outlined and its stages over it (encode,
communicate, decode; copies grey): a call's time outside its stages is its call check with
the other ranks (waiting for the slowest) and the choices made before data moves. --merged writes all ranks' events, shifted to the common clock, as one trace file.
Needs matplotlib for --png (Debian's python3-matplotlib of /usr/bin/python3).
"""
import argparse
import json
import sys

STAGE_COLOURS = {"encode": "tab:orange", "communicate": "tab:blue", "decode": "tab:green"}
COPY_COLOUR = "0.55"
TASK_COLOUR = "0.88"
WAIT_COLOUR = "tab:red"
STEP_COLOUR = "0.80"


def load(paths):
    """[(rank, origin_epoch_us, events)] sorted by rank."""
    traces = []
    for path in paths:
        with open(path) as f:
            trace = json.load(f)
        other = trace.get("otherData", {})
        traces.append((other.get("rank", 0), other.get("origin_epoch_us", 0), trace["traceEvents"]))
    return sorted(traces, key=lambda t: t[0])


def merged(traces):
    """One trace of every rank's events, their timestamps moved to the earliest origin."""
    base = min(origin for _, origin, _ in traces)
    events = []
    for _, origin, rank_events in traces:
        for event in rank_events:
            event = dict(event)
            if "ts" in event:
                event["ts"] = round(event["ts"] + (origin - base), 3)
            events.append(event)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"origin_epoch_us": base}}


def draw(traces, png, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    base = min(origin + min((e["ts"] for e in ev if "ts" in e), default=0) for _, origin, ev in traces)
    rows = []  # (label, rank, tid)
    for rank, _, events in traces:
        names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
        for tid in sorted(names):
            rows.append((f"rank {rank} {names[tid]}", rank, tid))
    row_of = {(rank, tid): i for i, (_, rank, tid) in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.6))
    for rank, origin, events in traces:
        shift = origin - base

        def ms(ts):
            return (ts + shift) / 1000.0

        for e in events:
            row = row_of.get((rank, e.get("tid")))
            if row is None or e["ph"] not in ("X", "i"):
                continue
            y = len(rows) - 1 - row
            if e["ph"] == "i":
                if e["cat"] == "launch":
                    ax.plot(ms(e["ts"]), y + 0.42, marker="v", color="black", markersize=5,
                            zorder=3)
                else:
                    ax.plot([ms(e["ts"])] * 2, [y - 0.3, y + 0.3], color="tab:purple", linewidth=0.8,
                            zorder=3)
                continue
            start, width = ms(e["ts"]), e["dur"] / 1000.0
            if e["cat"] == "task":
                ax.barh(y, width, left=start, height=0.8, color=TASK_COLOUR, edgecolor="0.6",
                        linewidth=0.4, zorder=1)
            elif e["cat"] == "stage":
                ax.barh(y, width, left=start, height=0.5, color=STAGE_COLOURS.get(e["name"], "k"),
                        linewidth=0, zorder=2)
            elif e["cat"] == "call":  # an outline: its time outside the stages is the call
                # check with the other ranks and the choices before the data moves
                ax.barh(y, width, left=start, height=0.6, fill=False, edgecolor="black",
                        linewidth=0.5, zorder=2)
            elif e["cat"] == "copy":
                ax.barh(y, width, left=start, height=0.5, color=COPY_COLOUR, linewidth=0, zorder=2)
            elif e["cat"] == "step":
                ax.barh(y, width, left=start, height=0.8, color=STEP_COLOUR, linewidth=0, zorder=1)
            elif e["cat"] == "wait":
                ax.barh(y, width, left=start, height=0.35, color=WAIT_COLOUR, linewidth=0, zorder=2)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _, _ in reversed(rows)], fontsize=8)
    ax.set_xlabel("ms since the first event")
    ax.set_title(title, fontsize=10)
    handles = [Patch(color=c, label=n) for n, c in STAGE_COLOURS.items()]
    handles += [Patch(color=COPY_COLOUR, label="pack / unpack"),
                Patch(color=TASK_COLOUR, label="chunk task"),
                Patch(fill=False, edgecolor="black", label="call"),
                Patch(color=WAIT_COLOUR, label="wait()"),
                Patch(color=STEP_COLOUR, label="step")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=8,
              fontsize=8, frameon=False)
    ax.grid(axis="x", linewidth=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--png")
    parser.add_argument("--merged")
    parser.add_argument("--title", default="gradzip timeline")
    args = parser.parse_args(argv)
    traces = load(args.traces)
    if args.merged:
        with open(args.merged, "w") as f:
            json.dump(merged(traces), f)
        print(f"wrote {args.merged}")
    if args.png:
        draw(traces, args.png, args.title)
    if not args.png and not args.merged:
        parser.error("nothing to do: give --png and/or --merged")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
