"""What each suite of benchmarks/reproduce.py measures: the paths (files, or folders with
everything under them) whose change can change the suite's figures.

A suite's JSON (docs/data/reproduce/<suite>.json) records the commit it was measured at
(machine.commit). tests/lint/check_results_fresh.py fails when a commit after that one changed
any path listed here for the suite: the figures would then describe code that no longer
exists, and the suite is run again (benchmarks/reproduce.sh --only SUITE).

The rule for the lists: the product code on the measured path (the codecs and kernels every
suite runs; the collectives for what moves data; the Reducer for overlap and training; the
Python package for PyTorch's peers), the build settings that decide how it is compiled, and
the suite's own driver and harness. Documentation, tests (tests/, and a folder's own tests/ by
the exclusion below) and other benchmarks are not listed.
"""

# Tests kept beside the code they test (a codec folder's compressors/<codec>/tests/) are not
# measured: a git pathspec that every suite's list carries (through _CORE), so each reader of
# these lists (git diff -- PATHS) leaves them out.
_NOT_MEASURED = [":(exclude,glob)**/tests/**"]
# Compiled into everything: the public headers, the element math and CPU kernels, the codecs,
# error feedback, and how it is all built.
_CORE = ["include", "kernels", "compressors", "error_feedback", "CMakeLists.txt", "cmake",
         "benchmarks/CMakeLists.txt", "benchmarks/gradzip_bench.cpp", "benchmarks/bench_support.cpp",
         "benchmarks/bench_support.h"] + _NOT_MEASURED
_COLLECTIVES = _CORE + ["collectives"]
_CLUSTER = ["benchmarks/emulated_cluster.sh"]
# The Python package's binding and common modules; the FSDP suites add fsdp.py (gradzip/torch.py
# only re-exports compress_fsdp for them, guarded, never running it), the DDP-hook suites the hook
# (torch.py), and lm the optimizer module too: cnn's driver imports gradzip.optim but its SGD
# never constructs an optimizer from it, and the peers never import it.
_PYTHON_BINDING = ["python/CMakeLists.txt", "python/gradzip_module.cpp",
                   "python/process_group_transport.cpp", "python/process_group_transport.h",
                   "python/gradzip/__init__.py", "python/gradzip/_lifecycle.py",
                   "python/gradzip/_process_group.py", "python/gradzip/_stats.py",
                   "python/gradzip/_world.py"]
_PYTHON_FSDP = _PYTHON_BINDING + ["python/gradzip/fsdp.py"]
_PYTHON_HOOK = _PYTHON_BINDING + ["python/gradzip/torch.py"]
_PYTHON_OPTIM = ["python/gradzip/optim.py"]
# The DDP-hook convergence suites' driver and what it imports from the peers' driver and the
# PyTorch example (the IDX reader).
_DDP_TRAIN = ["benchmarks/convergence_ddp", "benchmarks/peers/ddp_peers.py",
              "examples/torch_ddp_fashion_mnist.py"]

MEASURED = {
    "codecs": _CORE + ["benchmarks/codecs_bench.cpp"],
    "allreduce_shm": _COLLECTIVES + ["benchmarks/allreduce_bench.cpp"],
    "allreduce_cluster": _COLLECTIVES + _CLUSTER + ["benchmarks/allreduce_bench.cpp"],
    "overlap": _COLLECTIVES + _CLUSTER + ["pipeline", "benchmarks/overlap_bench.cpp"],
    "convergence": _COLLECTIVES + ["pipeline", "examples", "benchmarks/convergence.sh"],
    "peers": _COLLECTIVES + _CLUSTER + ["pipeline"] + _PYTHON_HOOK + ["benchmarks/peers/ddp_peers.py"],
    "lm": _COLLECTIVES + _CLUSTER + ["pipeline"] + _PYTHON_HOOK + _PYTHON_OPTIM + _DDP_TRAIN,
    "cnn": _COLLECTIVES + _CLUSTER + ["pipeline"] + _PYTHON_HOOK + _DDP_TRAIN,
    "cost_model": _COLLECTIVES + _CLUSTER + ["benchmarks/allreduce_bench.cpp", "benchmarks/model"],
    "fsdp": _COLLECTIVES + _CLUSTER + _PYTHON_FSDP + ["benchmarks/fsdp"],
    "fsdp_hybrid": _COLLECTIVES + _CLUSTER + _PYTHON_FSDP + ["benchmarks/fsdp"],
}
