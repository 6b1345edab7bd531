"""Where the SpecForge CLI's run-to-run spread comes from, per run of a sweep directory:

    python scripts/sf_spread.py results/h200-specforge-diag [--smi results/h200-specforge-diag/smi.csv]
        [--steps 2-12]

For each ok run: its level (mean step time over --steps) and the coefficient of variation inside
it; with probe.json (BENCH_SPECFORGE_PROBE), the profiled steps' wall time split into GPU kernels,
pageable host-to-device copies and GPU idle time, per step, and the main thread's CPU placement;
with --smi (nvidia-smi's 250-ms samples, scripts/h200_sweeps.sh), the card's mean SM clock and
power over the run's level window and the correlation of step time with 1/clock over all steps
of an arm; every step more than 15% slower than its run's median (a pause, e.g. a full garbage
collection); then, per arm, the spread of the level across runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics as st
from pathlib import Path


def smi_samples(path: Path) -> list[tuple[float, float, float, int | None]]:
    """(unix time, SM clock MHz, power W, GPU utilisation % or None) of each sample of
    scripts/h200_sweeps.sh's nvidia-smi CSV (no header, no units)."""
    out = []
    for line in path.read_text().splitlines():
        f = [x.strip() for x in line.split(",")]
        try:
            t = dt.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.UTC).timestamp()
            util = int(f[5]) if len(f) > 5 and f[5].isdigit() else None
            out.append((t, float(f[1]), float(f[3]), util))
        except (ValueError, IndexError):
            continue
    return out


def window(smi, t0: float, t1: float) -> list[tuple[float, float, float, int | None]]:
    return [s for s in smi if t0 <= s[0] <= t1]


def profile_split(probe: dict) -> dict | None:
    p = probe.get("profile")
    if not p:
        return None
    n = max(int(probe.get("count") or 1), 1)
    memcpy = sum(k["s"] for k in p["top"] if k["name"].startswith("Memcpy"))
    ranges = sum(k["s"] for k in p["top"] if "FullyShardedDataParallel" in k["name"])  # annotations
    main = next((t for t in probe.get("host", {}).get("threads", []) if t["tid"] == probe.get("pid")), {})
    return {
        "wall": p["wall_s"] / n,
        "kernels": (p["kernel_s"] - ranges - memcpy) / n,
        "memcpy": memcpy / n,
        "idle": (p["wall_s"] - p["gpu_busy_s"]) / n,
        "main_cpu": main.get("cpu_last"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--smi", type=Path)
    ap.add_argument("--steps", default="2-12", help="the level's steps, FIRST-LAST (default 2-12)")
    args = ap.parse_args(argv)
    lo, hi = (int(x) for x in args.steps.split("-"))
    smi = smi_samples(args.smi) if args.smi else []
    levels: dict[str, list[float]] = {}
    clock_pairs: dict[str, list[tuple[float, float]]] = {}
    print(
        f"{'run':<44} {'level s':>8} {'cv %':>5} {'clock':>6} {'power':>6}  profiled step: wall / kernels / memcpy / idle"
    )
    for rdir in sorted((args.sweep_dir / "runs").iterdir()):
        run = json.loads((rdir / "run.json").read_text()) if (rdir / "run.json").exists() else {}
        if run.get("status") != "ok":
            continue
        rows = [json.loads(x) for x in (rdir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        steps = [r for r in rows if lo <= r["step"] <= hi]
        times = [r["step_time_s"] for r in steps]
        level = st.mean(times)
        arm = run.get("arm", "?")
        levels.setdefault(arm, []).append(level)
        clock = power = ""
        if smi and steps:
            w = window(smi, steps[0]["time"] - steps[0]["step_time_s"], steps[-1]["time"])
            if w:
                clock, power = f"{st.mean(s[1] for s in w):.0f}", f"{st.mean(s[2] for s in w):.0f}"
            for r in steps:
                ws = window(smi, r["time"] - r["step_time_s"], r["time"])
                if ws:
                    clock_pairs.setdefault(arm, []).append((1 / st.mean(s[1] for s in ws), r["step_time_s"]))
        split = ""
        probe_path = rdir / "probe.json"
        if probe_path.exists():
            s = profile_split(json.loads(probe_path.read_text()))
            if s:
                split = f"{s['wall']:.4f} / {s['kernels']:.4f} / {s['memcpy']:.4f} / {s['idle']:.4f} (main thread on CPU {s['main_cpu']})"
        cv = st.stdev(times) / level * 100 if len(times) > 1 else 0.0
        print(f"{rdir.name:<44} {level:8.4f} {cv:5.2f} {clock:>6} {power:>6}  {split}")
        med = st.median(r["step_time_s"] for r in rows if r["step"] > 1)
        slow = [
            (r["step"], round(r["step_time_s"], 3))
            for r in rows
            if r["step"] > 1 and r["step_time_s"] > 1.15 * med
        ]
        if slow:
            print(f"{'':<44} steps over 1.15x the median {med:.3f}: {slow}")
    print()
    for arm, xs in levels.items():
        spread = (max(xs) - min(xs)) / st.mean(xs) * 100
        sd = st.stdev(xs) / st.mean(xs) * 100 if len(xs) > 1 else float("nan")
        line = (
            f"{arm}: {len(xs)} runs, level {min(xs):.4f}-{max(xs):.4f} s (range {spread:.1f}%, sd {sd:.2f}%)"
        )
        pairs = clock_pairs.get(arm, [])
        if len(pairs) > 2:
            line += (
                f"; corr(step time, 1/clock) over {len(pairs)} steps = {st.correlation(*zip(*pairs)):+.2f}"
            )
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
