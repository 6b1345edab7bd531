"""--dry-run: the planned runs, caches and commands of a sweep or capacity search, printed;
nothing is written."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from bench.config import Run, SweepConfig, run_id
from bench.record import read_run
from bench.run import preflight
from bench.run.capacity_plan import probe_cell, series
from bench.run.sweepdir import cache_dir_for, is_finished, run_dir
from bench.trainers import plugs_for


def _header(cfg: SweepConfig, runs: list[Run]) -> None:
    pairing = (
        "; pairing: lockstep (each round's two runs together, taking turns)"
        if cfg.pairing == "lockstep"
        else ""
    )
    print(
        f"hardware: {', '.join(cfg.hardware)}; order: {cfg.order} (seed {cfg.order_seed}){pairing}; ", end=""
    )
    if any(c.precision for c in cfg.cells):
        print(f"{len(runs)} pilot runs = {len(cfg.cells)} cells x {len(cfg.arms)} arms x precision.min_pairs")
        for cell in cfg.cells:
            p = cell.precision
            if p is not None:
                print(
                    f"precision {cell.cell_id}: pairs are added after the pilot of {p.min_pairs} until the 95% CI "
                    f"of Δ samples/s is ±{p.ci_halfwidth_pct:g} points (Stein's rule), at most {p.max_pairs}"
                )
    else:
        print(f"{len(runs)} runs = {len(cfg.cells)} cells x {len(cfg.arms)} arms x {cfg.repeats} repeats")
    if cfg.contrasts:
        print("also compared: " + ", ".join(f"{a} against {r}" for a, r in cfg.contrasts) + " (contrasts)")
    if cfg.prime_runs:
        print(
            f"plus {cfg.prime_runs} discarded priming run(s) per cell and arm before its first measured run "
            f"({cfg.prime_runs * len(cfg.cells) * len(cfg.arms)} in all, under prime/; again on a resume"
            + ("; each cell's as lockstep pairs, taking turns)" if cfg.pairing == "lockstep" else ")")
        )
    if cfg.nodes > 1:
        print(
            f"{cfg.nodes} nodes per run, started by `{shlex.join(cfg.launcher)}`; rendezvous at "
            f"{cfg.rdzv_endpoint} (from {cfg.rdzv_from})"
        )


def print_plan(cfg: SweepConfig, runs: list[Run], out_dir: Path, hardware_problem: str | None = None) -> None:
    print(f"sweep {cfg.name} ({cfg.path}) -> {out_dir}   [dry run: nothing is written]")
    if hardware_problem:
        print(f"note: a real run would be refused here: {hardware_problem}")
    _header(cfg, runs)
    for line in preflight.skip_lines(preflight.arm_skip_reasons(cfg)):
        print(line)
    plugs = plugs_for(cfg)
    seen = set()
    for run in runs:
        key = run.cell.cache_key()
        if run.cell.prepared and key not in seen:
            seen.add(key)
            cdir = cache_dir_for(out_dir, run.cell)
            state = "ready" if (cdir / "meta.json").exists() else "to prepare"
            argv = plugs[run.cell.trainer].prepare_command(cfg, run.cell, cdir)
            print(f"cache {key} ({state}): {shlex.join(argv)}")
    for run in runs:
        rdir = run_dir(out_dir, run)
        done = read_run(rdir, tolerant=True) if is_finished(rdir) else None
        note = f"  [finished: {done.status}]" if done else ""
        print(f"[{run.order_index + 1:>3}/{len(runs)}] {run.run_id}{note}")
        argv = plugs[run.cell.trainer].train_command(cfg, run, rdir, cache_dir_for(out_dir, run.cell))
        print(f"      {shlex.join(armed(run, argv))}")


def armed(run: Run, argv: list[str]) -> list[str]:
    """The command as the session starts it: under the arm's own variables and import path."""
    return run.spec.env.command(argv, os.environ) if run.spec.env is not None else argv


def print_capacity_plan(cfg: SweepConfig, out_dir: Path, hardware_problem: str | None) -> None:
    """The series, the first probe of each arm and its command."""
    cap = cfg.capacity
    assert cap is not None
    print(f"capacity search {cfg.name} ({cfg.path}) -> {out_dir}   [dry run: nothing is written]")
    if hardware_problem:
        print(f"note: a real run would be refused here: {hardware_problem}")
    print(
        f"axis {cap.axis}: from {cap.start}, doubling up to {cap.max}, then bisecting to multiples of "
        f"{cap.granularity}; {cap.steps} steps per probe"
    )
    for line in preflight.skip_lines(preflight.arm_skip_reasons(cfg)):
        print(line)
    plugs = plugs_for(cfg)
    for sid, cell in series(cfg):
        for arm in cfg.arms:
            pcell = probe_cell(cfg, cell, cap.start)
            run = Run(run_id(pcell.cell_id, arm, 1), pcell, arm, 1, 0)
            argv = plugs[cell.trainer].train_command(
                cfg, run, run_dir(out_dir, run), cache_dir_for(out_dir, pcell)
            )
            print(f"{sid} {arm}: first probe {cap.axis}={cap.start}")
            print(f"      {shlex.join(armed(run, argv))}")
