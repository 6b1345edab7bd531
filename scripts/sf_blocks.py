"""Host conditions A/B'd inside one SpecForge CLI process, in blocks of its steps:

    SPECFORGE_PYTHON=... python scripts/sf_blocks.py configs/h200-specforge-blocks.yaml \
        --out results/h200-specforge-blocks [--block-s 12] [--seed 0]

It runs the sweep (one long baseline run, its own VRAM poller off), finds SpecForge's training
process, and once its warm-up steps are logged switches two host conditions in blocks of
--block-s seconds, each round visiting the four combinations in a random order:

- ``poll``: the suite's VramPoller (bench/probe/poller.py, the sweep's settings: used memory every
  0.05 s, clocks and power every 1 s, energy every 0.25 s) running in this process, or not;
- ``pin``: SpecForge's main thread alone on the last CPU (its other threads, and this process,
  on the rest), or every thread free to run anywhere (affinity only; nothing else is changed).

Every step that falls wholly inside a block is that block's; a block's level is the mean
log step time of its steps. Per round, a condition's effect is the mean level with it minus
the mean without; the rounds give a t-interval. It also samples the machine's CPU steal time
(the hypervisor's) per block, to set beside the block levels. It writes ``blocks.json`` (blocks,
steps, steal, effects) into --out and prints the analysis.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics as st
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.probe.poller import VramPoller  # noqa: E402

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
CONDITIONS = [(poll, pin) for poll in (False, True) for pin in (False, True)]


def specforge_pid(root: int) -> int | None:
    """The process below ``root`` that runs ``specforge train`` with the most threads."""
    best, best_n = None, 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            n = len(os.listdir(f"/proc/{entry}/task"))
        except OSError:
            continue
        if "specforge" in cmd and " train" in cmd and "bench" not in cmd.split(" ")[0] and n > best_n:
            best, best_n = int(entry), n
    return best


def set_pin(pid: int, pinned: bool, cpus: set[int]) -> None:
    """Main thread alone on max(cpus), the rest elsewhere; or every thread on all cpus."""
    last = max(cpus)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            if not pinned:
                os.sched_setaffinity(int(tid), cpus)
            else:
                os.sched_setaffinity(int(tid), {last} if int(tid) == pid else cpus - {last})
        except OSError:
            pass


def steal_sampler(stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        f = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        vals = [int(x) for x in f]
        out.append((time.time(), vals[7] if len(vals) > 7 else 0, sum(vals[:8])))
        stop.wait(0.5)


def steps_of(run_dir: Path) -> list[dict]:
    p = run_dir / "metrics.jsonl"
    if not p.exists():
        return []
    rows = []
    for line in p.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "step_time_s" in r and "time" in r:
            rows.append(r)
    return rows


def analyse(blocks: list[dict], steps: list[dict], steal: list) -> dict:
    for b in blocks:
        inside = [
            math.log(s["step_time_s"])
            for s in steps
            if s["time"] - s["step_time_s"] >= b["t0"] + 0.3 and s["time"] <= b["t1"]
        ]
        b["steps"] = len(inside)
        b["level"] = sum(inside) / len(inside) if inside else None
        win = [x for x in steal if b["t0"] <= x[0] <= b["t1"]]
        b["steal_pct"] = (
            100 * (win[-1][1] - win[0][1]) / max(win[-1][2] - win[0][2], 1) if len(win) >= 2 else None
        )
    rounds: dict[int, list[dict]] = {}
    for b in blocks:
        if b["level"] is not None:
            rounds.setdefault(b["round"], []).append(b)
    full = [r for r in rounds.values() if len(r) == len(CONDITIONS)]
    effects = {}
    for name, key in (("poll", "poll"), ("pin", "pin")):
        d = [
            100 * (st.mean(b["level"] for b in r if b[key]) - st.mean(b["level"] for b in r if not b[key]))
            for r in full
        ]
        if len(d) >= 2:
            m, s = st.mean(d), st.stdev(d)
            h = T95.get(len(d) - 1, 2.0) * s / math.sqrt(len(d))
            effects[name] = {
                "rounds": len(d),
                "pct": round(m, 3),
                "ci": [round(m - h, 3), round(m + h, 3)],
                "per_round": [round(x, 3) for x in d],
            }
    levels = [b["level"] for r in full for b in r]
    resid = [b["level"] - st.mean(x["level"] for x in r) for r in full for b in r]
    out = {"effects": effects, "rounds": len(full)}
    if len(levels) >= 3:
        out["block_level_sd_pct"] = round(100 * st.stdev(levels), 3)
        out["within_round_sd_pct"] = round(
            100 * math.sqrt(sum(x * x for x in resid) / max(len(resid) - len(full), 1)), 3
        )
        ss = [(b["steal_pct"], b["level"]) for r in full for b in r if b["steal_pct"] is not None]
        if len(ss) >= 3 and st.pstdev([x for x, _ in ss]) > 0:
            out["corr_steal_level"] = round(st.correlation([x for x, _ in ss], [y for _, y in ss]), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--block-s", type=float, default=12.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    cpus = set(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus - {max(cpus)})  # this process (and the sweep it starts) off the pinned CPU
    sweep = subprocess.Popen(
        [sys.executable, "-m", "bench", "sweep", a.config, "--out", str(a.out), "--resume"]
    )
    rng = random.Random(a.seed)
    blocks: list[dict] = []
    steal: list = []
    stop = threading.Event()
    threading.Thread(target=steal_sampler, args=(stop, steal), daemon=True).start()
    pid = run_dir = None
    try:
        while sweep.poll() is None and run_dir is None:  # the run's directory and its warm-up steps
            time.sleep(0.5)
            dirs = sorted((a.out / "runs").glob("*")) if (a.out / "runs").exists() else []
            if dirs and len(steps_of(dirs[0])) >= 4:
                run_dir, pid = dirs[0], specforge_pid(sweep.pid)
        print(f"sf_blocks: run {run_dir}, SpecForge pid {pid}", flush=True)
        rnd = 0
        while pid and sweep.poll() is None:
            order = CONDITIONS[:]
            rng.shuffle(order)
            for poll, pin in order:
                if sweep.poll() is not None:
                    break
                try:
                    set_pin(pid, pin, cpus)
                except OSError:
                    break
                poller = VramPoller(a.out / "blocks_poller", interval_s=0.05).start() if poll else None
                t0 = time.time()
                time.sleep(a.block_s)
                t1 = time.time()
                if poller:
                    poller.stop()
                blocks.append({"round": rnd, "poll": poll, "pin": pin, "t0": t0, "t1": t1})
                print(f"sf_blocks: round {rnd} poll={poll} pin={pin} {t0:.1f}-{t1:.1f}", flush=True)
            rnd += 1
    finally:
        rc = sweep.wait()
        stop.set()
    steps = steps_of(run_dir) if run_dir else []
    res = analyse(blocks, steps, steal)
    (a.out / "blocks.json").write_text(
        json.dumps({"blocks": blocks, "steps": steps, "analysis": res}, indent=1)
    )
    print(json.dumps(res, indent=1))
    for b in blocks:
        lv = "—" if b.get("level") is None else f"{math.exp(b['level']):.4f}"
        print(
            f"round {b['round']} poll={b['poll']!s:5} pin={b['pin']!s:5} steps {b.get('steps')} level {lv} steal {b.get('steal_pct')}"
        )
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
