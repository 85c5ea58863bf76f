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
A refactor proven to change no byte and no speed carries the figures over it: each folder of
docs/data/refactor-proofs/ written by scripts/prove_refactor.py BEFORE --after AFTER and accepted
by its verify() (digests of 1-4 ranks identical, benchmark rounds within its tolerances, only
REFACTORABLE paths changed) moves a suite measured at a commit whose measured code equals
BEFORE's to AFTER, and the check goes on from there. A proof that verify() rejects fails the check.

  check_results_fresh.py ROOT [--data DIR]   the self-test, then the check of ROOT
  check_results_fresh.py --self-test         a throw-away git repository: fresh data passes;
                                             a change to a measured path, a dirty tree, an
                                             unknown commit and a missing load fail; a change
                                             elsewhere passes; a proven refactor passes, and
                                             proofs with other digests, a slowdown or a path
                                             outside the refactorable ones fail
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


def load_prover():
    """scripts/prove_refactor.py of the checkout this lint belongs to (its verify() is the rule)."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "prove_refactor.py"
    spec = importlib.util.spec_from_file_location("prove_refactor", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def checked_proofs(root, proofs_dir, measured, refactorable=None):
    """([accepted proofs, each with its folder name under "dir"], [problems of rejected ones])."""
    if not Path(proofs_dir).is_dir():
        return [], []
    prover = load_prover()
    every_measured_path = sorted({p for paths in measured.values() for p in paths})
    accepted, problems = [], []
    for folder in sorted(Path(proofs_dir).iterdir()):
        if not folder.is_dir():
            continue
        proof, found = prover.verify(root, folder, refactorable or prover.REFACTORABLE,
                                     every_measured_path)
        if found:
            problems.extend(found)
        else:
            accepted.append(dict(proof, dir=folder.name))
    return accepted, problems


def carried_over_refactors(root, commit, paths, proofs):
    """(commit, [proof folders]): where the accepted proofs carry figures measured at `commit`:
    a proof whose BEFORE has the same measured code (`paths`) as `commit` and whose AFTER comes
    after `commit` moves them to its AFTER, repeatedly."""
    used = []
    moved = True
    while moved:
        moved = False
        for proof in proofs:
            if proof["dir"] in used:
                continue
            same_code = git(root, "diff", "--quiet", commit, proof["before"], "--", *paths).returncode == 0
            later = git(root, "merge-base", "--is-ancestor", commit, proof["after"]).returncode == 0
            if same_code and later:
                commit, moved = proof["after"], True
                used.append(proof["dir"])
    return commit, used


def problems_of(root, data_dir, measured, proofs_dir=None, refactorable=None):
    """Every reason a suite's figures are not those of the code at HEAD, as lines ("suite: ..."
    or "proof FOLDER: ...")."""
    proofs_dir = proofs_dir or Path(root) / "docs" / "data" / "refactor-proofs"
    proofs, problems = checked_proofs(root, proofs_dir, measured, refactorable)
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
        measured_at = commit[:12]
        commit, carried_by = carried_over_refactors(root, commit, paths, proofs)
        if carried_by:
            measured_at = f"{measured_at}, carried to {commit[:12]} by {', '.join(carried_by)}"
        later = git(root, "log", "--format=%h %s", f"{commit}..HEAD", "--", *paths)
        if later.returncode != 0:
            problems.append(f"{suite}: git log failed: {later.stderr.strip()}")
        elif later.stdout.strip():
            commits = later.stdout.strip().splitlines()
            files = git(root, "diff", "--name-only", commit, "HEAD", "--", *paths).stdout.split()
            shown = ", ".join(files[:8]) + (f" and {len(files) - 8} more" if len(files) > 8 else "")
            problems.append(f"{suite}: measured at {measured_at}; {len(commits)} later commit(s) "
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


def write_proof(folder, before, after, digest_edit=False, slowdown=1.0, slow_row=1.0,
                reducer=None):
    """A proof folder as scripts/prove_refactor.py writes it, with made-up but well-formed data:
    digest_edit changes one line of the 3-rank digest after the refactor; slowdown multiplies
    every AFTER time, slow_row the first all-reduce row's only; reducer "same" or "differ"
    adds the Reducer's digests, equal or with one line changed after the refactor."""
    prover = load_prover()
    (folder / "digests").mkdir(parents=True)
    (folder / "bench").mkdir()
    for ranks in prover.RANK_COUNTS:
        lines = [f"{ranks} ranks"] + [f"spec {i} call: result ['{i:016x}']"
                                      for i in range(prover.MIN_DIGEST_LINES)]
        (folder / "digests" / f"before-np{ranks}.txt").write_text("\n".join(lines) + "\n")
        if digest_edit and ranks == 3:
            lines[5] = lines[5].replace("result", "result differs")
        (folder / "digests" / f"after-np{ranks}.txt").write_text("\n".join(lines) + "\n")
        if reducer:
            lines = [f"{ranks} ranks"] + [f"spec step {i} tensor {i:016x}"
                                          for i in range(prover.MIN_REDUCER_DIGEST_LINES)]
            (folder / "digests" / f"reducer-before-np{ranks}.txt").write_text("\n".join(lines) + "\n")
            if reducer == "differ" and ranks == 2:
                lines[9] += " changed"
            (folder / "digests" / f"reducer-after-np{ranks}.txt").write_text("\n".join(lines) + "\n")
    for r in range(1, 4):
        noise = 1.0 + 0.04 * (r - 2)  # rounds 4% apart, the same for both builds
        for version, factor in (("before", 1.0), ("after", slowdown)):
            allreduce = [{"spec": f"codec{i}", "ranks": 4, "bytes": 65536,
                          "time_s": 1e-4 * (i + 1) * noise * factor * (slow_row if i == 0 and version == "after" else 1.0)}
                         for i in range(6)]
            codecs = [{"codec": f"codec{i}", "size": 4194304, "encode_gbps": 10.0 / (noise * factor),
                       "decode_gbps": 20.0 / (noise * factor)} for i in range(6)]
            (folder / "bench" / f"allreduce-{version}-{r}.json").write_text(json.dumps(allreduce))
            (folder / "bench" / f"codecs-{version}-{r}.json").write_text(json.dumps(codecs))
    (folder / "proof.json").write_text(json.dumps({"before": before, "after": after, "rounds": 3}))


def proof_self_test(root, data, measured, commit_file, record):
    """A refactor of a measured path is carried by an accepted proof; proofs with other digests,
    a slowdown or a change outside the refactorable paths are rejected and the suite is stale."""
    import shutil
    proofs = root / "proofs"
    refactorable = ["kernels", "collectives"]
    rev = lambda: git(root, "rev-parse", "HEAD").stdout.strip()
    measured_at = rev()
    record("fast", measured_at)
    record("slow", measured_at)
    commit_file("kernels/a.cpp", "3")  # the refactor
    refactored = rev()
    commit_file("docs/c.md", "3")  # a later change elsewhere
    check = lambda: problems_of(root, data, measured, proofs, refactorable)
    found = check()
    assert len(found) == 1 and found[0].startswith("fast:"), found
    write_proof(proofs / "good", measured_at, refactored)
    assert check() == [], check()
    commit_file("kernels/a.cpp", "4")  # a change after the proven refactor is stale again
    found = check()
    assert len(found) == 1 and "carried to" in found[0] and "by good" in found[0], found
    record("fast", rev())
    for name, kwargs, expected in (("digest", {"digest_edit": True}, "digests of 3 ranks differ"),
                                   ("slower", {"slowdown": 1.05}, "geometric mean"),
                                   ("one-row", {"slow_row": 1.4}, "allreduce codec0"),
                                   ("faster", {"slowdown": 1 / 1.05}, "geometric mean")):
        shutil.rmtree(proofs)
        write_proof(proofs / name, measured_at, refactored, **kwargs)
        found = check()
        assert len(found) == 1 and found[0].startswith(f"proof {name}:") and expected in found[0], found
    shutil.rmtree(proofs)
    before_bench = rev()
    record("fast", before_bench)
    commit_file("bench.cpp", "2")  # measured by "fast", not refactorable: the digests miss it
    write_proof(proofs / "driver", before_bench, rev())
    found = check()
    assert any(f.startswith("proof driver:") and "bench.cpp" in f for f in found), found
    assert any(f.startswith("fast:") for f in found), found
    shutil.rmtree(proofs)
    # A driver whose only change is an #include line (a header moved) is covered.
    commit_file("bench.cpp", '#include "kernels/a.h"\nint main() {}\n')
    before_include = rev()
    record("fast", before_include)
    commit_file("bench.cpp", '#include "kernels/moved/a.h"\nint main() {}\n')
    write_proof(proofs / "moved", before_include, rev())
    assert check() == [], check()
    shutil.rmtree(proofs)
    record("fast", rev())
    # The Reducer (pipeline/): covered only by a proof with the Reducer's digests, equal.
    before_reducer = rev()
    record("slow", before_reducer)
    commit_file("pipeline/r.cpp", "2")
    for reducer, accepted in ((None, False), ("differ", False), ("same", True)):
        write_proof(proofs / "reducer", before_reducer, rev(), reducer=reducer)
        found = check()
        if accepted:
            assert not any(f.startswith(("proof", "slow")) for f in found), found
        else:
            assert any(f.startswith("proof reducer:") for f in found), found
            assert any(f.startswith("slow:") for f in found), found
        shutil.rmtree(proofs)


def self_test():
    measured = {"fast": ["kernels", "bench.cpp"], "slow": ["collectives", "pipeline"]}
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
        record("slow", head)
        proof_self_test(root, data, measured, commit_file, record)
        assert skip_reason(root) is None
        shallow = Path(tmp) / "shallow"
        assert git(root, "clone", "-q", "--depth", "1", f"file://{root}", str(shallow)).returncode == 0
        assert "shallow clone" in (skip_reason(shallow) or ""), skip_reason(shallow)
    with tempfile.TemporaryDirectory() as outside:  # not under the throw-away repository
        assert "not a git checkout" in (skip_reason(outside) or ""), skip_reason(outside)
    print("self-test: fresh data passes; a measured change, a dirty tree, an unknown commit, a "
          "missing load and a missing file fail; a change elsewhere passes; a shallow clone and "
          "a folder outside git are skipped; a proven refactor is carried over, a proof with "
          "other digests, a 5% slowdown or speed-up, one row 40% slower or a driver change is "
          "rejected; a Reducer change is carried only by equal Reducer digests; a driver that only "
          "changed an #include is carried")


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
    measured = load_prover().load_measured(root)
    problems = problems_of(root, data_dir, measured)
    for problem in problems:
        print(f"STALE {problem}")
    stale = {p.split(":")[0] for p in problems if not p.startswith("proof ")}
    print(f"{len(measured) - len(stale)} of {len(measured)} suites measured at the code they "
          f"describe")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
