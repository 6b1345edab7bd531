"""Capacity search: per cell and arm, the largest batch size (or sequence length) that trains.

    python -m bench capacity CONFIG [--out DIR] [--resume] [--force] [--dry-run]

The sweep config's ``capacity: {axis, start, max, granularity, steps}`` names the axis. For
every cell (its other axis fixed) and every arm, probes grow the value geometrically from
``start`` (doubling, capped at ``max``) until one runs out of memory, then bisect between the
largest value that fit and the smallest that did not, down to ``granularity``. A start that
does not fit halves instead. Each probe is an ordinary run of the cell at that value (its own
process, ``steps`` optimizer steps, the first dropped), so an OOM is an answer that cannot
poison the next probe, and the probes' files, runs.csv and the report are a sweep's. An
error or timeout (anything but ok / oom) ends that arm's search, recorded as such.

The next value depends only on the outcomes so far, so a killed search resumes with
``--resume`` to the same answer, redoing only the probe in flight.
"""

from __future__ import annotations

import functools
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.config.sweep import ARM_OPTIONS, Capacity, Cell, Run, SweepConfig, _cell_id
from bench.fileio import read_json
from bench.run import console
from bench.run.sweepdir import is_finished, run_dir


def next_value(history: dict[int, str], cap: Capacity) -> int | None:
    """The next value to probe given {value: status} so far, or None when the search is over."""
    if any(s not in ("ok", "oom") for s in history.values()):
        return None  # an error or timeout is no answer about memory: stop, say so
    fits = [v for v, s in history.items() if s == "ok"]
    lo = max(fits, default=None)
    fails = [v for v, s in history.items() if s == "oom" and (lo is None or v > lo)]
    hi = min(fails, default=None)
    g = cap.granularity
    if lo is None and hi is None:
        return cap.start
    if lo is None:  # even the smallest probe so far OOMs: halve
        smaller = (hi // 2) // g * g
        return smaller if smaller >= g and smaller not in history else None
    if hi is None:  # everything so far fits: double, up to the cap
        if lo >= cap.max:
            return None
        return min(lo * 2, cap.max)
    if hi - lo <= g:
        return None
    mid = (lo + hi) // 2 // g * g
    return mid if lo < mid < hi else None


def probe_cell(cfg: SweepConfig, cell: Cell, value: int) -> Cell:
    """The cell at one probed value, trained for ``capacity.steps`` steps (the first dropped)."""
    cap = cfg.capacity
    assert cap is not None
    probed = replace(cell, **{cap.axis: value}, steps=cap.steps, warmup_steps=1)
    return replace(probed, cell_id=_cell_id(probed, None))


def series(cfg: SweepConfig) -> list[tuple[str, Cell]]:
    """One (series id, representative cell) per cell with the searched axis left out."""
    cap = cfg.capacity
    assert cap is not None
    seen: dict[str, Cell] = {}
    for cell in cfg.cells:
        other = f"s{cell.seq_len}" if cap.axis == "batch_size" else f"bs{cell.batch_size}"
        key = f"{cell.profile}_{cell.mode}_{other}" + (f"_g{cell.gpus}" if cell.gpus > 1 else "")
        seen.setdefault(key, cell)
    return list(seen.items())


def _status(out_dir: Path, run: Run) -> str | None:
    rdir = run_dir(out_dir, run)
    if not is_finished(rdir):
        return None
    doc = read_json(rdir / "run.json") or {}
    return str(doc.get("status"))


def search(cfg: SweepConfig, out_dir: Path, info: dict) -> int:
    """Run every arm's search of every series; write the report and capacity.csv/png."""
    from bench.run import sweep as driver

    skip = driver.liger_skip_reason() if any(ARM_OPTIONS[a]["liger"] for a in cfg.arms) else None
    compile_dir = driver.compile_cache_dir(out_dir, info) if cfg.compile_cache else None
    progress = console.Progress(total=0, done=0)
    server = functools.cache(
        lambda: driver.start_fork_server(cfg, out_dir, compile_dir, info, progress.write)
    )
    caches: dict[str, str | None] = {}  # offline caches prepared (or verified) once, shared by probes
    order = 0
    try:
        for _sid, cell in series(cfg):
            for arm in cfg.arms:
                history: dict[int, str] = {}
                while (value := next_value(history, cfg.capacity)) is not None:
                    pcell = probe_cell(cfg, cell, value)
                    run = Run(f"{pcell.cell_id}_{arm}_r1", pcell, arm, 1, order)
                    order += 1
                    status = _status(out_dir, run)
                    if status is None:
                        if run.liger and skip:
                            driver.execute_run(cfg, run, out_dir, skip, {}, None, compile_dir)
                            history[value] = "skipped"
                            continue
                        caches = driver._prepare_caches(cfg, out_dir, [run], known=caches)
                        server()  # before the first probe that launches, not on a finished search
                        progress.grow(progress.bar.total + 1)
                        progress.start(run)
                        t0 = time.monotonic()
                        line = driver.execute_run(
                            cfg, run, out_dir, skip, caches, progress.ticker(run, out_dir), compile_dir
                        )
                        progress.done(run, line, time.monotonic() - t0)
                        status = _status(out_dir, run) or "error"
                    history[value] = status
    except KeyboardInterrupt:
        print("\ninterrupted: the probe in flight was stopped; --resume redoes it", file=sys.stderr)
        return 130
    finally:
        progress.close()
    return driver.report(out_dir)


def print_capacity_plan(cfg: SweepConfig, out_dir: Path, hardware_problem: str | None) -> None:
    """--dry-run: the series, the first probe of each arm and its command; nothing is written."""
    from bench.run import sweep as driver

    cap = cfg.capacity
    assert cap is not None
    print(f"capacity search {cfg.name} ({cfg.path}) -> {out_dir}   [dry run: nothing is written]")
    if hardware_problem:
        print(f"note: a real run would be refused here: {hardware_problem}")
    print(
        f"axis {cap.axis}: from {cap.start}, doubling up to {cap.max}, then bisecting to multiples of "
        f"{cap.granularity}; {cap.steps} steps per probe"
    )
    for sid, cell in series(cfg):
        for arm in cfg.arms:
            pcell = probe_cell(cfg, cell, cap.start)
            run = Run(f"{pcell.cell_id}_{arm}_r1", pcell, arm, 1, 0)
            argv = driver.train_command(cfg, run, run_dir(out_dir, run), driver.cache_dir_for(out_dir, pcell))
            print(f"{sid} {arm}: first probe {cap.axis}={cap.start}")
            print(f"      {shlex.join(argv)}")
