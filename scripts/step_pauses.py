"""What each step of a lockstep sweep's runs did: ``python scripts/lockstep_steps.py SWEEP_DIR
[--from-step 4] [--pause-s 0.1] [--smi SMI_CSV]``

For every pair (``pairing: lockstep``) of SWEEP_DIR: each arm's level (mean own step time over the
measured steps), the pair's Δ samples/s (the samples per step are the same in both arms), and
each step slower than its run's median by more than PAUSE_S, with when it ended after step 1
and what its record says of it (``lockstep.jsonl``: full garbage collections, CPU time of the
process and of its main thread, the CUDA allocator's calls). With ``--smi`` (scripts/h200_sweeps.sh's
nvidia-smi samples: time, SM clock, memory clock, power, temperature, utilisation, clock-event
reasons), how many pause steps and how many other measured steps hold a sample of 0% utilisation
(the card idle for a whole sample period). With ``--threads N``, each run's CPU seconds per
measured step by thread (``lockstep.jsonl``'s ``threads``: the N busiest names, user + system,
and all others summed), the priming pairs of ``prime_runs`` (under prime/) first as r0. The pause
analysis of results/h200-specforge-verdict-lockstep/README.md is this script's output.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fileio import read_json, read_jsonl  # noqa: E402
from bench.trainers.specforge_cli.wrapper import LOCKSTEP, lockstep_records  # noqa: E402
from scripts.sf_spread import smi_samples, window  # noqa: E402


def records(rdir: Path) -> list[dict]:
    """Each step's time and end: a lockstep run's turn records, else its metrics rows."""
    turns = lockstep_records(rdir / LOCKSTEP)
    if turns:
        return [turns[k] for k in sorted(turns)]
    return [
        {
            "step": r["step"],
            "own_s": r["step_time_s"],
            "ended": r["time"],
            "started": r["time"] - r["step_time_s"],
        }
        for r in read_jsonl(rdir / "metrics.jsonl")
        if isinstance(r.get("step_time_s"), float) and isinstance(r.get("time"), float)
    ]


def pauses(recs: list[dict], first: int, over_s: float) -> list[dict]:
    """The measured steps slower than the run's median by more than ``over_s``."""
    measured = [r for r in recs if r["step"] >= first]
    if not measured:
        return []
    median = statistics.median(r["own_s"] for r in measured)
    t1 = recs[0]["ended"]
    out = []
    for r in measured:
        if r["own_s"] - median > over_s:
            extra = {k: r[k] for k in ("gc2_s", "cpu_s", "main_cpu_s", "allocator") if k in r}
            out.append(
                {"step": r["step"], "over_s": r["own_s"] - median, "after_step1_s": r["ended"] - t1, **extra}
            )
    return out


def thread_cpu(recs: list[dict], first: int, top: int) -> str:
    """A run's mean CPU seconds per measured step by thread: the ``top`` busiest names, then the rest."""
    measured = [r for r in recs if r["step"] >= first and isinstance(r.get("threads"), dict)]
    if not measured:
        return "no per-thread record"
    totals: dict[str, float] = {}
    for r in measured:
        for name, t in r["threads"].items():
            totals[name] = totals.get(name, 0.0) + t["user_s"] + t["sys_s"]
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    parts = [f"{name} {cpu / len(measured):.3f}" for name, cpu in ranked[:top]]
    rest = sum(cpu for _, cpu in ranked[top:]) / len(measured)
    system = sum(t["sys_s"] for r in measured for t in r["threads"].values()) / len(measured)
    return (
        ", ".join(parts)
        + f", {len(ranked) - top} others {rest:.3f}" * (len(ranked) > top)
        + f" (system {system:.3f})"
    )


def idle_counts(rounds: dict, smi: list[tuple], first: int, over_s: float) -> tuple[int, int, int, int]:
    """(pause steps with a 0% sample, pause steps, other steps with one, other steps)."""
    counts = [0, 0, 0, 0]
    for arms in rounds.values():
        for recs in arms.values():
            paused = {p["step"] for p in pauses(recs, first, over_s)}
            for r in recs:
                if r["step"] < first:
                    continue
                idle = any(x[3] == 0 for x in window(smi, r["started"] + 0.05, r["ended"]))
                k = 0 if r["step"] in paused else 2
                counts[k] += idle
                counts[k + 1] += 1
    return counts[0], counts[1], counts[2], counts[3]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--from-step", type=int, default=4, help="the first measured step (warmup_steps + 1)")
    ap.add_argument("--pause-s", type=float, default=0.1)
    ap.add_argument("--smi", type=Path, help="nvidia-smi's samples over the sweep (smi.csv)")
    ap.add_argument("--threads", type=int, default=0, help="each run's CPU per step by thread: the N busiest")
    a = ap.parse_args()
    rounds: dict[str, dict[str, list[dict]]] = {}
    primed = (
        sorted((a.sweep_dir / "prime").iterdir()) if a.threads and (a.sweep_dir / "prime").is_dir() else []
    )
    for rdir in [*primed, *sorted((a.sweep_dir / "runs").iterdir())]:
        recs = records(rdir)
        cell = read_json(rdir / "cell.json")
        cell = cell if isinstance(cell, dict) else {}
        if recs and isinstance(cell.get("repeat"), int):
            rounds.setdefault(f"r{cell['repeat']}", {})[cell["arm"]] = recs
    deltas: dict[str, list[float]] = {}
    for name, arms in sorted(rounds.items(), key=lambda kv: int(kv[0][1:])):
        level = {
            k: statistics.fmean(r["own_s"] for r in v if r["step"] >= a.from_step)
            for k, v in arms.items()
            if any(r["step"] >= a.from_step for r in v)
        }
        if "baseline" not in level or len(level) < 2:
            print(f"{name}: {', '.join(arms)} only (no pair with the baseline)")
        else:
            for arm in (k for k in level if k != "baseline"):
                delta = (level["baseline"] / level[arm] - 1) * 100
                if name != "r0":  # a priming pair: shown, never in the mean
                    deltas.setdefault(arm, []).append(delta)
                print(
                    f"{name}: baseline {level['baseline']:.4f} s/step, {arm} {level[arm]:.4f}: "
                    f"Δ samples/s {delta:+.2f}%" + " (priming pair, discarded)" * (name == "r0")
                )
        for k, recs in arms.items():
            if a.threads:
                print(f"    {k} CPU s/step by thread: {thread_cpu(recs, a.from_step, a.threads)}")
            for p in pauses(recs, a.from_step, a.pause_s):
                extra = ", ".join(
                    f"{key} {val}" for key, val in p.items() if key not in ("step", "over_s", "after_step1_s")
                )
                print(
                    f"    {k} step {p['step']}: +{p['over_s']:.3f} s, ended {p['after_step1_s']:.1f} s after step 1"
                    + (f" ({extra})" if extra else "")
                )
    for arm, ds in deltas.items():
        if len(ds) > 1:
            sd = statistics.stdev(ds)
            print(f"{arm}: {len(ds)} pairs: mean Δ {statistics.fmean(ds):+.2f}%, pair sd {sd:.2f} points")
    if a.smi is not None:
        pz, pn, oz, on = idle_counts(rounds, smi_samples(a.smi), a.from_step, a.pause_s)
        print(
            f"steps holding a 0% utilisation sample: {pz} of {pn} pause steps, {oz} of {on} other measured steps"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
