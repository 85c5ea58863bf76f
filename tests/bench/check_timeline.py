#!/usr/bin/env python3
"""ctest bench_overlap_timeline: the Reducer's timeline (`gradzip-bench overlap --trace`) holds
the step it recorded, and its spans nest and come in the order the Reducer promises.

    python3 tests/bench/check_timeline.py BENCH MPIEXEC WORK_DIR

Runs `gradzip-bench overlap` on the small model at 2 and 3 ranks with 2 lanes for fp16, top-k
and 4-bit qsgd (--trace: the last overlapped step), then checks every rank's file:
  - it is JSON with traceEvents; every event has this rank as pid; tracks 0 ("training loop")
    and 1 + l ("lane l") are named;
  - spans ("X") on one track nest: any two are disjoint or one holds the other;
  - on the lanes, every top-level span is a task (category "task"); calls ("call") lie directly
    in a task; stages ("stage": encode, communicate, decode) lie in a call; copies ("copy":
    pack, unpack) lie in a task outside its call;
  - one task per chunk of the step: as many tasks per (bucket, group) as the bench JSON's
    Reducer stats give chunks (rank 0), each task holding exactly one call named after it;
  - order: one mark_ready per tensor; buckets launched in order, each after the mark_ready of
    each of its tensors; every task of a bucket starts after its launch and ends before the
    bucket's async span ends, which begins at the launch; the step span holds every mark_ready
    and ends with the wait span, which ends after every task;
  - bytes: a call's encode stages count its encoded message bytes, its calls' sent bytes (MPI's
    own all-reduce counted as the Reducer counts it, 2(P-1)/P of its f32 bytes) add up to the
    Reducer's sent_bytes of that step (rank 0's stats in the bench JSON);
  - every rank's lanes ran the same calls in the same order.
Then it breaks a good file in ways a broken recorder would (a stage moved out of its call, a
task dropped, two launches swapped, a call's bytes changed, a span ending after its parent) and
requires each to be rejected, so none of these checks passes whatever the file holds.
Exit 0 when all hold, 1 naming every failure.
"""
import copy
import json
import os
import subprocess
import sys

SPECS = ["fp16", "topk:ratio=0.01", "qsgd:bits=4"]
RANKS = [2, 3]
LANES = 2
# Timestamps have three decimals of a microsecond and durations twelve digits: comparisons of
# a span's ends allow this much rounding.
SLACK_US = 0.005


class TraceError(Exception):
    pass


def require(condition, message):
    if not condition:
        raise TraceError(message)


def spans_of(events, tid):
    return [e for e in events if e["ph"] == "X" and e["tid"] == tid]


def end_of(span):
    return span["ts"] + span["dur"]


def inside(child, parent):
    return child["ts"] >= parent["ts"] - SLACK_US and end_of(child) <= end_of(parent) + SLACK_US


def nest(spans):
    """Each span with its parent (or None), checking that the spans of one track nest."""
    ordered = sorted(spans, key=lambda s: (s["ts"], -s["dur"]))
    stack, parent_of = [], []
    for span in ordered:
        while stack and span["ts"] >= end_of(stack[-1]) - SLACK_US and not (
                span["dur"] == 0 and span["ts"] <= end_of(stack[-1])):
            stack.pop()
        if stack:
            require(inside(span, stack[-1]),
                    f"span '{span['name']}' [{span['ts']}, {end_of(span)}] overlaps "
                    f"'{stack[-1]['name']}' [{stack[-1]['ts']}, {end_of(stack[-1])}] on track "
                    f"{span['tid']} without nesting in it")
        parent_of.append((span, stack[-1] if stack else None))
        stack.append(span)
    return parent_of


def ring_bytes(count, ranks):
    return 2 * (ranks - 1) * count * 4 // ranks if ranks > 1 else 0


def check_file(trace, rank, ranks, stats):
    """Checks one rank's trace against the Reducer stats of its step; returns the per-lane call
    names (for the check across ranks)."""
    events = trace["traceEvents"]
    require(trace.get("otherData", {}).get("rank") == rank, "otherData.rank is not the rank")
    require(all(e["pid"] == rank for e in events), "an event has another pid than the rank")
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    expected_names = {0: "training loop", **{1 + l: f"lane {l}" for l in range(LANES)}}
    require(names == expected_names, f"track names {names}, expected {expected_names}")

    # Track 0: mark_ready instants, launches, the step and wait spans.
    marks = [e for e in events if e["ph"] == "i" and e["cat"] == "ready"]
    launches = [e for e in events if e["ph"] == "i" and e["cat"] == "launch"]
    tensors = [t for b in stats["buckets"] for g in b["groups"] for t in g["tensors"]]
    require(len(marks) == len(tensors), f"{len(marks)} mark_ready events, {len(tensors)} tensors")
    require(sorted(m["name"].split(" ", 1)[1] for m in marks) == sorted(tensors),
            "the mark_ready events do not name each tensor once")
    require([l["args"]["bucket"] for l in sorted(launches, key=lambda e: e["ts"])] ==
            list(range(len(stats["buckets"]))), "buckets were not launched once each, in order")
    launch_at = {l["args"]["bucket"]: l["ts"] for l in launches}
    for m in marks:
        require(m["ts"] <= launch_at[m["args"]["bucket"]] + SLACK_US,
                f"bucket {m['args']['bucket']} launched before '{m['name']}'")
    training = nest(spans_of(events, 0))
    steps = [s for s, p in training if s["cat"] == "step"]
    waits = [s for s, p in training if s["cat"] == "wait"]
    require(len(steps) == 1 and len(waits) == 1, "not one step span and one wait span")
    step, wait = steps[0], waits[0]
    require(inside(wait, step) and abs(end_of(wait) - end_of(step)) <= SLACK_US,
            "the wait span does not end the step span")
    require(all(step["ts"] - SLACK_US <= m["ts"] <= end_of(step) + SLACK_US for m in marks),
            "a mark_ready lies outside the step span")

    # The lanes.
    tasks, calls, lane_calls = [], [], {}
    for lane in range(LANES):
        lane_calls[lane] = []
        for span, parent in nest(spans_of(events, 1 + lane)):
            category = span["cat"]
            if parent is None:
                require(category == "task", f"'{span['name']}' ({category}) outside any task")
                tasks.append(span)
            elif category == "call":
                require(parent["cat"] == "task", f"call '{span['name']}' not directly in a task")
                require(span["name"].split(" ", 1)[1] == parent["name"],
                        f"call '{span['name']}' in task '{parent['name']}'")
                calls.append(span)
                lane_calls[lane].append(span["name"])
            elif category == "stage":
                require(parent["cat"] in ("call", "stage"),
                        f"stage '{span['name']}' in a {parent['cat']}, not in a call")
                require(span["name"] in ("encode", "communicate", "decode"),
                        f"unknown stage '{span['name']}'")
            elif category == "copy":
                require(parent["cat"] == "task", f"copy '{span['name']}' in a {parent['cat']}")
            else:
                require(False, f"unexpected category '{category}' on lane {lane}")
    for task in tasks:
        held = [c for c in calls if c["tid"] == task["tid"] and inside(c, task)]
        require(len(held) == 1, f"task '{task['name']}' holds {len(held)} calls")
        bucket = task["args"]["bucket"]
        require(task["ts"] >= launch_at[bucket] - SLACK_US,
                f"task '{task['name']}' started before bucket {bucket} was launched")
        require(end_of(task) <= end_of(wait) + SLACK_US, f"task '{task['name']}' ended after wait")
    for b, bucket in enumerate(stats["buckets"]):
        for g, group in enumerate(bucket["groups"]):
            count = sum(1 for t in tasks if t["args"]["bucket"] == b and t["args"]["group"] == g)
            require(count == group["chunks"],
                    f"bucket {b} group {g}: {count} tasks, the Reducer ran {group['chunks']} chunks")
    begins = {e["id"]: e for e in events if e["ph"] == "b"}
    ends = {e["id"]: e for e in events if e["ph"] == "e"}
    require(begins.keys() == ends.keys() and len(begins) == len(stats["buckets"]),
            "not one async span (begin and end) per bucket")
    for span_id, begin in begins.items():
        bucket = begin["args"]["bucket"]
        require(abs(begin["ts"] - launch_at[bucket]) <= SLACK_US,
                f"bucket {bucket}'s span does not begin at its launch")
        for t in tasks:
            if t["args"]["bucket"] == bucket:
                require(end_of(t) <= ends[span_id]["ts"] + SLACK_US,
                        f"task '{t['name']}' ends after bucket {bucket}'s span")

    # Bytes.
    sent = 0
    for call in calls:
        args = call["args"]
        sent += ring_bytes(args["count"], ranks) if args["algorithm"] == "mpi" else args["sent_bytes"]
        encoded = sum(s.get("args", {}).get("encoded_message_bytes", 0)
                      for s in spans_of(events, call["tid"])
                      if s["cat"] == "stage" and s["name"] == "encode" and inside(s, call))
        require(encoded == args["encoded_message_bytes"],
                f"call '{call['name']}': its encode stages count {encoded} message bytes, the "
                f"call {args['encoded_message_bytes']}")
    if rank == 0:
        require(sent == stats["sent_bytes"],
                f"the calls sent {sent} bytes, the Reducer's stats say {stats['sent_bytes']}")
    return lane_calls


def mutants(trace):
    """Broken copies of a good trace, each named; check_file must reject every one."""
    events = trace["traceEvents"]

    def broken(name, change):
        copied = copy.deepcopy(trace)
        change(copied["traceEvents"])
        return name, copied

    first_stage = next(i for i, e in enumerate(events) if e["ph"] == "X" and e["cat"] == "stage")
    first_task = next(i for i, e in enumerate(events) if e["ph"] == "X" and e["cat"] == "task")
    first_call = next(i for i, e in enumerate(events)
                      if e["ph"] == "X" and e["cat"] == "call" and e["args"]["sent_bytes"] > 0)
    launch_indices = [i for i, e in enumerate(events) if e["ph"] == "i" and e["cat"] == "launch"]

    def move_stage_out(ev):
        ev[first_stage]["ts"] -= 1e6

    def drop_task(ev):
        del ev[first_task]

    def swap_launches(ev):
        a, b = ev[launch_indices[0]], ev[launch_indices[1]]
        a["ts"], b["ts"] = b["ts"], a["ts"]

    def change_bytes(ev):
        ev[first_call]["args"]["sent_bytes"] += 4

    def stretch_call(ev):
        ev[first_call]["dur"] += 1e6

    return [broken("a stage moved out of its call", move_stage_out),
            broken("a task dropped", drop_task),
            broken("two launches swapped", swap_launches),
            broken("a call's sent bytes changed", change_bytes),
            broken("a call ending after its task", stretch_call)]


def main():
    bench, mpiexec, work = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    failures = []
    env = dict(os.environ, GRADZIP_LINK="50,0.1")  # algo=auto's choice independent of the load
    for ranks in RANKS:
        trace_path = os.path.join(work, f"trace.np{ranks}.json")
        json_path = os.path.join(work, f"overlap.np{ranks}.json")
        command = [mpiexec, "-np", str(ranks), "--oversubscribe", "--bind-to", "none", bench,
                   "overlap", "--model", "small", "--batch", "256", "--iters", "1", "--warmup", "1",
                   "--lanes", str(LANES), "--first-bucket-bytes", "262144",
                   "--bucket-bytes", "524288", "--chunk-bytes", "131072",
                   "--trace", trace_path, "--json", json_path]
        for spec in SPECS:
            command += ["--codec", spec]
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
        if run.returncode != 0:
            failures.append(f"np{ranks}: gradzip-bench overlap failed ({run.returncode}):\n"
                            f"{run.stdout}\n{run.stderr}")
            continue
        with open(json_path) as f:
            rows = json.load(f)
        for s, spec in enumerate(SPECS):
            stats = rows[s]["reducer_stats"]
            per_rank = []
            for rank in range(ranks):
                path = trace_path.replace(".json", f".spec{s}.rank{rank}.json")
                try:
                    with open(path) as f:
                        trace = json.load(f)
                    per_rank.append(check_file(trace, rank, ranks, stats))
                except (OSError, ValueError, KeyError, TraceError) as error:
                    failures.append(f"np{ranks} {spec} rank {rank} ({path}): {error}")
                    continue
                if rank == 0:
                    for name, bad in mutants(trace):
                        try:
                            check_file(bad, rank, ranks, stats)
                            failures.append(f"np{ranks} {spec}: the check passed a trace with "
                                            f"{name}")
                        except (KeyError, TraceError, StopIteration):
                            pass
            if per_rank and any(calls != per_rank[0] for calls in per_rank):
                failures.append(f"np{ranks} {spec}: the ranks' lanes ran different calls")
            tasks = sum(len(v) for v in per_rank[0].values()) if per_rank else 0
            print(f"np{ranks} {spec}: {ranks} files, {tasks} calls per rank on {LANES} lanes, "
                  f"{stats['sent_bytes']} bytes sent by rank 0: checked")
    for failure in failures:
        print("FAIL:", failure)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
