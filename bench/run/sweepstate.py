"""A sweep directory's state, read from its files only (``bench status``; bench/slurm/status.py
adds the Slurm job): runs finished of planned and their statuses, runs lost to the engine (which
--resume redoes), whether a driver holds the directory's lock on this machine, and the run in
flight (or left unfinished) with the last lines of its log."""

from __future__ import annotations

import os
import socket
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from bench.errors import SweepError
from bench.fileio import read_json
from bench.procs.launcher import group_alive, log_lines
from bench.record import read_cell, read_run
from bench.run.engine import LOST
from bench.run.sweepdir import LOCK, is_finished


@dataclass
class SweepState:
    out_dir: Path
    name: str
    planned: int
    statuses: Counter = field(default_factory=Counter)  # of finished runs
    lost: list[tuple[str, str]] = field(default_factory=list)  # (run_id, reason)
    driver_pid: int | None = None  # the lock holder on this machine
    in_flight: str | None = None  # run id: launched, not ended
    in_flight_alive: bool | None = None  # its process group, when it ran on this machine
    started: str | None = None
    job_ids: list[str] = field(default_factory=list)  # Slurm jobs the runs' cell.json name, in order

    @property
    def finished(self) -> int:
        return sum(self.statuses.values())


def read_state(out_dir: Path) -> SweepState:
    """The state of the sweep in ``out_dir``; SweepError (one line) when it holds none."""
    doc = read_json(out_dir / "sweep.json")
    if not isinstance(doc, dict):
        raise SweepError(f"{out_dir}: no sweep.json; expected the output directory of a sweep")
    raw = doc.get("order") or []
    if not isinstance(raw, list) or not all(
        isinstance(r, str) and r and "/" not in r and r not in (".", "..") for r in raw
    ):
        raise SweepError(f"{out_dir / 'sweep.json'}: 'order' is not a list of run ids; the file is damaged")
    order = raw
    state = SweepState(out_dir, str(doc.get("name")), len(order), driver_pid=lock_holder(out_dir / LOCK))
    launched: list[tuple[str, str, dict]] = []
    for run_id in order:
        rdir = out_dir / "runs" / run_id
        run, cell = read_run(rdir, tolerant=True), read_cell(rdir, tolerant=True)
        job = (cell.slurm or {}).get("job_id") if cell else None
        if job and job not in state.job_ids:
            state.job_ids.append(str(job))
        if run is not None and is_finished(rdir):
            state.statuses[str(run.status)] += 1
        elif run is not None and run.status == LOST:
            state.lost.append((run_id, str(run.reason)))
        elif isinstance(launch := read_json(rdir / "launch.json"), dict):
            launched.append((str(launch.get("start_time") or ""), run_id, launch))
    if launched:
        state.started, state.in_flight, launch = max(launched)
        if launch.get("hostname") == socket.gethostname() and isinstance(launch.get("pgid"), int):
            state.in_flight_alive = group_alive(launch["pgid"])
    return state


def lock_holder(lock: Path) -> int | None:
    """The pid holding the sweep's flock on this machine (from /proc/locks; the lock itself is
    never taken here, so a starting sweep is never refused because someone looked)."""
    try:
        st = lock.stat()
        rows = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for row in rows:
        parts = row.split()
        if len(parts) < 6 or parts[1] != "FLOCK" or parts[4] == "->":
            continue
        dev_ino = parts[5].split(":")
        try:
            major, minor, ino = int(dev_ino[0], 16), int(dev_ino[1], 16), int(dev_ino[2])
        except (IndexError, ValueError):
            continue
        if ino == st.st_ino and (major, minor) == (os.major(st.st_dev), os.minor(st.st_dev)):
            return int(parts[4])
    return None


def lines(state: SweepState, tail: int) -> list[str]:
    """What ``bench status`` prints about the sweep directory."""
    done = ", ".join(f"{n} {s}" for s, n in state.statuses.most_common())
    out = [f"sweep {state.name}: {state.out_dir}"]
    out.append(
        f"runs:    {state.finished} of {state.planned} planned finished" + (f" ({done})" if done else "")
    )
    for run_id, reason in state.lost[:5]:
        out.append(f"lost:    {run_id}: {reason} (not final: --resume redoes it)")
    if state.driver_pid is not None:
        out.append(f"driver:  running here (pid {state.driver_pid} holds {LOCK})")
    if state.in_flight is not None:
        how = {True: "running", False: "not running: --resume redoes it", None: "on another machine"}
        out.append(
            f"in flight: {state.in_flight} (started {_ago(state.started)}; {how[state.in_flight_alive]})"
        )
        log = state.out_dir / "runs" / state.in_flight / "stdout.log"
        shown = log_lines(log)[-tail:] if tail > 0 else []
        out += [f"  {log} (last {len(shown)} lines):"] + [f"    {ln[:200]}" for ln in shown] if shown else []
    elif state.finished + len(state.lost) < state.planned:
        out.append("in flight: none")
    return out


def _ago(start: str | None) -> str:
    try:
        then = datetime.fromisoformat(str(start))
    except ValueError:
        return "at an unknown time"
    zone = ""
    if then.tzinfo is None:  # the suite writes an offset; a start time without one is read as UTC
        then, zone = then.replace(tzinfo=timezone.utc), " (no time zone: read as UTC)"
    seconds = int((datetime.now(timezone.utc) - then).total_seconds())
    return f"{start}{zone}, {seconds} s ago"
