#!/usr/bin/env python3
"""ctest's lint.layers: the include rule of docs/architecture.md ("The include rule"), checked.

The product folders form layers, from the bottom up:

    include/gradzip < kernels < compressors < error_feedback < collectives < pipeline < python

A file may include the public headers (gradzip/...), its own layer and the layers below it;
an include of a layer above is an upward arrow and fails, naming the file, the line and the
header. Tests inside a product folder (compressors/<codec>/tests/) are test code, like tests/,
and not checked. Inside collectives/, transport/ is below the rest: a transport file may include
collectives/transport/..., never another collectives/ header. pipeline/ and python/ reach the
collectives only through the headers NARROW_COLLECTIVES lists, never communicator_state.h or
the objects it owns. EXCEPTIONS lists the arrows the architecture states as exceptions, each
with its reason; an exception that no longer occurs fails too (so the list stays true).

Also printed, not enforced: the include arrows between files of collectives/ (a measure of how
tangled the layer is inside).

  check_layers.py ROOT           the self-test, then the check of ROOT's product folders
  check_layers.py --self-test    the rule on made-up files: a downward include passes; an
                                 upward one, a transport file including the collectives and a
                                 pipeline file including communicator_state.h fail; a listed
                                 exception passes and a stale one fails
"""
import re
import sys
import tempfile
from pathlib import Path

LAYERS = ["kernels", "compressors", "error_feedback", "collectives", "pipeline", "python"]
SOURCE_SUFFIXES = {".h", ".cpp", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

# What pipeline/ and python/ may include from collectives/: the narrow interface and the
# helpers the architecture names for them.
NARROW_COLLECTIVES = {
    "collectives/communicator_internal.h", "collectives/random_streams.h",
    "collectives/device_memory.h", "collectives/call_check.h", "collectives/collective_job.h",
    "collectives/timeline.h", "collectives/json_text.h",
    "collectives/transport/transport.h", "collectives/transport/deadline.h",
    "collectives/transport/nccl/nccl_library.h",
}

# (including file, included header): why the arrow is allowed. docs/architecture.md states each.
EXCEPTIONS = {
    ("collectives/transport/mpi/mpi_communicator.cpp", "collectives/communicator_state.h"):
        "the transport sub-layer builds the world Communicator (make_communicator)",
    ("python/gradzip_module.cpp", "pipeline/powersgd.h"):
        "the binding exposes PowerSGD's matrix all-reduce",
}


def layer_of(path):
    """The layer index of a repository-relative path (or header), or None outside the layers;
    the public headers (gradzip/..., include/gradzip/...) are -1, below everything."""
    if path.startswith("gradzip/") or path.startswith("include/gradzip/"):
        return -1
    top = path.split("/", 1)[0]
    return LAYERS.index(top) if top in LAYERS else None


def arrows(root):
    """(file, line number, header) for every quoted include in the product folders."""
    found = []
    for layer in ["include"] + LAYERS:
        for path in sorted((Path(root) / layer).rglob("*")):
            if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
                continue
            relative = path.relative_to(root).as_posix()
            if "/tests/" in relative:
                continue  # a codec folder's own tests (compressors/<codec>/tests/) are test code
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                match = INCLUDE.match(line)
                if match:
                    found.append((relative, number, match.group(1)))
    return found


def problems_of(root, exceptions=EXCEPTIONS):
    problems, used = [], set()
    for source, number, header in arrows(root):
        where = f"{source}:{number}: includes {header}"
        if (source, header) in exceptions:
            used.add((source, header))
            continue
        mine, theirs = layer_of(source), layer_of(header)
        if mine is None or theirs is None:
            continue  # a system-style or third-party header, or tests/ and benchmarks/
        if theirs > mine:
            problems.append(f"{where}: {LAYERS[theirs]}/ is above {LAYERS[mine]}/ (upward)")
        elif source.startswith("collectives/transport/") and header.startswith("collectives/") \
                and not header.startswith("collectives/transport/"):
            problems.append(f"{where}: collectives/transport/ is below the rest of collectives/")
        elif LAYERS[mine] in ("pipeline", "python") and header.startswith("collectives/") \
                and header not in NARROW_COLLECTIVES:
            problems.append(f"{where}: {LAYERS[mine]}/ reaches collectives/ only through "
                            f"communicator_internal.h and the helpers NARROW_COLLECTIVES lists")
    for stale in sorted(set(exceptions) - used):
        problems.append(f"exception {stale[0]} -> {stale[1]} no longer occurs: remove it from "
                        f"EXCEPTIONS and docs/architecture.md")
    return problems


def collectives_arrows(root):
    """How many includes of one collectives/ file by another (outside transport/)."""
    return sum(1 for source, _, header in arrows(root)
               if source.startswith("collectives/") and header.startswith("collectives/")
               and not source.startswith("collectives/transport/")
               and not header.startswith("collectives/transport/"))


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)

        def write(name, *headers):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text("".join(f'#include "{h}"\n' for h in headers) + "#include <vector>\n")

        write("kernels/a.h", "gradzip/error.h")
        write("compressors/b.cpp", "kernels/a.h", "compressors/b.h")
        write("collectives/c.cpp", "error_feedback/d.h", "compressors/b.h")
        write("collectives/transport/t.cpp", "collectives/transport/transport.h", "kernels/a.h")
        write("pipeline/p.cpp", "collectives/communicator_internal.h")
        write("compressors/codec/tests/test_codec.cpp", "collectives/codec_table.h")  # test code
        assert problems_of(root, {}) == [], problems_of(root, {})
        write("kernels/up.cpp", "compressors/b.h")
        write("collectives/transport/up.cpp", "collectives/call.h")
        write("pipeline/inside.cpp", "collectives/communicator_state.h")
        found = problems_of(root, {})
        assert len(found) == 3, found
        assert any("kernels/up.cpp:1" in f and "upward" in f for f in found), found
        assert any("transport/up.cpp" in f and "below the rest" in f for f in found), found
        assert any("pipeline/inside.cpp" in f and "communicator_internal.h" in f for f in found), found
        allowed = {("kernels/up.cpp", "compressors/b.h"): "made up",
                   ("collectives/transport/up.cpp", "collectives/call.h"): "made up",
                   ("pipeline/inside.cpp", "collectives/communicator_state.h"): "made up"}
        assert problems_of(root, allowed) == [], problems_of(root, allowed)
        stale = {**allowed, ("kernels/a.h", "compressors/gone.h"): "made up"}
        found = problems_of(root, stale)
        assert len(found) == 1 and "no longer occurs" in found[0], found
    print("self-test: downward includes and a codec folder's tests pass; an upward one, transport including the "
          "collectives and pipeline including communicator_state.h fail; listed exceptions pass, "
          "a stale one fails")


def main():
    args = sys.argv[1:]
    self_test()
    if args == ["--self-test"]:
        return 0
    if len(args) != 1:
        print(__doc__)
        return 2
    root = Path(args[0])
    problems = problems_of(root)
    for problem in problems:
        print(f"LAYER {problem}")
    count = len(arrows(root))
    print(f"{count} includes in the product folders, {len(problems)} against the include rule, "
          f"{len(EXCEPTIONS)} stated exceptions; {collectives_arrows(root)} arrows between files "
          f"of collectives/ (outside transport/)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
