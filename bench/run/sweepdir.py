"""The sweep directory: its lock, which runs are finished, resume checks, --force, the rounds
--retry-failed reopens, sweep.json.

A sweep may create, replace or delete only what it can prove is its own: sweep.json, the
aggregation outputs, runs/ and cache/ (docs/run-contract.md lists the layout).
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path

from bench.config import Cell, Run, SweepConfig, SweepError, diff_resolved
from bench.fileio import atomic_write_json, read_json, writing
from bench.record import has_cell, has_run, read_cell, read_run
from bench.results.columns import OPTIONAL_REPORT_FILES, REPORT_FILES
from bench.trainers.outcome import TERMINAL

AGGREGATE_OUTPUTS = (*REPORT_FILES, *OPTIONAL_REPORT_FILES)  # what `bench report` writes
LOCK = ".sweep.lock"  # held (flock) while a sweep writes; a second sweep of the directory is refused
# Everything else a sweep writes at the top of its directory (docs/run-contract.md, docs/reference.md):
# sweep.json, the lock, the runs, the discarded priming runs, and the caches (offline caches with
# their preparation's log and launch record; the shared compile caches).
SWEEP_ENTRIES = ("sweep.json", LOCK, "runs/", "prime/", "pairs/", "cache/", "cache/compile/", "ab.yaml")


def is_finished(rdir: Path) -> bool:
    doc = read_run(rdir, tolerant=True)
    if doc is None or doc.status not in TERMINAL:
        return False
    launch = rdir / "launch.json"
    if not launch.exists():
        return True  # never launched: skipped or recorded by the driver
    rec = read_json(launch)
    return isinstance(rec, dict) and "exit_code" in rec


# A run that ended so can be re-run by --retry-failed (a skipped run is the machine's answer:
# its reason, e.g. no GPU for Liger, holds on every retry).
RETRYABLE = ("error", "timeout", "oom")


def failed_rounds(out_dir: Path) -> list[dict]:
    """The rounds (one run of each arm of a cell, back to back: cell.json's cell_id and repeat)
    holding a run whose status is error, timeout or oom, in run order; each
    ``{cell_id, repeat, runs: {run_id: {arm, status, reason}}}`` with every run of the round."""
    rounds: dict[tuple[str, int], dict] = {}
    runs_dir = out_dir / "runs"
    for rdir in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []:
        cell, doc = read_cell(rdir, tolerant=True), read_run(rdir, tolerant=True)
        if cell is None or cell.repeat is None or not cell.has("cell_id"):
            continue
        key = (str(cell.cell_id), cell.repeat)
        r = rounds.setdefault(key, {"cell_id": key[0], "repeat": key[1], "runs": {}, "first": 1 << 30})
        r["runs"][rdir.name] = {
            "arm": cell.arm,
            "status": doc.status if doc else None,
            "reason": doc.reason if doc else None,
        }
        if cell.order_index is not None:
            r["first"] = min(r["first"], cell.order_index)
    failed = [r for r in rounds.values() if any(v["status"] in RETRYABLE for v in r["runs"].values())]
    failed.sort(key=lambda r: (r["first"], r["cell_id"], r["repeat"]))
    return [{k: v for k, v in r.items() if k != "first"} for r in failed]


def reopen_rounds(out_dir: Path, rounds: list[dict]) -> None:
    """Delete every run of these rounds (ok ones too: a round is re-run whole, its arms back to
    back again), the failed runs last: killed half-way, the round still shows as failed."""
    for r in rounds:
        runs = sorted(r["runs"], key=lambda rid: r["runs"][rid]["status"] in RETRYABLE)
        for run_id in runs:
            shutil.rmtree(out_dir / "runs" / run_id, ignore_errors=True)


def run_dir(out_dir: Path, run: Run) -> Path:
    return out_dir / "runs" / run.run_id


def prime_dir(out_dir: Path, run: Run) -> Path:
    """Where a priming run goes (sweep key prime_runs): beside runs/, never read as a result."""
    return out_dir / "prime" / run.run_id


def pair_dir(out_dir: Path, run: Run) -> Path:
    """Where a lockstep pair's FIFOs and launch files go (``pairing: lockstep``): beside runs/,
    never read as a result; named for the pair's first run."""
    return out_dir / "pairs" / run.run_id


def cache_dir_for(out_dir: Path, cell: Cell) -> Path | None:
    """The offline hidden-state cache a cell reads (None for online cells)."""
    return out_dir / "cache" / cell.cache_key() if cell.prepared else None


def check_out_path(out_dir: Path, flag: str = "--out") -> None:
    """One line (SweepError) when ``out_dir`` cannot be a sweep directory: a file, unwritable, empty,
    or a path with a control character or whitespace around it (refused as a sweep's or an arm's
    name is: bench/config/typed.py's name_problem; a newline would put a second line into every
    path and message naming the directory)."""
    from bench.config.typed import name_problem  # not at import time: bench.config needs PyYAML

    if not str(out_dir).strip():
        raise SweepError(f"{flag}: empty path; expected a directory")
    why = name_problem(str(out_dir))
    if why:
        raise SweepError(f"{flag} {str(out_dir)!r}: the path {why}; expected a directory path on one line")
    if out_dir.exists() and not out_dir.is_dir():
        raise SweepError(f"{flag} {out_dir}: is a file; expected a directory")
    existing = out_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise SweepError(f"{flag} {out_dir}: {existing} is a file; expected a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == out_dir else f" ({existing} is where it would be created)"
        raise SweepError(f"{flag} {out_dir}: not writable{where}; choose a directory you can write to")


def _shown(names: list[str], limit: int) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_out_dir(
    cfg: SweepConfig, out_dir: Path, resume: bool, force: bool, can_force: bool = True
) -> dict | None:
    """Refuse to touch an existing sweep without --resume/--force, or a directory holding anything
    but a sweep; returns the old sweep.json on resume. ``can_force``: whether the command has a
    --force to suggest (``bench submit`` has none: it never deletes runs)."""
    check_out_path(out_dir)
    sweep_json = out_dir / "sweep.json"
    if not sweep_json.exists():
        # no sweep here (its sweep.json is the mark; a runs/ alone may be anyone's, e.g. TensorBoard's):
        # only an empty directory (or one holding shared caches) may become one
        names = [p.name for p in out_dir.iterdir()] if out_dir.is_dir() else []
        # slurm/: bench submit's batch script; ab.yaml: the sweep config `bench ab` wrote (bench/run/ab.py)
        theirs = sorted(set(names) - {"cache", LOCK, "slurm", "ab.yaml"})
        if theirs:
            raise SweepError(
                f"{out_dir} is not empty and holds no sweep (found {_shown(theirs, 4)}); a sweep writes only into an empty "
                "or new directory or its own sweep directory: choose another --out (make: OUT=DIR)"
            )
        return None
    # with --force, a file of the user's beside the sweep stays; one among its runs would mix in
    if force and (foreign := foreign_runs(out_dir)):
        raise SweepError(
            f"--force: {out_dir}/runs holds what this suite did not write ({_shown(foreign, 3)}); --force "
            "deletes only a sweep's own runs and reports: move those away, or choose another --out (make: OUT=DIR)"
        )
    if force:
        return None
    if not resume:
        if not can_force:
            raise SweepError(
                f"{out_dir} already holds a sweep; pass --resume to finish it (or --retry-failed to re-run its "
                "failed rounds), or --out DIR to write elsewhere (bench submit never deletes runs)"
            )
        raise SweepError(
            f"{out_dir} already holds a sweep; pass --resume to finish it, --force to delete its runs and "
            f"start over, or --out DIR (make: OUT=DIR) to write elsewhere"
        )
    instead = "--force to start over or " if can_force else ""
    old = read_json(sweep_json)
    if not isinstance(old, dict) or not isinstance(old.get("config"), dict):
        raise SweepError(
            f"{sweep_json}: missing or unreadable, so --resume cannot check the config; use {instead.replace(' to start over', '')}--out"
        )
    changed = diff_resolved(old["config"], cfg.resolved)
    if changed:
        raise SweepError(
            f"--resume: {out_dir} was run with a different config ({_shown(changed, 6)} differ); "
            f"use {instead}--out for a new directory"
        )
    return old


def take_lock(out_dir: Path) -> int:
    with writing(out_dir / LOCK):
        fd = os.open(out_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise SweepError(f"{out_dir}: another sweep is running in this directory") from None
    return fd


def is_suite_run(rdir: Path) -> bool:
    """A directory under runs/ that a sweep wrote: it holds the run files the driver writes first."""
    return rdir.is_dir() and (has_cell(rdir) or (rdir / "launch.json").exists() or has_run(rdir))


def foreign_runs(out_dir: Path) -> list[str]:
    """What a sweep's runs/ holds that no sweep wrote (no run files): what --force must not delete."""
    runs = out_dir / "runs"
    return sorted(f"runs/{p.name}" for p in runs.iterdir() if not is_suite_run(p)) if runs.is_dir() else []


def clear_results(out_dir: Path) -> None:
    """--force: delete the sweep's own runs (runs/<id> holding run files), prime/, pairs/, sweep.json and
    the aggregation outputs; cache/ and the user's own files beside them stay (check_out_dir
    has refused a runs/ holding anything else)."""
    runs = out_dir / "runs"
    if runs.is_dir():
        for rdir in runs.iterdir():
            if is_suite_run(rdir):
                shutil.rmtree(rdir, ignore_errors=True)
        if not any(runs.iterdir()):
            runs.rmdir()
    shutil.rmtree(out_dir / "prime", ignore_errors=True)
    shutil.rmtree(out_dir / "pairs", ignore_errors=True)
    for path in [out_dir / "sweep.json", *(out_dir / n for n in AGGREGATE_OUTPUTS)]:
        path.unlink(missing_ok=True)


def write_sweep_json(cfg, runs, out_dir, info, previous, argv, retried: list[dict] | None = None) -> None:
    """sweep.json at (re)start: config, planned order, command line, hardware, earlier resumes
    (each with the rounds its --retry-failed re-ran, ``retried``, and why)."""
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
        "git_commit": git_commit(),
        # per cell with a precision target: its ci_halfwidth_pct, min_pairs, max_pairs (the report reads them)
        "precision_targets": cfg.precision_targets,
        # per cell: the workload its runs' cell.json must hold (bench/results/identity.py checks them)
        "cells": {c.cell_id: planned_cell(c) for c in cfg.cells},
        "equivalence_pct": cfg.equivalence_pct,
        "resumes": [],
    }
    if previous:
        doc["created"] = previous.get("created", now)
        # the rounds Stein's rule added stay planned until it decides again (bench/run/sweep.py)
        later = [
            rid for rid in previous.get("order") or [] if isinstance(rid, str) and rid not in doc["order"]
        ]
        doc["order"] += later
        doc["resumes"] = [
            *previous.get("resumes", []),
            {
                "time": now,
                "argv": list(argv),
                "hardware": info,
                "git_commit": doc["git_commit"],
                **({"retried": retried} if retried else {}),
            },
        ]
    atomic_write_json(out_dir / "sweep.json", doc)


def planned_cell(c) -> dict:
    """A cell's workload keys as its runs' cell.json records them (bench/run/execute.py)."""
    return {
        "trainer": c.trainer, "profile": c.profile, "mode": c.mode, "batch_size": c.batch_size,
        "seq_len": c.seq_len, "accumulation_steps": c.accumulation_steps, "num_anchors": c.num_anchors,
        "gpus": c.gpus, "nodes": c.nodes, "set": c.overrides, "train_config": c.train_config,
        "steps": c.steps, "warmup_steps": c.warmup_steps, "config_sha256": c.config_sha256,
    }  # fmt: skip


def git_commit() -> str | None:
    """The code's commit: $BENCH_GIT_COMMIT (set it where the code was copied without .git), else
    ``git describe --always --dirty`` of this checkout, else None."""
    if os.environ.get("BENCH_GIT_COMMIT"):
        return os.environ["BENCH_GIT_COMMIT"]
    import subprocess

    try:
        out = subprocess.run(
            [
                "git",
                "-C",
                str(Path(__file__).resolve().parents[2]),
                "describe",
                "--always",
                "--dirty",
                "--abbrev=12",
            ],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def update_sweep_json(out_dir: Path, **fields) -> None:
    """Merge fields into sweep.json (e.g. the run order as the precision rule extends it)."""
    doc = read_json(out_dir / "sweep.json")
    atomic_write_json(out_dir / "sweep.json", {**(doc if isinstance(doc, dict) else {}), **fields})


def compile_cache_dir(out_dir: Path, info: dict) -> Path:
    """The compile caches (TorchInductor, AOTAutograd, Triton) the runs of a sweep share.

    Keyed by the torch and Triton versions of this interpreter and the GPU kind, so caches of
    different versions or devices never mix; under cache/, so --force keeps it.
    """
    return out_dir / "cache" / "compile" / compile_cache_key(info)


def compile_cache_key(info: dict) -> str:
    def version(*names: str) -> str:
        for name in names:
            try:
                return importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                continue
        return "none"

    key = f"torch-{version('torch')}_triton-{version('triton', 'pytorch-triton-rocm')}_{info.get('kind') or 'cpu'}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", key)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
