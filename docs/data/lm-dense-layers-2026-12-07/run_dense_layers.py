"""The lm workload of benchmarks/convergence_ddp/ddp_train.py with two more configurations, for
one measurement recorded in docs/results.md ("Keeping the embeddings and the output layer
dense"): `signdense` and `topk1dense` are sign and top-k 1% with min_bytes=131073, so that the
DDP hook averages every parameter under 131073 bytes uncompressed. In the byte GPT (width 128)
those are the token embedding and the output layer (256 x 128 each), the position embedding,
the four attention output projections (128 x 128), the norms and biases; the attention's
input projections (128 x 384) and the MLPs (128 x 512, 512 x 128) stay compressed. With the
default min_bytes (65536) only the position embedding, norms and biases are dense.

Run it like the driver, from the repository root (same flags):
    PYTHONPATH=build/python torchrun --nproc_per_node 4 \
        docs/data/lm-dense-layers-2026-12-07/run_dense_layers.py --workload lm --seed 1 \
        --configs sign,signdense,topk1,topk1dense --json seed1.json
"""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "convergence_ddp"))

import ddp_train  # noqa: E402

ddp_train.CODECS.update({"signdense": "sign:min_bytes=131073",
                         "topk1dense": "topk:ratio=0.01,min_bytes=131073"})

if __name__ == "__main__":
    ddp_train.main()
