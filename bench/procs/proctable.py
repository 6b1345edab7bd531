"""What the driver reads about processes, through psutil (a dependency of the `train` extra and of
SpecForge itself): one process's parent, group, state and start, and the table of every process.

psutil reads them safely against a pid that ends or is reused while it is read; what no library
does — the process groups, the stop-then-kill order, the lifeline, the fork server — stays in
bench/procs/launcher.py and its neighbours. ``started`` is a process's identity beside its pid:
its creation time, to 0.01 s, so that a pid the kernel handed to another process since is told
apart (launch.json's ``leader_start``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    zombie: bool
    started: str


def _proc(p) -> Proc | None:
    import psutil

    try:
        with p.oneshot():
            return Proc(
                pid=p.pid,
                ppid=p.ppid(),
                pgid=os.getpgid(p.pid),
                zombie=p.status() == psutil.STATUS_ZOMBIE,
                started=f"{p.create_time():.2f}",
            )
    except (psutil.Error, ProcessLookupError, PermissionError):
        return None


def facts(pid: int) -> Proc | None:
    """The process ``pid`` now; None when there is none (or it cannot be read)."""
    import psutil

    try:
        return _proc(psutil.Process(pid))
    except psutil.Error:
        return None


def table() -> list[Proc]:
    """Every process that can be read now (one that ends while it is read is left out)."""
    import psutil

    return [f for p in psutil.process_iter() if (f := _proc(p)) is not None]


def started(pid: int) -> str | None:
    """The process's creation time as its identity beside its pid; None when there is none."""
    f = facts(pid)
    return f.started if f is not None else None


def ancestors(pid: int) -> list[int] | None:
    """The pids above ``pid`` (its parent, theirs, ...); None when ``pid`` cannot be seen here
    (ended, or in another PID namespace)."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).parents()]
    except psutil.Error:
        return None
