"""What the run loop is handed to start its runs where they run: an engine.

The loop (bench/run/sweep.py, Session) never knows which scheduler it runs under. It asks its
engine to bind what the config leaves to the place (a rendezvous), to run the whole sweep
stoppably (a scheduler's signals), to say where a run ran (cell.json), and, per run, for the
hooks of its process tree: watched while it runs, ended on a timeout or an interrupt, recorded
after, and asked whether the scheduler, not the run, ended it. ``Engine`` is the local one:
plain process trees on this machine. Slurm's (bench/slurm/slurm_engine.py) is handed in by the
command line; ``bench.run`` never imports it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bench.config import Run, SweepConfig
from bench.errors import SweepError

LOST = "lost"  # run.json's status of a run the scheduler ended (a node, a time limit): never final
LOST_EXIT = 75  # the driver's exit status after such a run (EX_TEMPFAIL: --resume redoes it)


@dataclass(frozen=True)
class Lost:
    """Why the scheduler ended a run: ``cause`` (node, time, cancelled, ended) and one line."""

    cause: str
    reason: str


class RunLost(Exception):
    """Raised by the loop after recording a lost run: the place the runs need is gone or going
    (a node failed, the time limit passed, the step was cancelled), so the sweep stops there."""

    def __init__(self, run_id: str, lost: Lost) -> None:
        super().__init__(f"{run_id}: {lost.reason}")
        self.run_id = run_id
        self.lost = lost


class StepHooks(Protocol):
    """The engine's hold on one run's process tree."""

    def watch(self) -> None:
        """Called about once a second while the run goes."""

    def stop(self, pgid: int, proc: subprocess.Popen | None = None) -> None:
        """End the tree (a timeout, an interrupt) instead of signalling its process group."""

    def record(self, rdir: Path) -> None:
        """After the tree ended (also when the driver was stopped): what the engine saw."""

    def lost(self, rdir: Path, rc: int) -> Lost | None:
        """Whether the scheduler ended a run that did not finish ok, and why; else None."""


class Engine:
    """The local engine: every run a process tree on this machine; nothing to bind, no signals
    of a scheduler, no placement to record."""

    name = "local"

    def bind(self, cfg: SweepConfig, dry_run: bool = False) -> SweepConfig:
        """``cfg`` with what the place decides (nothing here). A sweep whose runs are Slurm job
        steps (nodes > 1, no launcher) needs the Slurm engine."""
        if cfg.launcher_from == "slurm":
            raise SweepError(
                f"{cfg.path}: nodes: {cfg.nodes} and no launcher: every run is a Slurm job step, which this "
                "engine cannot start (python -m bench sweep inside an allocation, or bench submit)"
            )
        return cfg

    def resume_hint(self) -> str | None:
        """How to resume, when the place knows better than the command line (a batch script)."""
        return None

    def run_stoppable(self, fn: Callable[[], int], resume_hint: str, out_dir: Path) -> int:
        """Run the sweep (``fn``) under the place's stop signals; here, just run it."""
        return fn()

    def placement(self) -> dict:
        """Fields cell.json records about where the run ran (none here)."""
        return {}

    def step(self, cfg: SweepConfig, run: Run) -> StepHooks | None:
        """The hooks of ``run``'s process tree, or None: its process group is signalled."""
        return None


LOCAL = Engine()
