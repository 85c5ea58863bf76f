#!/usr/bin/env python3
"""No linked NCCL or shared CUDA runtime in gradzip's binaries.

Usage: check_linked_libraries.py FILE...

gradzip loads NCCL at run time and links the CUDA runtime statically, so that a process with
PyTorch's own NCCL and CUDA runtime (the nvidia-* wheels) loads either first (see
collectives/transport/nccl/nccl_library.h). A DT_NEEDED entry for libnccl or libcudart in any
FILE fails. The scan's own check: every FILE must list libc.so.6 (a dynamic binary always
does), so a parse that finds nothing cannot pass.
"""
import re
import subprocess
import sys

FORBIDDEN = re.compile(r"^(libnccl|libcudart)\.so")


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def main():
    failures = []
    for path in sys.argv[1:]:
        libraries = needed(path)
        if "libc.so.6" not in libraries:
            failures.append(f"{path}: the scan found no libc.so.6 among {libraries}: broken scan")
        bad = [library for library in libraries if FORBIDDEN.match(library)]
        if bad:
            failures.append(f"{path} links {', '.join(bad)}")
        print(f"{path}: {len(libraries)} needed: {', '.join(libraries)}")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
