#!/usr/bin/env python3
"""gradzip's module, built with CUDA, works on the CPU where no CUDA library exists at all.

Usage: run_without_cuda.py PYTHON CUDA_ROOT...   (PYTHONPATH must find gradzip)

Hides each CUDA_ROOT (the toolkit's folders: its CUDA runtime and NCCL) behind an empty folder
in a mount namespace of its own (unshare --mount, as root), then in that namespace: imports
gradzip, runs a one-rank all-reduce with fp16 and a codec round trip on the CPU (exact values
expected), and asks for NCCL, which must fail with gradzip.Error naming what it tried, not crash.
The module links no CUDA library (the CUDA runtime is static, NCCL is loaded on first use), so
the loader never looks for one. Exit 77 (skip) when a mount namespace cannot be made here.
"""
import os
import subprocess
import sys
import tempfile

CHECK = r'''
import numpy as np, gradzip
comm = gradzip.Communicator(transport="mpi")
x = np.arange(-512, 512, dtype=np.float32) / 4
y = x.copy()
stats = comm.allreduce(y, "no-cuda", "fp16:min_bytes=0", op="sum")
assert comm.size == 1 and (y == x).all(), (comm.size, y[:4])
codec = gradzip.Codec("qsgd:bits=8")
out = np.zeros_like(x)
codec.decode(codec.encode(x, seed=1), out)
assert np.abs(out - x).max() <= np.abs(x).max() / 127 * 1.0001, np.abs(out - x).max()
try:
    gradzip._gradzip.nccl_library()
except gradzip.Error as error:
    text = str(error)
    assert "no usable libnccl.so.2" in text or "built without NCCL" in text, text
    print("NCCL refused as expected:", text.splitlines()[0])
else:
    raise AssertionError("NCCL was found although every CUDA folder is hidden")
print("CPU paths work with no CUDA library:", stats["algorithm"])
'''


def main():
    python, roots = sys.argv[1], [os.path.realpath(root) for root in sys.argv[2:]]
    roots = [root for root in sorted(set(roots)) if os.path.isdir(root)]
    # a folder inside another one is hidden with it (and could not be mounted over afterwards)
    roots = [root for root in roots
             if not any(root != other and root.startswith(other + os.sep) for other in roots)]
    if not roots:
        print("SKIP: no CUDA folder to hide")
        return 77
    with tempfile.TemporaryDirectory(prefix="gradzip-empty-") as empty:
        mounts = " && ".join(f"mount --bind {empty} '{root}'" for root in roots)
        probe = subprocess.run(["unshare", "--mount", "sh", "-c", mounts + " && true"],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            print(f"SKIP: cannot hide folders in a mount namespace here: {probe.stderr.strip()}")
            return 77
        run = subprocess.run(["unshare", "--mount", "sh", "-c", mounts + ' && exec "$0" -c "$1"',
                              python, CHECK], capture_output=True, text=True, timeout=300)
    print(run.stdout, end="")
    if run.returncode != 0:
        print(f"FAIL: exit {run.returncode} with {', '.join(roots)} hidden\n{run.stderr[-3000:]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
