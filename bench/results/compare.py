"""Compare two sweeps' results (two machines or two commits), row by row, and hold B to A.

Each input is a summary.csv, or a runs.csv that is first aggregated through summary_table
(reading and checking them: compare_inputs.py). Rows are joined on KEY_COLUMNS (a file from
before the trainer column reads as our trainer's, bench.results.tables.with_trainer); B is
compared with A. Where the per-run values of both sides are at hand (a runs.csv given, or the
runs.csv beside a summary.csv), each row's B/A ratio gets a 95% CI: runs of different sweeps
are not paired, so it is Welch's interval on log throughput, and a verdict says which
differences are real. With a threshold, the regression gate (gate.py) judges each row.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from bench import fmt
from bench.results import gate, stats
from bench.results.columns import DEFAULT_TRAINER
from bench.results.compare_inputs import KEY_COLUMNS, key_value, load_summary
from bench.results.plots import plot_compare
from bench.results.report import write_csv
from bench.results.tables import join_unique

__all__ = ["COMPARE_COLUMNS", "KEY_COLUMNS", "compare", "compare_tables", "run_compare"]

COMPARE_COLUMNS = [
    *KEY_COLUMNS, "present",
    "samples_per_s_a", "samples_per_s_b", "samples_per_s_ratio_b_over_a", "samples_per_s_delta_pct",
    "s_per_step_a", "s_per_step_b", "peak_vram_gib_a", "peak_vram_gib_b", "peak_vram_delta_gib",
    "delta_samples_per_s_pct_a", "delta_samples_per_s_pct_ci95_low_a", "delta_samples_per_s_pct_ci95_high_a",
    "delta_samples_per_s_pct_b", "delta_samples_per_s_pct_ci95_low_b", "delta_samples_per_s_pct_ci95_high_b",
    "n_runs_a", "n_runs_b", "samples_per_s_delta_pct_ci95_low", "samples_per_s_delta_pct_ci95_high", "verdict",
    "gate",
]  # fmt: skip
MIN_RUNS = 3  # per side, for a verdict on an unpaired comparison
_VALUES = {
    "samples_per_s_mean": "samples_per_s",
    "s_per_step_mean": "s_per_step",
    "peak_vram_gib": "peak_vram_gib",
    "delta_samples_per_s_pct": "delta_samples_per_s_pct",
    "delta_samples_per_s_pct_ci95_low": "delta_samples_per_s_pct_ci95_low",
    "delta_samples_per_s_pct_ci95_high": "delta_samples_per_s_pct_ci95_high",
}


def _significance(m: pd.DataFrame, a: pd.DataFrame, b: pd.DataFrame, equivalence_pct: float) -> pd.DataFrame:
    runs_a, runs_b = a.attrs.get("runs") or {}, b.attrs.get("runs") or {}
    cols = {k: [] for k in ("n_runs_a", "n_runs_b", "lo", "hi", "verdict")}
    for r in m.itertuples():
        key = tuple(key_value(getattr(r, c)) for c in KEY_COLUMNS)
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
        out = df.reindex(columns=KEY_COLUMNS + list(_VALUES)).rename(
            columns={k: f"{v}_{suffix}" for k, v in _VALUES.items()}
        )
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


def compare(
    a_csv: str | Path,
    b_csv: str | Path,
    out_dir: str | Path | None = None,
    fail_if_slower: float | None = None,
) -> pd.DataFrame:
    """Compare B with A, print the table; with out_dir also write compare.csv and compare.png.

    Warnings about a runs.csv beside a summary that was ignored go to stderr. With
    ``fail_if_slower`` the ``gate`` column holds each row's outcome (gate.decide).
    """
    a_csv, b_csv = Path(a_csv), Path(b_csv)
    a, b = load_summary(a_csv), load_summary(b_csv)
    for line in a.attrs["warnings"] + b.attrs["warnings"]:
        print(f"warning: {line}", file=sys.stderr)
    label_a, label_b = _label(a, a_csv), _label(b, b_csv)
    df = compare_tables(a, b)
    if fail_if_slower is not None:
        decisions = gate.decide(df, fail_if_slower, MIN_RUNS)
        df["gate"] = [d.outcome if d else None for d in decisions]
    print(format_compare(df, label_a, label_b))
    if out_dir is not None:
        out = Path(out_dir)
        write_csv(df, out / "compare.csv")
        plot_compare(df[df["present"] == "both"], out / "compare.png", label_a, label_b)
    return df


def run_compare(
    a_csv: str | Path,
    b_csv: str | Path,
    out_dir: str | Path | None = None,
    fail_if_slower: str | float | None = None,
    fail_if_inconclusive: bool = False,
) -> int:
    """`bench compare`: the table, the files, the gate's lines; the exit status: 0, or
    gate.EXIT_FAILED when the gate failed (README). Bad input: ValueError (one line), checked
    before anything is written, except the gate's finding that no row could be judged."""
    pct = None if fail_if_slower is None else gate.parse_threshold(fail_if_slower)
    if fail_if_inconclusive and pct is None:
        raise ValueError("--fail-if-inconclusive: needs --fail-if-slower PCT")
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ValueError(f"--out {out_dir}: is a file; expected a directory for compare.csv and compare.png")
    df = compare(a_csv, b_csv, out_dir, pct)
    if pct is None:
        return 0
    lines, final, status = gate.verdict(gate.decide(df, pct, MIN_RUNS), pct, fail_if_inconclusive)
    print("\n".join(lines))
    if status == 2:
        raise ValueError(final)
    print(final)
    return status
