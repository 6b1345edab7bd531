"""Compare two sweeps' results (two machines or two commits), row by row.

Each input is a summary.csv, or a runs.csv that is first aggregated through summary_table.
Rows are joined on KEY_COLUMNS; B is compared with A.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.aggregate import join_unique, summary_table
from bench.plots import plot_compare
from bench.report import write_csv

KEY_COLUMNS = ["profile", "mode", "batch_size", "seq_len", "gpus", "arm"]
SUMMARY_NEEDED = [
    *KEY_COLUMNS,
    "samples_per_s_mean",
    "s_per_step_mean",
    "peak_vram_gib",
    "delta_samples_per_s_pct",
]
RUNS_NEEDED = [
    "run_id",
    "cell_id",
    *KEY_COLUMNS,
    "repeat",
    "status",
    "samples_per_s",
    "s_per_step_mean",
    "peak_vram_gib",
]
COMPARE_COLUMNS = [
    *KEY_COLUMNS, "present",
    "samples_per_s_a", "samples_per_s_b", "samples_per_s_ratio_b_over_a", "samples_per_s_delta_pct",
    "s_per_step_a", "s_per_step_b", "peak_vram_gib_a", "peak_vram_gib_b", "peak_vram_delta_gib",
    "delta_samples_per_s_pct_a", "delta_samples_per_s_pct_b",
]  # fmt: skip
_VALUES = {
    "samples_per_s_mean": "samples_per_s",
    "s_per_step_mean": "s_per_step",
    "peak_vram_gib": "peak_vram_gib",
    "delta_samples_per_s_pct": "delta_samples_per_s_pct",
}


def load_summary(path: str | Path) -> pd.DataFrame:
    """A summary table from a summary.csv or runs.csv; ValueError (one line, naming the file) otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        df = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path}: not a readable CSV ({first})") from None
    kind, needed = ("runs.csv", RUNS_NEEDED) if "run_id" in df.columns else ("summary.csv", SUMMARY_NEEDED)
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: not a usable {kind}; missing columns: {', '.join(missing)}")
    df = summary_table(df) if kind == "runs.csv" else df
    for c in ("batch_size", "seq_len", "gpus"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    dup = df[df.duplicated(KEY_COLUMNS, keep=False)]
    if len(dup):
        raise ValueError(
            f"{path}: several rows share the key {KEY_COLUMNS}: {dup[KEY_COLUMNS].iloc[0].tolist()}"
        )
    return df


def _label(df: pd.DataFrame, path: Path) -> str:
    parts = [
        f"{c} {join_unique(df[c])}" for c in ("gpu_name", "git_commit") if c in df and join_unique(df[c])
    ]
    return f"{path}" + (f" ({'; '.join(parts)})" if parts else "")


def compare_tables(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """COMPARE_COLUMNS, one row per key in A or B (``present``: both / A only / B only), A's order first."""

    def side(df: pd.DataFrame, suffix: str) -> pd.DataFrame:
        out = df[KEY_COLUMNS + list(_VALUES)].rename(columns={k: f"{v}_{suffix}" for k, v in _VALUES.items()})
        return out.assign(**{f"_order_{suffix}": range(len(out))})

    m = side(a, "a").merge(side(b, "b"), on=KEY_COLUMNS, how="outer", indicator=True)
    m = m.sort_values(["_order_a", "_order_b"], na_position="last", kind="stable").reset_index(drop=True)
    m["present"] = (
        m["_merge"].map({"both": "both", "left_only": "A only", "right_only": "B only"}).astype(str)
    )
    m["samples_per_s_ratio_b_over_a"] = m["samples_per_s_b"] / m["samples_per_s_a"]
    m["samples_per_s_delta_pct"] = 100 * (m["samples_per_s_ratio_b_over_a"] - 1)
    m["peak_vram_delta_gib"] = m["peak_vram_gib_b"] - m["peak_vram_gib_a"]
    return m.reindex(columns=COMPARE_COLUMNS)


def format_compare(df: pd.DataFrame, label_a: str, label_b: str) -> str:
    """An aligned text table of the rows in both, then the rows found on one side only."""

    def num(spec: str):
        return lambda x: "—" if pd.isna(x) else format(x, spec)

    lines = [f"A: {label_a}", f"B: {label_b}", ""]
    both = df[df["present"] == "both"]
    shown = pd.DataFrame(
        {
            "profile": both["profile"],
            "mode": both["mode"],
            "bs": both["batch_size"].map(num(".0f")),
            "seq": both["seq_len"].map(num(".0f")),
            "gpus": both["gpus"].map(num(".0f")),
            "arm": both["arm"],
            "samples/s A": both["samples_per_s_a"].map(num(".2f")),
            "samples/s B": both["samples_per_s_b"].map(num(".2f")),
            "B/A": both["samples_per_s_ratio_b_over_a"].map(num(".3f")),
            "Δ%": both["samples_per_s_delta_pct"].map(num("+.1f")),
            "s/step A": both["s_per_step_a"].map(num(".3f")),
            "s/step B": both["s_per_step_b"].map(num(".3f")),
            "VRAM A": both["peak_vram_gib_a"].map(num(".2f")),
            "VRAM B": both["peak_vram_gib_b"].map(num(".2f")),
            "Δ GiB": both["peak_vram_delta_gib"].map(num("+.2f")),
            "vs base A %": both["delta_samples_per_s_pct_a"].map(num("+.1f")),
            "vs base B %": both["delta_samples_per_s_pct_b"].map(num("+.1f")),
        }
    )
    lines.append(shown.to_string(index=False) if len(shown) else "(no row is in both A and B)")
    for which in ("A only", "B only"):
        rows = df[df["present"] == which]
        if len(rows):
            lines += ["", f"Only in {which[0]}:"]
            lines += [
                f"  {r.profile} {r.mode} bs{num('.0f')(r.batch_size)} seq{num('.0f')(r.seq_len)} "
                f"gpus{num('.0f')(r.gpus)} {r.arm}"
                for r in rows.itertuples()
            ]
    return "\n".join(lines)


def compare(a_csv: str | Path, b_csv: str | Path, out_dir: str | Path | None = None) -> pd.DataFrame:
    """Compare B with A, print the table; with out_dir also write compare.csv and compare.png."""
    a_csv, b_csv = Path(a_csv), Path(b_csv)
    a, b = load_summary(a_csv), load_summary(b_csv)
    label_a, label_b = _label(a, a_csv), _label(b, b_csv)
    df = compare_tables(a, b)
    print(format_compare(df, label_a, label_b))
    if out_dir is not None:
        out = Path(out_dir)
        write_csv(df, out / "compare.csv")
        plot_compare(df[df["present"] == "both"], out / "compare.png", label_a, label_b)
    return df
