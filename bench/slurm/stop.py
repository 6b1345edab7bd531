"""The driver's clean stop inside a Slurm allocation, and the requeue.

Slurm signals the batch step before the time limit when the job asked for it (``--signal=
B:USR1@SECONDS``, written by ``bench submit --requeue``) and on ``scancel`` of the job (SIGTERM,
then SIGKILL after KillWait). Either stops the sweep as Ctrl-C does: the run in flight is ended
(its job step through scancel, bench/slurm/steps.py) and left unfinished, so the next
``--resume`` redoes it; every finished run is kept. On the requeue signal, with
$BENCH_SLURM_REQUEUE set (the batch script of ``bench submit --requeue``), the driver then
requeues its own job: the next allocation runs the same batch script and resumes the sweep.

A requeue cannot loop: the driver requeues at most $BENCH_SLURM_MAX_REQUEUES times (Slurm's
restart count; ``bench submit --max-requeues``, default 3), and only after an allocation in which
at least one run finished. A run lost to Slurm (a failed node, the time limit: bench/slurm/lost.py)
stops the sweep; with --requeue the driver requeues for it under the same rules.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.record import read_cell
from bench.run.engine import LOST_EXIT, Lost
from bench.run.sweepdir import is_finished
from bench.slurm.alloc import Allocation, current, fields

REQUEUE_ENV = "BENCH_SLURM_REQUEUE"
MAX_REQUEUES_ENV = "BENCH_SLURM_MAX_REQUEUES"  # bench submit --max-requeues
DEFAULT_MAX_REQUEUES = 3
REQUEUED_CAUSES = ("node", "time")  # a lost run requeues the job (with --requeue) for these causes
REQUEUE_SIGNAL = signal.SIGUSR1
STOP_SIGNALS = (REQUEUE_SIGNAL, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """Raised in the driver by a stop signal: it unwinds the run in flight as Ctrl-C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class _Caught:
    signum: int | None = None


def run_stoppable(
    fn: Callable[[], int],
    resume_hint: str,
    env: Mapping[str, str] | None = None,
    out_dir: Path | None = None,
    lost: Callable[[], Lost | None] = lambda: None,
) -> int:
    """Call ``fn`` (the sweep) with the stop signals turned into ``Stopped`` inside an allocation
    (outside one, just call it); after a stop, or a run lost to Slurm (``lost``: what the steps
    saw), say what happened and requeue the job when asked and allowed (``_requeue``). Returns
    fn's status, or 128 + the signal after a stop (0 when the job was requeued)."""
    alloc = current(env)
    if alloc is None:
        return fn()
    env = os.environ if env is None else env
    caught = _Caught()

    def handler(signum: int, _frame: object) -> None:
        if caught.signum is None:  # once: a second signal must not break the stop in progress
            caught.signum = signum
            raise Stopped(signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        try:
            rc = fn()
        except Stopped:
            rc = 130
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if caught.signum is not None:
        return _after_stop(alloc, caught.signum, resume_hint, env, out_dir)
    found = lost() if rc == LOST_EXIT else None
    if found is None:
        return rc
    if found.cause in REQUEUED_CAUSES and env.get(REQUEUE_ENV):
        if _requeue(alloc, f"a run was lost ({found.reason})", resume_hint, env, out_dir) == 0:
            return 0
    else:
        print(f"resume with: {resume_hint}", file=sys.stderr, flush=True)
    return rc


def _after_stop(
    alloc: Allocation, signum: int, resume_hint: str, env: Mapping[str, str], out_dir: Path | None
) -> int:
    name = signal.Signals(signum).name
    if signum == REQUEUE_SIGNAL and env.get(REQUEUE_ENV):
        if _requeue(alloc, f"Slurm sent {name} (the time limit is near)", resume_hint, env, out_dir) == 0:
            return 0
        return 128 + signum
    why = "the time limit is near" if signum == REQUEUE_SIGNAL else ended_why(alloc.job_id)
    print(
        f"Slurm sent {name} ({why}): the sweep stopped cleanly; resume with: {resume_hint}",
        file=sys.stderr,
        flush=True,
    )
    return 128 + signum


def ended_why(job_id: str) -> str:
    """Why Slurm ended the job, as scontrol sees it now: its Reason names a time limit or a node;
    a cancel shows only as COMPLETING (measured on 22.05), hence the default."""
    job = fields("job", job_id)
    state, reason = job.get("JobState", ""), job.get("Reason", "")
    if reason == "TimeLimit" or state.startswith("TIMEOUT"):
        return "the job reached its time limit"
    if state.startswith("NODE_FAIL") or "Node" in reason:
        return f"a node of the job failed (JobState={state} Reason={reason})"
    if state.startswith("PREEMPTED"):
        return "the job was preempted"
    if state.startswith("CANCELLED"):
        return "the job was cancelled"
    return "the job was cancelled or preempted"


def _requeue(
    alloc: Allocation, what: str, resume_hint: str, env: Mapping[str, str], out_dir: Path | None
) -> int | None:
    """Requeue the job (``bench submit --requeue``) unless it was requeued $BENCH_SLURM_MAX_REQUEUES
    times already or this allocation finished no run (a requeue would loop): 0 when requeued,
    else None, having said why not and how to resume."""
    bound = int(env.get(MAX_REQUEUES_ENV) or DEFAULT_MAX_REQUEUES)
    done = finished_here(out_dir, alloc) if out_dir is not None else None
    if alloc.restart_count >= bound:
        n = alloc.restart_count
        problem = f"job {alloc.job_id} was requeued {n} time{'s' * (n != 1)} already (--max-requeues {bound})"
    elif done == 0:
        problem = f"no run finished in this allocation ({alloc.key}): a requeue would loop (a longer --time?)"
    else:
        print(f"{what}: the sweep stopped cleanly; requeuing job {alloc.job_id} (requeue {alloc.restart_count + 1} "
              f"of at most {bound}), whose next allocation resumes it", flush=True)  # fmt: skip
        problem = requeue(alloc.job_id)
        if problem is None:
            return 0
        problem = f"scontrol requeue {alloc.job_id}: {problem}"
    print(f"{what}: the sweep stopped cleanly; not requeued: {problem}; resume with: {resume_hint}",
          file=sys.stderr, flush=True)  # fmt: skip
    return None


def finished_here(out_dir: Path, alloc: Allocation) -> int:
    """How many runs of the sweep finished in this allocation (cell.json's slurm.allocation)."""
    n = 0
    runs = out_dir / "runs"
    for rdir in sorted(runs.iterdir()) if runs.is_dir() else []:
        cell = read_cell(rdir, tolerant=True)
        where = cell.slurm if cell else None
        n += isinstance(where, dict) and where.get("allocation") == alloc.key and is_finished(rdir)
    return n


def requeue(job_id: str) -> str | None:
    """``scontrol requeue JOB``: None when done, else why not (the job was submitted without
    --requeue, or scontrol failed)."""
    try:
        r = subprocess.run(
            ["scontrol", "requeue", job_id],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if r.returncode == 0:
        return None
    return (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
