#!/usr/bin/env python3
"""gradzip and PyTorch load together in any import order, and share one NCCL.

Usage: run_import_order.py PYTHON   (PYTHONPATH must find gradzip)

Each order runs in a fresh interpreter: `import gradzip; import torch`, `import torch; import
gradzip`, and gradzip loading its NCCL before torch is imported at all. In every order torch must
import (with its CUDA library when the build has one: a CUDA PyTorch from PyPI fails to load
when another NCCL already holds the soname libnccl.so.2), a small all-reduce-free codec
round-trip must work, and when both have NCCL, gradzip's run-time NCCL must be the very library
torch uses (same version code, and torch's own file when torch was imported first). Exit 77
(skip) when PYTHON does not exist or has no torch.
"""
import os
import subprocess
import sys

PROLOGUE = r'''
import json, os, sys
def torch_nccl():
    import torch
    if not torch.cuda.is_available() and not hasattr(torch._C, "_nccl_version"):
        return None
    try:
        major, minor, patch = torch.cuda.nccl.version()[:3]
    except Exception:
        return None
    return major * 10000 + minor * 100 + patch
def gradzip_nccl():
    import gradzip
    try:
        return gradzip._gradzip.nccl_library()
    except gradzip.Error as error:
        if "built without NCCL" in str(error):
            return None
        raise
def codec_round_trip():
    import numpy as np, gradzip
    codec = gradzip.Codec("fp16")
    x = np.arange(-8, 8, dtype=np.float32)
    out = np.zeros_like(x)
    codec.decode(codec.encode(x), out)
    assert (out == x).all(), out
'''

ORDERS = {
    "gradzip, then torch": PROLOGUE + r'''
import gradzip
import torch, torch.distributed
codec_round_trip()
print(json.dumps({"torch": torch.__version__, "torch_nccl": torch_nccl(), "gradzip_nccl": gradzip_nccl()}))
''',
    "torch, then gradzip": PROLOGUE + r'''
import torch, torch.distributed
import gradzip
codec_round_trip()
print(json.dumps({"torch": torch.__version__, "torch_nccl": torch_nccl(), "gradzip_nccl": gradzip_nccl()}))
''',
    "gradzip loads NCCL, then torch": PROLOGUE + r'''
import gradzip
first = gradzip_nccl()
import torch, torch.distributed
codec_round_trip()
print(json.dumps({"torch": torch.__version__, "torch_nccl": torch_nccl(), "gradzip_nccl": first}))
''',
}


def main():
    python = sys.argv[1]
    if not os.path.exists(python):
        print(f"SKIP: {python} does not exist (scripts/install-deps.sh --torch-venv makes it)")
        return 77
    installed = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 3)"
    if subprocess.run([python, "-c", installed], capture_output=True).returncode != 0:
        print(f"SKIP: {python} has no torch")  # not installed; one that fails to load fails below
        return 77
    import json
    failures = []
    shared_checked = 0
    for order, code in ORDERS.items():
        run = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=240)
        if run.returncode != 0:
            failures.append(f"{order}: exit {run.returncode}\n{run.stderr[-3000:]}")
            continue
        seen = json.loads(run.stdout.strip().splitlines()[-1])
        print(f"{order}: {seen}")
        torch_code, ours = seen["torch_nccl"], seen["gradzip_nccl"]
        if torch_code is None or ours is None:
            # Nothing to share: a CPU build of gradzip (no NCCL loader) or a torch without NCCL.
            print(f"{order}: NCCL sharing NOT CHECKED (torch's NCCL: {torch_code}, gradzip's: {ours})")
        else:
            shared_checked += 1
            if ours["version"] != torch_code:
                failures.append(f"{order}: gradzip's NCCL {ours} is not torch's ({torch_code})")
            if order == "torch, then gradzip" and ours["found_by"] != "already loaded":
                failures.append(f"{order}: gradzip did not take torch's NCCL: {ours}")
    for failure in failures:
        print("FAIL:", failure)
    if not failures:
        print(f"OK: all {len(ORDERS)} import orders load and run a codec round trip; NCCL sharing checked in "
              f"{shared_checked} of {len(ORDERS)} orders (only where both sides have NCCL)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
