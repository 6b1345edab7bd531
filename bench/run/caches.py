"""Offline hidden-state caches: each one a sweep's runs need is prepared once (by the plug's
prepare command), verified when it exists, and prepared again when damaged."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from bench.config import Run, SweepConfig
from bench.procs.launcher import exit_text, log_lines, mark_exit, run_process
from bench.run.sweepdir import cache_dir_for
from bench.trainers import TrainerPlug


def prepare_caches(
    cfg: SweepConfig,
    plug: TrainerPlug,
    out_dir: Path,
    runs: list[Run],
    known: dict[str, str | None] | None = None,
) -> dict[str, str | None]:
    """Prepare each offline cache the runs need, once; cache key -> error or None (``known``: done already)."""
    caches: dict[str, str | None] = dict(known or {})
    for run in runs:
        cell = run.cell
        key = cell.cache_key()
        cdir = cache_dir_for(out_dir, cell)
        if cdir is None or key in caches:
            continue
        if (cdir / "meta.json").exists():
            damage = plug.cache_problem(cfg, cell, out_dir, cdir)
            if damage is None:
                caches[key] = None
                continue
            print(f"offline cache {cdir} cannot be used ({damage}): preparing it again", flush=True)
        caches[key] = _prepare(cfg, plug.prepare_command(cfg, cell, cdir), cdir, key)
    return caches


def _prepare(cfg: SweepConfig, argv: list[str], cdir: Path, key: str) -> str | None:
    """Run one prepare command into a fresh ``cdir``; the error line, or None."""
    if cdir.exists():
        shutil.rmtree(cdir)  # a partial cache from an interrupted prepare
    cdir.parent.mkdir(parents=True, exist_ok=True)
    log = cdir.parent / f"{key}.log"
    log.unlink(missing_ok=True)
    print(f"preparing offline cache {cdir} ...", flush=True)
    t0 = time.monotonic()
    launch = cdir.parent / f"{key}.launch.json"
    rc, timed_out = run_process(argv, log, launch, cfg.prepare_timeout_s)
    mark_exit(launch, rc, timed_out)
    error = None
    if timed_out:
        error = f"cache prepare failed: timed out after {cfg.prepare_timeout_s:g} s (log: {log})"
    elif rc != 0 or not (cdir / "meta.json").exists():
        lines = log_lines(log)
        error = f"cache prepare failed: {lines[-1] if lines else exit_text(rc)}"
    print(f"  {error or 'done'} ({time.monotonic() - t0:.0f} s)", flush=True)
    return error
