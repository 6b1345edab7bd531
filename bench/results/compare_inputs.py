"""Reading `bench compare`'s two inputs: a summary.csv or runs.csv, checked file, shape and cell
by cell (a one-line ValueError naming the file, line and column), and the per-run values of
each row, from the runs.csv given or the one found beside a summary.csv (a damaged or
mismatched one is ignored with a warning, never fatal)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from bench.results.capacity_table import CAPACITY_COLUMNS
from bench.results.columns import (
    CONTRAST_COLUMNS,
    LOSS_PARITY_COLUMNS,
    RUNS_TEXT_COLUMNS,
    SCALING_COLUMNS,
    TRAINERS_COLUMNS,
    VRAM_PER_CARD_COLUMNS,
)
from bench.results.gate import row_name
from bench.results.tables import summary_table, with_trainer

KEY_COLUMNS = ["trainer", "profile", "mode", "batch_size", "seq_len", "gpus", "arm"]
_OPTIONAL_KEYS = {"trainer"}  # filled in when a file has none
_NUMERIC_KEYS = ["batch_size", "seq_len", "gpus"]
SUMMARY_NEEDED = [
    *(c for c in KEY_COLUMNS if c not in _OPTIONAL_KEYS),
    "samples_per_s_mean",
    "s_per_step_mean",
    "peak_vram_gib",
    "delta_samples_per_s_pct",
]
# Read when there (older summaries lack them): the Liger Δ's CI, and the ok runs each row counts.
SUMMARY_OPTIONAL = ["delta_samples_per_s_pct_ci95_low", "delta_samples_per_s_pct_ci95_high", "n_ok"]
RUNS_NEEDED = [
    "run_id",
    "cell_id",
    *(c for c in KEY_COLUMNS if c not in _OPTIONAL_KEYS),
    "repeat",
    "status",
    "samples_per_s",
    "s_per_step_mean",
    "peak_vram_gib",
]
# Per kind: columns that must hold text, numbers that must be there, numbers that may be blank
# (an arm with no ok run has no samples/s; a CPU run has no VRAM; a baseline has no Δ).
_RULES = {
    "summary.csv": (
        ["profile", "mode", "arm"],
        _NUMERIC_KEYS,
        [c for c in SUMMARY_NEEDED + SUMMARY_OPTIONAL if c not in KEY_COLUMNS],
    ),
    "runs.csv": (
        ["run_id", "cell_id", "profile", "mode", "arm", "status"],
        [*_NUMERIC_KEYS, "repeat"],
        ["samples_per_s", "s_per_step_mean", "peak_vram_gib"],
    ),
}
_POSITIVE = {"samples_per_s_mean", "s_per_step_mean", "samples_per_s"}
# The suite's other CSVs, to say which one was given where a summary.csv belongs.
_OTHER_CSVS = {
    "loss_parity.csv": LOSS_PARITY_COLUMNS,
    "vram_per_card.csv": VRAM_PER_CARD_COLUMNS,
    "contrasts.csv": CONTRAST_COLUMNS,
    "scaling.csv": SCALING_COLUMNS,
    "trainers.csv": TRAINERS_COLUMNS,
    "capacity.csv": CAPACITY_COLUMNS,
}
_EXPECTED = "expected the summary.csv (or runs.csv) of a sweep's output directory"


def read_csv(path: Path, expected: str = _EXPECTED) -> pd.DataFrame:
    """The table of a CSV file with at least one row; ValueError (one line, ending in ``expected``) otherwise."""
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
    return df


def check_table(df: pd.DataFrame, path: Path, kind: str, expected: str = _EXPECTED) -> pd.DataFrame:
    """``df`` (a ``kind``) with its columns checked and its numeric ones as numbers."""
    needed = RUNS_NEEDED if kind == "runs.csv" else SUMMARY_NEEDED
    missing = [c for c in needed if c not in df.columns]
    if missing:
        other = _which_csv(df)
        if other:
            raise ValueError(f"{path}: by its columns a {other}, not a {kind}; {expected}")
        raise ValueError(f"{path}: not a usable {kind}; missing columns: {', '.join(missing)}; {expected}")
    text, keys, values = _RULES[kind]
    df = df.copy()
    for c in text:
        blank = df[c].isna() | (df[c].astype(str).str.strip() == "")
        if blank.any():
            raise ValueError(f"{path}: line {_line(blank)}: no {c}; every row of a {kind} names its {c}")
    for c in keys + [v for v in values if v in df.columns]:
        df[c] = _numbers(df[c], path, c, required=c in keys)
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


def _line(mask: pd.Series) -> int:
    """The file line of the first row ``mask`` marks (the header is line 1)."""
    return int(mask.to_numpy().nonzero()[0][0]) + 2


def _which_csv(df: pd.DataFrame) -> str | None:
    cols = set(df.columns)
    if "samples_per_s_ratio_b_over_a" in cols:
        return "compare.csv (`bench compare`'s output)"
    best = max(_OTHER_CSVS, key=lambda n: len(cols & set(_OTHER_CSVS[n])) / len(cols | set(_OTHER_CSVS[n])))
    known = set(_OTHER_CSVS[best])
    return best if len(cols & known) / len(cols | known) >= 0.6 else None


def load_summary(path: str | Path) -> pd.DataFrame:
    """A summary table from a summary.csv or runs.csv; ValueError (one line, naming the file) otherwise.

    ``attrs["runs"]``: per key, the samples/s of each ok run (empty when there are none);
    ``attrs["warnings"]``: lines about a runs.csv beside the summary that was ignored.
    """
    path = Path(path)
    raw = read_csv(path)
    kind = "runs.csv" if "run_id" in raw.columns else "summary.csv"
    checked = check_table(raw, path, kind)
    if kind == "runs.csv":
        text = RUNS_TEXT_COLUMNS | {"trainer"}
        numeric = checked.assign(
            **{c: pd.to_numeric(checked[c], errors="coerce") for c in checked.columns if c not in text}
        )
        df, runs, warning = with_trainer(summary_table(numeric)), per_run_values(checked), None
    else:
        df = with_trainer(checked)
        runs, warning = _runs_beside(path, df)
    dup = df[df.duplicated(KEY_COLUMNS, keep=False)]
    if len(dup):
        raise ValueError(
            f"{path}: several rows share the key {KEY_COLUMNS}: {dup[KEY_COLUMNS].iloc[0].tolist()}"
        )
    df.attrs["runs"] = runs
    df.attrs["warnings"] = [warning] if warning else []
    return df


def _runs_beside(summary_path: Path, summary: pd.DataFrame) -> tuple[dict, str | None]:
    """The per-run values of the runs.csv a sweep wrote next to its summary.csv, when it is there,
    sound and the same sweep's; else none, with a warning line when one is there but unusable."""
    path = summary_path.parent / "runs.csv"
    if not path.exists():
        return {}, None
    ignored = f"ignored: no per-run values for {summary_path}, so its rows get no CI"
    try:
        expected = f"expected the runs.csv of the sweep whose {summary_path.name} is beside it"
        values = per_run_values(check_table(read_csv(path, expected), path, "runs.csv", expected))
    except ValueError as e:
        return {}, f"{e}; {ignored}"
    if "n_ok" in summary.columns:
        for r in summary.itertuples():
            key = tuple(key_value(getattr(r, c)) for c in KEY_COLUMNS)
            have, want = len(values.get(key, [])), r.n_ok
            if not math.isnan(want) and have != want:
                return {}, (
                    f"{path}: not the runs of the {summary_path.name} beside it ({have} ok runs of "
                    f"{row_name(r)}, the summary counts {want:g}); {ignored}"
                )
    return values, None


def per_run_values(runs: pd.DataFrame | None) -> dict[tuple, list[float]]:
    """KEY_COLUMNS -> samples/s of each ok run (the runs summary.csv's statistics count)."""
    if runs is None:
        return {}
    runs = with_trainer(runs)
    ok = runs[(runs["status"] == "ok") & runs["samples_per_s"].notna()].copy()
    for c in _NUMERIC_KEYS:
        ok[c] = pd.to_numeric(ok[c], errors="coerce")
    return {
        tuple(key_value(v) for v in key): list(g["samples_per_s"].astype(float))
        for key, g in ok.groupby(KEY_COLUMNS, dropna=False)
    }


def key_value(v):
    """A key's value as the dictionaries of per-run values hold it (numbers as floats)."""
    return float(v) if isinstance(v, int | float) else v
