#!/usr/bin/python3
"""`pip wheel .` builds gradzip's wheel, which installs into a clean virtual environment and
works there, and (second mode) loads beside a current PyPI PyTorch in either import order.

  build   makes a fresh venv in WORK, runs `pip wheel SOURCE` (scikit-build-core, pybind11 and
          numpy from PyPI), installs the wheel there, and checks from a directory outside the
          source tree: the module comes from the venv's site-packages; a one-rank all-reduce of
          integers with spec none is exact and reports transport "mpi"; an fp16 Codec round
          trip of values exact in f16 returns them bit for bit.
  beside  unpacks that wheel into WORK/site and, with the PyPI PyTorch venv's interpreter,
          imports `gradzip` then `torch`, and `torch` then `gradzip` (each in a new process):
          both must work, and the module must not load any CUDA or NCCL library of its own.
          Exit 77 (skipped) when that venv does not exist.

Usage: run_pip_wheel.py build SOURCE WORK | beside WORK TORCH_PYTHON
"""
import glob
import os
import shutil
import subprocess
import sys
import venv

SMOKE = r"""
import os, sys
import numpy as np
import gradzip
site = sys.argv[1]
assert gradzip.__file__.startswith(site), (gradzip.__file__, site)
comm = gradzip.Communicator()
assert comm.transport_name == "mpi" and comm.size == 1, (comm.transport_name, comm.size)
values = (np.arange(50_000) % 15 - 7).astype(np.float32)
expected = values.copy()
stats = comm.allreduce(values, "smoke", "none")
assert np.array_equal(values, expected), "a one-rank sum must return its input"
codec = gradzip.Codec("fp16")
halves = (np.arange(1000) / 8).astype(np.float32)  # multiples of 1/8 below 125: exact in f16
out = np.zeros_like(halves)
codec.decode(codec.encode(halves), out)
assert np.array_equal(out, halves)
print("SMOKE OK", gradzip.__version__, stats["algorithm"])
"""


def run(command, **kwargs):
    print("+ " + " ".join(command), flush=True)
    return subprocess.run(command, check=True, **kwargs)


def build(source, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env_dir = os.path.join(work, "venv")
    venv.create(env_dir, with_pip=True)
    python = os.path.join(env_dir, "bin", "python")
    dist = os.path.join(work, "dist")
    run([python, "-m", "pip", "wheel", "--quiet", source, "--no-deps", "-w", dist,
         f"--config-settings=build-dir={os.path.join(work, 'build')}"])
    wheels = glob.glob(os.path.join(dist, "gradzip-*.whl"))
    assert len(wheels) == 1, wheels
    run([python, "-m", "pip", "install", "--quiet", wheels[0]])
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    outside = os.path.join(work, "elsewhere")
    os.makedirs(outside, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run([python, "-c", SMOKE, site], cwd=outside, env=env)
    return 0


def beside(work, torch_python):
    if not os.path.exists(torch_python):
        print(f"SKIP: {torch_python} does not exist (scripts/install-deps.sh --torch-venv makes it)")
        return 77
    wheels = glob.glob(os.path.join(work, "dist", "gradzip-*.whl"))
    assert len(wheels) == 1, f"no wheel in {work}/dist: run the build mode first ({wheels})"
    site = os.path.join(work, "site")
    shutil.rmtree(site, ignore_errors=True)
    run([torch_python, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site, wheels[0]])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = site
    for order in ("import gradzip, torch", "import torch, gradzip"):
        code = (f"{order}; import os; "
                "ldd = os.popen('ldd ' + gradzip._gradzip.__file__).read(); "
                "assert 'nccl' not in ldd and 'cudart' not in ldd, ldd; "
                "print('OK:', '" + order + "', torch.__version__)")
        run([torch_python, "-c", code], env=env, cwd=work)
    return 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "build":
        return build(os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3]))
    if len(sys.argv) == 4 and sys.argv[1] == "beside":
        return beside(os.path.abspath(sys.argv[2]), sys.argv[3])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
