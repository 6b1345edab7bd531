"""Reading `bench compare`'s two inputs into one side each: a summary.csv, summary.json or runs.csv,
checked file (whole: bench/results/manifest.py; a summary.json must parse whole), shape and cell by
cell (a one-line ValueError naming the file, line and column). Per-run data decides: a runs.csv is
aggregated here (summary_table); a summary with the runs.csv of its sweep beside it is recomputed
from those runs and refused when it does not agree (one line naming both files); a summary alone
gives point estimates (``attrs["source"]`` says which), never a CI or a gate verdict.

A planned run that never ran (runs.csv's "not run" row) counts in its arm's n_runs, as `bench
report` counts it, under its cell's columns; ``attrs["missing"]`` says which runs never ran. Every
row carries its workload identity (KEY_COLUMNS: bench/results/identity.py); a file from before a
key existed reads it as unknown (trainer: ours; nodes: 1)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from bench.fileio import read_json
from bench.results.columns import (
    CAPACITY_COLUMNS,
    CELL_COLUMNS,
    CONTRAST_COLUMNS,
    IDENTITY_COLUMNS,
    LOSS_PARITY_COLUMNS,
    PROVENANCE_COLUMNS,
    RUNS_TEXT_COLUMNS,
    SCALING_COLUMNS,
    TRAINERS_COLUMNS,
    VRAM_PER_CARD_COLUMNS,
)
from bench.results.manifest import check_whole
from bench.results.records import NOT_RUN, in_statistics
from bench.results.summary_json import SCHEMA_VERSION, SUMMARY_JSON
from bench.results.tables import distinct_values, summary_table, with_trainer

KEY_COLUMNS = list(IDENTITY_COLUMNS)
NUMERIC_KEYS = ["batch_size", "seq_len", "accumulation_steps", "num_anchors", "gpus", "nodes"]
_REQUIRED_KEYS = ["profile", "mode", "arm", "batch_size", "seq_len", "gpus"]
_DEFAULTS = {"nodes": 1.0}  # a file from before multi-node ran on one node
SUMMARY_NEEDED = [
    *_REQUIRED_KEYS,
    "samples_per_s_mean",
    "s_per_step_mean",
    "peak_vram_gib",
    "delta_samples_per_s_pct",
]
# Read when there (older summaries lack them).
SUMMARY_OPTIONAL = [
    "delta_samples_per_s_pct_ci95_low", "delta_samples_per_s_pct_ci95_high", "n_ok", "n_pairs",
    "peak_vram_delta_gib", "samples_per_s_ci95_low", "samples_per_s_ci95_high",
]  # fmt: skip
RUNS_NEEDED = [
    "run_id",
    "cell_id",
    *_REQUIRED_KEYS,
    "repeat",
    "status",
    "samples_per_s",
    "s_per_step_mean",
    "peak_vram_gib",
]
_RULES = {  # per kind: columns that must hold text, numbers that must be there, numbers that may be blank
    "summary.csv": (["profile", "mode", "arm"], ["batch_size", "seq_len", "gpus"], SUMMARY_NEEDED[6:] + SUMMARY_OPTIONAL),
    "runs.csv": (
        ["run_id", "cell_id", "profile", "mode", "arm", "status"],
        ["batch_size", "seq_len", "gpus", "repeat"],
        ["samples_per_s", "s_per_step_mean", "peak_vram_gib", "peak_vram_delta_gib"],
    ),
}  # fmt: skip
_POSITIVE = {"samples_per_s_mean", "s_per_step_mean", "samples_per_s"}
# (point, low, high): a CI that does not hold its own estimate is a damaged file.
_INTERVALS = [
    ("delta_samples_per_s_pct", "delta_samples_per_s_pct_ci95_low", "delta_samples_per_s_pct_ci95_high"),
    ("samples_per_s_mean", "samples_per_s_ci95_low", "samples_per_s_ci95_high"),
]
# What a summary must agree on with the runs it came from (the rest depends on sweep.json).
CHECKED = [
    "n_runs",
    "n_ok",
    "samples_per_s_mean",
    "s_per_step_mean",
    "peak_vram_gib",
    "delta_samples_per_s_pct",
]
_OTHER_CSVS = {
    "loss_parity.csv": LOSS_PARITY_COLUMNS,
    "vram_per_card.csv": VRAM_PER_CARD_COLUMNS,
    "contrasts.csv": CONTRAST_COLUMNS,
    "scaling.csv": SCALING_COLUMNS,
    "trainers.csv": TRAINERS_COLUMNS,
    "capacity.csv": CAPACITY_COLUMNS,
}
_EXPECTED = "expected the summary.csv (or runs.csv) of a sweep's output directory"
RUNS, SUMMARY_ONLY = "per-run data", "point estimates (a summary.csv without its runs.csv)"


def read_csv(path: Path, expected: str = _EXPECTED) -> pd.DataFrame:
    """The table of a CSV file, whole, with at least one row; ValueError (one line) otherwise."""
    if path.is_dir():
        raise ValueError(
            f"{path}: is a directory; expected a summary.csv or runs.csv (e.g. {path / 'summary.csv'})"
        )
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        with open(path, "rb") as f:
            head = f.read(8192)
        if b"\0" in head:
            raise ValueError(f"{path}: a binary file, not a CSV; {expected}")
        df = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path}: not a readable CSV ({first}); {expected}") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror or e})") from None
    if df.empty:
        raise ValueError(f"{path}: no rows (a header only); {expected}")
    check_whole(path)
    return df


def check_table(df: pd.DataFrame, path: Path, kind: str, expected: str = _EXPECTED) -> pd.DataFrame:
    """``df`` (a ``kind``) with its columns checked, its numeric ones as numbers and its identity filled in."""
    needed = RUNS_NEEDED if kind == "runs.csv" else SUMMARY_NEEDED
    missing = [c for c in needed if c not in df.columns]
    if missing:
        other = _which_csv(df)
        if other:
            raise ValueError(f"{path}: by its columns a {other}, not a {kind}; {expected}")
        raise ValueError(f"{path}: not a usable {kind}; missing columns: {', '.join(missing)}; {expected}")
    text, keys, values = _RULES["runs.csv" if kind == "runs.csv" else "summary.csv"]
    df = df.copy()
    unrun = df.iloc[:0]
    if kind == "runs.csv":  # a planned run that never ran (the sweep's own row for it) names no workload
        never = df["status"].astype(str) == NOT_RUN
        df, unrun = df[~never], df[never]
        if df.empty:
            raise ValueError(f"{path}: no run has run yet (every row is '{NOT_RUN}'); {expected}")
    for c in text:
        blank = df[c].isna() | (df[c].astype(str).str.strip() == "")
        if blank.any():
            raise ValueError(f"{path}: line {_line(blank)}: no {c}; every row of a {kind} names its {c}")
    if kind == "runs.csv":
        twice = df["run_id"].astype(str).duplicated(keep="first")
        if twice.any():  # counted twice, a run would narrow the CI and could flip a gate
            run = df.loc[twice, "run_id"].iloc[0]
            raise ValueError(f"{path}: line {_line(twice)}: run {run} is listed again; a run counts once")
    optional_keys = [c for c in NUMERIC_KEYS if c not in keys and c in df.columns]
    for c in keys + optional_keys + [v for v in values if v in df.columns]:
        df[c] = _numbers(df[c], path, c, required=c in keys)
    if kind != "runs.csv":
        _check_intervals(df, path)
    elif len(unrun):  # counted in its arm's n_runs, as `bench report` counts it, under its cell
        unrun = unrun.assign(**{c: pd.to_numeric(unrun[c], errors="coerce") for c in keys + optional_keys})
        df = pd.concat([df, _with_cell_columns(unrun, df)]).sort_index()
    return _with_identity(df)


def _with_cell_columns(rows: pd.DataFrame, known: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (of arms or runs that never ran: no cell.json told their shape) with their cell's
    columns (CELL_COLUMNS) from a row of ``known`` of the same cell_id, where there is one."""
    cells = known.dropna(subset=["cell_id"]).drop_duplicates("cell_id").set_index("cell_id")
    rows = rows.copy()
    has = rows["cell_id"].isin(cells.index)
    for c in CELL_COLUMNS:
        if c in cells:
            rows[c] = rows[c].astype(object)
            rows.loc[has, c] = rows.loc[has, "cell_id"].map(cells[c])
    return rows


def _never_ran(summary: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """A summary's rows of arms none of whose runs ran (`bench report` writes them with no cell
    columns) with their cell's columns from another row of the cell; a row of a cell no run of
    which ran is left out: (the table, a line for each row left out)."""
    if not {"cell_id", "n_ok", "profile"} <= set(summary.columns):
        return summary, []
    blank = summary["profile"].isna() | (summary["profile"].astype(str).str.strip() == "")
    never = blank & summary["cell_id"].notna() & (pd.to_numeric(summary["n_ok"], errors="coerce") == 0)
    if not never.any():
        return summary, []
    filled = _with_cell_columns(summary[never], summary[~blank])
    out = summary.copy()
    for c in CELL_COLUMNS:
        if c in out:
            out[c] = out[c].astype(object)
            out.loc[never, c] = filled[c]
    gone = never & out["profile"].isna()
    lines = [f"cell {r.cell_id} arm {r.arm}: no run of its cell ran" for r in out[gone].itertuples()]
    return out[~gone], lines


def _with_identity(df: pd.DataFrame) -> pd.DataFrame:
    df = with_trainer(df)
    for c in KEY_COLUMNS:
        if c not in df.columns:
            df[c] = _DEFAULTS.get(c, np.nan)
        elif c in _DEFAULTS:
            df[c] = pd.to_numeric(df[c], errors="coerce").fillna(_DEFAULTS[c])
    df["workload_digest"] = df["workload_digest"].astype(object).where(df["workload_digest"].notna(), None)
    return df


def _numbers(col: pd.Series, path: Path, name: str, required: bool) -> pd.Series:
    num = pd.to_numeric(col, errors="coerce").astype(float)
    given = col.notna() & (col.astype(str).str.strip() != "")
    missing = ~given if required else pd.Series(False, index=col.index)
    if missing.any():
        raise ValueError(f"{path}: line {_line(missing)}: no {name}; it must be a number")
    bad = given & ~num.map(math.isfinite)
    if bad.any():
        value = str(col[bad].iloc[0])[:40]
        raise ValueError(f"{path}: line {_line(bad)}: {name} {value!r} is not a finite number")
    if name in _POSITIVE and (num <= 0).any():
        raise ValueError(f"{path}: line {_line(num <= 0)}: {name} {num[num <= 0].iloc[0]:g} is not > 0")
    return num


def _check_intervals(df: pd.DataFrame, path: Path) -> None:
    for point, lo, hi in _INTERVALS:
        if not {point, lo, hi} <= set(df.columns):
            continue
        slack = 1e-5 * df[point].abs() + 1e-9  # the CSV's 6 significant digits
        outside = (df[lo] > df[point] + slack) | (df[hi] < df[point] - slack)
        if outside.any():
            i = outside.to_numpy().nonzero()[0][0]
            raise ValueError(
                f"{path}: line {_line(outside)}: {point} {df[point].iloc[i]:g} lies outside its own 95% CI "
                f"[{df[lo].iloc[i]:g}, {df[hi].iloc[i]:g}]: the file was edited or damaged"
            )


def _line(mask: pd.Series) -> int:
    """The file line of the first row ``mask`` marks (the header is line 1; rows keep the file's index)."""
    return int(mask.index[mask.to_numpy().nonzero()[0][0]]) + 2


def _which_csv(df: pd.DataFrame) -> str | None:
    cols = set(df.columns)
    if "samples_per_s_ratio_b_over_a" in cols:
        return "compare.csv (`bench compare`'s output)"
    best = max(_OTHER_CSVS, key=lambda n: len(cols & set(_OTHER_CSVS[n])) / len(cols | set(_OTHER_CSVS[n])))
    known = set(_OTHER_CSVS[best])
    return best if len(cols & known) / len(cols | known) >= 0.6 else None


def _numeric_runs(checked: pd.DataFrame) -> pd.DataFrame:
    text = RUNS_TEXT_COLUMNS | {"trainer", "workload_digest"}
    return checked.assign(
        **{c: pd.to_numeric(checked[c], errors="coerce") for c in checked.columns if c not in text}
    )


def _sweep_json(path: Path) -> dict | None:
    doc = read_json(path.parent / "sweep.json")
    return doc if isinstance(doc, dict) else None


def _aggregate(runs: pd.DataFrame, sweep: dict | None) -> pd.DataFrame:
    sweep = sweep or {}
    eq = float(sweep.get("equivalence_pct") or 1.0)
    table = summary_table(runs, precision=sweep.get("precision_targets") or {}, equivalence_pct=eq)
    return _with_identity(table)


def _read(path: Path) -> tuple[pd.DataFrame, str]:
    """The table of an input and its kind: runs.csv, summary.csv, or summary.json (read as summary.csv's rows)."""
    if path.suffix == ".json" or (path.is_file() and _first_char(path) in "{["):
        return _summary_json(path), SUMMARY_JSON
    raw = read_csv(path)
    return raw, "runs.csv" if "run_id" in raw.columns else "summary.csv"


def _first_char(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(64).lstrip()[:1].decode("latin-1") or " "
    except OSError:
        return " "


def _summary_json(path: Path) -> pd.DataFrame:
    """summary.json (bench/results/summary_json.py) as summary.csv's rows: per arm, its cell's
    fields, its own, each verdict's words, and the sweep's versions as the provenance columns."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8, not a summary.json; {_EXPECTED}") from None
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path}: not a whole JSON document ({e.msg}, line {e.lineno}): cut short or edited; rebuild "
            "it with `python -m bench report` on its sweep directory"
        ) from None
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise ValueError(f"{path}: JSON, but not a sweep's {SUMMARY_JSON} (no list of cells); {_EXPECTED}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"{path}: {SUMMARY_JSON} schema_version {data.get('schema_version')!r}; this suite reads {SCHEMA_VERSION}"
        )
    versions = data.get("versions") if isinstance(data.get("versions"), dict) else {}
    rows = []
    for i, entry in enumerate(data["cells"]):
        arms = entry.get("arms") if isinstance(entry, dict) else None
        if not isinstance(arms, list) or not all(isinstance(a, dict) for a in arms):
            raise ValueError(f"{path}: cells[{i}] is not a cell with a list of arms; the file was edited")
        shared = {k: v for k, v in entry.items() if k not in ("arms", "contrasts")}
        for a in arms:
            mine = {
                k: v.get("text") if isinstance(v, dict) else v for k, v in a.items() if k != "training_parity"
            }
            rows.append({**versions, **shared, **mine})
    if not rows:
        raise ValueError(f"{path}: no arm in any cell; {_EXPECTED}")
    return pd.DataFrame(rows)


def load_summary(path: str | Path) -> pd.DataFrame:
    """One side of a comparison: a summary table from a summary.csv, summary.json or runs.csv;
    ValueError (one line, naming the file) otherwise. ``attrs``: "runs" (the runs in the statistics,
    or None), "source" (RUNS or SUMMARY_ONLY), "versions" (PROVENANCE_COLUMNS -> values), "warnings",
    "missing" (lines: the planned runs that never ran), "user_arms" (a sweep's own arm -> the keys it
    declares, from sweep.json), "loss_parity" ((cell_id, arm) -> summary's loss_parity), "path"."""
    path = Path(path)
    raw, kind = _read(path)
    missing: list[str] = []
    if kind != "runs.csv":
        raw, missing = _never_ran(raw)
    checked = check_table(raw, path, kind)
    runs, summary = None, raw
    if kind == "runs.csv":
        runs = _numeric_runs(checked)
        df, missing = _built(runs, path)
        beside = path.parent / "summary.csv"
        summary = pd.read_csv(beside, dtype=str, keep_default_na=False) if beside.is_file() else None
    else:
        df = checked
        beside = path.parent / "runs.csv"
        if path.name in ("summary.csv", SUMMARY_JSON) and beside.exists():  # a sweep's own files
            expected = f"expected the runs.csv of the sweep whose {path.name} is beside it"
            try:
                runs = _numeric_runs(check_table(read_csv(beside, expected), beside, "runs.csv", expected))
            except ValueError as e:
                raise ValueError(f"{e} (the per-run data of {path}, which is judged from it)") from None
            rebuilt, missing = _built(runs, path)
            df = _verified(df, rebuilt, path, beside)
    dup = df[df.duplicated(KEY_COLUMNS, keep=False)]
    if len(dup):
        raise ValueError(f"{path}: several rows share the workload {dup[KEY_COLUMNS].iloc[0].tolist()}")
    df.attrs["runs"] = None if runs is None else _with_identity(runs[in_statistics(runs)])
    df.attrs["source"] = SUMMARY_ONLY if runs is None else RUNS
    df.attrs["versions"] = versions(runs if runs is not None else df)
    df.attrs["warnings"] = []
    df.attrs["missing"] = missing
    user = ((_sweep_json(path) or {}).get("config") or {}).get("user_arms")
    df.attrs["user_arms"] = {
        str(k): v["set"] for k, v in (user if isinstance(user, dict) else {}).items()
        if isinstance(v, dict) and isinstance(v.get("set"), dict)
    }  # fmt: skip
    df.attrs["loss_parity"] = _loss_parity(summary)
    df.attrs["path"] = path
    return df


def _built(runs: pd.DataFrame, path: Path) -> tuple[pd.DataFrame, list[str]]:
    """The summary table of a sweep's runs and a line for each run that never ran (and each arm of
    a cell none of whose runs ran, left out: nothing says what its workload was)."""
    table, gone = _never_ran(_aggregate(runs, _sweep_json(path)))
    unrun = runs[runs["status"].astype(str) == NOT_RUN]
    lines = []
    if len(unrun):
        n = len(unrun)
        ids = ", ".join(map(str, unrun["run_id"].iloc[:5])) + (f" and {n - 5} more" if n > 5 else "")
        lines.append(f"{n} planned run{'s' if n > 1 else ''} never ran (not run): {ids}")
    return table, lines + gone


def _loss_parity(summary: pd.DataFrame | None) -> dict[tuple[str, str], str]:
    """(cell_id, arm) -> the summary's loss_parity words ("" where blank)."""
    if summary is None or not {"cell_id", "arm", "loss_parity"} <= set(summary.columns):
        return {}
    words = summary["loss_parity"].astype(object).where(summary["loss_parity"].notna(), "")
    return {(str(c), str(a)): str(v) for c, a, v in zip(summary["cell_id"], summary["arm"], words)}


def versions(df: pd.DataFrame) -> dict[str, list[str]]:
    """Per provenance column the table holds: its distinct values (tables.distinct_values)."""
    return {c: distinct_values(df[c]) for c in PROVENANCE_COLUMNS if c in df.columns}


def row_key(r) -> tuple:
    """A row's identity (KEY_COLUMNS) as a hashable tuple: numbers as floats, blanks as None."""
    values = [getattr(r, c) if not isinstance(r, dict) else r.get(c) for c in KEY_COLUMNS]
    return tuple(None if _missing(v) else float(v) if isinstance(v, int | float) else v for v in values)


def _verified(summary: pd.DataFrame, rebuilt: pd.DataFrame, path: Path, runs_path: Path) -> pd.DataFrame:
    """The table rebuilt from the runs, once ``summary`` agrees with it row for row on the
    identity and CHECKED; the CI columns the rebuild cannot know without sweep.json are the summary's."""
    refused = (
        "this summary is not the one built from those runs (edited, or another sweep's runs.csv beside it)"
    )
    given = {row_key(r): (i, r) for i, r in enumerate(summary.itertuples(index=False))}
    built = {row_key(r): r for r in rebuilt.itertuples(index=False)}
    extra = [k for k in given if k not in built]
    lacking = [k for k in built if k not in given]
    if extra or lacking:
        what = (
            f"line {given[extra[0]][0] + 2}: a workload {runs_path} has no run of"
            if extra
            else f"no row for {_named(lacking[0])}, which {runs_path} has"
        )
        raise ValueError(f"{path}: {what}: {refused}")
    for k, (i, r) in given.items():
        for c in CHECKED:
            if c not in summary.columns:
                continue
            a, b = float(getattr(r, c)), float(getattr(built[k], c))
            atol = (
                0.005 if c.startswith("delta_") else 1e-9
            )  # points: from runs.csv's 6 digits, not the full ones
            if not (np.isnan(a) and np.isnan(b)) and not np.isclose(a, b, rtol=1e-5, atol=atol):
                raise ValueError(f"{path}: line {i + 2}: {c} {a:g}, where {runs_path} gives {b:g}: {refused}")
    if not (path.parent / "sweep.json").exists():
        cis = [
            c
            for c in ("delta_samples_per_s_pct_ci95_low", "delta_samples_per_s_pct_ci95_high")
            if c in summary
        ]
        for c in cis:
            by_key = {k: getattr(r, c) for k, (_, r) in given.items()}
            rebuilt[c] = [by_key[row_key(r)] for r in rebuilt.itertuples(index=False)]
    return rebuilt


def _named(key: tuple) -> str:
    return " ".join(f"{c} {v}" for c, v in zip(KEY_COLUMNS, key) if v is not None)


def per_run_values(runs: pd.DataFrame | None) -> dict[tuple, list[float]]:
    """Per identity (row_key): samples/s of each run of ``runs`` (a side's attrs["runs"])."""
    out: dict[tuple, list[float]] = {}
    if runs is None:
        return out
    for r in runs.itertuples(index=False):
        if not _missing(r.samples_per_s):
            out.setdefault(row_key(r), []).append(float(r.samples_per_s))
    return out


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))
