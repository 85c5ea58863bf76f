#!/usr/bin/python3
"""ctest's readme.torchrun_command: the README's torchrun line, as a user types it.

Reads README.md, takes the one line of its fenced blocks that launches the DDP example with
`torchrun`, and runs it with bash from the repository root (so `~` and the relative
`build/python` mean what they mean to a user there), with only `--max-steps 4` appended to keep
the run short. It must exit 0 within the bound and print the example's header line (2 ranks,
over torch.distributed, PyTorch from the virtual environment) and one epoch line with a test
accuracy. A README whose command stops working (a missing torchrun, an import that fails, an
option the example no longer takes) fails here.

Skips (77) with the reason when the command's torchrun does not exist (scripts/install-deps.sh
--torch-venv makes it) or the dataset is not installed.

Also skips when the build under test is not REPO_ROOT/build, which the command's
`PYTHONPATH=build/python` names (another build's package would be tested instead).

Usage: run_readme_torchrun.py REPO_ROOT BUILD_DIR
"""
import os
import re
import shlex
import subprocess
import sys

BOUND_S = 300
SKIP = 77


def readme_line(root):
    lines, in_block = [], False
    for line in open(os.path.join(root, "README.md"), encoding="utf-8"):
        if line.lstrip().startswith("```"):
            in_block = not in_block
        elif in_block and "torchrun" in line and "torch_ddp_fashion_mnist.py" in line:
            lines.append(line)
    if len(lines) != 1:
        print(f"FAIL: expected one torchrun line for the DDP example in README.md's fenced "
              f"blocks, found {len(lines)}: {lines}")
        sys.exit(1)
    return lines[0].strip()


def main():
    root = os.path.abspath(sys.argv[1])
    build = os.path.realpath(sys.argv[2])
    line = readme_line(root)
    if build != os.path.realpath(os.path.join(root, "build")):
        print(f"SKIP: this build is {build}; the README's command uses {root}/build/python")
        return SKIP
    print(f"README: {line}")
    words = shlex.split(line)
    launcher = next(os.path.expanduser(w) for w in words if w.endswith("torchrun"))
    if not os.access(launcher, os.X_OK):
        print(f"SKIP: {launcher} does not exist (scripts/install-deps.sh --torch-venv makes it)")
        return SKIP
    data = "/usr/share/datasets/fashion-mnist"
    if not os.path.isdir(data):
        print(f"SKIP: {data} is missing (Debian's dataset-fashion-mnist)")
        return SKIP
    command = line + " --max-steps 4"
    try:
        run = subprocess.run(["bash", "-c", command], cwd=root, capture_output=True, text=True,
                             timeout=BOUND_S)
    except subprocess.TimeoutExpired as expired:
        print(f"FAIL: not finished in {BOUND_S} s:\n{expired.stdout or ''}{expired.stderr or ''}")
        return 1
    output = run.stdout + run.stderr
    print(output[-6000:])
    failures = []
    if run.returncode != 0:
        failures.append(f"exit status {run.returncode}")
    if not re.search(r"^gradzip \S+: 2 ranks, .*4 steps, over torch\.distributed", run.stdout, flags=re.M):
        failures.append("no header line for 2 ranks, 4 steps, over torch.distributed")
    torch_major = re.search(r"\(torch (\d+)\.", run.stdout)
    if not torch_major or int(torch_major.group(1)) < 2:
        failures.append("not the virtual environment's current PyTorch (torch 2 or later)")
    if not re.search(r"^epoch 1: steps 4 .*test accuracy 0\.\d+", run.stdout, flags=re.M):
        failures.append("no epoch line with 4 steps and a test accuracy")
    if failures:
        print("FAIL: " + "; ".join(failures))
        return 1
    print("OK: the README's torchrun command ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
