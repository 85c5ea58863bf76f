#!/usr/bin/python3
"""Runs the DDP hook's strengthened checks against deliberately broken copies of the installed
hook (BUILD/python/gradzip/torch.py; the source is never changed) and writes one log per
mutant here. Each mutant is a text replacement; the run must fail, and the log shows how.

Usage: python3 run_mutants.py BUILD [--only NAME,...]
Needs Debian's python3 with torch and mpirun; the GradScaler check needs the PyTorch virtual
environment (scripts/install-deps.sh --torch-venv) because it needs a current PyTorch.
"""
import argparse
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
VENV_PYTHON = os.path.expanduser("~/.cache/gradzip/venv-torch/bin/python")

# name: (what it breaks, [(old, new)], pytest -k expression or "resume", python)
MUTANTS = {
    "state-dict-folds-live": (
        "state_dict() folds every residual into the workers' on the live communicator",
        [("residuals.update(self._parameter_residuals(fold=False))",
          "residuals.update(self._parameter_residuals(fold=True))")],
        "taking_a_state_dict", "/usr/bin/python3"),
    "no-drop-at-rebuild": (
        "the old buckets' residuals are left in the communicator after DDP's rebuild",
        [("            for old_name, _ in self._layouts.values():\n"
          "                self.communicator.drop_residuals(old_name)\n", "")],
        "long_run_across_the_rebuild", "/usr/bin/python3"),
    "rebuild-drops-residuals": (
        "the residuals are not carried to the rebuilt buckets (they start from zero)",
        [("            self._pending.update(self._parameter_residuals(fold=True))",
          "            self._parameter_residuals(fold=True)")],
        "every_algorithms_residuals_survive", "/usr/bin/python3"),
    "powersgd-dense-not-averaged": (
        "PowerSGD's other (1-D) parameters are left as this rank's own gradient",
        [("    for parameter, offset, numel in dense:\n        part = ",
          "    for parameter, offset, numel in dense[:0]:\n        part = ")],
        "powersgd_hook_equals", "/usr/bin/python3"),
    "gradscaler-saturates": (
        "the hook clamps every result to fp16's finite range (a saturating store)",
        [("            future.set_result(buffer)\n        except Exception as error:  # the future carries it",
          "            buffer.clamp_(-65504.0, 65504.0)\n            future.set_result(buffer)\n"
          "        except Exception as error:  # the future carries it")],
        "gradscaler", VENV_PYTHON),
    "draws-by-call-number": (
        "random draws keyed by each name's call count instead of the iteration",
        [('stats = state.communicator.allreduce(target, name, spec, op="average", step=step)',
          'stats = state.communicator.allreduce(target, name, spec, op="average")'),
         ('return state.communicator.allreduce(buffer, name, spec, op="average", step=step)',
          'return state.communicator.allreduce(buffer, name, spec, op="average")')],
        "resume", "/usr/bin/python3"),
    "no-resumed-iteration-repacking": (
        "the first iteration after a resume is reduced in DDP's first buckets, not the saved ones",
        [("if saved and saved != mine and parameters(saved) == parameters(mine):",
          "if False:")],
        "resume", "/usr/bin/python3"),
}


def run(build, name):
    """Applies mutant `name` to BUILD's installed hook, runs its check, restores the hook;
    returns (a summary line, whether the check failed as it must)."""
    broken, replacements, selection, interpreter = MUTANTS[name]
    installed = os.path.join(build, "python", "gradzip", "torch.py")
    backup = installed + ".orig"
    shutil.copy(installed, backup)
    try:
        text = open(installed).read()
        for old, new in replacements:
            if old not in text:
                return f"{name}: the mutation does not apply (text not found)", False
            text = text.replace(old, new)
        open(installed, "w").write(text)
        env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), GRADZIP_TEST_PORT="29977",
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        if selection == "resume":
            command = ["/usr/bin/python3", os.path.join(REPO, "tests", "python", "run_hook_resume.py"),
                       "--python", interpreter, "--port", "29981"]
        else:
            command = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", interpreter,
                       "-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no", "-k", selection,
                       os.path.join(REPO, "tests", "python", "test_torch_hook.py")]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        log = (f"mutant: {name}: {broken}\ncommand: {' '.join(command)}\nexit code: "
               f"{result.returncode}\n\n{result.stdout}\n{result.stderr}")
        # Paths relative to the repository and the home folder, as a user's checkout would show.
        log = log.replace(REPO + os.sep, "").replace(REPO, ".").replace(os.path.expanduser("~"), "~")
        with open(os.path.join(HERE, f"{name}.txt"), "w") as out:
            out.write(log)
        verdict = "FAILED as it must" if result.returncode != 0 else "PASSED: the check missed it"
        return f"{name}: exit {result.returncode} ({verdict})", result.returncode != 0
    finally:
        shutil.move(backup, installed)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build")
    parser.add_argument("--only", default=",".join(MUTANTS))
    args = parser.parse_args()
    caught = 0
    names = args.only.split(",")
    for name in names:
        line, failed = run(os.path.abspath(args.build), name)
        caught += failed
        print(line, flush=True)
    print(f"{caught} of {len(names)} mutants caught")
    return 0 if caught == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
