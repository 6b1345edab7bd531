"""The kernels command's one door into the rest of the suite: every name it takes from the
sweep's config (bench.config), its run loop (bench.run, bench.procs), the hardware check
(bench.probe) and the report's writers (bench.results) is used here and nowhere else in
bench/kernels, so when one of those is renamed or moved it is re-pointed here alone.

The config's types are imported at the top (they are what a plan is made of); everything else
is imported where it is used, so the command loads only what a run needs (matplotlib, the
launcher) and a module being rebuilt elsewhere breaks only the step that calls it. Profile runs
go through the sweep's own run loop (bench.run.session.Session: the trainer's plug, the VRAM
poller, the fork server, timeouts, the reading-back of what a run left).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.config import Cell, Run, SweepConfig, format_set_value
from bench.errors import SweepError
from bench.record import RUN_JSON, RunDoc, read_run
from bench.trainers import load_config
from bench.trainers.embedded.facts import MODULE as OUR_MODULE  # our trainer, whose modules kernels times

__all__ = [
    "OUR_MODULE",
    "Cell",
    "Run",
    "SweepConfig",
    "SweepError",
    "cache_dir",
    "check_machine",
    "check_out_path",
    "format_set_value",
    "git_commit",
    "liger_skip_reason",
    "load_config",
    "our_trainer_importable",
    "no_gpu_reason",
    "plot_grid",
    "open_session",
    "prepare_cache",
    "run_in_session",
    "save_plot",
    "train_command",
    "write_csv",
]


# ---------------------------------------------------------------- the machine and the output


def check_machine(cfg: SweepConfig) -> None:
    """SweepError (one line) when this machine is not the config's hardware (as ``sweep`` checks)."""
    from bench.probe.hardware import check_hardware

    try:
        problem = check_hardware(list(cfg.hardware), config=str(cfg.path))
    except ValueError as e:  # HardwareError: an unknown hardware name, a bad BENCH_HARDWARE
        raise SweepError(str(e)) from None
    if problem:
        raise SweepError(problem)


def check_out_path(out_dir: Path) -> None:
    """SweepError (one line) when ``out_dir`` cannot be written as an output directory."""
    from bench.run.sweepdir import check_out_path as check

    check(out_dir)


def our_trainer_importable() -> None:
    """Our trainer (specforge/) is not a top-level package of site-packages: put its folder (this
    checkout, or an installed copy's bench/shipped) first on the driver's sys.path, so that the
    attribution imports ours from any working directory."""
    import sys

    from bench.distribution import TRAINER_ROOT

    if TRAINER_ROOT is not None and str(TRAINER_ROOT) not in sys.path:
        sys.path.insert(0, str(TRAINER_ROOT))


def git_commit() -> str | None:
    from bench.run.sweepdir import git_commit as commit

    return commit()


# ---------------------------------------------------------------- the sweep's skip reasons


def liger_skip_reason() -> str | None:
    """Why the sweep's Liger arms cannot run on this machine, or None."""
    from bench.run.preflight import liger_skip_reason as reason

    return reason()


def no_gpu_reason() -> str:
    """The sweep's reason for skipping a Liger arm on a machine without a GPU."""
    from bench.run.preflight import NO_GPU

    return NO_GPU


# ---------------------------------------------------------------- one profile run


def cache_dir(out_dir: Path, cell: Cell) -> Path | None:
    """The offline cache a cell reads under ``out_dir`` (None for an online cell), as in a sweep."""
    from bench.run.sweepdir import cache_dir_for

    return cache_dir_for(out_dir, cell)


def train_command(cfg: SweepConfig, run: Run, rdir: Path, cache: Path | None) -> list[str]:
    """The sweep's exact trainer command for ``run`` (the cell's --set values, the arm's keys, the
    launcher), ending in ``--output-dir rdir``."""
    from bench.trainers import plug_for

    return plug_for(cfg, run.cell).train_command(cfg, run, rdir, cache)


def open_session(cfg: SweepConfig, out_dir: Path) -> Any:
    """The sweep's run loop for runs of ``cfg`` written under ``out_dir`` (a Session)."""
    from bench.run.preflight import detect
    from bench.run.session import Session

    return Session.open(cfg, out_dir, detect())


def prepare_cache(session: Any, run: Run) -> str | None:
    """Prepare (or verify) the offline cache ``run`` reads, under the session's out_dir/cache, as
    the sweep does (reused when it is there already); the one-line error, or None."""
    session.prepare([run])
    return session.cache_errors.get(run.cell.cache_key())


def run_in_session(session: Any, run: Run, rdir: Path) -> RunDoc:
    """One run through the sweep's run loop into ``rdir`` (cell.json, the polled process tree, the
    plug's run.json); returns its run.json."""
    session.run(run, rdir=rdir, show=False, prime=False)
    return read_run(rdir, tolerant=True) or RunDoc.of(status="error", reason=f"no {RUN_JSON} in {rdir}")


# ---------------------------------------------------------------- the report's writers


def write_csv(df: Any, path: Path) -> Path:
    """A table written atomically as the sweep's report writes its CSVs (6 significant digits)."""
    from bench.results.report import write_csv as write

    return write(df, path)


def plot_grid(n: int, title: str) -> tuple[Any, list[Any]]:
    """A figure with one panel per cell, as the sweep's plots lay them out."""
    from bench.results.canvas import grid as _grid

    return _grid(n, title)


def save_plot(fig: Any, path: Path) -> Path:
    """The figure written atomically as a PNG, as the sweep's plots are."""
    from bench.results.canvas import save as _save

    return _save(fig, path)
