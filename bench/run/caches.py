"""Offline hidden-state caches: each one a sweep's runs need is prepared once (by the plug's
prepare command), verified when it exists, and prepared again when damaged; the staging
directories of preparations that were killed before their rename are removed."""

from __future__ import annotations

import os
import re
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


# Where a trainer's prepare stages a cache before renaming it into place: specforge/prepare.py
# writes ``.<name>.prepare-<pid>-<hex>`` beside the cache directory (<pid>: the prepare's own).
STAGING_RE = re.compile(r"\.(?P<key>.+)\.prepare-(?P<pid>\d+)-[0-9a-f]+")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` may still be the preparation that named a staging directory after
    itself: it exists and (where /proc says) its command line is a prepare's (a recycled pid is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process
    try:
        return b"prepare" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: keep it


def clear_staging(cache_root: Path, key: str | None = None) -> list[Path]:
    """Remove the staging directories (``.<key>.prepare-<pid>-<hex>``) in ``cache_root`` (a sweep's
    cache/) that a killed preparation left behind — a Ctrl-C, a timeout or a dead driver kills the
    prepare's process group before it can clean up, and a 4B cache stages GBs. ``key``: only that
    cache's. A staging directory whose process <pid> is alive is kept (a prepare still writing);
    the caller holds the sweep's lock, after reaping what a dead driver left running. Returns what
    was removed."""
    removed = []
    for entry in sorted(cache_root.iterdir()) if cache_root.is_dir() else []:
        m = STAGING_RE.fullmatch(entry.name)
        if m is None or (key is not None and m["key"] != key) or entry.is_symlink() or not entry.is_dir():
            continue
        if _alive(int(m["pid"])):
            print(f"kept {entry}: the preparation that stages it (process {m['pid']}) is still running")
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    if removed:
        names = ", ".join(p.name for p in removed)
        print(
            f"removed the staging of {len(removed)} interrupted cache preparation(s) in {cache_root}: {names}"
        )
    return removed


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
    try:
        rc, timed_out = run_process(argv, log, launch, cfg.prepare_timeout_s)
    finally:  # after a timeout or Ctrl-C too: the killed prepare's staging directory goes
        clear_staging(cdir.parent, key)
    mark_exit(launch, rc, timed_out)
    error = None
    if timed_out:
        error = f"cache prepare failed: timed out after {cfg.prepare_timeout_s:g} s (log: {log})"
    elif rc != 0 or not (cdir / "meta.json").exists():
        lines = log_lines(log)
        error = f"cache prepare failed: {lines[-1] if lines else exit_text(rc)}"
    print(f"  {error or 'done'} ({time.monotonic() - t0:.0f} s)", flush=True)
    return error
