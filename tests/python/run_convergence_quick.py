#!/usr/bin/env python3
"""The quick convergence check of the DDP hook: compressed training must learn.

    run_convergence_quick.py --workload lm|cnn --python PY --torchrun TORCHRUN [--port P]

Runs benchmarks/convergence_ddp/ddp_train.py --quick under torchrun (4 ranks: 150 steps of
none, qsgd4 and topk1_fv for the lm workload, none and topk1_mc for the cnn) and checks every
configuration against thresholds that a model which learned nothing cannot meet:

- lm: the validation loss must be below H1, the cross-entropy of the held-out text under the
  training text's byte frequencies (add-one smoothed): the best a model can do that ignores
  the context. And a compressed configuration must keep at least half of `none`'s gain over
  H1 (H1 - loss >= (H1 - loss_none) / 2).
- cnn: the test accuracy must be above what a classifier without information scores on the
  10,000 balanced test images: 10%, plus 5 standard deviations of a 10% binomial share
  (0.3%), so 11.5%. And a compressed configuration must keep at least 80% of `none`'s gain
  over 10%.
- every configuration: the replicas end identical (DDP stays in step only if the gradients
  were averaged) and the run did not diverge.

Then the same checks must FAIL on a broken hook: the first compressed configuration again with
--sabotage negate (the hook hands back the negated average: gradient ascent), against the good
run's `none`. A checker that passed it would pass anything. Exit 0 when both hold, 1 otherwise,
77 (skip) when the interpreter has no torch or the data is missing.
"""
import argparse
import collections
import glob
import json
import math
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(ROOT, "benchmarks", "convergence_ddp", "ddp_train.py")
FORTUNES = "/usr/share/games/fortunes"
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
CHANCE, CHANCE_BOUND = 0.10, 0.10 + 5 * math.sqrt(0.10 * 0.90 / 10000)


def unigram_cross_entropy(folder):
    """H1 in nats per byte: the held-out tenth under the add-one smoothed byte frequencies of
    the first nine tenths (the split ddp_train.py makes)."""
    files = sorted(p for p in glob.glob(os.path.join(folder, "*"))
                   if os.path.isfile(p) and not p.endswith((".dat", ".u8")))
    text = b"".join(open(p, "rb").read() for p in files)
    split = len(text) * 9 // 10
    counts = collections.Counter(text[:split])
    total = split + 256
    held_out = text[split:]
    return -sum(n * math.log((counts[b] + 1) / total)
                for b, n in collections.Counter(held_out).items()) / len(held_out)


def failures(workload, results, none_final, h1):
    """What each result misses of its thresholds (an empty list: it learned)."""
    problems = []
    for r in results:
        label = r["label"]
        if r["diverged"]:
            problems.append(f"{label}: diverged at step {r['diverged']}")
            continue
        if not r["replicas_identical"]:
            problems.append(f"{label}: the replicas ended different (the gradients were not averaged)")
        if workload == "lm":
            loss = r["final"]["validation_loss"]
            if not loss < h1:
                problems.append(f"{label}: validation loss {loss:.4f} is not below H1 = {h1:.4f}")
            elif r["kind"] == "gradzip" and r["spec"] != "none" and h1 - loss < (h1 - none_final) / 2:
                problems.append(f"{label}: gain over H1 {h1 - loss:.4f} is under half of none's "
                                f"{h1 - none_final:.4f}")
        else:
            accuracy = r["final"]["test_accuracy"]
            if not accuracy > CHANCE_BOUND:
                problems.append(f"{label}: test accuracy {accuracy:.4f} is not above {CHANCE_BOUND:.4f}")
            elif r["kind"] == "gradzip" and r["spec"] != "none" and \
                    accuracy - CHANCE < 0.8 * (none_final - CHANCE):
                problems.append(f"{label}: gain over chance {accuracy - CHANCE:.4f} is under 80% of "
                                f"none's {none_final - CHANCE:.4f}")
    return problems


def train(args, extra, path):
    command = [args.torchrun, "--nproc_per_node", "4", "--master_addr", "127.0.0.1",
               "--master_port", str(args.port), DRIVER, "--workload", args.workload, "--quick",
               "--json", path, *extra]
    print("run_convergence_quick:", " ".join(command), flush=True)
    done = subprocess.run(command, timeout=args.timeout)
    if done.returncode != 0:
        sys.exit(f"run_convergence_quick: ddp_train.py exited {done.returncode}")
    with open(path) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=["lm", "cnn"], required=True)
    parser.add_argument("--python", required=True, help="the interpreter torchrun runs")
    parser.add_argument("--torchrun", required=True)
    parser.add_argument("--port", type=int, default=29760)
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()
    if not os.access(args.torchrun, os.X_OK) or subprocess.run(
            [args.python, "-c", "import torch"], capture_output=True).returncode != 0:
        print(f"SKIP: no torchrun with torch at {args.torchrun} (scripts/install-deps.sh --torch-venv)")
        return 77
    data = FORTUNES if args.workload == "lm" else FASHION_MNIST
    if not os.path.isdir(data):
        print(f"SKIP: {data} is missing (scripts/install-deps.sh installs it)")
        return 77
    h1 = unigram_cross_entropy(FORTUNES) if args.workload == "lm" else None
    with tempfile.TemporaryDirectory() as scratch:
        good = train(args, [], os.path.join(scratch, "good.json"))
        none = next(r for r in good["results"] if r["label"] == "none")
        metric = good["metric"]
        none_final = none["final"][metric]
        print(f"{args.workload}: none's {metric} after {good['steps']} steps: {none_final:.4f}"
              + (f" (H1 = {h1:.4f} nats per byte)" if h1 is not None else
                 f" (chance bound {CHANCE_BOUND:.4f})"))
        for r in good["results"]:
            print(f"  {r['label']:<12} {metric} {r['final'][metric]:.4f}, "
                  f"{r['bytes_per_step'] / 1e6:.3f} MB/step")
        problems = failures(args.workload, good["results"], none_final, h1)
        compressed = next(r["label"] for r in good["results"] if r["spec"] != "none")
        broken = train(args, ["--configs", compressed, "--sabotage", "negate"],
                       os.path.join(scratch, "broken.json"))
        caught = failures(args.workload, broken["results"], none_final, h1)
        print(f"sabotaged {compressed} (negated average): "
              + ("; ".join(caught) if caught else "PASSED THE CHECKS"))
    for problem in problems:
        print(f"FAIL {problem}")
    if not caught:
        print("FAIL the thresholds let a broken hook (negated average) pass")
    ok = not problems and bool(caught)
    print("run_convergence_quick: " + ("every configuration learned, and the broken hook was caught"
                                       if ok else "failed"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
