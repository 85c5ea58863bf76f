#!/usr/bin/env python3
"""ctest's lint.results_fresh: every generated figure describes the code as it is.

docs/results.md's and README.md's generated sections come from docs/data/reproduce/<suite>.json.
Each JSON records the commit it was measured at, whether the tree was clean, and the load before
and after each round. For every suite of benchmarks/measured_code.py this fails, naming the
suite and what to run, when:
  - its JSON is missing, or records no commit, a dirty tree, or a round without its load;
  - the recorded commit is not in this checkout's history;
  - a commit after the recorded one changed a path the suite measures (MEASURED): the figures
    would describe code that no longer exists (the commits and files are listed).

  check_results_fresh.py ROOT [--data DIR]   the self-test, then the check of ROOT
  check_results_fresh.py --self-test         a throw-away git repository: fresh data passes;
                                             a change to a measured path, a dirty tree, an
                                             unknown commit and a missing load fail; a change
                                             elsewhere passes
Exit 77 (ctest: skipped, with the reason) when ROOT is not a git checkout (a source archive has
no history to compare against) or is a shallow clone (the measured commits may be cut off).
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def load_measured(root):
    spec = importlib.util.spec_from_file_location("measured_code",
                                                  Path(root) / "benchmarks" / "measured_code.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MEASURED


def problems_of(root, data_dir, measured):
    """Every reason a suite's figures are not those of the code at HEAD, as lines."""
    problems = []
    for suite, paths in measured.items():
        path = Path(data_dir) / f"{suite}.json"
        redo = f"run: bash benchmarks/reproduce.sh --only {suite}"
        if not path.exists():
            problems.append(f"{suite}: {path} is missing ({redo})")
            continue
        record = json.loads(path.read_text())
        machine = record.get("machine", {})
        commit = machine.get("commit")
        if not commit:
            problems.append(f"{suite}: {path.name} records no commit ({redo})")
            continue
        if machine.get("dirty") is not False:
            problems.append(f"{suite}: {path.name} was measured on a tree with uncommitted changes "
                            f"(dirty: {machine.get('dirty')}) ({redo} on a clean tree)")
        rounds = record.get("rounds", [])
        unloaded = [r.get("round") for r in rounds
                    if not r.get("load_average_before") or not r.get("load_average_after")]
        if not rounds or unloaded:
            problems.append(f"{suite}: {path.name} has rounds without their load average "
                            f"({unloaded or 'no rounds'}) ({redo})")
        if git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            problems.append(f"{suite}: the recorded commit {commit[:12]} is not in this "
                            f"checkout's history ({redo})")
            continue
        later = git(root, "log", "--format=%h %s", f"{commit}..HEAD", "--", *paths)
        if later.returncode != 0:
            problems.append(f"{suite}: git log failed: {later.stderr.strip()}")
        elif later.stdout.strip():
            commits = later.stdout.strip().splitlines()
            files = git(root, "diff", "--name-only", commit, "HEAD", "--", *paths).stdout.split()
            shown = ", ".join(files[:8]) + (f" and {len(files) - 8} more" if len(files) > 8 else "")
            problems.append(f"{suite}: measured at {commit[:12]}; {len(commits)} later commit(s) "
                            f"changed what it measures ({shown}), the latest "
                            f"'{commits[0]}' ({redo})")
    return problems


def skip_reason(root):
    """Why ROOT's history cannot tell which code the figures describe (exit 77), or None."""
    if git(root, "rev-parse", "--git-dir").returncode != 0:
        return (f"{root} is not a git checkout: no history to tell which code the figures "
                f"describe")
    if git(root, "rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        return (f"{root} is a shallow clone: the commits the figures were measured at may be "
                f"missing from it (git fetch --unshallow gives the history this check needs)")
    return None


def self_test():
    measured = {"fast": ["kernels", "bench.cpp"], "slow": ["collectives"]}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = root / "data"
        data.mkdir()

        def commit_file(name, text):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
            git(root, "add", name)
            assert git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m",
                       f"change {name}").returncode == 0
            return git(root, "rev-parse", "HEAD").stdout.strip()

        def record(suite, commit, dirty=False, load=True):
            rounds = [{"round": 0, "load_average_before": [0.1, 0.1, 0.1] if load else None,
                       "load_average_after": [0.2, 0.2, 0.2]}]
            (data / f"{suite}.json").write_text(json.dumps(
                {"suite": suite, "machine": {"commit": commit, "dirty": dirty}, "rounds": rounds}))

        assert git(root, "init", "-q").returncode == 0
        first = commit_file("kernels/a.cpp", "1")
        commit_file("collectives/b.cpp", "1")
        head = commit_file("docs/c.md", "1")
        record("fast", first)
        record("slow", head)
        assert problems_of(root, data, measured) == [], problems_of(root, data, measured)
        commit_file("docs/c.md", "2")  # not measured by either suite
        assert problems_of(root, data, measured) == []
        commit_file("kernels/a.cpp", "2")  # measured by "fast" only
        found = problems_of(root, data, measured)
        assert len(found) == 1 and found[0].startswith("fast:") and "kernels/a.cpp" in found[0], found
        record("fast", git(root, "rev-parse", "HEAD").stdout.strip())
        assert problems_of(root, data, measured) == []
        record("slow", head, dirty=True)
        found = problems_of(root, data, measured)
        assert len(found) == 1 and "uncommitted" in found[0], found
        record("slow", "0" * 40)
        found = problems_of(root, data, measured)
        assert len(found) == 1 and "not in this checkout's history" in found[0], found
        record("slow", head, load=False)
        found = problems_of(root, data, measured)
        assert len(found) == 1 and "load average" in found[0], found
        (data / "slow.json").unlink()
        found = problems_of(root, data, measured)
        assert len(found) == 1 and "missing" in found[0], found
        assert skip_reason(root) is None
        shallow = Path(tmp) / "shallow"
        assert git(root, "clone", "-q", "--depth", "1", f"file://{root}", str(shallow)).returncode == 0
        assert "shallow clone" in (skip_reason(shallow) or ""), skip_reason(shallow)
    with tempfile.TemporaryDirectory() as outside:  # not under the throw-away repository
        assert "not a git checkout" in (skip_reason(outside) or ""), skip_reason(outside)
    print("self-test: fresh data passes; a measured change, a dirty tree, an unknown commit, a "
          "missing load and a missing file fail; a change elsewhere passes; a shallow clone and "
          "a folder outside git are skipped")


def main():
    args = sys.argv[1:]
    self_test()
    if args == ["--self-test"]:
        return 0
    if not args:
        print(__doc__)
        return 2
    root = Path(args[0])
    data_dir = Path(args[2]) if args[1:2] == ["--data"] else root / "docs" / "data" / "reproduce"
    reason = skip_reason(root)
    if reason is not None:
        print(f"SKIP: {reason}")
        return 77
    measured = load_measured(root)
    problems = problems_of(root, data_dir, measured)
    for problem in problems:
        print(f"STALE {problem}")
    print(f"{len(measured) - len({p.split(':')[0] for p in problems})} of {len(measured)} suites "
          f"measured at the code they describe")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
