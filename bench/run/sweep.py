"""Sweep driver: plans the runs, runs them pair by pair, adds pairs where a precision target
asks for them, and builds the report.

One run is one trainer process tree (bench/launcher.py) writing into a fresh
``runs/<run_id>/`` under the run contract (docs/run-contract.md). The driver writes
``cell.json`` before launch, polls VRAM while it runs, and fixes ``run.json`` when the
trainer died, hung or never wrote an end status. Runs come in pairs (rounds): one run of
each arm of a cell, back to back, in an order drawn from the sweep's seed. Without a
precision target every cell runs ``repeats`` pairs; with one, every cell runs a pilot of
``precision.min_pairs`` pairs, then Stein's rule (bench/stats.py) fixes how many more it
needs. The decision depends only on the pilot's finished runs, so ``--resume`` after a kill
at any moment reaches the same decision and redoes only the run in flight.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.config.sweep import (
    ARM_OPTIONS,
    CPU_MAX_PROCS,
    Cell,
    Run,
    SweepConfig,
    SweepError,
    format_set_value,
    load_config,
    plan,
    plan_rounds,
)
from bench.fileio import atomic_write_json, read_json, read_jsonl, read_jsonl_counted
from bench.run import console
from bench.run.launcher import exit_text, log_lines, mark_exit, now, reap_stale, run_process
from bench.run.launcher import group_alive as group_alive  # re-exported for tests
from bench.run.sweepdir import (
    TERMINAL,
    cache_dir_for,
    check_out_dir,
    check_out_path,
    clear_results,
    compile_cache_dir,
    is_finished,
    prime_dir,
    run_dir,
    take_lock,
    update_sweep_json,
    write_sweep_json,
)

NO_GPU = "Liger's Triton kernels need a CUDA or ROCm GPU; this machine has none"
NO_LIGER = "liger-kernel is not installed: pip install '.[liger]'"
NO_LIGER_ROCM = (
    "liger-kernel is not installed: pip install --no-deps 'liger-kernel>=0.6.0' (ROCm: without its triton "
    "requirement, which would add a CUDA Triton beside pytorch-triton-rocm; docs/rocm.md)"
)
OOM_RE = re.compile(r"CUDA out of memory|HIP out of memory|OutOfMemoryError")
# The allocator's first sentence; the rest (capacity, free, reserved, advice) stays in stdout.log.
OOM_SENTENCE_RE = re.compile(r"(?:CUDA|HIP) out of memory\. Tried to allocate [\d.]+ [KMGTP]?i?B")


def short_oom(line: str) -> str:
    """``CUDA out of memory. Tried to allocate 2.00 GiB`` out of an allocator message, else the line cut to 200."""
    m = OOM_SENTENCE_RE.search(line)
    return m.group(0) if m else line[:200]


# ---------------------------------------------------------------- seams onto the other bench modules
# Imported lazily, so the driver loads without them; tests replace these functions.


def detect_hardware() -> dict:
    from bench.probe import hardware

    return hardware.detect()


def check_hardware(expected: list[str], info: dict, config: str | None = None) -> str | None:
    from bench.probe import hardware

    return hardware.check_hardware(expected, info, config=config)


def make_poller(run_dir: Path, interval_s: float):
    from bench.probe.vram import VramPoller

    return VramPoller(run_dir, interval_s=interval_s)


def gather_node_vram(run_dir: Path, nodes: int) -> dict:
    """Merge a multi-node run's per-node VRAM files into its vram.json (bench/nodevram.py)."""
    from bench.probe.nodevram import gather

    return gather(run_dir, nodes)


def vram_preflight() -> str | None:
    """A one-line warning when this machine's GPUs cannot be polled (e.g. amdsmi missing)."""
    from bench.probe import vram

    check = getattr(vram, "preflight", None)
    return check() if check is not None else None


def build_report(out_dir: Path) -> dict:
    from bench.results.report import build_report as build

    return build(out_dir)


def liger_skip_reason() -> str | None:
    """Why the liger arm cannot run on this machine, or None when it can."""
    import importlib.util

    try:
        import torch

        has_gpu = torch.cuda.is_available()
        rocm = bool(getattr(torch.version, "hip", None))
    except Exception:
        has_gpu, rocm = False, False
    if not has_gpu:
        return NO_GPU
    if importlib.util.find_spec("liger_kernel") is None:
        return NO_LIGER_ROCM if rocm else NO_LIGER
    return None


# ---------------------------------------------------------------- the sweep


def run_sweep(
    config_path: str | Path,
    out: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
    dry_run: bool = False,
    argv: list[str] | None = None,
    capacity: bool = False,
) -> int:
    """Run (or resume) a sweep — or, with ``capacity``, the config's capacity search
    (bench/capacity.py); returns the exit status. Bad input raises SweepError before anything
    is written."""
    cfg = load_config(config_path)
    if resume and force:
        raise SweepError(
            "--resume and --force exclude each other: --resume finishes a sweep, --force starts it over"
        )
    if capacity and cfg.capacity is None:
        raise SweepError(
            f"{cfg.path}: capacity: missing; `bench capacity` needs a capacity section (docs/method.md)"
        )
    if out is not None and not str(out).strip():
        raise SweepError("--out: empty path; expected a directory")
    out_dir = Path(out) if out is not None else Path(cfg.out)
    check_out_path(out_dir)
    runs = plan(cfg) if not capacity else []
    _check_imports(cfg)
    check_cells(cfg, out_dir)
    info = _detect()
    problem = _hardware_problem(cfg, info)
    if dry_run:
        if capacity:
            from bench.run.capacity import print_capacity_plan

            print_capacity_plan(cfg, out_dir, problem)
        else:
            print_plan(cfg, runs, out_dir, problem)
        return 0
    if problem:
        raise SweepError(problem)
    _check_gpus(cfg, info)
    _check_launcher(cfg)
    previous = check_out_dir(cfg, out_dir, resume, force)

    out_dir.mkdir(parents=True, exist_ok=True)
    lock = take_lock(out_dir)
    try:
        reap_stale(out_dir)
        if force:
            clear_results(out_dir)
        argv = argv if argv is not None else ["python", "-m", "bench", *sys.argv[1:]]
        write_sweep_json(cfg, runs, out_dir, info, previous, argv)
        if cfg.poll_vram:
            warning = _quietly("VRAM preflight", vram_preflight)
            if warning:
                print(f"warning: {warning}", file=sys.stderr, flush=True)
        if capacity:
            from bench.run.capacity import search

            return search(cfg, out_dir, info)
        return _execute(cfg, runs, out_dir, info)
    finally:
        os.close(lock)


def start_fork_server(
    cfg: SweepConfig, out_dir: Path, compile_dir: Path | None, info: dict, say: Callable[[str], None] = print
) -> None:
    """Start the warm fork server when any cell forks its runs (bench/forkstart.py); record
    in sweep.json what it imported and how long that took (paid once, not by each run)."""
    if not any(cfg.forks(c) for c in cfg.cells):
        return
    from bench.run import forkstart

    gpus = 0 if cfg.runs_on_cpu else int(info.get("gpu_count") or 0)
    try:
        ready_s = forkstart.start_server(cfg.preload, compile_env(compile_dir), gpus)
    except (OSError, EOFError, ValueError, forkstart.ForkServerUnusable) as e:  # runs start afresh
        print(f"warning: fork server did not start ({e}); runs start as new interpreters", file=sys.stderr)
        return
    if ready_s:
        say(f"fork server ready in {ready_s:.1f}s ({', '.join(cfg.preload)} imported once for all runs)")
        update_sweep_json(out_dir, fork_server={"preload": cfg.preload, "ready_s": round(ready_s, 2)})


def _execute(cfg: SweepConfig, pilot: list[Run], out_dir: Path, info: dict) -> int:
    skip = liger_skip_reason() if any(r.liger for r in pilot) else None
    compile_dir = compile_cache_dir(out_dir, info) if cfg.compile_cache else None
    runs = pilot
    try:
        todo = [r for r in pilot if not is_finished(run_dir(out_dir, r))]
        if len(todo) < len(pilot):
            print(f"{len(pilot) - len(todo)} of {len(pilot)} runs already finished in {out_dir}")
        caches = _prepare_caches(cfg, out_dir, [r for r in todo if not (r.liger and skip)])
        progress = console.Progress(total=len(pilot), done=len(pilot) - len(todo))
        # the fork server starts once, before the first run that launches (printed above the bar)
        server = functools.cache(lambda: start_fork_server(cfg, out_dir, compile_dir, info, progress.write))
        primed: set[tuple[str, str]] = set()  # (cell, arm) primed by this invocation
        try:
            _run_pending(cfg, pilot, out_dir, skip, caches, compile_dir, progress, server, primed)
            if any(c.precision for c in cfg.cells):
                runs = _extend_by_precision(cfg, out_dir, progress)
                more = [r for r in runs if not (r.liger and skip)]
                caches.update(_prepare_caches(cfg, out_dir, more, known=caches))
                _run_pending(cfg, runs, out_dir, skip, caches, compile_dir, progress, server, primed)
        finally:
            progress.close()
    except KeyboardInterrupt:
        print("\ninterrupted: the run in flight was stopped; --resume redoes it", file=sys.stderr)
        return 130
    failed = console.print_outcome(out_dir, runs)
    rc = report(out_dir)
    if failed and rc == 0:
        print(
            f"{failed} of {len(runs)} runs did not finish ok (see report.md: 'Runs that did not finish ok')",
            file=sys.stderr,
        )
        return 1
    return rc


def _run_pending(
    cfg, runs, out_dir, skip, caches, compile_dir, progress: console.Progress, server, primed=None
) -> None:
    """Run the unfinished runs in order; ``server()`` starts the fork server before the first
    run that launches (a resumed sweep with nothing left to run never starts it). With
    ``prime_runs``, a (cell, arm)'s first pending run in this invocation is preceded by its
    priming runs (``primed`` holds those done)."""
    primed = set() if primed is None else primed
    for run in runs:
        if is_finished(run_dir(out_dir, run)):
            continue
        if not (run.liger and skip):
            server()
            if cfg.prime_runs and (run.cell.cell_id, run.arm) not in primed:
                primed.add((run.cell.cell_id, run.arm))
                _prime(cfg, run, out_dir, skip, caches, compile_dir, progress)
        progress.start(run)
        t0 = time.monotonic()
        line = execute_run(cfg, run, out_dir, skip, caches, progress.ticker(run, out_dir), compile_dir)
        progress.done(run, line, time.monotonic() - t0)


def prime_runs(cfg: SweepConfig, run: Run) -> list[Run]:
    """The discarded runs that precede ``run``'s (cell, arm) (sweep key prime_runs)."""
    stem = f"{run.cell.cell_id}_{run.arm}"
    return [Run(f"{stem}_prime{i}", run.cell, run.arm, 0, -1) for i in range(1, cfg.prime_runs + 1)]


def _prime(cfg, run, out_dir, skip, caches, compile_dir, progress: console.Progress) -> None:
    """Run ``run``'s priming runs under prime/ (not runs/: no table, pair or verdict reads them).
    They fill the compile and autotune caches, so that no measured run compiles a kernel inside
    its measured steps; their outcome is printed and kept, and does not stop the sweep."""
    for p in prime_runs(cfg, run):
        progress.start(p)
        t0 = time.monotonic()
        line = execute_run(cfg, p, out_dir, skip, caches, None, compile_dir, rdir=prime_dir(out_dir, p))
        progress.write(f"{p.run_id}: {line} ({time.monotonic() - t0:.0f} s, discarded: it primes the caches)")


def _extend_by_precision(cfg: SweepConfig, out_dir: Path, progress: console.Progress) -> list[Run]:
    """Stein's second stage: from the finished pilot, the pairs each cell needs; the full run order."""
    from bench.results.aggregate import load_runs, runs_table, stein_decisions

    targets = cfg.precision_targets
    decisions = stein_decisions(runs_table(load_runs(out_dir)), targets)
    rounds = {
        c.cell_id: decisions[c.cell_id].pairs if c.cell_id in decisions else cfg.pilot_pairs(c)
        for c in cfg.cells
    }
    runs = plan_rounds(cfg, rounds)
    update_sweep_json(
        out_dir,
        order=[r.run_id for r in runs],
        precision={cid: {**targets[cid], "decision": vars(d)} for cid, d in decisions.items()},
    )
    for cid, d in decisions.items():
        progress.write(f"precision: {cid}: {d.reason}")
    progress.grow(len(runs))
    return runs


def execute_run(
    cfg: SweepConfig,
    run: Run,
    out_dir: Path,
    skip: str | None,
    caches: dict,
    tick=None,
    compile_dir: Path | None = None,
    rdir: Path | None = None,
) -> str:
    """Run one planned run in a fresh directory (default its runs/ directory); returns a one-line outcome."""
    rdir = rdir if rdir is not None else run_dir(out_dir, run)
    if rdir.exists():
        shutil.rmtree(rdir)
    rdir.mkdir(parents=True)
    cache_dir = cache_dir_for(out_dir, run.cell)
    cache_error = caches.get(run.cell.cache_key())
    argv = train_command(cfg, run, rdir, cache_dir)
    warm = compile_dir is not None and any(p.is_file() for p in compile_dir.rglob("*"))  # not just empty dirs
    record = cell_record(cfg, run, argv, cache_dir)
    record["compile_cache"] = {"dir": str(compile_dir) if compile_dir else None, "warm": warm}
    atomic_write_json(rdir / "cell.json", record)
    if run.liger and skip:
        return _record(rdir, run, "skipped", skip)
    if cache_error:
        return _record(rdir, run, "error", cache_error)

    started = now()
    poller = None
    multinode = run.cell.nodes > 1  # each node polls its own cards beside its agent (bench/nodevram.py)
    if not cfg.polls(run.arm):
        why = "poll_vram: false" if not cfg.poll_vram else f"arm {run.arm} runs without the poller"
        atomic_write_json(rdir / "vram.json", {"backend": "none", "status": "disabled", "reason": why})
    elif not multinode:
        poller = _quietly("VRAM poller", lambda: make_poller(rdir, cfg.poll_interval_s))
    if poller is not None:
        _quietly("VRAM poller", poller.start)
    try:
        rc, timed_out = run_process(
            argv,
            rdir / "stdout.log",
            rdir / "launch.json",
            run.cell.timeout_s,
            tick,
            compile_env(compile_dir),
            fork=cfg.forks(run.cell),
        )
    finally:
        if poller is not None:
            _quietly("VRAM poller", poller.stop)
    if multinode and cfg.polls(run.arm):
        _quietly("VRAM gather", lambda: gather_node_vram(rdir, run.cell.nodes))
    reconcile(rdir, run, rc, timed_out, started)
    mark_exit(rdir / "launch.json", rc, timed_out)
    return console.outcome_line(rdir)


def compile_env(compile_dir: Path | None) -> dict[str, str]:
    """Environment pointing TorchInductor (FX graph, AOTAutograd, autotune) and Triton at the
    sweep's shared compile cache; empty when the sweep does not share one."""
    if compile_dir is None:
        return {}
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(compile_dir / "inductor"),
        "TRITON_CACHE_DIR": str(compile_dir / "triton"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    }


def reconcile(rdir: Path, run: Run, rc: int, timed_out: bool, started: str) -> dict:
    """The run's final run.json: the trainer's own when it recorded an end status, else the driver's."""
    doc = read_json(rdir / "run.json")
    torn = (rdir / "run.json").exists() and not isinstance(doc, dict)
    doc = doc if isinstance(doc, dict) else {}
    if doc.get("status") == "ok":
        short = _short_metrics(rdir, run)
        if short:  # "ok" with steps missing is not a result: say what was found
            doc.update(
                status="error", reason=short, driver_note="the trainer recorded ok; the driver did not"
            )
            atomic_write_json(rdir / "run.json", doc)
            return doc
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
    doc = {**base, **doc, "end_time": now(), "exit_code": rc}
    if timed_out:
        rows = read_jsonl(rdir / "metrics.jsonl")
        at = f"at step {rows[-1].get('step')}/{run.cell.steps}" if rows else "before the first step"
        doc.update(status="timeout", reason=f"timed out after {run.cell.timeout_s:g} s {at}")
    else:
        lines = log_lines(rdir / "stdout.log")
        oom = [ln for ln in lines if OOM_RE.search(ln)]
        if rc == 3 or oom:
            doc.update(status="oom", reason=short_oom((oom or lines or [f"exit code {rc}"])[-1]))
        else:
            last = torchrun_reason(lines) or (lines[-1] if lines else "no output")
            doc.update(status="error", reason=f"{last} ({exit_text(rc)})")
    if torn:
        doc["driver_note"] = (
            "the trainer's run.json was not valid JSON (a torn write); replaced by the driver's"
        )
    atomic_write_json(rdir / "run.json", doc)
    return doc


_EXCEPTION_RE = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b.*)$")


def torchrun_reason(lines: list[str]) -> str | None:
    """For a torchrun tree whose rank failed: "rank R: <its exception line>" from torchrun's
    "Root Cause" summary and the last exception printed before it; None for other logs."""
    try:
        root = max(i for i, ln in enumerate(lines) if ln.startswith("Root Cause (first observed failure)"))
    except ValueError:
        return None
    rank = next((ln.split(":", 1)[1].split()[0] for ln in lines[root:] if ln.startswith("rank")), "?")
    start = next((i for i in range(root, -1, -1) if "ChildFailedError" in lines[i]), root)
    for ln in reversed(lines[:start]):
        m = _EXCEPTION_RE.match(ln)
        if m and "ChildFailedError" not in ln and "SignalException" not in ln:
            return f"rank {rank}: {m.group(1)}"
    return f"rank {rank} failed"


def _short_metrics(rdir: Path, run: Run) -> str | None:
    """Why an "ok" run's metrics.jsonl cannot back its result (steps missing, unreadable lines), or None."""
    rows, bad = read_jsonl_counted(rdir / "metrics.jsonl")
    steps = {r["step"] for r in rows if isinstance(r.get("step"), int)}
    if len(steps) >= run.cell.steps and not bad:
        return None
    found = f"metrics.jsonl holds {len(steps)} of {run.cell.steps} steps"
    return found + (f" and {bad} unreadable line(s)" if bad else "") + "; the run is not counted"


# ---------------------------------------------------------------- checks before anything is written

DRIVER_PACKAGES = ("yaml", "pandas", "scipy", "matplotlib", "tqdm")
SPECFORGE_PACKAGES = ("torch", "transformers", "safetensors")
CHECK_TIMEOUT_S = 120.0


def _check_imports(cfg: SweepConfig) -> None:
    """One line naming the missing packages, before anything is written (not a ModuleNotFoundError later)."""
    import importlib.util

    wanted = DRIVER_PACKAGES + (SPECFORGE_PACKAGES if cfg.trainer_module == "specforge" else ())
    missing = [m for m in wanted if importlib.util.find_spec(m) is None]
    if missing:
        raise SweepError(
            f"this Python ({sys.executable}) lacks {', '.join(missing)}: run `make install` (the venv), or "
            "point PYTHON= at an environment that has them"
        )


def check_command(
    cfg: SweepConfig, cell: Cell, out_dir: Path, cache_dir: Path | None, arm: str = "baseline"
) -> list[str]:
    """The trainer's validate-only command for a cell: its training config with every --set the runs
    get. With an existing offline cache as ``cache_dir`` the trainer also verifies that cache."""
    run = Run("check", cell, arm, 1, 0)
    args = train_args(run, out_dir / "runs" / "check", cache_dir)  # train CONFIG ... --output-dir DIR
    return [sys.executable, "-m", cfg.trainer_module, "check", *args[1:-2]]


def check_cells(cfg: SweepConfig, out_dir: Path) -> None:
    """Ask the trainer to validate every cell's training config (unknown or mistyped `set:` keys, an
    unknown profile or trainer module) before anything is written; SweepError with its one line."""
    seen: set[tuple] = set()
    for cell, arm in ((c, a) for c in cfg.cells for a in cfg.arms):
        cache = cache_dir_for(out_dir, cell)  # a path only: the cache itself is verified when it is used
        planned = cache.with_name(cache.name + ".unprepared") if cache else None
        argv = check_command(cfg, cell, out_dir, planned, arm)
        if tuple(argv) in seen:
            continue
        seen.add(tuple(argv))
        try:
            r = subprocess.run(
                argv, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            raise SweepError(
                f"{cfg.path}: cells[{cell.entry}] ({cell.cell_id}): the trainer's check did not answer in {CHECK_TIMEOUT_S:g} s"
            ) from None
        if r.returncode == 0:
            continue
        lines = [ln.strip() for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit code {r.returncode}"
        if "No module named" in last and cfg.trainer_module.split(".")[0] in last:
            raise SweepError(
                f"{cfg.path}: trainer_module: {cfg.trainer_module!r} cannot be run here ({last})"
            )
        last = last.removeprefix("error: ")
        raise SweepError(f"{cfg.path}: cells[{cell.entry}] ({cell.cell_id}): {last}")


# ---------------------------------------------------------------- commands and records


def launcher(cfg: SweepConfig, run: Run, rdir: Path) -> list[str]:
    """The command up to the trainer's arguments: ``python -m <trainer>`` for one process,
    ``torchrun --standalone`` for one node's GPUs; for several nodes the config's launcher
    (which starts the rest once per node), then bench.probe.nodevram polling each node's cards into
    the run directory (when the arm is polled), then a torchrun agent that meets the other
    nodes' at the c10d rendezvous."""
    cell = run.cell
    if cell.gpus == 1 and cell.nodes == 1:
        return [sys.executable, "-m", cfg.trainer_module]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(cell.gpus)]
    if cell.nodes == 1:
        return [*torchrun, "--standalone", "-m", cfg.trainer_module]
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", str(cfg.rdzv_endpoint), "--rdzv-id", run.run_id]
    torchrun += ["--nnodes", str(cell.nodes), *rdzv]
    wrap = [sys.executable, "-m", "bench.probe.nodevram", "--run-dir", str(rdir), "--interval-s"]
    wrap = [*wrap, f"{cfg.poll_interval_s:g}", "--"] if cfg.polls(run.arm) else []
    return [*cfg.launcher, *wrap, *torchrun, "-m", cfg.trainer_module]


def train_command(cfg: SweepConfig, run: Run, rdir: Path, cache_dir: Path | None) -> list[str]:
    return [*launcher(cfg, run, rdir), *train_args(run, rdir, cache_dir)]


def train_args(run: Run, rdir: Path, cache_dir: Path | None) -> list[str]:
    """The trainer's arguments: ``train CONFIG --set k=v ... [--use-liger-kernel] --output-dir DIR``."""
    cell = run.cell
    sets: dict[str, Any] = {
        "training.steps": cell.steps,
        "training.batch_size": cell.batch_size,
        "data.seq_len": cell.seq_len,
    }
    if cache_dir is not None:
        sets["data.cache_dir"] = str(cache_dir)
    if not run.liger:
        sets["model.use_liger_kernel"] = False
    sets.update(cell.overrides)
    sets.update(ARM_OPTIONS[run.arm]["set"])  # the arm's own keys (a cell may not set them)
    argv = ["train", cell.train_config, *_set_args(sets)]
    if run.liger:
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
            "end_time": now(),
            "config": None,
        },
    )
    return f"{status}: {reason}"


# ---------------------------------------------------------------- offline caches


def _prepare_caches(
    cfg: SweepConfig, out_dir: Path, runs: list[Run], known: dict[str, str | None] | None = None
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
            damage = _cache_problem(cfg, cell, out_dir, cdir)
            if damage is None:
                caches[key] = None
                continue
            print(f"offline cache {cdir} cannot be used ({damage}): preparing it again", flush=True)
        if cdir.exists():
            shutil.rmtree(cdir)  # a partial cache from an interrupted prepare
        cdir.parent.mkdir(parents=True, exist_ok=True)
        argv = prepare_command(cfg, cell, cdir)
        log = cdir.parent / f"{key}.log"
        log.unlink(missing_ok=True)
        print(f"preparing offline cache {cdir} ...", flush=True)
        t0 = time.monotonic()
        rc, timed_out = run_process(argv, log, cdir.parent / f"{key}.launch.json", cfg.prepare_timeout_s)
        mark_exit(cdir.parent / f"{key}.launch.json", rc, timed_out)
        error = None
        if timed_out:
            error = f"cache prepare failed: timed out after {cfg.prepare_timeout_s:g} s (log: {log})"
        elif rc != 0 or not (cdir / "meta.json").exists():
            lines = log_lines(log)
            error = f"cache prepare failed: {lines[-1] if lines else exit_text(rc)}"
        print(f"  {error or 'done'} ({time.monotonic() - t0:.0f} s)", flush=True)
        caches[key] = error
    return caches


def _cache_problem(cfg: SweepConfig, cell: Cell, out_dir: Path, cdir: Path) -> str | None:
    """Why an existing offline cache of the sweep cannot be used (damaged, truncated, an older
    format: the trainer's check says), or None."""
    try:
        r = subprocess.run(
            check_command(cfg, cell, out_dir, cdir),
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"its check did not answer in {CHECK_TIMEOUT_S:g} s"
    if r.returncode == 0:
        return None
    lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
    return (lines[-1] if lines else exit_text(r.returncode)).removeprefix("error: ")


# ---------------------------------------------------------------- checks and output


def _detect() -> dict:
    try:
        info = detect_hardware()
    except ValueError as e:  # bench.probe.hardware.HardwareError
        raise SweepError(str(e)) from None
    return info if isinstance(info, dict) else {}


def _hardware_problem(cfg: SweepConfig, info: dict) -> str | None:
    try:
        return check_hardware(list(cfg.hardware), info, config=str(cfg.path))
    except ValueError as e:  # bench.probe.hardware.HardwareError: unknown hardware name in the config
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


def _check_launcher(cfg: SweepConfig) -> None:
    if cfg.launcher and shutil.which(cfg.launcher[0]) is None:
        raise SweepError(f"{cfg.path}: launcher: {cfg.launcher[0]!r} is not on this machine's PATH")


def print_plan(cfg: SweepConfig, runs: list[Run], out_dir: Path, hardware_problem: str | None = None) -> None:
    print(f"sweep {cfg.name} ({cfg.path}) -> {out_dir}   [dry run: nothing is written]")
    if hardware_problem:
        print(f"note: a real run would be refused here: {hardware_problem}")
    print(f"hardware: {', '.join(cfg.hardware)}; order: {cfg.order} (seed {cfg.order_seed}); ", end="")
    if any(c.precision for c in cfg.cells):
        print(f"{len(runs)} pilot runs = {len(cfg.cells)} cells x {len(cfg.arms)} arms x precision.min_pairs")
        for cell in cfg.cells:
            p = cell.precision
            if p is not None:
                print(
                    f"precision {cell.cell_id}: pairs are added after the pilot of {p.min_pairs} until the 95% CI "
                    f"of Δ samples/s is ±{p.ci_halfwidth_pct:g} points (Stein's rule), at most {p.max_pairs}"
                )
    else:
        print(f"{len(runs)} runs = {len(cfg.cells)} cells x {len(cfg.arms)} arms x {cfg.repeats} repeats")
    if cfg.contrasts:
        print("also compared: " + ", ".join(f"{a} against {r}" for a, r in cfg.contrasts) + " (contrasts)")
    if cfg.prime_runs:
        print(
            f"plus {cfg.prime_runs} discarded priming run(s) per cell and arm before its first measured run "
            f"({cfg.prime_runs * len(cfg.cells) * len(cfg.arms)} in all, under prime/; again on a resume)"
        )
    if cfg.nodes > 1:
        print(
            f"{cfg.nodes} nodes per run, started by `{shlex.join(cfg.launcher)}`; rendezvous at "
            f"{cfg.rdzv_endpoint} (from {cfg.rdzv_from})"
        )
    skip = liger_skip_reason() if any(r.liger for r in runs) else None
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
    table = console.main_table(md)
    if table:
        print(table)
    return 0


def _quietly(what: str, fn: Callable[[], Any]) -> Any:
    """Call fn; a failure of the poller or the progress display must never stop a run."""
    try:
        return fn()
    except Exception as e:
        print(f"warning: {what} failed: {e!r}", file=sys.stderr)
        return None
