#!/usr/bin/env python3
"""ctest's lint.workflow_words: the project's documents and sources describe the project.

A user has only the repository. Words that point at the way the code was written instead of at
the code — a device being "lent" or "not drawn", a "GPU session", numbered goals ("Goal 1"),
"the issue" and issue numbers, a remote-run tool's `run(command=..., carry=[...])` call — and
absolute paths of the machine it was written on (/root/..., /work/...) mean nothing to them.
This scans README.md, docs/ (outside docs/data, which holds raw logs), scripts/, benchmarks/,
include/, the sources, tests/, python/, examples/ and the build files, and fails naming every
file, line and word it finds.

  check_workflow_words.py ROOT        the self-test, then the scan of ROOT
  check_workflow_words.py --self-test planted words are found, clean text passes
"""
import re
import sys
from pathlib import Path

# (pattern, what to write instead)
RULES = [
    (r"\blent\b", "say whether the machine has a GPU, and how a user with one runs the check"),
    (r"\bnot[ _]drawn\b", "say whether the machine has a GPU"),
    (r"\bGPU session\b", "name the run: 'a run on a GPU machine'"),
    (r"\b(?:this|next|previous|earlier|later) session\b", "state the decision or the date"),
    (r"\bgoal ?\d", "name the target itself (e.g. 'target 1.8x'), not a numbered goal"),
    (r"\bissues? ?#?\d+\b", "state the decision, not an issue number"),
    (r"\bissue:", "state the decision, not the issue"),
    (r"\bthe issue\b", "state the decision, not the issue"),
    (r"\bissue's\b", "state the decision, not the issue"),
    (r"\brun\(command=", "show the command a user with a GPU machine types"),
    (r"\bcarry=\[", "show the command a user with a GPU machine types"),
    (r"(?<![\w.~$])/root/", "a path relative to the repository, or ~ / $HOME"),
    (r"(?<![\w.~$])/work/", "a path relative to the repository"),
]
PATTERNS = [(re.compile(pattern, re.IGNORECASE), advice) for pattern, advice in RULES]

SCANNED = ["README.md", "CMakeLists.txt", "pyproject.toml", ".ci", "docs", "scripts",
           "benchmarks", "include", "python", "examples", "tests", "collectives", "compressors",
           "error_feedback", "kernels", "pipeline", "cmake"]
SUFFIXES = {".md", ".h", ".hpp", ".cpp", ".cu", ".cuh", ".py", ".sh", ".cmake", ".txt", ".toml",
            ".in", ".cfg", ".ini", ""}
SKIPPED_DIRS = {Path("docs/data"), Path("build"), Path(".gpu-deps")}


def findings_in(text, name):
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, advice in PATTERNS:
            match = pattern.search(line)
            if match:
                found.append(f"{name}:{number}: '{match.group(0)}' ({advice})")
    return found


def scanned_files(root):
    this = Path(__file__).resolve()
    for entry in SCANNED:
        path = root / entry
        candidates = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        for file in candidates:
            if not file.is_file() or file.resolve() == this or file.suffix not in SUFFIXES:
                continue
            relative = file.relative_to(root)
            if any(relative.is_relative_to(skipped) for skipped in SKIPPED_DIRS):
                continue
            if "__pycache__" in relative.parts:
                continue
            yield file, relative


def scan(root):
    findings, files = [], 0
    for file, relative in scanned_files(root):
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary data (images, datasets)
        files += 1
        findings += findings_in(text, str(relative))
    return findings, files


def self_test():
    planted = {
        "the device was not drawn": 1, "no GPU was lent to us": 1, "in the next session": 1,
        "Goal 1 asks for it": 1, "data in goal5-2026-12-03/": 1, "as issue 8 says": 1,
        "see the issue": 1, "(issue: {0, 1})": 1, "run(command=x, carry=[\".gpu-deps\"])": 2,
        "python /root/.cache/venv/bin/python": 1, "at /work/main/build": 1,
        # Clean: ordinary words and paths.
        "the goal of 0.5 is met": 0, "indices are drawn from the key": 0,
        "DDP issues its own all-reduces": 0, "a pytest session fixture": 0,
        "~/.cache/gradzip/venv-torch/bin/python": 0, "build/bin/gradzip-bench": 0,
        "$HOME/.cache/x and ./work/y": 0,
    }
    wrong = []
    for text, expected in planted.items():
        found = findings_in(text, "planted")
        if len(found) != expected:
            wrong.append(f"{text!r}: {len(found)} findings, expected {expected}: {found}")
    if wrong:
        print("self-test FAILED:\n  " + "\n  ".join(wrong))
        return 1
    print(f"self-test: ok ({len(planted)} lines)")
    return 0


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    tested = self_test()
    if sys.argv[1] == "--self-test" or tested != 0:
        return tested
    findings, files = scan(Path(sys.argv[1]).resolve())
    if findings:
        print(f"{len(findings)} workflow words or machine paths in {files} files scanned:")
        print("\n".join(findings))
        return 1
    print(f"{files} files scanned: no workflow words or machine paths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
