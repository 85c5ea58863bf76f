"""The diagnosis behind the DDP hook's per-parameter min_bytes rule (docs/results.md).

Runs examples/torch_ddp_fashion_mnist.py with the hook replaced (EXP_MODE=perparam) by one that
all-reduces every parameter of a bucket on its own with the spec, except parameters under
EXP_MIN_BYTES, which go packed and uncompressed; EXP_MODE=bucket keeps gradzip's hook, which
compresses the whole bucket for a spec with an explicit algo= such as sign:algo=sra. From the repository root:

    EXP_MODE=perparam EXP_MIN_BYTES=4096 PYTHONPATH=build/python torchrun --nproc_per_node 2 \
        docs/data/torch-ddp-min-bytes-2026-12-02/diagnosis_per_parameter_hook.py --spec sign:algo=sra
"""
import os, runpy, sys
import torch
import gradzip, gradzip.torch as gt

MIN = int(os.environ.get("EXP_MIN_BYTES", "65536"))
MODE = os.environ.get("EXP_MODE", "perparam")

def hook(state, bucket):
    buffer = bucket.buffer()
    index = bucket.index()
    layout = state._layout_of(bucket)
    spec = state.spec
    if bucket.is_last():
        state.iteration += 1
    future = torch.futures.Future()
    def communicate():
        try:
            stats = {"sent_bytes": 0}
            small = [(n, o, c) for n, o, c in layout if c * 4 < MIN]
            large = [(n, o, c) for n, o, c in layout if c * 4 >= MIN]
            if small:
                packed = torch.cat([buffer[o:o + c] for _, o, c in small])
                s = state.communicator.allreduce(packed, f"exp.small{index}", "none", op="average")
                stats["sent_bytes"] += s["sent_bytes"]
                at = 0
                for _, o, c in small:
                    buffer[o:o + c].copy_(packed[at:at + c]); at += c
            for n, o, c in large:
                view = buffer[o:o + c]
                s = state.communicator.allreduce(view, f"exp.{n}", spec, op="average")
                stats["sent_bytes"] += s["sent_bytes"]
            state.last_stats[index] = stats
            future.set_result(buffer)
        except Exception as e:
            future.set_exception(e)
    state._thread.submit(communicate)
    return future

if MODE == "perparam":
    gt.hook = hook
sys.argv = ["torch_ddp_fashion_mnist.py"] + sys.argv[1:]
runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples",
                            "torch_ddp_fashion_mnist.py"), run_name="__main__")
