"""The launcher part of a run's command: one interpreter, torchrun on one node, or the
config's multi-node launcher with a per-node VRAM poller in front of each torchrun agent.
Shared by every plug that starts a Python module."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bench.config import Run, SweepConfig, format_set_value


def module_launcher(cfg: SweepConfig, run: Run, rdir: Path, module: str) -> list[str]:
    """The command up to the trainer's arguments: ``python -m <module>`` for one process,
    ``torchrun --standalone`` for one node's GPUs; for several nodes the config's launcher
    (which starts the rest once per node), then bench.probe.nodevram polling each node's cards
    into the run directory (when the arm is polled), then a torchrun agent that meets the other
    nodes' at the c10d rendezvous."""
    cell = run.cell
    env = run.spec.env  # an arm's own interpreter, else the driver's runs the trainer
    python = env.python if env is not None and env.python else sys.executable
    if cell.gpus == 1 and cell.nodes == 1:
        return [python, "-m", module]
    torchrun = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(cell.gpus)]
    if cell.nodes == 1:
        return [*torchrun, "--standalone", "-m", module]
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", str(cfg.rdzv_endpoint), "--rdzv-id", run.run_id]
    torchrun += ["--nnodes", str(cell.nodes), *rdzv]
    wrap = [sys.executable, "-m", "bench.probe.nodevram", "--run-dir", str(rdir), "--interval-s"]
    wrap = [*wrap, f"{cfg.poll_interval_s:g}", "--"] if cfg.polls(run.arm) else []
    return [*cfg.launcher, *step_name(cfg, run), *wrap, *torchrun, "-m", module]


def step_name(cfg: SweepConfig, run: Run) -> list[str]:
    """An srun launcher's step is named after its run (``--job-name``, last, so it wins): the
    driver finds the step by that name to end it with scancel (bench/slurm/steps.py)."""
    return [f"--job-name={run.run_id}"] if cfg.launcher and Path(cfg.launcher[0]).name == "srun" else []


def set_args(sets: dict[str, Any]) -> list[str]:
    """``--set key=value`` arguments, each value written as YAML reads it back."""
    return [a for k, v in sets.items() for a in ("--set", f"{k}={format_set_value(v)}")]
