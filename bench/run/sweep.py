"""The sweep: checks, then runs pair by pair, adds pairs where a precision target asks for
them, and builds the report.

One run is one trainer process tree (bench/procs/launcher.py) writing into a fresh
``runs/<run_id>/`` (bench/run/execute.py). Runs come in pairs (rounds): one run of each arm of
a cell, back to back, in an order drawn from the sweep's seed. Without a precision target every
cell runs ``repeats`` pairs; with one, every cell runs a pilot of ``precision.min_pairs`` pairs,
then Stein's rule (bench/results/stats.py) fixes how many more it needs. The decision depends
only on the pilot's finished runs, so ``--resume`` after a kill at any moment reaches the same
decision and redoes only the run in flight. ``--retry-failed`` reopens the rounds that hold a
failed run (error, timeout, oom) and re-runs each whole, so its arms run back to back again.

Where the runs run is the engine's (bench/run/engine.py), handed in by the caller (the command
line hands Slurm's); a run the engine lost (a failed node, a time limit) stops the sweep with it
unfinished (exit 75), and --resume redoes it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bench.config import Run, SweepConfig, plan, plan_rounds
from bench.errors import SweepError
from bench.fileio import writing
from bench.probe import vram
from bench.procs.launcher import reap_stale
from bench.run import armenv, console, dryrun, preflight
from bench.run import capacity_search as search  # the capacity loop, a user of the same Session
from bench.run.caches import clear_staging
from bench.run.engine import LOCAL, LOST_EXIT, Engine, RunLost
from bench.run.execute import quietly
from bench.run.session import Session
from bench.run.sweepdir import (
    RETRYABLE,
    cache_dir_for,
    check_out_dir,
    check_out_path,
    clear_results,
    failed_rounds,
    is_finished,
    reopen_rounds,
    run_dir,
    take_lock,
    update_sweep_json,
    write_sweep_json,
)
from bench.trainers import load_config, plugs_for


def run_sweep(
    config_path: str | Path,
    out: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
    dry_run: bool = False,
    argv: list[str] | None = None,
    capacity: bool = False,
    retry_failed: bool = False,
    engine: Engine = LOCAL,
) -> int:
    """Run (or resume) a sweep — or, with ``capacity``, the config's capacity search
    (bench/run/capacity_search.py); returns the exit status. ``retry_failed``: a resume that first
    reopens the rounds holding a failed run (bench/run/sweepdir.py failed_rounds). Bad input
    raises SweepError before anything is written. ``engine``: where the runs go (bench/run/engine.py)."""
    cfg = engine.bind(
        load_config(config_path), dry_run
    )  # e.g. Slurm job steps: the rendezvous on the first node
    if retry_failed and (force or capacity):
        what = "--force starts the sweep over" if force else "a capacity search's OOMs are its answers"
        raise SweepError(f"--retry-failed re-runs a sweep's failed rounds; {what}")
    resume = resume or retry_failed
    if resume and force:
        raise SweepError(
            "--resume and --force exclude each other: --resume finishes a sweep, --force starts it over"
        )
    if cfg.pairing == "lockstep" and capacity:
        raise SweepError(
            f"{cfg.path}: pairing: lockstep times pairs of arms; a capacity search runs one arm at a time"
        )
    if capacity and cfg.capacity is None:
        raise SweepError(
            f"{cfg.path}: capacity: missing; `bench capacity` needs a capacity section (docs/method.md)"
        )
    if out is not None and not str(out).strip():
        raise SweepError("--out: empty path; expected a directory")
    out_dir = Path(out) if out is not None else Path(cfg.out)
    check_out_path(out_dir)
    runs = plan(cfg) if not capacity else []
    plugs = plugs_for(cfg)
    for plug in plugs.values():
        missing = [] if dry_run else [*preflight.missing_run_packages(), *plug.missing_packages(cfg)]
        preflight.check_imports(missing)  # a plan needs no torch
    for line in armenv.check_arm_envs(cfg, plugs):  # arms in environments of their own: what each runs
        print(line, flush=True)
    for trainer, plug in plugs.items():
        plug.check_cells(cfg, [c for c in cfg.cells if c.trainer == trainer], out_dir, cache_dir_for)
    info = preflight.detect()
    problem = preflight.hardware_problem(cfg, info)
    retried = failed_rounds(out_dir) if retry_failed else []
    if dry_run:
        if resume and not force:  # what the real --resume refuses (a changed config), a dry run refuses too
            check_out_dir(cfg, out_dir, resume, force)
        (
            dryrun.print_capacity_plan(cfg, out_dir, problem)
            if capacity
            else dryrun.print_plan(cfg, runs, out_dir, problem)
        )
        if retry_failed:
            print(retry_line(retried, "would re-run"))
        return 0
    if problem:
        raise SweepError(problem)
    preflight.check_gpus(cfg, info)
    preflight.check_launcher(cfg)
    previous = check_out_dir(cfg, out_dir, resume, force)
    argv = argv if argv is not None else ["python", "-m", "bench", *sys.argv[1:]]
    hint = engine.resume_hint() or (
        f"python -m bench {'capacity' if capacity else 'sweep'} {cfg.path} --out {out_dir} --resume"
    )
    # e.g. inside a Slurm allocation its stop signals end the run in flight cleanly (bench/slurm/stop.py)
    return engine.run_stoppable(
        lambda: _locked(cfg, runs, out_dir, info, previous, argv, force, capacity, retry_failed, engine),
        hint,
        out_dir,
    )


def _locked(
    cfg,
    runs,
    out_dir: Path,
    info: dict,
    previous,
    argv,
    force: bool,
    capacity: bool,
    retry: bool,
    engine: Engine,
) -> int:
    """The part that writes: under the sweep directory's lock, after reaping what a dead driver
    left (its processes, and the staging directories of the cache preparations it was running).
    A run the engine lost stops it there (exit 75), the run unfinished."""
    with writing(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
    lock = take_lock(out_dir)
    try:
        reap_stale(out_dir)
        clear_staging(out_dir / "cache")
        if force:
            clear_results(out_dir)
        retried = failed_rounds(out_dir) if retry else []  # under the lock: what is on disk now
        write_sweep_json(cfg, runs, out_dir, info, previous, argv, retried)
        if retry:
            print(retry_line(retried, "re-running"), flush=True)
            reopen_rounds(out_dir, retried)
        if cfg.poll_vram:
            warning = quietly("VRAM preflight", vram.preflight)
            if warning:
                print(f"warning: {warning}", file=sys.stderr, flush=True)
        if capacity:
            return search.search(cfg, out_dir, info, engine)
        return execute_sweep(cfg, runs, out_dir, info, engine)
    except RunLost as e:
        print(
            f"\nthe sweep stopped: {e}; that run is not final: --resume redoes it",
            file=sys.stderr,
            flush=True,
        )
        return LOST_EXIT
    finally:
        os.close(lock)


# What a CPU sweep is for, said before its first run (the verdicts at its end are about this machine).
CPU_NOTE = (
    "a CPU sweep: real DFlash training through the whole pipeline (cache, paired runs, CIs, report); on a "
    "shared or loaded CPU step times can drift by tens of percent, so CIs can be wide and the A/A row says "
    "how wide; Liger's kernels need a GPU (its rows are skipped). Not a benchmark of anything."
)


def execute_sweep(
    cfg: SweepConfig, pilot: list[Run], out_dir: Path, info: dict, engine: Engine = LOCAL
) -> int:
    """Run the pilot's unfinished runs, then the pairs the precision rule adds; report."""
    runs = pilot
    todo = [r for unit in units(cfg, pilot) if not finished(out_dir, unit) for r in unit]
    if cfg.runs_on_cpu and todo:
        print(CPU_NOTE, flush=True)
    if len(todo) < len(pilot):
        failed = len(failed_rounds(out_dir))
        retry = f" ({failed} round(s) hold a run that failed: --retry-failed re-runs them)" if failed else ""
        print(f"{len(pilot) - len(todo)} of {len(pilot)} runs already finished in {out_dir}{retry}")
    session = None
    try:
        session = Session.open(cfg, out_dir, info, engine)
        session.prepare(todo)
        session.progress = console.Progress(total=len(pilot), done=len(pilot) - len(todo))
        run_pending(session, pilot)
        if any(c.precision for c in cfg.cells):
            runs = extend_by_precision(session)
            session.prepare(runs)
            run_pending(session, runs)
    except KeyboardInterrupt:
        print("\ninterrupted: the run in flight was stopped; --resume redoes it", file=sys.stderr)
        return 130
    finally:
        if session is not None:
            session.close()
    failed = console.print_outcome(out_dir, runs)
    rc = console.report(out_dir)
    if failed and rc == 0:
        print(
            f"{failed} of {len(runs)} runs did not finish ok (see report.md: 'Runs that did not finish ok'); "
            "--resume keeps them (they are finished): re-run their rounds with --retry-failed",
            file=sys.stderr,
        )
        return 1
    return rc


def retry_line(rounds: list[dict], verb: str) -> str:
    """What --retry-failed reopens, in one line: each failed round, whole, and its failed runs."""
    if not rounds:
        return "--retry-failed: no run ended in error, timeout or oom; nothing to re-run"
    n_runs = sum(len(r["runs"]) for r in rounds)
    shown = "; ".join(
        f"{r['cell_id']} r{r['repeat']} ("
        + ", ".join(f"{v['arm']} {v['status']}" for v in r["runs"].values() if v["status"] in RETRYABLE)
        + ")"
        for r in rounds[:4]
    ) + (f"; and {len(rounds) - 4} more" if len(rounds) > 4 else "")
    return (
        f"--retry-failed: {verb} {len(rounds)} round(s) whole, {n_runs} runs (every arm of a round again, "
        f"back to back; ok runs of other rounds kept): {shown}"
    )


def run_pending(session: Session, runs: list[Run]) -> None:
    """Run the unfinished runs in order (a resumed sweep with nothing left never starts the fork
    server); with ``pairing: lockstep``, each unfinished pair whole, both runs at once."""
    for unit in units(session.cfg, runs):
        if finished(session.out_dir, unit):
            continue
        session.run_unit(unit)
        for line in (
            quietly("running Δ", lambda run=unit[-1]: console.running_deltas(session.out_dir, runs, run))
            or []
        ):
            session.say(line)


def units(cfg: SweepConfig, runs: list[Run]) -> list[list[Run]]:
    """What runs as one: a run, or with ``pairing: lockstep`` the two runs of a round."""
    return lockstep_pairs(runs) if cfg.pairing == "lockstep" else [[r] for r in runs]


def finished(out_dir: Path, unit: list[Run]) -> bool:
    """Whether every run of a unit is finished (a lockstep pair with one unfinished run runs again whole)."""
    return all(is_finished(run_dir(out_dir, r)) for r in unit)


def lockstep_pairs(runs: list[Run]) -> list[list[Run]]:
    """The runs of each round (a cell's repeat) together, in the round's order: role 0 is the arm the
    round's order puts first (``order: shuffled`` draws it per round)."""
    rounds: dict[tuple[str, int], list[Run]] = {}
    for run in runs:
        rounds.setdefault((run.cell.cell_id, run.repeat), []).append(run)
    return list(rounds.values())


def extend_by_precision(session: Session) -> list[Run]:
    """Stein's second stage: from the finished pilot, the pairs each cell needs; the full run order."""
    cfg, out_dir = session.cfg, session.out_dir
    targets = cfg.precision_targets
    # pandas and scipy: imported when a pilot is read, not at start
    from bench.results.deltas import stein_decisions
    from bench.results.records import load_runs
    from bench.results.tables import runs_table

    decisions = stein_decisions(runs_table(load_runs(out_dir)), targets)
    rounds = {
        c.cell_id: decisions[c.cell_id].pairs if c.cell_id in decisions else cfg.pilot_pairs(c)
        for c in cfg.cells
    }
    runs = plan_rounds(cfg, rounds)
    update_sweep_json(
        out_dir,
        order=[r.run_id for r in runs],
        precision={cid: {**targets[cid], "decision": vars(d)} for cid, d in decisions.items()},
    )
    for cid, d in decisions.items():
        session.say(f"precision: {cid}: {d.reason}")
    session.progress.grow(len(runs))
    return runs
