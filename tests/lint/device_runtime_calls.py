#!/usr/bin/env python3
"""Fails when the library allocates device memory or waits for the device anywhere but
kernels/cuda/device_runtime.cpp, or when host code calls a CUDA runtime function that
kernels/device_api.h does not route (so it would bypass the emulated device).

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
# The files allowed to make these calls: the one place that allocates and waits, and the
# emulated device's runtime (which defines the entry points) and its stand-in CUDA header.
ALLOWED = {"kernels/cuda/device_runtime.cpp", "kernels/emulated/emulated_runtime.cpp",
           "kernels/emulated/include/cuda_runtime.h"}
# Host code (not .cu, which nvcc compiles without the renaming) in these folders calls the CUDA
# runtime only through kernels/device_api.h's list.
ROUTED_FOLDERS = LIBRARY_FOLDERS + ["tests", "benchmarks", "examples"]
ROUTED_SUFFIXES = {".cpp", ".h", ".hpp"}
NOT_ROUTED = {"kernels/emulated/emulated_runtime.cpp", "kernels/emulated/include/cuda_runtime.h",
              "kernels/device_api.h"}
RUNTIME_CALL = re.compile(r"\b(cuda[A-Z][A-Za-z0-9_]*)\s*\(")
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


def routed_functions(root):
    """The names in device_api.h's GRADZIP_CUDA_RUNTIME_FUNCTIONS list."""
    text = (root / "kernels" / "device_api.h").read_text(encoding="utf-8")
    block = text.split("#define GRADZIP_CUDA_RUNTIME_FUNCTIONS(X)", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"X\((cuda[A-Za-z0-9_]+)\)", block))


def unrouted_calls(path_name, text, routed):
    code = strip_comments_and_strings(text)
    found = []
    for number, line in enumerate(code.splitlines(), 1):
        for match in RUNTIME_CALL.finditer(line):
            if match.group(1) not in routed:
                found.append(f"{path_name}:{number}: {match.group(1)} is not in "
                             f"kernels/device_api.h's list (add it there, to the emulator and "
                             f"to kernels/emulated/include/cuda_runtime.h)")
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
    routed = {"cudaMemcpyAsync"}
    got_unrouted = unrouted_calls("u.cpp", "cudaMemcpyAsync(a);\ncudaMemcpy2D(b);\n", routed)
    ok = ok and len(got_unrouted) == 1 and "u.cpp:2: cudaMemcpy2D" in got_unrouted[0]
    print("self-test:", "ok" if ok else "FAILED", got_planted, got_clean, got_sync, got_unrouted)
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
    routed = routed_functions(root)
    if len(routed) < 10:
        print(f"only {len(routed)} names read from kernels/device_api.h's list: parser broken?")
        return 1
    for folder in ROUTED_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in ROUTED_SUFFIXES or not path.is_file():
                continue
            name = path.relative_to(root).as_posix()
            if name in NOT_ROUTED:
                continue
            found += unrouted_calls(name, path.read_text(encoding="utf-8", errors="replace"), routed)
    if scanned == 0:
        print(f"no sources found under {root}: wrong root?")
        return 1
    for line in found:
        print(line)
    print(f"{scanned} files scanned, {len(found)} device allocations or waits outside "
          f"{', '.join(sorted(ALLOWED))}, or runtime calls not routed through kernels/device_api.h")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
