"""A finished sweep read for `bench export`, tracker-neutral: one TrackerRun per run directory
(its identity and versions as tags, its cell as params, its runs.csv numbers as totals and its
steps from metrics.jsonl) and one SummaryRow per cell × arm of summary.csv (its numbers, Δs with
their CIs among them, and its verdict words). The tracker modules (export_tensorboard.py,
export_mlflow.py, export_wandb.py) write these; nothing here imports a tracker's library.

Runs are read through the typed loaders (bench/results/records.py: load_runs, run_row), so a run's
tags say what runs.csv says of it; a packed sweep's records are read from a temporary unpacked copy
of raw.tar.xz (bench/results/rawdata.py), leaving the sweep as it is.
"""

from __future__ import annotations

import importlib
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd

from bench.distribution import DIST
from bench.errors import SweepError
from bench.fileio import read_json
from bench.results.columns import CELL_COLUMNS, METRIC_FIELDS, PROVENANCE_COLUMNS, TABLES, WORKLOAD_DIGEST
from bench.results.manifest import check_whole
from bench.results.rawdata import packed, unpacked_copy
from bench.results.records import RunRecord, load_runs, run_row
from bench.results.summary_json import VERDICTS

INSTALL_HINT = f"pip install '{DIST}[trackers]'"
STEP_PREFIX = "step/"  # a per-step metric's name: step/loss, step/samples_per_s, ...
# metrics.jsonl's fields exported per step: all but the step's identity, clock and fixed counts.
STEP_METRICS = [
    f for f in METRIC_FIELDS if f not in ("step", "time", "elapsed_s", "samples", "tokens", "alloc_retries")
]
# A run's tags: its identity and state (runs.csv's columns of those names), then its versions.
IDENTITY_TAGS = ["run_id", "cell_id", "arm", "trainer", "status", "repeat", "arm_in_effect", "reason", "note"]
_NOT_TOTALS = {*CELL_COLUMNS, *PROVENANCE_COLUMNS, "repeat", "order_index"}
RUN_TOTALS = [c.name for c in TABLES["runs.csv"].columns if c.numeric and c.name not in _NOT_TOTALS]
SUMMARY_NUMBERS = [c.name for c in TABLES["summary.csv"].columns if c.numeric and c.name not in CELL_COLUMNS]
SUMMARY_WORDS = [n for n in TABLES["summary.csv"].names if n in VERDICTS or n == "ci_method"]


@dataclass
class TrackerRun:
    """One run directory as a tracker run."""

    name: str  # the run id
    tags: dict[str, str]  # identity, state and versions (runs.csv's column names), blanks left out
    params: dict[str, str]  # the cell: its columns and workload digest
    totals: dict[str, float]  # runs.csv's numbers of the run (samples_per_s, peak_vram_gib, ...)
    steps: list[tuple[int, float | None, dict[str, float]]] = field(default_factory=list)  # step, unix time

    @property
    def ok(self) -> bool:
        return self.tags.get("status") == "ok"


@dataclass
class SummaryRow:
    """One summary.csv row: a cell's arm, its numbers (NaN left out) and its verdict words."""

    cell_id: str
    arm: str
    numbers: dict[str, float]
    words: dict[str, str]

    @property
    def key(self) -> str:
        return f"{self.cell_id}/{self.arm}"


@dataclass
class SweepExport:
    name: str
    sweep_dir: Path
    # the sweep's own: sweep (its name), sweep_git_commit, sweep_config_path, sweep_created
    tags: dict[str, str]
    runs: list[TrackerRun]
    summary: list[SummaryRow]


def need(module: str, to: str, dist: str) -> ModuleType:
    """Import a tracker's library; missing, one line naming the extra (SweepError: exit 2)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = e.name or module
        why = "" if missing.split(".")[0] == module.split(".")[0] else f" (its {missing} is missing)"
        raise SweepError(f"bench export --to {to} needs {dist}{why}: {INSTALL_HINT}") from None


@contextmanager
def env_defaults(values: dict[str, str], unless: tuple[str, ...] = ()) -> Iterator[None]:
    """Each of ``values`` the user has not set (nor any variable of ``unless``) set for the call,
    and removed after it: a tracker library's phoning home off unless the user's configuration
    turns it on (read by the library at its import: import it inside)."""
    added = [k for k in values if k not in os.environ and not any(u in os.environ for u in unless)]
    os.environ.update({k: values[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def fresh_dir(out: Path) -> Path:
    """``out``, refused (one line) when it already holds something: a second export beside the
    first would show each run twice in the tracker."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SweepError(f"{out}: already holds files (an earlier export?); remove it or pass another --out")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _text(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA or value == "":
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _number(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _steps(rec: RunRecord) -> list[tuple[int, float | None, dict[str, float]]]:
    """Per step: its number, unix time (None when the trainer wrote none) and the STEP_METRICS it
    holds; samples/s, where the trainer logged none, is the step's samples over its time."""
    m = rec.metrics.copy()
    m["samples_per_s"] = m["samples_per_s"].fillna(m["samples"] / m["step_time_s"])
    m["tokens_per_s"] = m["tokens_per_s"].fillna(m["tokens"] / m["step_time_s"])
    out = []
    for _, r in m.iterrows():
        values = {f"{STEP_PREFIX}{k}": x for k in STEP_METRICS if (x := _number(r[k])) is not None}
        out.append((int(r["step"]), _number(r["time"]), values))
    return out


def tracker_run(rec: RunRecord) -> TrackerRun:
    row = run_row(rec)
    tags = {k: t for k in (*IDENTITY_TAGS, *PROVENANCE_COLUMNS) if (t := _text(row.get(k))) is not None}
    params = {k: t for k in (*CELL_COLUMNS, WORKLOAD_DIGEST) if (t := _text(row.get(k))) is not None}
    totals = {k: x for k in RUN_TOTALS if (x := _number(row.get(k))) is not None}
    return TrackerRun(name=rec.run_id, tags=tags, params=params, totals=totals, steps=_steps(rec))


def summary_rows(path: Path) -> list[SummaryRow]:
    """summary.csv's rows, read as text and each number parsed (a blank one left out)."""
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    rows = []
    for _, r in table.iterrows():
        numbers = {k: x for k in SUMMARY_NUMBERS if k in r and (x := _number(r[k] or None)) is not None}
        words = {k: str(r[k]) for k in SUMMARY_WORDS if k in r and r[k]}
        rows.append(SummaryRow(str(r["cell_id"]), str(r["arm"]), numbers, words))
    return rows


def _records(sweep_dir: Path) -> list[TrackerRun]:
    """The runs that have a directory (a planned run that never ran has nothing to show)."""
    if packed(sweep_dir):
        with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
            return _records(unpacked_copy(sweep_dir, Path(tmp) / "raw"))
    return [tracker_run(r) for r in load_runs(sweep_dir) if r.run_dir.is_dir()]


def read_sweep(sweep_dir: str | Path) -> SweepExport:
    """The sweep's runs and summary; SweepError (one line) for a directory that is no reported sweep
    or whose summary.csv is not whole (bench/results/manifest.py: cut short or edited)."""
    d = Path(sweep_dir)
    if not d.is_dir():
        raise SweepError(f"{d}: not a directory; expected the output directory of a sweep")
    if not (d / "runs").is_dir() and not packed(d):
        raise SweepError(f"{d}: no runs/ directory; expected the output directory of a sweep")
    if not (d / "summary.csv").is_file():
        raise SweepError(f"{d}: no summary.csv; run `python -m bench report {d}` first")
    try:  # cut short or edited since `bench report` wrote it: refused as `bench compare` refuses it
        check_whole(d / "summary.csv")
    except ValueError as e:
        raise SweepError(str(e)) from None
    runs = _records(d)
    if not runs:
        raise SweepError(f"{d}: no run directories under runs/; nothing to export")
    sweep = read_json(d / "sweep.json")
    sweep = sweep if isinstance(sweep, dict) else {}
    name = str(sweep.get("name") or d.resolve().name)
    tags = {"sweep": name}  # not its local path: the tracker may be shared
    for key in ("git_commit", "config_path", "created"):
        if (t := _text(sweep.get(key))) is not None:
            tags[f"sweep_{key}"] = t
    return SweepExport(name=name, sweep_dir=d, tags=tags, runs=runs, summary=summary_rows(d / "summary.csv"))
