"""Process trees of runs: launch, timeout, kill, reap, and the exit record in launch.json.

Each run (and each cache preparation) is one process tree in its own session (process
group). ``run_process`` records the group in launch.json before and after the launch, so a
later ``--resume`` can kill what a dead driver left behind (``reap_stale``); on timeout or
interrupt the whole group gets SIGTERM, then SIGKILL, and is waited for.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from bench.fileio import atomic_write_json, read_json
from bench.procs import forkstart, proctable
from bench.procs.forkstart import ForkedRun, module_argv
from bench.procs.lifeline import die_with_parent_fn

KILL_GRACE_S = 10.0
TICK_S = 1.0


def run_process(
    argv: list[str],
    log_path: Path,
    launch_path: Path,
    timeout_s: float,
    tick: Callable[[], None] | None = None,
    extra_env: dict[str, str] | None = None,
    fork: bool = False,
    stop: Callable[[int, subprocess.Popen], None] | None = None,
) -> tuple[int, bool]:
    """Run argv as its own process group, output to log_path; returns (exit code, timed out).

    The group's id goes to launch_path so a later --resume can kill what a dead driver left
    behind. On timeout or KeyboardInterrupt the whole group is killed (SIGTERM, then SIGKILL);
    after a normal exit any process left in the group is killed too. With ``fork``, a
    ``python -m module`` command is forked from the warm fork server (bench/procs/forkstart.py)
    (when the driver started it) instead of started afresh; launch.json records which. ``stop``
    ends the tree on a timeout or interrupt instead of kill_group (a Slurm job step: scancel).
    """
    forked = module_argv(argv) if fork and forkstart.ready() else None
    record = {
        "hostname": socket.gethostname(),
        "boot_id": _boot_id(),
        "command": argv,
        "start": "fork-server" if forked else "exec",
        "start_time": now(),
    }
    atomic_write_json(launch_path, record)  # before the launch: a half-recorded launch is never "finished"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    try:
        if forked:
            proc = ForkedRun(*forked, str(log_path), env)
        else:
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    preexec_fn=die_with_parent_fn(),
                )
    except (OSError, subprocess.SubprocessError) as e:
        with open(log_path, "ab") as log:
            log.write(f"driver: could not launch the trainer: {e}\n".encode())
        return 127, False
    pgid = proc.pid  # start_new_session: the child leads its own session and group
    atomic_write_json(
        launch_path, {**record, "pid": proc.pid, "pgid": pgid, "leader_start": proctable.started(proc.pid)}
    )
    deadline = time.monotonic() + timeout_s
    next_tick = time.monotonic() + TICK_S
    try:
        while True:
            try:
                proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if tick is not None and time.monotonic() >= next_tick:
                next_tick = time.monotonic() + TICK_S
                _tick_quietly(tick)
            if time.monotonic() >= deadline:
                (stop or kill_group)(pgid, proc)
                return proc.wait(), True
    except BaseException:
        (stop or kill_group)(pgid, proc)
        raise
    if group_alive(pgid):
        kill_group(pgid, proc)
    return proc.returncode, False


def kill_group(pgid: int, proc: subprocess.Popen | None = None) -> None:
    """SIGTERM the process group, SIGKILL it after KILL_GRACE_S, and wait until it is gone; then
    SIGKILL the processes below it that had left the group (torchrun's ranks lead sessions of
    their own: a torchrun killed before it passed the signal on would leave them running, and
    holding their GPU memory)."""
    leader = proctable.facts(pgid)
    leads = leader is not None and leader.pgid == pgid  # else the id may be another's by now
    strays = [
        (pid, f.started)
        for pid in (descendants(pgid) if leads else [])
        if (f := proctable.facts(pid)) is not None and f.pgid != pgid
    ]
    _end_group(pgid, proc)
    for pid, started in strays:
        if proctable.started(pid) == started:  # the same process, not a reused pid
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _end_group(pgid: int, proc: subprocess.Popen | None) -> None:
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            if proc is not None:
                proc.poll()  # reap our own child, or it lingers as a zombie
            if not group_alive(pgid):
                if proc is not None:
                    proc.wait()
                return
            time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in the group."""
    return any(f.pgid == pgid and not f.zombie for f in proctable.table())


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (its children, theirs, ...), from the parent links of
    every process: also those that left ``root``'s process group or session (torchrun's ranks do)."""
    children: dict[int, list[int]] = {}
    for f in proctable.table():
        if not f.zombie:
            children.setdefault(f.ppid, []).append(f.pid)
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def kill_tree(root: int) -> int:
    """SIGSTOP ``root`` and every process below it, top down and until no new one appears (a
    stopped parent can neither respawn a rank nor fork a worker), then SIGKILL them all. Returns
    how many processes were killed."""
    held: list[int] = []
    for _ in range(10):
        new = [p for p in [root, *descendants(root)] if p not in held]
        if not new:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
                held.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
    for pid in held:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return len(held)


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def reap_stale(out_dir: Path) -> None:
    """Kill process groups that a killed driver left running in this sweep (this host, this boot)."""
    launches = [
        *out_dir.glob("runs/*/launch.json"),
        *out_dir.glob("prime/*/launch.json"),  # priming runs (sweep key prime_runs)
        *out_dir.glob("cache/*.launch.json"),
    ]
    for path in launches:
        rec = read_json(path)
        if not isinstance(rec, dict) or "exit_code" in rec or not isinstance(rec.get("pgid"), int):
            continue
        if rec.get("hostname") != socket.gethostname() or rec.get("boot_id") != _boot_id():
            continue
        pgid = rec["pgid"]
        leader = proctable.started(pgid)
        if leader is not None and leader != rec.get("leader_start"):
            continue  # the id now belongs to an unrelated process: ours is gone
        if group_alive(pgid):
            print(
                f"stopping process group {pgid} left running by an earlier driver ({path.relative_to(out_dir)})"
            )
            kill_group(pgid)


def mark_exit(launch_path: Path, rc: int, timed_out: bool) -> None:
    rec = read_json(launch_path)
    rec = rec if isinstance(rec, dict) else {}
    atomic_write_json(launch_path, {**rec, "exit_code": rc, "timed_out": timed_out, "end_time": now()})


def log_lines(path: Path, tail_bytes: int = 65536) -> list[str]:
    """Non-empty lines at the end of a log (its last 64 KiB)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]


def exit_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _tick_quietly(tick: Callable[[], None]) -> None:
    """A failing progress display must never stop a run."""
    try:
        tick()
    except Exception as e:
        print(f"warning: progress display failed: {e!r}", file=sys.stderr)
