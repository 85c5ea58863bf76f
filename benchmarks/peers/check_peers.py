#!/usr/bin/env python3
"""Smoke check of ddp_peers.py (ctest python.peers_smoke.np2): tiny settings, 2 ranks, loopback.

    python3 benchmarks/peers/check_peers.py --mpirun MPIRUN [--port P]

Runs ddp_peers.py under `MPIRUN --oversubscribe --bind-to none -np 2` with a 784-256-128-10
model for 60 steps (timed 3..5; about 10 s in all) and checks its JSON: every configuration is there and measured
(none skipped), times and bytes are positive, every gradzip row names the algorithms it ran (no_communication: 0 bytes, no accuracy),
accuracies lie in [0, 1], and the bytes per step
relative to DDP's default all-reduce are what the codecs derive (f32 ring baseline:
2(P-1)/P x 4 bytes per element; per-chunk headers add at most the slack given below):
  ddp_fp16_hook        exactly 1/2 (the formula)
  gradzip_none         [1, 1.005]              (the same f32 ring, + headers)
  gradzip_fp16         [0.5, 0.505]            (2 bytes per element + headers)
  gradzip_qsgd4        [0.1269, 0.135]          ((4 + 32 / 512) / 32: 4 bits + an f32 scale per 512)
  gradzip_sign         [0.0332, 0.036]          ((1 + 32 / 512) / 32)
  gradzip_topk1        (0, 1.1 x 0.01 x P]      (all-gather of k = 1% (index, value) pairs to
                                                 P - 1 ranks: 8k(P-1) / (2(P-1)/P x 4n) = 0.01 P)
  gradzip_powersgd4    [1, 1.2] x ddp_powersgd_hook (the same P and Q, every matrix of this
                                                 model compressed by both, plus headers)
For gradzip's codecs these are the ratios of the compressed parameters: the DDP hook averages
the parameters under min_bytes (65536 bytes: the biases and the 128 x 10 output layer, 0.7% of
this model) uncompressed, so a codec's bounds [low, high] become (1 - f) [low, high] + f with f
that fraction, computed from the JSON's widths (uncompressed_fraction).
And training ran and communicated:
  - ddp_default's test accuracy after 60 steps is at least 0.4 (measured 0.62; chance is 0.1);
  - every configuration that communicates reaches at least ACCURACY_FRACTION (0.9) of
    ddp_default's accuracy (measured: 0.97-1.00 of it). A codec whose decode collapses (a
    hook that hands DDP zeros after the dense steps) stays near the dense steps' model and
    fails this;
  - every configuration that communicates ends with the same parameters on every rank
    (replicas_identical), and no_communication does not: a hook that does nothing (hands DDP
    the local gradient) lets the replicas drift apart and fails this, and the control shows
    the digest can tell.
The byte figures are those of each codec's default algorithm (SRA for qsgd and sign). algo=auto
would measure the link and could take the tree (f32 vectors) instead when a loaded machine
makes every start-up slow, so the run is given a fixed link, GRADZIP_LINK=50,0.1 (50 us,
100 Mbit/s: bytes dominate), and the choice does not depend on what else the machine is doing.
Exit 0 when all hold, 1 (naming every failed check) otherwise, 77 (skip) without torch.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
RANKS = 2
STEPS = 60
ACCURACY_FRACTION = 0.9
EXPECTED = ["no_communication", "ddp_default", "ddp_fp16_hook", "ddp_powersgd_hook", "gradzip_none",
            "gradzip_fp16", "gradzip_qsgd4", "gradzip_sign", "gradzip_topk1", "gradzip_powersgd4"]
MIN_BYTES = 65536  # the spec default: the hook averages smaller parameters uncompressed
# name -> (low, high) of bytes per step / ddp_default's, for the compressed parameters (gradzip_*)
RATIO_BOUNDS = {
    "ddp_fp16_hook": (0.5, 0.5),
    "gradzip_none": (1.0, 1.005),
    "gradzip_fp16": (0.5, 0.505),
    "gradzip_qsgd4": (0.1269, 0.135),
    "gradzip_sign": (0.0332, 0.036),
    "gradzip_topk1": (1e-9, 1.1 * 0.01 * RANKS),
}


def uncompressed_fraction(hidden):
    """The fraction of WideMlp(hidden)'s parameters under MIN_BYTES (4 bytes an element): what
    gradzip's hook sends uncompressed with algo=auto."""
    widths = [784] + list(hidden) + [10]
    sizes = []
    for fan_in, fan_out in zip(widths, widths[1:]):
        sizes += [fan_in * fan_out, fan_out]  # a 1x1 convolution's weight and bias
    return sum(n for n in sizes if 4 * n < MIN_BYTES) / sum(sizes)


def check(document):
    failures = []
    f = uncompressed_fraction(document["hidden"])
    results = {r["name"]: r for r in document["results"]}
    for name in EXPECTED:
        if name not in results:
            failures.append(f"{name}: missing from the JSON")
        elif "skipped" in results[name]:
            failures.append(f"{name}: skipped ({results[name]['skipped']})")
    measured = {n: r for n, r in results.items() if "skipped" not in r}
    for name, r in measured.items():
        if not r["step_time_s"] > 0:
            failures.append(f"{name}: step time {r['step_time_s']} is not positive")
        if name == "no_communication":
            if r["bytes_per_step"] != 0 or r["test_accuracy"] is not None:
                failures.append(f"{name}: sends {r['bytes_per_step']} bytes, accuracy "
                                f"{r['test_accuracy']} (expected 0 and none)")
            continue
        if not r["bytes_per_step"] > 0:
            failures.append(f"{name}: bytes per step {r['bytes_per_step']} is not positive")
        if not 0 <= r["test_accuracy"] <= 1:
            failures.append(f"{name}: test accuracy {r['test_accuracy']} outside [0, 1]")
    if "ddp_default" in measured:
        base = measured["ddp_default"]["bytes_per_step"]
        for name, (low, high) in RATIO_BOUNDS.items():
            if name.startswith("gradzip_"):
                low, high = (1 - f) * low + f, (1 - f) * high + f
            if name in measured:
                ratio = measured[name]["bytes_per_step"] / base
                if not low - 1e-12 <= ratio <= high + 1e-12:
                    failures.append(f"{name}: bytes per step {ratio:.5f} x the default's, "
                                    f"expected [{low:.5f}, {high:.5f}]")
        reference = measured["ddp_default"]["test_accuracy"]
        if not reference >= 0.4:
            failures.append(f"ddp_default: accuracy {reference} below 0.4 after {STEPS} steps")
        for name, r in measured.items():
            if name != "no_communication" and not r["test_accuracy"] >= ACCURACY_FRACTION * reference:
                failures.append(f"{name}: accuracy {r['test_accuracy']:.4f} below "
                                f"{ACCURACY_FRACTION} x ddp_default's {reference:.4f}")
    for name, r in measured.items():
        if name.startswith("gradzip_") and not r.get("algorithms"):
            failures.append(f"{name}: no algorithms recorded for the hook's calls")
    for name, r in measured.items():
        communicates = name != "no_communication"
        if r.get("replicas_identical") is not communicates:
            failures.append(f"{name}: replicas_identical is {r.get('replicas_identical')}, expected "
                            f"{communicates} ({'averaged' if communicates else 'local'} gradients)")
    if "ddp_powersgd_hook" in measured and "gradzip_powersgd4" in measured:
        ratio = measured["gradzip_powersgd4"]["bytes_per_step"] / measured["ddp_powersgd_hook"]["bytes_per_step"]
        if not 1 <= ratio <= 1.2:
            failures.append(f"gradzip_powersgd4: bytes per step {ratio:.4f} x the PowerSGD hook's, "
                            "expected [1, 1.2]")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mpirun", default="mpirun")
    parser.add_argument("--port", type=int, default=29699)
    args = parser.parse_args()
    if importlib.util.find_spec("torch") is None:  # ddp_peers.py needs it
        print("check_peers: skipped, this Python has no torch")
        return 77
    with tempfile.TemporaryDirectory() as folder:
        output = os.path.join(folder, "peers.json")
        command = [args.mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(RANKS),
                   sys.executable, os.path.join(HERE, "ddp_peers.py"), "--hidden", "256,128",
                   "--steps", str(STEPS), "--warmup", "3", "--timed", "3", "--port", str(args.port),
                   "--json", output]
        print(" ".join(command), flush=True)
        run = subprocess.run(command, timeout=300, env=dict(os.environ, GRADZIP_LINK="50,0.1"))
        if run.returncode != 0:
            print(f"check_peers: ddp_peers.py failed (exit {run.returncode})")
            return 1
        with open(output) as f:
            failures = check(json.load(f))
    for failure in failures:
        print(f"check_peers: FAILED {failure}")
    print("check_peers: " + ("all checks passed" if not failures else f"{len(failures)} failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
