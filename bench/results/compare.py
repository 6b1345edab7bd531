"""Compare two sweeps' results (two machines or two commits), row by row.

Each input is a summary.csv, or a runs.csv that is first aggregated through summary_table.
Rows are joined on KEY_COLUMNS (a file from before the trainer column reads as our trainer's,
bench.results.tables.with_trainer); B is compared with A. Where the per-run values of both sides
are at hand (a runs.csv given, or the runs.csv beside a summary.csv), each row's B/A ratio
gets a 95% CI: runs of different sweeps are not paired, so it is Welch's interval on log
throughput, and a verdict says which differences are real.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench import fmt
from bench.results import stats
from bench.results.columns import DEFAULT_TRAINER
from bench.results.plots import plot_compare
from bench.results.report import write_csv
from bench.results.tables import join_unique, summary_table, with_trainer

KEY_COLUMNS = ["trainer", "profile", "mode", "batch_size", "seq_len", "gpus", "arm"]
_OPTIONAL_KEYS = {"trainer"}  # filled in when a file has none
SUMMARY_NEEDED = [
    *(c for c in KEY_COLUMNS if c not in _OPTIONAL_KEYS),
    "samples_per_s_mean",
    "s_per_step_mean",
    "peak_vram_gib",
    "delta_samples_per_s_pct",
]
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
COMPARE_COLUMNS = [
    *KEY_COLUMNS, "present",
    "samples_per_s_a", "samples_per_s_b", "samples_per_s_ratio_b_over_a", "samples_per_s_delta_pct",
    "s_per_step_a", "s_per_step_b", "peak_vram_gib_a", "peak_vram_gib_b", "peak_vram_delta_gib",
    "delta_samples_per_s_pct_a", "delta_samples_per_s_pct_b",
    "n_runs_a", "n_runs_b", "samples_per_s_delta_pct_ci95_low", "samples_per_s_delta_pct_ci95_high", "verdict",
]  # fmt: skip
MIN_RUNS = 3  # per side, for a verdict on an unpaired comparison
_VALUES = {
    "samples_per_s_mean": "samples_per_s",
    "s_per_step_mean": "s_per_step",
    "peak_vram_gib": "peak_vram_gib",
    "delta_samples_per_s_pct": "delta_samples_per_s_pct",
}


def load_summary(path: str | Path) -> pd.DataFrame:
    """A summary table from a summary.csv or runs.csv; ValueError (one line, naming the file) otherwise."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(
            f"{path}: is a directory; expected a summary.csv or runs.csv (e.g. {path / 'summary.csv'})"
        )
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
    df = with_trainer(summary_table(df) if kind == "runs.csv" else df)
    df.attrs["runs"] = per_run_values(pd.read_csv(path) if kind == "runs.csv" else _runs_beside(path))
    for c in ("batch_size", "seq_len", "gpus"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    dup = df[df.duplicated(KEY_COLUMNS, keep=False)]
    if len(dup):
        raise ValueError(
            f"{path}: several rows share the key {KEY_COLUMNS}: {dup[KEY_COLUMNS].iloc[0].tolist()}"
        )
    return df


def _runs_beside(summary_path: Path) -> pd.DataFrame | None:
    """The runs.csv a sweep wrote next to its summary.csv, when it is there and readable."""
    path = summary_path.parent / "runs.csv"
    try:
        runs = pd.read_csv(path)
    except (OSError, pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError):
        return None
    return runs if set(RUNS_NEEDED) <= set(runs.columns) else None


def per_run_values(runs: pd.DataFrame | None) -> dict[tuple, list[float]]:
    """KEY_COLUMNS -> samples/s of each ok run."""
    if runs is None:
        return {}
    runs = with_trainer(runs)
    ok = runs[(runs["status"] == "ok") & runs["samples_per_s"].notna()].copy()
    for c in ("batch_size", "seq_len", "gpus"):
        ok[c] = pd.to_numeric(ok[c], errors="coerce")
    return {
        tuple(_key_value(v) for v in key): list(g["samples_per_s"].astype(float))
        for key, g in ok.groupby(KEY_COLUMNS, dropna=False)
    }


def _key_value(v):
    return float(v) if isinstance(v, int | float) else v


def _significance(m: pd.DataFrame, a: pd.DataFrame, b: pd.DataFrame, equivalence_pct: float) -> pd.DataFrame:
    runs_a, runs_b = a.attrs.get("runs") or {}, b.attrs.get("runs") or {}
    cols = {k: [] for k in ("n_runs_a", "n_runs_b", "lo", "hi", "verdict")}
    for r in m.itertuples():
        key = tuple(_key_value(getattr(r, c)) for c in KEY_COLUMNS)
        va, vb = runs_a.get(key), runs_b.get(key)
        cols["n_runs_a"].append(len(va) if va is not None else float("nan"))
        cols["n_runs_b"].append(len(vb) if vb is not None else float("nan"))
        if not va or not vb:
            cols["lo"].append(float("nan"))
            cols["hi"].append(float("nan"))
            cols["verdict"].append(
                "n/a (no per-run values: give runs.csv files)" if r.present == "both" else None
            )
            continue
        d = stats.welch_log_delta(va, vb)
        cols["lo"].append(d.lo)
        cols["hi"].append(d.hi)
        if min(len(va), len(vb)) < MIN_RUNS:
            cols["verdict"].append(f"too few runs ({len(va)} vs {len(vb)}): {d.pct:+.1f}%")
        else:
            cols["verdict"].append(
                stats.speed_verdict(d, MIN_RUNS, equivalence_pct)
                .replace("faster", "B faster")
                .replace("slower", "B slower")
            )
    return m.assign(
        n_runs_a=cols["n_runs_a"],
        n_runs_b=cols["n_runs_b"],
        samples_per_s_delta_pct_ci95_low=cols["lo"],
        samples_per_s_delta_pct_ci95_high=cols["hi"],
        verdict=cols["verdict"],
    )


def _label(df: pd.DataFrame, path: Path) -> str:
    parts = [
        f"{c} {join_unique(df[c])}" for c in ("gpu_name", "git_commit") if c in df and join_unique(df[c])
    ]
    return f"{path}" + (f" ({'; '.join(parts)})" if parts else "")


def compare_tables(a: pd.DataFrame, b: pd.DataFrame, equivalence_pct: float = 1.0) -> pd.DataFrame:
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
    m = _significance(m, a, b, equivalence_pct)
    return m.reindex(columns=COMPARE_COLUMNS)


def format_compare(df: pd.DataFrame, label_a: str, label_b: str) -> str:
    """An aligned text table of the rows in both, then the rows found on one side only."""

    def num(spec: str):
        return lambda x: fmt.f(x, spec)

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
            "Δ% 95% CI": [
                "—" if pd.isna(lo) else f"[{lo:+.1f}, {hi:+.1f}]"
                for lo, hi in zip(
                    both["samples_per_s_delta_pct_ci95_low"], both["samples_per_s_delta_pct_ci95_high"]
                )
            ],
            "B vs A": both["verdict"].fillna("—"),
        }
    )
    if (both["trainer"] != DEFAULT_TRAINER).any():  # another trainer's cells: say whose each row is
        shown.insert(0, "trainer", both["trainer"])
    lines.append(shown.to_string(index=False) if len(shown) else "(no row is in both A and B)")
    for which in ("A only", "B only"):
        rows = df[df["present"] == which]
        if len(rows):
            lines += ["", f"Only in {which[0]}:"]
            lines += [
                f"  {'' if r.trainer == DEFAULT_TRAINER else f'{r.trainer} '}"
                f"{r.profile} {r.mode} bs{num('.0f')(r.batch_size)} seq{num('.0f')(r.seq_len)} "
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
