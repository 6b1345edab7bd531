"""The driver's clean stop inside a Slurm allocation, and the requeue.

Slurm signals the batch step before the time limit when the job asked for it (``--signal=
B:USR1@SECONDS``, written by ``bench submit --requeue``) and on ``scancel`` of the job (SIGTERM,
then SIGKILL after KillWait). Either stops the sweep as Ctrl-C does: the run in flight is ended
(its job step through scancel, bench/slurm/steps.py) and left unfinished, so the next
``--resume`` redoes it; every finished run is kept. On the requeue signal, with
$BENCH_SLURM_REQUEUE set (the batch script of ``bench submit --requeue``), the driver then
requeues its own job: the next allocation runs the same batch script and resumes the sweep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from bench.slurm.alloc import Allocation, current

REQUEUE_ENV = "BENCH_SLURM_REQUEUE"
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


def run_stoppable(fn: Callable[[], int], resume_hint: str, env: dict | None = None) -> int:
    """Call ``fn`` (the sweep) with the stop signals turned into ``Stopped`` inside an allocation
    (outside one, just call it); after a stop, say what happened and requeue the job when asked.
    Returns fn's status, or 128 + the signal after a stop (0 when the job was requeued)."""
    alloc = current(env)
    if alloc is None:
        return fn()
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
    if caught.signum is None:
        return rc
    return _after_stop(alloc, caught.signum, resume_hint, env)


def _after_stop(alloc: Allocation, signum: int, resume_hint: str, env: dict | None) -> int:
    env = os.environ if env is None else env
    name = signal.Signals(signum).name
    if signum == REQUEUE_SIGNAL and env.get(REQUEUE_ENV):
        print(
            f"Slurm sent {name} (the time limit is near): the sweep stopped cleanly; requeuing job "
            f"{alloc.job_id}, whose next allocation resumes it",
            flush=True,
        )  # first: the requeue ends this allocation
        problem = requeue(alloc.job_id)
        if problem is None:
            return 0
        print(
            f"error: scontrol requeue {alloc.job_id}: {problem}; resume with: {resume_hint}", file=sys.stderr
        )
        return 128 + signum
    why = "the time limit is near" if signum == REQUEUE_SIGNAL else "the job was cancelled or preempted"
    print(
        f"Slurm sent {name} ({why}): the sweep stopped cleanly; resume with: {resume_hint}",
        file=sys.stderr,
        flush=True,
    )
    return 128 + signum


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
