"""How steady is this machine's host side? ``python scripts/host_copy_probe.py [--seconds 96]
[--block-s 12] [--mib 100] [--out host_copy.json]``

A SpecForge step copies its batch from pageable host memory to the GPU on the main thread
(docs/method.md: 0.063-0.094 s a step, 49% apart between runs of one arm). This probe times,
round after round for SECONDS, the host operations a step is made of, each on a buffer of MIB:

- ``pageable_reused``: one pageable tensor copied to the GPU (the driver stages it through its
  own pinned buffer);
- ``pageable_fresh``: a tensor allocated and filled on the CPU each round, then copied (what a
  loader that builds new tensors per batch does: first-touch page faults plus the copy);
- ``pinned``: a page-locked tensor copied to the GPU (the PCIe link alone);
- ``host_memcpy``: one CPU tensor copied into another (host memory bandwidth alone);
- ``gpu_matmul``: a fixed bfloat16 matmul on the GPU (the card's own speed, at its clocks).

For each it prints the mean time, the coefficient of variation of single rounds, and the spread
(sd, % of the mean) of BLOCK-S-second block means: a host whose speed wanders on a scale of
seconds shows block spreads far above what the single-round noise predicts (cv / sqrt(rounds
per block)). Read-only: it sets no GPU or CPU setting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _timed(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=96.0)
    ap.add_argument("--block-s", type=float, default=12.0)
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--out", default="host_copy.json")
    a = ap.parse_args()
    n = a.mib * 2**20 // 2  # bfloat16 elements
    dev = torch.device("cuda")
    gpu = torch.empty(n, dtype=torch.bfloat16, device=dev)
    pageable = torch.randn(n).to(torch.bfloat16)
    pinned = pageable.pin_memory()
    host_dst = torch.empty_like(pageable)
    m = torch.randn(4096, 4096, dtype=torch.bfloat16, device=dev)

    def fresh():
        t = torch.empty(n, dtype=torch.bfloat16)
        t.fill_(1.0)
        gpu.copy_(t)

    ops = {
        "pageable_reused": lambda: gpu.copy_(pageable),
        "pageable_fresh": fresh,
        "pinned": lambda: gpu.copy_(pinned, non_blocking=True),
        "host_memcpy": lambda: host_dst.copy_(pageable),
        "gpu_matmul": lambda: [m @ m for _ in range(8)],
    }
    for fn in ops.values():  # warm-up
        _timed(fn)
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in ops}
    t0 = time.perf_counter()
    while (now := time.perf_counter() - t0) < a.seconds:
        for k, fn in ops.items():
            samples[k].append((now, _timed(fn)))
    doc = {"seconds": a.seconds, "block_s": a.block_s, "mib": a.mib, "ops": {}}
    print(f"{'op':<16} {'mean ms':>8} {'GB/s':>7} {'cv %':>6} {'block sd %':>10} {'white %':>8} blocks")
    for k, xs in samples.items():
        ts = [t for _, t in xs]
        mean = statistics.fmean(ts)
        cv = statistics.stdev(ts) / mean * 100
        nb = int(a.seconds // a.block_s)
        blocks = [[t for s, t in xs if b * a.block_s <= s < (b + 1) * a.block_s] for b in range(nb)]
        bmeans = [statistics.fmean(b) for b in blocks if b]
        bsd = statistics.stdev(bmeans) / statistics.fmean(bmeans) * 100 if len(bmeans) > 1 else float("nan")
        white = cv / (len(ts) / max(len(bmeans), 1)) ** 0.5
        gbs = a.mib * 2**20 / mean / 1e9 if k != "gpu_matmul" else float("nan")
        doc["ops"][k] = {
            "rounds": len(ts),
            "mean_s": mean,
            "cv_pct": cv,
            "block_means_s": bmeans,
            "block_sd_pct": bsd,
            "white_block_sd_pct": white,
        }
        print(f"{k:<16} {mean * 1e3:8.2f} {gbs:7.2f} {cv:6.2f} {bsd:10.2f} {white:8.2f} {len(bmeans)}")
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
