#!/usr/bin/env python3
"""The walk of a tensor through the code: which source files one Communicator::allreduce call
runs in, in order, and how often it comes back to a file it had left.

    python3 scripts/walk.py [COMMIT ...] [--spec SPEC] [--elements N] [--ranks P] [--out DIR]
    python3 scripts/walk.py --self-test    the walk and its counts on made-up events (ctest:
                                           lint.walk)

Each COMMIT (default HEAD) is checked out into a temporary git worktree and its library built
there (Release, -g, every function compiled with -finstrument-functions, CUDA and Python off;
through
ccache as scripts/configure-and-build.sh does), installed into a prefix, and scripts/walk/ (this
checkout's copy) built against it. `mpirun -np P walk SPEC N` then records, on rank 0, every
function entry and exit of one Communicator::allreduce of N f32 elements (after two warm-up
calls of the same spec and size), and addr2line maps each function to the file that defines it.
N defaults to 32768 (128 KiB, above the default min_bytes, so the codec runs): the element
math is instrumented too, about ten events per element, and the program keeps 4 Mi events.

The walk of a thread is the sequence of files its innermost project function lies in, each
time that file changes (a call into another file, or the return from it). Two walks are
reported: `files` counts every file of the repository (headers too: an inline helper in a
header is a visit to the header), `implementation` only .cpp / .cu files (a header's function
counts as part of the .cpp that called it). For each: the distinct files, the visits, and the
returns (visits to a file already visited before: visits minus distinct files), the most
visited files, and the files visited more than twice; and the same with the loops collapsed
(a return to a file counts once per file it returns from, so that a loop calling a helper in
another file once per bucket is one return, not one per bucket): the structural returns, and
the files returned to from more than one file. The calling thread's walk is the one
that follows the tensor; other threads (a transport's progress thread) are listed separately.

Written to DIR (default docs/data/walk/<date>): walk-<commit>.json per commit (the counts of
both walks and the implementation walk itself) and summary.txt (what it printed).
"""
import argparse
import collections
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE_PATH = re.compile(r"/tree-[0-9a-f]{12}/(.+)$")
INSTRUMENT = ("-g -finstrument-functions "
              "-finstrument-functions-exclude-file-list=/usr/include,/usr/lib,/usr/local")


def run(command, log, cwd=None, env=None):
    with open(log, "a") as sink:
        sink.write("$ " + " ".join(str(c) for c in command) + "\n")
        sink.flush()
        done = subprocess.run(command, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(str(c) for c in command)} failed (log: {log})")


def build_walk(commit, workdir, log):
    """The walk program built against `commit`'s instrumented library; returns (program, tree)."""
    tree = workdir / f"tree-{commit[:12]}"
    run(["git", "worktree", "add", "--detach", str(tree), commit], log, cwd=ROOT)
    run(["bash", "scripts/configure-and-build.sh", "--target", "gradzip",
         "-DGRADZIP_BUILD_TESTS=OFF", "-DGRADZIP_BUILD_BENCHMARKS=OFF",
         "-DGRADZIP_BUILD_EXAMPLES=OFF", "-DGRADZIP_WITH_CUDA=OFF", "-DGRADZIP_WITH_PYTHON=OFF",
         f"-DCMAKE_CXX_FLAGS={INSTRUMENT}"], log, cwd=tree)
    prefix, out = workdir / f"prefix-{commit[:12]}", workdir / f"walk-{commit[:12]}"
    run(["cmake", "--install", str(tree / "build"), "--prefix", str(prefix)], log)
    run(["cmake", "-S", str(ROOT / "scripts" / "walk"), "-B", str(out),
         f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"], log)
    run(["cmake", "--build", str(out)], log)
    return out / "walk", tree


def record(program, spec, elements, ranks, events, log):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    run(["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", str(program), spec,
         str(elements), str(events)], log, env=env)


def locate(program, addresses, tree):
    """{address: repository-relative file, or None outside the repository} by addr2line."""
    located = {}
    ordered = sorted(addresses)
    for start in range(0, len(ordered), 2000):
        part = ordered[start:start + 2000]
        output = subprocess.run(["addr2line", "-f", "-C", "-e", str(program)] +
                                [hex(a) for a in part], capture_output=True, text=True,
                                check=True).stdout.splitlines()
        for i, address in enumerate(part):
            path = os.path.normpath(output[2 * i + 1].rsplit(":", 1)[0])
            # ccache may serve an object compiled in an earlier worktree of the same commit, whose
            # debug information names that worktree: the path inside any tree-<commit> counts.
            inside = TREE_PATH.search(path)
            located[address] = inside.group(1) if inside else None
    return located


def walks(events, located, implementation_only):
    """{thread: [file, ...]}: each thread's walk (see the module docstring)."""
    stacks = collections.defaultdict(list)
    result = collections.defaultdict(list)
    for kind, address, thread in events:
        stack = stacks[thread]
        if kind == ">":
            path = located.get(address)
            if path is not None and implementation_only and not path.endswith((".cpp", ".cu")):
                path = None
            stack.append(path)
        elif stack:
            stack.pop()
        current = next((p for p in reversed(stack) if p is not None), None)
        walk = result[thread]
        if current is not None and (not walk or walk[-1] != current):
            walk.append(current)
    return result


def measure(walk):
    visits = collections.Counter(walk)
    # The structure without the loops: a return to a file counts once per file it returns from
    # (a loop that calls b from a per bucket is one return to a, not one per bucket).
    seen, return_edges = set(), set()
    for previous, current in zip([None] + walk, walk):
        if current in seen:
            return_edges.add((previous, current))
        seen.add(current)
    structural = collections.Counter(current for _, current in return_edges)
    return {
        "files": len(visits),
        "visits": len(walk),
        "returns": len(walk) - len(visits),
        "most_visited": visits.most_common(10),
        "files_visited_more_than_twice": sorted(f for f, n in visits.items() if n > 2),
        "structural_returns": len(return_edges),
        "structural_most_returned_to": structural.most_common(10),
        "files_returned_to_from_more_than_one_file": sorted(
            f for f, n in structural.items() if n > 1),
    }


def compress(walk, limit=120):
    """The walk as 'a > b > a ...', at most `limit` steps."""
    text = " > ".join(walk[:limit])
    return text + (f" > ... ({len(walk) - limit} more)" if len(walk) > limit else "")


def self_test():
    """The walk and its counts on made-up events whose answers are worked out by hand."""
    located = {1: "a.cpp", 2: "b.cpp", 3: "h.h", 4: None, 5: "c.cu"}
    # a calls b three times (a loop), b calls an inline helper in h.h, which calls std code (4),
    # then a calls c; thread 1 runs c alone.
    events = [(">", 1, 0)]
    for _ in range(3):
        events += [(">", 2, 0), (">", 3, 0), (">", 4, 0), ("<", 4, 0), ("<", 3, 0), ("<", 2, 0)]
    events += [(">", 5, 0), ("<", 5, 0), ("<", 1, 0), (">", 5, 1), ("<", 5, 1)]
    implementation = walks(events, located, True)
    files = walks(events, located, False)
    problems = []
    expected_implementation = ["a.cpp", "b.cpp", "a.cpp", "b.cpp", "a.cpp", "b.cpp", "a.cpp",
                               "c.cu", "a.cpp"]
    if implementation[0] != expected_implementation:
        problems.append(f"implementation walk {implementation[0]}")
    if files[0] != ["a.cpp", "b.cpp", "h.h", "b.cpp", "a.cpp", "b.cpp", "h.h", "b.cpp", "a.cpp",
                    "b.cpp", "h.h", "b.cpp", "a.cpp", "c.cu", "a.cpp"]:
        problems.append(f"header walk {files[0]}")
    if implementation[1] != ["c.cu"]:
        problems.append(f"thread 1's walk {implementation[1]}")
    counts = measure(implementation[0])
    # 9 visits of 3 files: 6 returns; loops collapsed: b from a and a from b, a from c.
    if (counts["files"], counts["visits"], counts["returns"]) != (3, 9, 6):
        problems.append(f"counts {counts}")
    if counts["structural_returns"] != 3 or counts["files_returned_to_from_more_than_one_file"] \
            != ["a.cpp"]:
        problems.append(f"loops collapsed {counts}")
    if counts["files_visited_more_than_twice"] != ["a.cpp", "b.cpp"]:
        problems.append(f"visited more than twice {counts['files_visited_more_than_twice']}")
    if TREE_PATH.search("/tmp/x/tree-0123456789ab/collectives/call.cpp").group(1) != \
            "collectives/call.cpp" or TREE_PATH.search("/usr/include/c++/12/vector"):
        problems.append("the repository path of a debug file name")
    for problem in problems:
        print(f"walk self-test FAILED: {problem}")
    print("walk self-test: " + ("ok" if not problems else f"{len(problems)} failures"))
    return 1 if problems else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commits", nargs="*", default=["HEAD"])
    parser.add_argument("--spec", default="qsgd:bits=4")
    parser.add_argument("--elements", type=int, default=1 << 15)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out or ROOT / "docs" / "data" / "walk" / datetime.date.today().isoformat()
    out.mkdir(parents=True, exist_ok=True)
    summary = []

    def say(line):
        print(line, flush=True)
        summary.append(line)

    workdir = Path(tempfile.mkdtemp(prefix="gradzip-walk-"))
    log = workdir / "walk.log"
    try:
        for name in args.commits:
            commit = subprocess.run(["git", "rev-parse", name], cwd=ROOT, capture_output=True,
                                    text=True, check=True).stdout.strip()
            program, tree = build_walk(commit, workdir, log)
            events_file = workdir / f"events-{commit[:12]}.txt"
            record(program, args.spec, args.elements, args.ranks, events_file, log)
            events = []
            for line in events_file.read_text().splitlines():
                kind, address, thread = line.split()
                events.append((kind, int(address, 16), int(thread)))
            located = locate(program, {a for _, a, _ in events}, tree)
            report = {"commit": commit, "spec": args.spec, "elements": args.elements,
                      "ranks": args.ranks, "events": len(events), "walks": {}}
            say(f"{commit[:12]}: {args.spec}, {args.elements} elements, {args.ranks} ranks, "
                f"{len(events)} function entries and exits on rank 0")
            for label, implementation_only in (("implementation", True), ("files", False)):
                per_thread = walks(events, located, implementation_only)
                report["walks"][label] = {}
                for thread in sorted(per_thread):
                    walk = per_thread[thread]
                    counts = measure(walk)
                    # The header-level walk runs into the element math: its counts only.
                    report["walks"][label][str(thread)] = (
                        dict(counts, walk=walk) if implementation_only else counts)
                    who = "calling thread" if thread == 0 else f"thread {thread}"
                    say(f"  {label}, {who}: {counts['files']} files, {counts['visits']} visits, "
                        f"{counts['returns']} returns; visited more than twice: "
                        f"{len(counts['files_visited_more_than_twice'])} files; loops collapsed: "
                        f"{counts['structural_returns']} returns, "
                        f"{len(counts['files_returned_to_from_more_than_one_file'])} files "
                        f"returned to from more than one file")
                    say("    most visited: " + ", ".join(f"{f} {n}" for f, n in
                                                          counts["most_visited"][:6]))
                    say("    most returned to (loops collapsed): " + ", ".join(
                        f"{f} {n}" for f, n in counts["structural_most_returned_to"][:6]))
                    if thread == 0 and label == "implementation":
                        say("    walk: " + compress(walk))
            (out / f"walk-{commit[:12]}.json").write_text(json.dumps(report, indent=1) + "\n")
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                           capture_output=True)
    finally:
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    print(f"{out}: written (build log: {log})")


if __name__ == "__main__":
    sys.exit(main())
