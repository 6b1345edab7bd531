"""The toy trainer: fits y = w·x by minibatch SGD in pure Python, one ``TOY {json}`` line per step.

python -m tests.toy_trainer.train --config C --steps N --batch B --seed S
"""

from __future__ import annotations

import argparse
import json
import random
import time

import yaml


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.toy_trainer.train")
    for flag in ("--steps", "--batch", "--seed"):
        ap.add_argument(flag, type=int, required=True)
    ap.add_argument("--config", required=True)
    args = ap.parse_args()
    features = int(yaml.safe_load(open(args.config))["features"])
    rng = random.Random(0)  # the same data and start in every run: only timing differs
    truth = [rng.gauss(0, 1) for _ in range(features)]
    w = [0.0] * features
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        loss, grad = 0.0, [0.0] * features
        for _ in range(args.batch * 50):
            x = [rng.gauss(0, 1) for _ in range(features)]
            err = sum(a * b for a, b in zip(w, x)) - sum(a * b for a, b in zip(truth, x))
            loss += err * err
            grad = [g + 2 * err * xi for g, xi in zip(grad, x)]
        n = args.batch * 50
        w = [wi - 0.05 * g / n for wi, g in zip(w, grad)]
        dt = time.perf_counter() - t0
        row = {"step": step, "loss": loss / n, "accuracy": None, "step_time_s": dt, "samples": args.batch}
        row |= {"tokens": args.batch, "samples_per_s": args.batch / dt, "tokens_per_s": args.batch / dt}
        print("TOY " + json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
