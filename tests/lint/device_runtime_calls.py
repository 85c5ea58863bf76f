#!/usr/bin/env python3
"""Fails when the library allocates device memory or waits for the device anywhere but
kernels/cuda/device_runtime.cu.

cudaMalloc and cudaFree synchronise the whole device: with NCCL kernels of several
communicators on one device (the Reducer's lanes), a device-wide synchronisation while one
lane's kernel waits for a peer can deadlock. Every allocation and host wait of the library goes
through kernels/cuda/device_runtime.h instead, which also counts them (the GPU check reports the
counts per collective call). This scans the library's sources (C++, CUDA; comments and string
literals removed) for the runtime calls that allocate, free or synchronise.

    device_runtime_calls.py ROOT     scan ROOT's library folders; exit 1 naming every offence
    device_runtime_calls.py --self-test
                                     check that the scanner finds a planted call and passes
                                     clean code (run by ctest before the scan, so that a broken
                                     scanner cannot pass)
"""
import pathlib
import re
import sys

LIBRARY_FOLDERS = ["collectives", "compressors", "error_feedback", "kernels", "pipeline", "python"]
SUFFIXES = {".cpp", ".cu", ".cuh", ".h", ".hpp"}
# The one file allowed to make these calls.
ALLOWED = {"kernels/cuda/device_runtime.cu"}
FORBIDDEN = re.compile(
    r"\bcuda(Malloc|MallocAsync|MallocFromPoolAsync|MallocManaged|MallocHost|MallocPitch|"
    r"Malloc3D|MallocArray|HostAlloc|Free|FreeAsync|FreeHost|FreeArray|DeviceSynchronize|"
    r"StreamSynchronize|EventSynchronize|ThreadSynchronize|DeviceReset)\s*\(")


def strip_comments_and_strings(text):
    """The source with // and /* */ comments and string / character literals blanked (newlines
    kept, so that line numbers stay right)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * max(0, min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def offences(path_name, text):
    code = strip_comments_and_strings(text)
    found = []
    for number, line in enumerate(code.splitlines(), 1):
        for match in FORBIDDEN.finditer(line):
            found.append(f"{path_name}:{number}: {match.group(0).rstrip('( ')} "
                         f"(use kernels/cuda/device_runtime.h)")
    return found


def self_test():
    planted = 'void f() {\n  // cudaFree(p) in a comment is fine\n  auto s = "cudaMalloc(";\n  cudaFree (p);\n}\n'
    clean = 'void g() { device_release(p, n, d, s); /* cudaDeviceSynchronize() */ }\n'
    sync = "x = cudaStreamSynchronize(stream);\n"
    got_planted = offences("planted.cpp", planted)
    got_clean = offences("clean.cpp", clean)
    got_sync = offences("sync.cu", sync)
    ok = (len(got_planted) == 1 and "planted.cpp:4: cudaFree" in got_planted[0]
          and got_clean == [] and len(got_sync) == 1 and "cudaStreamSynchronize" in got_sync[0])
    print("self-test:", "ok" if ok else "FAILED", got_planted, got_clean, got_sync)
    return 0 if ok else 1


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 2:
        print(__doc__)
        return 2
    root = pathlib.Path(argv[1]).resolve()
    scanned, found = 0, []
    for folder in LIBRARY_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            name = path.relative_to(root).as_posix()
            scanned += 1
            if name in ALLOWED:
                continue
            found += offences(name, path.read_text(encoding="utf-8", errors="replace"))
    if scanned == 0:
        print(f"no sources found under {root}: wrong root?")
        return 1
    for line in found:
        print(line)
    print(f"{scanned} files scanned, {len(found)} device allocations or waits outside "
          f"{', '.join(sorted(ALLOWED))}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
