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

import sys
from pathlib import Path

from bench.config import Run, SweepConfig, run_id
from bench.record import read_run
from bench.run import console
from bench.run.capacity_plan import next_value, probe_cell, series
from bench.run.engine import LOCAL, Engine
from bench.run.session import Session
from bench.run.sweepdir import is_finished, run_dir

__all__ = ["next_value", "probe_cell", "search", "series"]


def _status(out_dir: Path, run: Run) -> str | None:
    rdir = run_dir(out_dir, run)
    if not is_finished(rdir):
        return None
    doc = read_run(rdir, tolerant=True)
    return str(doc.status if doc else None)


def search(cfg: SweepConfig, out_dir: Path, info: dict, engine: Engine = LOCAL) -> int:
    """Run every arm's search of every series; write the report and capacity.csv/png."""
    session = Session.open(cfg, out_dir, info, engine)
    session.progress = console.Progress(total=0, done=0)
    try:
        for _sid, cell in series(cfg):
            for arm in cfg.arms:
                _search_arm(session, cell, arm)
    except KeyboardInterrupt:
        print("\ninterrupted: the probe in flight was stopped; --resume redoes it", file=sys.stderr)
        return 130
    finally:
        session.close()
    return console.report(out_dir)


def _search_arm(session: Session, cell, arm: str) -> None:
    """Probe one arm of one series until the search is over (probes already finished are read back)."""
    cfg, out_dir = session.cfg, session.out_dir
    history: dict[int, str] = {}
    while (value := next_value(history, cfg.capacity)) is not None:
        pcell = probe_cell(cfg, cell, value)
        run = Run(run_id(pcell.cell_id, arm, 1), pcell, arm, 1, session.next_order())
        status = _status(out_dir, run)
        if status is None:
            if session.skipped(run):
                session.run(run, show=False, prime=False)
                history[value] = "skipped"
                continue
            session.prepare([run])  # offline caches are prepared (or verified) once, shared by probes
            session.progress.grow(session.progress.bar.total + 1)
            session.run(run, prime=False)  # probes are not primed
            status = _status(out_dir, run) or "error"
        history[value] = status
