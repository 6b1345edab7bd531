"""`bench history DIR...`: the gain over time. Every given sweep's summary.csv rows (one per cell
and arm) become points of a series keyed by workload identity (trainer, the cell's workload digest,
arm, GPU name); each series is ordered by the date of the commit that produced the sweep (from git,
where this checkout knows the commit) or else by the sweep's own date; consecutive points whose
95% CIs of Δ samples/s do not overlap are flagged as a step change, naming the versions (or only
the commit) that changed between them. A series of one point is kept apart with the reason (the
only sweep of its workload, another GPU, another workload of the same cell). Reads only the
published face (summary.csv, summary.json): the light install runs it. The output formats and
the trend plots are history_format.py's."""

from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from bench.errors import SweepError
from bench.fileio import read_json
from bench.results.manifest import check_whole

SUMMARY = "summary.csv"
# a series: one workload (the digest; the shapes and GPUs a capacity or scaling sweep varies under
# one digest) of one arm on one GPU kind
KEY = ("trainer", "workload_digest", "batch_size", "seq_len", "gpus", "nodes", "arm", "gpu_name")
# what may change between two points of one series, as summary.csv names it -> how the output says it
VERSIONS = {
    "torch_version": "torch",
    "triton_version": "triton",
    "transformers_version": "transformers",
    "liger_version": "liger-kernel",
    "code_versions": "code",
    "driver_version": "driver",
}
GIT_TIMEOUT_S = 10.0


@dataclass
class Point:
    """One sweep's row of one cell and arm: what the history shows of it."""

    sweep: str
    date: str
    date_source: str  # "commit" (git's commit date) or "run" (the sweep's own date)
    commit: str
    cell_id: str
    n_pairs: int | None
    delta_pct: float | None
    ci_low: float | None
    ci_high: float | None
    samples_per_s: float | None
    peak_vram_gib: float | None
    delta_energy_pct: float | None
    verdict: str
    loss_parity: str
    versions: dict[str, str] = field(default_factory=dict)
    change: str | None = None  # set on the point after a step change: what changed
    created: str = ""  # the sweep's own date: orders the sweeps of one commit

    @property
    def has_ci(self) -> bool:
        return self.ci_low is not None and self.ci_high is not None


@dataclass
class Series:
    trainer: str
    workload_digest: str
    batch_size: str
    seq_len: str
    gpus: str
    nodes: str
    arm: str
    gpu_name: str
    points: list[Point]
    apart: str | None = None  # why a series of one point stands alone

    def to_json(self) -> dict:
        return asdict(self)


def sweep_dirs(paths: list[str]) -> tuple[list[Path], list[str]]:
    """The sweep directories among ``paths`` (each holding a summary.csv, or a folder whose direct
    subfolders do: ``results/``) and a line for each path that is neither (a glob such as
    ``results/h200*`` also matches the kernel attributions' folders); SweepError when none is."""
    found: list[Path] = []
    skipped: list[str] = []
    for p in map(Path, paths):
        if (p / SUMMARY).is_file():
            found.append(p)
            continue
        inner = sorted(d for d in p.iterdir() if (d / SUMMARY).is_file()) if p.is_dir() else []
        if not inner:
            what = "no such directory" if not p.exists() else f"no {SUMMARY} in it or in its subfolders"
            skipped.append(f"{p}: not a sweep directory ({what})")
        found.extend(inner)
    if not found:
        first = skipped[0] if skipped else "bench history: no sweep given"
        raise SweepError(f"{first}; give sweep output directories")
    return list(dict.fromkeys(found)), skipped


def commit_date(commit: str, where: Path, cache: dict[str, str | None]) -> str | None:
    """The commit's date (ISO 8601) where git knows it: the repository holding the sweep directory
    ``where`` (a sweep committed under results/), else the one the command runs in; else None."""
    key = f"{where}\0{commit}"
    if key not in cache:
        try:
            r = subprocess.run(
                ["git", "-C", str(where), "show", "-s", "--format=%cI", commit],
                capture_output=True,
                text=True,
                timeout=GIT_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
            cache[key] = r.stdout.strip() or None if r.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            cache[key] = None
    return cache[key]


def _num(v) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def _text(v) -> str:
    return "" if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v)


def _key_text(v) -> str:
    """A key column as text: whole numbers without pandas' ``.0``."""
    if isinstance(v, float) and not pd.isna(v) and v.is_integer():
        return str(int(v))
    return _text(v)


def read_sweep(d: Path, dates: dict[str, str | None]) -> list[tuple[tuple, Point]]:
    """One sweep's rows as (series key, point); SweepError (one line) for a summary.csv that cannot
    be read, lacks a key column, or is not whole (bench/results/manifest.py: cut short or edited)."""
    try:
        table = pd.read_csv(d / SUMMARY, dtype={"workload_digest": str, "git_commit": str})
    except (OSError, ValueError) as e:
        raise SweepError(f"{d / SUMMARY}: cannot be read as a summary ({e})") from None
    missing = [c for c in (*KEY, "cell_id", "delta_samples_per_s_pct") if c not in table.columns]
    if missing:
        raise SweepError(f"{d / SUMMARY}: lacks {', '.join(missing)}; not a summary bench report wrote")
    try:  # cut short or edited since `bench report` wrote it (its manifest.json, or its shape)
        check_whole(d / SUMMARY)
    except ValueError as e:
        raise SweepError(str(e)) from None
    doc = read_json(d / "summary.json")  # None when missing, torn or not JSON
    sweep = doc.get("sweep") if isinstance(doc, dict) else None
    created = _text(sweep.get("created")) if isinstance(sweep, dict) else ""
    out = []
    for row in table.to_dict("records"):
        commit = _text(row.get("git_commit"))
        when = (commit_date(commit, d, dates) or commit_date(commit, Path.cwd(), dates)) if commit else None
        pairs = _num(row.get("n_pairs"))
        point = Point(
            sweep=str(d),
            date=when or created,
            date_source="commit" if when else "run",
            commit=commit,
            cell_id=_text(row["cell_id"]),
            n_pairs=int(pairs) if pairs is not None else None,
            delta_pct=_num(row.get("delta_samples_per_s_pct")),
            ci_low=_num(row.get("delta_samples_per_s_pct_ci95_low")),
            ci_high=_num(row.get("delta_samples_per_s_pct_ci95_high")),
            samples_per_s=_num(row.get("samples_per_s_mean")),
            peak_vram_gib=_num(row.get("peak_vram_gib")),
            delta_energy_pct=_num(row.get("delta_energy_per_sample_pct")),
            verdict=_text(row.get("verdict_speed")),
            loss_parity=_text(row.get("loss_parity")),
            versions={name: _text(row.get(col)) for col, name in VERSIONS.items() if _text(row.get(col))},
            created=created,
        )
        out.append((tuple(_key_text(row.get(k)) for k in KEY), point))
    return out


def what_changed(a: Point, b: Point) -> str:
    """The versions that differ between two points, else the commit, else that nothing recorded did."""
    names = sorted(set(a.versions) | set(b.versions))
    moved = [f"{n} {a.versions.get(n, '?')} -> {b.versions.get(n, '?')}" for n in names
             if a.versions.get(n) != b.versions.get(n)]  # fmt: skip
    if moved:
        return "; ".join(moved)
    if a.commit != b.commit:
        return f"commit {a.commit or '?'} -> {b.commit or '?'} (no recorded version changed)"
    return "nothing recorded changed (same commit and versions)"


def flag_changes(points: list[Point]) -> None:
    """Mark each point whose Δ CI does not overlap the previous point's (both with a CI)."""
    for prev, cur in zip(points, points[1:]):
        if prev.has_ci and cur.has_ci and (cur.ci_low > prev.ci_high or cur.ci_high < prev.ci_low):
            cur.change = what_changed(prev, cur)


def _apart(key: tuple, keys: list[tuple], cells: dict[tuple, str]) -> str:
    """Why the series ``key`` (one point) stands alone: the same workload on another GPU, another
    workload of the same cell and arm, or simply the only sweep of its workload."""
    digest, gpu = key[1], key[-1]
    gpus = sorted({k[-1] for k in keys if k[:-1] == key[:-1] and k != key})
    if gpus:
        return f"another GPU ({gpu or 'none named'}) than this workload's other sweeps ({', '.join(gpus)})"
    others = sorted({k[1] for k in keys if k != key and (k[0], *k[2:]) == (key[0], *key[2:])
                     and cells.get(k) == cells[key]})  # fmt: skip
    if others:
        return (
            f"another workload (digest {digest}) than cell {cells[key]}'s other sweeps ({', '.join(others)})"
        )
    if not digest:
        return "its summary records no workload digest (an arm that never ran?): nothing to compare it with"
    return f"the only sweep of this workload on {gpu or 'an unnamed GPU'}"


def build(paths: list[str]) -> tuple[list[Series], list[str]]:
    """Every series of the given sweeps, ordered, the multi-point ones first; and a line for each
    path that was not a sweep."""
    dates: dict[str, str | None] = {}
    grouped: dict[tuple, list[Point]] = {}
    dirs, skipped = sweep_dirs(paths)
    for d in dirs:
        try:
            rows = read_sweep(d, dates)
        except SweepError as e:  # an older or damaged summary.csv: this sweep is skipped, said why
            skipped.append(str(e))
            continue
        for key, point in rows:
            grouped.setdefault(key, []).append(point)
    if not grouped:
        why = skipped[0] if skipped else "the summaries given hold no row"
        raise SweepError(f"{why}; no sweep left to read")
    keys = list(grouped)
    cells = {k: grouped[k][0].cell_id for k in keys}
    series = []
    for key, points in grouped.items():
        points.sort(key=lambda p: (p.date, p.created, p.sweep))
        s = Series(*key, points=points)
        if len(points) == 1:
            s.apart = _apart(key, keys, cells)
        elif len({p.sweep for p in points}) < len(points):
            s.apart = (
                "several rows of one sweep under one key (a capacity search's probes): not points in time"
            )
        else:
            flag_changes(points)
        series.append(s)
    series.sort(key=lambda s: (s.apart is not None, s.trainer, s.points[0].cell_id, s.arm, s.gpu_name))
    return series, skipped
