"""Slurm as the engine the run loop is handed (bench/run/engine.py): the rendezvous on the
allocation's first node and the srun options of ``bench submit`` bound into the config, the
sweep run under Slurm's stop signals (and requeued), cell.json's record of the allocation, and
each multi-node run a job step ended by scancel whose loss to Slurm is told apart from the run's
own failure. Outside an allocation it runs like the local engine, except that a sweep of job
steps is refused in one line."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from bench.config import Run, SweepConfig
from bench.run.engine import Engine, Lost, StepHooks
from bench.slurm import alloc, options, steps, stop
from bench.slurm.batch import BATCH_SCRIPT_ENV, SRUN_OPTIONS_ENV


class SlurmEngine(Engine):
    name = "slurm"

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._env = env
        self.lost: Lost | None = None  # the last run lost to Slurm, for the stop's requeue rule

    @property
    def env(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    def bind(self, cfg: SweepConfig, dry_run: bool = False) -> SweepConfig:
        cfg = alloc.bind(cfg, dry_run)  # Slurm job steps: the rendezvous on the first node
        extra = options.parse_srun_env(self.env.get(SRUN_OPTIONS_ENV, ""))
        if extra and cfg.launcher_from == "slurm":  # bench submit --srun-option: on every step
            cfg = dataclasses.replace(cfg, launcher=(*cfg.launcher, *extra))
        return cfg

    def resume_hint(self) -> str | None:
        script = self.env.get(BATCH_SCRIPT_ENV)
        return f"sbatch {script}" if script else None

    def run_stoppable(self, fn: Callable[[], int], resume_hint: str, out_dir: Path) -> int:
        return stop.run_stoppable(fn, resume_hint, self._env, out_dir, lambda: self.lost)

    def placement(self) -> dict:
        here = alloc.current(self._env)
        return {"slurm": here.record()} if here is not None else {}

    def step(self, cfg: SweepConfig, run: Run) -> StepHooks | None:
        return steps.control_for(cfg, run, alloc.current(self._env), on_lost=self._lost)

    def _lost(self, lost: Lost) -> None:
        self.lost = lost
