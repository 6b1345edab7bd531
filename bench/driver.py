"""Sweep driver: launches trainer runs, enforces timeouts, records outcomes, resumes.

One run is one trainer process tree in its own session (process group), writing into a fresh
``runs/<run_id>/`` under the run contract (docs/run-contract.md). The driver writes
``cell.json`` before launch, ``launch.json`` around it (process group, exit code), polls VRAM
while it runs, and fixes ``run.json`` when the trainer died, hung or never wrote an end
status. A run counts as finished when ``run.json`` has a terminal status and, if it was
launched, ``launch.json`` holds the driver's record of its exit; ``--resume`` redoes every
other run from scratch, so a sweep killed at any moment (even ``kill -9``) loses at most the
run in flight and never duplicates one.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.fileio import atomic_write_json, read_json, read_jsonl
from bench.sweep_config import (
    CPU_MAX_PROCS,
    Cell,
    Run,
    SweepConfig,
    SweepError,
    diff_resolved,
    format_set_value,
    load_config,
    plan,
)

TERMINAL = ("ok", "oom", "error", "timeout", "skipped")
AGGREGATE_OUTPUTS = ("runs.csv", "summary.csv", "loss_parity.csv", "vram_per_card.csv", "report.md")
NO_GPU = "Liger's Triton kernels need a CUDA or ROCm GPU; this machine has none"
NO_LIGER = "liger-kernel is not installed: pip install '.[liger]'"
OOM_RE = re.compile(r"CUDA out of memory|HIP out of memory|OutOfMemoryError")
KILL_GRACE_S = 10.0
TICK_S = 1.0

# ---------------------------------------------------------------- seams onto the other bench modules
# Imported lazily, so the driver loads without them; tests replace these functions.


def detect_hardware() -> dict:
    from bench import hardware

    return hardware.detect()


def check_hardware(expected: list[str], info: dict, config: str | None = None) -> str | None:
    from bench import hardware

    return hardware.check_hardware(expected, info, config=config)


def make_poller(run_dir: Path, interval_s: float):
    from bench.vram import VramPoller

    return VramPoller(run_dir, interval_s=interval_s)


def build_report(out_dir: Path) -> dict:
    from bench.report import build_report as build

    return build(out_dir)


def liger_skip_reason() -> str | None:
    """Why the liger arm cannot run on this machine, or None when it can."""
    import importlib.util

    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    if not has_gpu:
        return NO_GPU
    if importlib.util.find_spec("liger_kernel") is None:
        return NO_LIGER
    return None


# ---------------------------------------------------------------- the sweep


def run_sweep(
    config_path: str | Path,
    out: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
    dry_run: bool = False,
    argv: list[str] | None = None,
) -> int:
    """Run (or resume) a sweep; returns the exit status. Bad input raises SweepError before anything is written."""
    cfg = load_config(config_path)
    if resume and force:
        raise SweepError(
            "--resume and --force exclude each other: --resume finishes a sweep, --force starts it over"
        )
    out_dir = Path(out) if out else Path(cfg.out)
    runs = plan(cfg)
    info = _detect()
    problem = _hardware_problem(cfg, info)
    if dry_run:
        print_plan(cfg, runs, out_dir, problem)
        return 0
    if problem:
        raise SweepError(problem)
    _check_gpus(cfg, info)
    previous = _check_out_dir(cfg, out_dir, resume, force)

    out_dir.mkdir(parents=True, exist_ok=True)
    lock = _take_lock(out_dir)
    try:
        _reap_stale(out_dir)
        if force:
            _clear_results(out_dir)
        _write_sweep_json(
            cfg,
            runs,
            out_dir,
            info,
            previous,
            argv if argv is not None else ["python", "-m", "bench", *sys.argv[1:]],
        )
        return _execute(cfg, runs, out_dir)
    finally:
        os.close(lock)


def _execute(cfg: SweepConfig, runs: list[Run], out_dir: Path) -> int:
    todo = [r for r in runs if not is_finished(run_dir(out_dir, r))]
    if len(todo) < len(runs):
        print(
            f"{len(runs) - len(todo)} of {len(runs)} runs already finished in {out_dir}; running {len(todo)}"
        )
    skip = liger_skip_reason() if any(r.arm == "liger" for r in todo) else None
    try:
        caches = _prepare_caches(cfg, out_dir, [r for r in todo if not (r.arm == "liger" and skip)])
        if todo:
            _run_all(cfg, runs, todo, out_dir, skip, caches)
    except KeyboardInterrupt:
        print("\ninterrupted: the run in flight was stopped; --resume redoes it", file=sys.stderr)
        return 130
    _print_outcome(out_dir, runs)
    return report(out_dir)


def _run_all(cfg, runs, todo, out_dir, skip, caches) -> None:
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    bar = tqdm(
        total=len(runs), initial=len(runs) - len(todo), unit="run", mininterval=TICK_S, dynamic_ncols=True
    )
    try:
        for run in todo:
            bar.set_description(run.run_id, refresh=False)
            bar.set_postfix({}, refresh=False)
            t0 = time.monotonic()
            line = execute_run(cfg, run, out_dir, skip, caches, _ticker(bar, run, out_dir, tty))
            bar.update(1)
            bar.write(f"{run.run_id}: {line} ({time.monotonic() - t0:.0f} s)")
    finally:
        bar.close()


def _ticker(bar, run: Run, out_dir: Path, tty: bool) -> Callable[[], None]:
    """Called about once a second while a run is going: step k/N and the last s/step in the bar."""
    state = {"last": 0.0}
    every = TICK_S if tty else 30.0  # non-TTY output (CI logs): a line every 30 s, not a flood

    def tick() -> None:
        rows = read_jsonl(run_dir(out_dir, run) / "metrics.jsonl")
        post = {"step": f"{rows[-1].get('step', len(rows)) if rows else 0}/{run.cell.steps}"}
        if rows and isinstance(rows[-1].get("step_time_s"), int | float):
            s = rows[-1]["step_time_s"]
            post["s/step"] = f"{s:.3f}"
            left = max(run.cell.steps - int(rows[-1].get("step", len(rows))), 0)
            post["run eta"] = f"{left * s:.0f}s"
        bar.set_postfix(post, refresh=False)
        now = time.monotonic()
        if now - state["last"] >= every:
            state["last"] = now
            bar.refresh()

    return tick


def execute_run(cfg: SweepConfig, run: Run, out_dir: Path, skip: str | None, caches: dict, tick=None) -> str:
    """Run one planned run in a fresh directory; returns a one-line outcome."""
    rdir = run_dir(out_dir, run)
    if rdir.exists():
        shutil.rmtree(rdir)
    rdir.mkdir(parents=True)
    cache_dir = cache_dir_for(out_dir, run.cell)
    cache_error = caches.get(run.cell.cache_key())
    argv = train_command(cfg, run, rdir, cache_dir)
    atomic_write_json(rdir / "cell.json", cell_record(cfg, run, argv, cache_dir))
    if run.arm == "liger" and skip:
        return _record(rdir, run, "skipped", skip)
    if cache_error:
        return _record(rdir, run, "error", cache_error)

    started = _now()
    poller = None
    if cfg.poll_vram:
        poller = _quietly("VRAM poller", lambda: make_poller(rdir, cfg.poll_interval_s))
    else:
        atomic_write_json(
            rdir / "vram.json", {"backend": "none", "status": "disabled", "reason": "poll_vram: false"}
        )
    if poller is not None:
        _quietly("VRAM poller", poller.start)
    try:
        rc, timed_out = run_process(argv, rdir / "stdout.log", rdir / "launch.json", run.cell.timeout_s, tick)
    finally:
        vram = _quietly("VRAM poller", poller.stop) if poller is not None else None
    doc = reconcile(rdir, run, rc, timed_out, started)
    _mark_exit(rdir / "launch.json", rc, timed_out)
    return _outcome_line(doc, rdir, run, vram)


def reconcile(rdir: Path, run: Run, rc: int, timed_out: bool, started: str) -> dict:
    """The run's final run.json: the trainer's own when it recorded an end status, else the driver's."""
    doc = read_json(rdir / "run.json")
    doc = doc if isinstance(doc, dict) else {}
    if doc.get("status") in TERMINAL:
        if timed_out:  # it finished, then hung on the way out: keep its result, say what happened
            doc["driver_note"] = (
                f"killed at the {run.cell.timeout_s:g} s timeout after recording its end status"
            )
            atomic_write_json(rdir / "run.json", doc)
        return doc
    base = {
        "arm": run.arm,
        "start_time": started,
        "world_size": run.cell.gpus * run.cell.nodes,
        "config": None,
    }
    doc = {**base, **doc, "end_time": _now(), "exit_code": rc}
    if timed_out:
        rows = read_jsonl(rdir / "metrics.jsonl")
        at = f"at step {rows[-1].get('step')}/{run.cell.steps}" if rows else "before the first step"
        doc.update(status="timeout", reason=f"timed out after {run.cell.timeout_s:g} s {at}")
    else:
        lines = _log_lines(rdir / "stdout.log")
        oom = [ln for ln in lines if OOM_RE.search(ln)]
        if rc == 3 or oom:
            doc.update(status="oom", reason=(oom or lines or [f"exit code {rc}"])[-1])
        else:
            last = lines[-1] if lines else "no output"
            doc.update(status="error", reason=f"{last} ({_exit_text(rc)})")
    atomic_write_json(rdir / "run.json", doc)
    return doc


def is_finished(rdir: Path) -> bool:
    doc = read_json(rdir / "run.json")
    if not isinstance(doc, dict) or doc.get("status") not in TERMINAL:
        return False
    launch = rdir / "launch.json"
    if not launch.exists():
        return True  # never launched: skipped or recorded by the driver
    rec = read_json(launch)
    return isinstance(rec, dict) and "exit_code" in rec


def run_dir(out_dir: Path, run: Run) -> Path:
    return out_dir / "runs" / run.run_id


def cache_dir_for(out_dir: Path, cell: Cell) -> Path | None:
    """The offline hidden-state cache a cell reads (None for online cells)."""
    return out_dir / "cache" / cell.cache_key() if cell.mode == "offline" else None


# ---------------------------------------------------------------- commands and records


def launcher(cfg: SweepConfig, cell: Cell, rdzv_id: str) -> list[str]:
    if cell.gpus == 1 and cell.nodes == 1:
        return [sys.executable, "-m", cfg.trainer_module]
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(cell.gpus)]
    if cell.nodes > 1:
        argv += ["--nnodes", str(cell.nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", cfg.rdzv_endpoint]
        argv += ["--rdzv-id", rdzv_id]
    else:
        argv.append("--standalone")
    return [*argv, "-m", cfg.trainer_module]


def train_command(cfg: SweepConfig, run: Run, rdir: Path, cache_dir: Path | None) -> list[str]:
    cell = run.cell
    sets: dict[str, Any] = {
        "training.steps": cell.steps,
        "training.batch_size": cell.batch_size,
        "data.seq_len": cell.seq_len,
    }
    if cache_dir is not None:
        sets["data.cache_dir"] = str(cache_dir)
    if run.arm == "baseline":
        sets["model.use_liger_kernel"] = False
    sets.update(cell.overrides)
    argv = [*launcher(cfg, cell, run.run_id), "train", cell.train_config, *_set_args(sets)]
    if run.arm == "liger":
        argv.append("--use-liger-kernel")
    return [*argv, "--output-dir", str(rdir)]


def prepare_command(cfg: SweepConfig, cell: Cell, cache_dir: Path) -> list[str]:
    sets = {"data.seq_len": cell.seq_len, **cell.overrides}
    return [
        sys.executable,
        "-m",
        cfg.trainer_module,
        "prepare",
        cell.train_config,
        *_set_args(sets),
        "--output-dir",
        str(cache_dir),
    ]


def cell_record(cfg: SweepConfig, run: Run, argv: list[str], cache_dir: Path | None) -> dict:
    c = run.cell
    return {
        "run_id": run.run_id,
        "cell_id": c.cell_id,
        "sweep": cfg.name,
        "profile": c.profile,
        "mode": c.mode,
        "batch_size": c.batch_size,
        "seq_len": c.seq_len,
        "accumulation_steps": c.accumulation_steps,
        "num_anchors": c.num_anchors,
        "gpus": c.gpus,
        "nodes": c.nodes,
        "arm": run.arm,
        "repeat": run.repeat,
        "order_index": run.order_index,
        "steps": c.steps,
        "warmup_steps": c.warmup_steps,
        "loss_tolerance": cfg.loss_tolerance,
        "attention_backend": c.attention_backend,
        "train_config": c.train_config,
        "set": c.overrides,
        "cache_dir": str(cache_dir) if cache_dir is not None else None,
        "timeout_s": c.timeout_s,
        "command": argv,
    }


def _set_args(sets: dict[str, Any]) -> list[str]:
    return [a for k, v in sets.items() for a in ("--set", f"{k}={format_set_value(v)}")]


def _record(rdir: Path, run: Run, status: str, reason: str) -> str:
    atomic_write_json(
        rdir / "run.json",
        {
            "status": status,
            "reason": reason,
            "arm": run.arm,
            "start_time": None,
            "end_time": _now(),
            "config": None,
        },
    )
    return f"{status}: {reason}"


# ---------------------------------------------------------------- offline caches


def _prepare_caches(cfg: SweepConfig, out_dir: Path, runs: list[Run]) -> dict[str, str | None]:
    """Prepare each offline cache the remaining runs need, once; cache key -> error or None."""
    caches: dict[str, str | None] = {}
    for run in runs:
        cell = run.cell
        key = cell.cache_key()
        cdir = cache_dir_for(out_dir, cell)
        if cdir is None or key in caches:
            continue
        if (cdir / "meta.json").exists():
            caches[key] = None
            continue
        if cdir.exists():
            shutil.rmtree(cdir)  # a partial cache from an interrupted prepare
        cdir.parent.mkdir(parents=True, exist_ok=True)
        argv = prepare_command(cfg, cell, cdir)
        log = cdir.parent / f"{key}.log"
        log.unlink(missing_ok=True)
        print(f"preparing offline cache {cdir} ...", flush=True)
        t0 = time.monotonic()
        rc, timed_out = run_process(argv, log, cdir.parent / f"{key}.launch.json", cfg.prepare_timeout_s)
        _mark_exit(cdir.parent / f"{key}.launch.json", rc, timed_out)
        error = None
        if timed_out:
            error = f"cache prepare failed: timed out after {cfg.prepare_timeout_s:g} s (log: {log})"
        elif rc != 0 or not (cdir / "meta.json").exists():
            lines = _log_lines(log)
            error = f"cache prepare failed: {lines[-1] if lines else _exit_text(rc)}"
        print(f"  {error or 'done'} ({time.monotonic() - t0:.0f} s)", flush=True)
        caches[key] = error
    return caches


# ---------------------------------------------------------------- process trees


def run_process(
    argv: list[str],
    log_path: Path,
    launch_path: Path,
    timeout_s: float,
    tick: Callable[[], None] | None = None,
) -> tuple[int, bool]:
    """Run argv as its own process group, output to log_path; returns (exit code, timed out).

    The group's id goes to launch_path so a later --resume can kill what a dead driver left
    behind. On timeout or KeyboardInterrupt the whole group is killed (SIGTERM, then SIGKILL);
    after a normal exit any process left in the group is killed too.
    """
    record = {"hostname": socket.gethostname(), "boot_id": _boot_id(), "command": argv, "start_time": _now()}
    atomic_write_json(launch_path, record)  # before the launch: a half-recorded launch is never "finished"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "ab") as log:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent_fn(),
            )
        except (OSError, subprocess.SubprocessError) as e:
            log.write(f"driver: could not launch the trainer: {e}\n".encode())
            return 127, False
    pgid = proc.pid  # start_new_session: the child leads its own session and group
    atomic_write_json(
        launch_path, {**record, "pid": proc.pid, "pgid": pgid, "leader_start": _start_ticks(proc.pid)}
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
                _quietly("progress display", tick)
            if time.monotonic() >= deadline:
                kill_group(pgid, proc)
                return proc.wait(), True
    except BaseException:
        kill_group(pgid, proc)
        raise
    if group_alive(pgid):
        kill_group(pgid, proc)
    return proc.returncode, False


def kill_group(pgid: int, proc: subprocess.Popen | None = None) -> None:
    """SIGTERM the process group, SIGKILL it after KILL_GRACE_S, and wait until it is gone."""
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
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for entry in proc_root.iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None and st[2] == str(pgid) and st[0] != "Z":
                return True
    return False


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name: [state, ppid, pgrp, ...]."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _start_ticks(pid: int) -> str | None:
    st = _stat(pid)
    return st[19] if st is not None and len(st) > 19 else None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _reap_stale(out_dir: Path) -> None:
    """Kill process groups that a killed driver left running in this sweep (this host, this boot)."""
    launches = [*out_dir.glob("runs/*/launch.json"), *out_dir.glob("cache/*.launch.json")]
    for path in launches:
        rec = read_json(path)
        if not isinstance(rec, dict) or "exit_code" in rec or not isinstance(rec.get("pgid"), int):
            continue
        if rec.get("hostname") != socket.gethostname() or rec.get("boot_id") != _boot_id():
            continue
        pgid = rec["pgid"]
        leader = _start_ticks(pgid)
        if leader is not None and leader != rec.get("leader_start"):
            continue  # the id now belongs to an unrelated process: ours is gone
        if group_alive(pgid):
            print(
                f"stopping process group {pgid} left running by an earlier driver ({path.relative_to(out_dir)})"
            )
            kill_group(pgid)


def _mark_exit(launch_path: Path, rc: int, timed_out: bool) -> None:
    rec = read_json(launch_path)
    rec = rec if isinstance(rec, dict) else {}
    atomic_write_json(launch_path, {**rec, "exit_code": rc, "timed_out": timed_out, "end_time": _now()})


def _die_with_parent_fn() -> Callable[[], None] | None:
    """A preexec_fn making the child get SIGTERM when the driver dies (Linux prctl PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)

    def preexec() -> None:  # runs in the forked child: no imports, no locks
        prctl(pr_set_pdeathsig, sigterm, 0, 0, 0)
        if os.getppid() != parent:  # the driver died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


# ---------------------------------------------------------------- sweep directory


def _check_out_dir(cfg: SweepConfig, out_dir: Path, resume: bool, force: bool) -> dict | None:
    """Refuse to touch an existing sweep without --resume/--force; returns the old sweep.json on resume."""
    sweep_json = out_dir / "sweep.json"
    if not sweep_json.exists() and not (out_dir / "runs").exists():
        return None
    if force:
        return None
    if not resume:
        raise SweepError(
            f"{out_dir} already holds a sweep; pass --resume to finish it, --force to delete its runs and "
            f"start over, or --out DIR (make: OUT=DIR) to write elsewhere"
        )
    old = read_json(sweep_json)
    if not isinstance(old, dict) or not isinstance(old.get("config"), dict):
        raise SweepError(
            f"{sweep_json}: missing or unreadable, so --resume cannot check the config; use --force or --out"
        )
    changed = diff_resolved(old["config"], cfg.resolved)
    if changed:
        shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
        raise SweepError(
            f"--resume: {out_dir} was run with a different config ({shown} differ); "
            "use --force to start over or --out for a new directory"
        )
    return old


def _take_lock(out_dir: Path) -> int:
    fd = os.open(out_dir / ".sweep.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise SweepError(f"{out_dir}: another sweep is running in this directory") from None
    return fd


def _clear_results(out_dir: Path) -> None:
    """--force: delete runs/ and the aggregation outputs; cache/ stays."""
    shutil.rmtree(out_dir / "runs", ignore_errors=True)
    for path in [out_dir / "sweep.json", *(out_dir / n for n in AGGREGATE_OUTPUTS), *out_dir.glob("*.png")]:
        path.unlink(missing_ok=True)


def _write_sweep_json(cfg, runs, out_dir, info, previous, argv) -> None:
    now = _now()
    doc = {
        "name": cfg.name,
        "config_path": str(cfg.path),
        "config": cfg.resolved,
        "order_mode": cfg.order,
        "order_seed": cfg.order_seed,
        "order": [r.run_id for r in runs],
        "argv": list(argv),
        "created": now,
        "hardware": info,
        "resumes": [],
    }
    if previous:
        doc["created"] = previous.get("created", now)
        doc["resumes"] = [*previous.get("resumes", []), {"time": now, "argv": list(argv), "hardware": info}]
    atomic_write_json(out_dir / "sweep.json", doc)


def _detect() -> dict:
    try:
        info = detect_hardware()
    except ValueError as e:  # bench.hardware.HardwareError
        raise SweepError(str(e)) from None
    return info if isinstance(info, dict) else {}


def _hardware_problem(cfg: SweepConfig, info: dict) -> str | None:
    try:
        return check_hardware(list(cfg.hardware), info, config=str(cfg.path))
    except ValueError as e:  # bench.hardware.HardwareError: unknown hardware name in the config
        raise SweepError(str(e)) from None


def _check_gpus(cfg: SweepConfig, info: dict) -> None:
    gpus = int(info.get("gpu_count") or 0)
    need = cfg.max_gpus
    if cfg.runs_on_cpu or gpus == 0:
        if need > CPU_MAX_PROCS:
            raise SweepError(
                f"gpus_per_run: {need} processes on the CPU; expected at most {CPU_MAX_PROCS} (gloo) on a machine without GPUs"
            )
    elif need > gpus:
        raise SweepError(f"gpus_per_run: {need} GPUs per run, but this machine has {gpus}")


# ---------------------------------------------------------------- output


def print_plan(cfg: SweepConfig, runs: list[Run], out_dir: Path, hardware_problem: str | None = None) -> None:
    print(f"sweep {cfg.name} ({cfg.path}) -> {out_dir}   [dry run: nothing is written]")
    if hardware_problem:
        print(f"note: a real run would be refused here: {hardware_problem}")
    print(f"hardware: {', '.join(cfg.hardware)}; order: {cfg.order} (seed {cfg.order_seed}); ", end="")
    print(f"{len(runs)} runs = {len(cfg.cells)} cells x {len(cfg.arms)} arms x {cfg.repeats} repeats")
    skip = liger_skip_reason() if "liger" in cfg.arms else None
    if skip:
        print(f"liger runs will be skipped here: {skip}")
    seen = set()
    for run in runs:
        key = run.cell.cache_key()
        if run.cell.mode == "offline" and key not in seen:
            seen.add(key)
            cdir = cache_dir_for(out_dir, run.cell)
            state = "ready" if (cdir / "meta.json").exists() else "to prepare"
            print(f"cache {key} ({state}): {shlex.join(prepare_command(cfg, run.cell, cdir))}")
    for run in runs:
        rdir = run_dir(out_dir, run)
        cache = cache_dir_for(out_dir, run.cell)
        done = read_json(rdir / "run.json") if is_finished(rdir) else None
        note = f"  [finished: {done.get('status')}]" if done else ""
        print(f"[{run.order_index + 1:>3}/{len(runs)}] {run.run_id}{note}")
        print(f"      {shlex.join(train_command(cfg, run, rdir, cache))}")


def _outcome_line(doc: dict, rdir: Path, run: Run, vram: Any) -> str:
    status = doc.get("status", "?")
    parts = [str(status)]
    if status != "ok" and doc.get("reason"):
        parts[0] += f": {doc['reason']}"
    rows = read_jsonl(rdir / "metrics.jsonl")
    steady = [r for r in rows if isinstance(r.get("step"), int) and r["step"] > run.cell.warmup_steps] or rows
    try:
        seconds = sum(float(r["step_time_s"]) for r in steady)
        samples = sum(float(r["samples"]) for r in steady)
        if seconds > 0:
            parts.append(f"{samples / seconds:.2f} samples/s")
    except (KeyError, TypeError, ValueError):
        pass
    peak = _peak_vram(vram, rows)
    if peak:
        parts.append(peak)
    return ", ".join(parts)


def _peak_vram(vram: Any, rows: list[dict]) -> str | None:
    if isinstance(vram, dict) and vram.get("status") == "ok":
        peaks = [d.get("peak_used_gib") for d in vram.get("devices") or [] if isinstance(d, dict)]
        peaks = [p for p in peaks if isinstance(p, int | float)]
        if peaks:
            return f"peak VRAM {max(peaks):.2f} GiB (busiest card)"
    torch_peaks = [r.get("torch_peak_reserved_gib") for r in rows]
    torch_peaks = [p for p in torch_peaks if isinstance(p, int | float) and p > 0]
    return f"torch peak reserved {max(torch_peaks):.2f} GiB" if torch_peaks else None


def _print_outcome(out_dir: Path, runs: list[Run]) -> None:
    docs = [read_json(run_dir(out_dir, r) / "run.json") or {} for r in runs]
    counts = Counter(d.get("status", "missing") for d in docs)
    print("runs: " + ", ".join(f"{n} {s}" for s, n in counts.most_common()))
    skipped = Counter(d.get("reason") for d in docs if d.get("status") == "skipped")
    for reason, n in skipped.items():
        print(f"skipped {n} run(s): {reason}")


def report(out_dir: Path) -> int:
    """Build the report from the run directories and print where it is and its main table."""
    out_dir = Path(out_dir)
    try:
        build_report(out_dir)
    except ValueError as e:  # bad input: no runs, unreadable directory
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        print(
            f"error: building the report failed: {e!r} (retry: python -m bench report {out_dir})",
            file=sys.stderr,
        )
        return 1
    md = out_dir / "report.md"
    print(f"report: {md}")
    table = main_table(md)
    if table:
        print(table)
    return 0


def main_table(md: Path) -> str:
    """The first markdown table of report.md."""
    try:
        lines = md.read_text().splitlines()
    except OSError:
        return ""
    table: list[str] = []
    for line in lines:
        if line.lstrip().startswith("|"):
            table.append(line)
        elif table:
            break
    return "\n".join(table)


# ---------------------------------------------------------------- small helpers


def _log_lines(path: Path, tail_bytes: int = 65536) -> list[str]:
    """Non-empty lines at the end of a log (its last 64 KiB)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]


def _exit_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def _quietly(what: str, fn: Callable[[], Any]) -> Any:
    """Call fn; a failure of the poller or the progress display must never stop a run."""
    try:
        return fn()
    except Exception as e:
        print(f"warning: {what} failed: {e!r}", file=sys.stderr)
        return None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
