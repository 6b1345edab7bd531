"""The tables of a sweep, built from its run records: runs.csv (one row per run), summary.csv
(one row per cell and arm, with the Δ columns against the baseline), contrasts.csv (arm against
arm), vram_per_card.csv and scaling.csv. Pure functions over pandas (no plotting, no writing);
numbers at full precision, rounded only when written (bench.results.report.write_csv).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from bench import fmt
from bench.arms import BASELINE
from bench.results import stats
from bench.results.allocations import split_pair_notes, with_split_pairs
from bench.results.columns import (
    CELL_COLUMNS,
    CONTRAST_COLUMNS,
    DEFAULT_TRAINER,
    RUNS_COLUMNS,
    RUNS_TEXT_COLUMNS,
    SCALING_COLUMNS,
    SCALING_KEY,
    SUMMARY_AGGREGATES,
    SUMMARY_COLUMNS,
    SUMMARY_PROVENANCE_COLUMNS,
    VRAM_PER_CARD_COLUMNS,
)
from bench.results.deltas import delta_columns
from bench.results.energy import arm_energy
from bench.results.records import RunRecord, in_statistics, run_row, vram_devices
from bench.results.versions import arm_env_effects, combined

NAN = float("nan")


def runs_table(records: list[RunRecord]) -> pd.DataFrame:
    """runs.csv: one row per run (RUNS_COLUMNS), none dropped, whatever its status."""
    split = split_pair_notes(records)  # pairs resumed in another Slurm allocation are flagged
    rows = [with_split_pairs(run_row(r), split) for r in records]
    env = arm_env_effects(records)  # an arm with its own environment: other code than the baseline's?
    for row in rows:
        if row["run_id"] in env:
            row["arm_in_effect"] = combined([row.get("arm_in_effect"), env[row["run_id"]]])
    df = pd.DataFrame(rows).reindex(columns=RUNS_COLUMNS)
    for c in RUNS_COLUMNS:
        if c not in RUNS_TEXT_COLUMNS:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def with_trainer(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its trainer column filled in: a table (or CSV) from before there was a second
    trainer plug has none, or blanks, and its runs are ours (DEFAULT_TRAINER)."""
    trainer = df["trainer"] if "trainer" in df else pd.Series(None, index=df.index, dtype=object)
    return df.assign(trainer=trainer.astype(object).fillna(DEFAULT_TRAINER))


def mean_ci(values: pd.Series) -> tuple[float, float, float, float]:
    """Mean, sample std and Student-t 95% interval of the non-NaN values (NaN where n is too small)."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    n = len(v)
    if n == 0:
        return NAN, NAN, NAN, NAN
    mean = float(v.mean())
    if n < 2:
        return mean, NAN, NAN, NAN
    std = float(v.std())
    half = stats.t_quantile(n - 1) * std / math.sqrt(n)
    return mean, std, mean - half, mean + half


def _first(s: pd.Series) -> Any:
    s = s.dropna()
    return s.iloc[0] if len(s) else None


def distinct_values(s: pd.Series) -> list[str]:
    """The distinct non-null values in order of appearance, whole numbers as integers ("1", not
    "1.0"), and one build of a package once: "2.11.0" is dropped beside "2.11.0+cu130"."""
    vals = [fmt.integer(v) if isinstance(v, float) and float(v).is_integer() else str(v) for v in s.dropna()]
    vals = list(dict.fromkeys(v for v in vals if v.strip()))
    return [v for v in vals if not any(o != v and o.startswith(v + "+") for o in vals)]


def join_unique(s: pd.Series) -> str | None:
    """The distinct non-null values, in order of appearance, joined by ", " (None when there are none)."""
    vals = [str(v) for v in dict.fromkeys(s.dropna())]
    return ", ".join(vals) or None


def position_means(ok: pd.DataFrame) -> str | None:
    """The mean per-position accuracy at the last step over ok runs (runs.csv's space-separated
    accuracy_by_position_last), as the same kind of text; None when no run logged them."""
    if "accuracy_by_position_last" not in ok:
        return None
    lists = [
        [float(x) for x in v.split()] for v in ok["accuracy_by_position_last"] if isinstance(v, str) and v
    ]
    if not lists:
        return None
    width = min(len(v) for v in lists)
    return " ".join(f"{sum(v[i] for v in lists) / len(lists):.4f}" for i in range(width))


def with_accuracy_deltas(out: pd.DataFrame) -> pd.DataFrame:
    """delta_accuracy_last: an arm's mean last-step accuracy minus its cell's baseline's (beside
    loss parity: a kernel that changes the numerics shows here as well)."""
    base = out[out["arm"] == BASELINE].set_index("cell_id")["accuracy_last_mean"]
    out["delta_accuracy_last"] = [
        (r.accuracy_last_mean - base.get(r.cell_id, math.nan)) if r.arm != BASELINE else math.nan
        for r in out.itertuples()
    ]
    return out


def summary_table(
    runs_df: pd.DataFrame, precision: dict[str, dict] | None = None, equivalence_pct: float = 1.0
) -> pd.DataFrame:
    """summary.csv: one row per (cell_id, arm), statistics over its ok runs that enter the
    statistics (records.in_statistics; n_ok counts them), deltas vs baseline.

    ``precision``: per cell_id, the sweep's precision target (ci_halfwidth_pct, min_pairs,
    max_pairs); ``equivalence_pct``: differences inside ±this are reported as "within".
    Arms with no ok run keep a row (n_ok = 0, NaN statistics) so a skipped arm stays visible.
    """
    precision = precision or {}
    df = with_trainer(runs_df.reindex(columns=RUNS_COLUMNS))
    ok_all = df[in_statistics(df)]
    cells = list(dict.fromkeys(df["cell_id"]))
    rows = []
    for (cell_id, arm), g in df.groupby(["cell_id", "arm"], sort=False, dropna=False):
        ok = g[in_statistics(g)]
        sps = mean_ci(ok["samples_per_s"])
        sps_step = mean_ci(ok["s_per_step_mean"])
        prov = ok if len(ok) else g  # shape and provenance: a run without a trusted cell.json has none
        row = {
            "cell_id": cell_id,
            **{c: _first(prov[c]) for c in CELL_COLUMNS},
            "workload_digest": _first(prov["workload_digest"]),
            "arm": arm,
            "n_runs": len(g),
            "n_ok": len(ok),
            "samples_per_s_mean": sps[0],
            "samples_per_s_std": sps[1],
            "samples_per_s_ci95_low": sps[2],
            "samples_per_s_ci95_high": sps[3],
            "s_per_step_mean": sps_step[0],
            "s_per_step_ci95_low": sps_step[2],
            "s_per_step_ci95_high": sps_step[3],
            **{c.name: getattr(ok[c.of], c.how)() for c in SUMMARY_AGGREGATES},  # tokens_per_s_mean, ...
            "accuracy_by_position_last_mean": position_means(ok),
            **arm_energy(ok),
            **{c: join_unique(prov[c]) for c in SUMMARY_PROVENANCE_COLUMNS},
        }
        if arm != BASELINE:
            base_ok = ok_all[(ok_all["cell_id"] == cell_id) & (ok_all["arm"] == BASELINE)]
            base_all = df[(df["cell_id"] == cell_id) & (df["arm"] == BASELINE)]
            row.update(
                delta_columns(
                    base_ok, ok, precision.get(cell_id), equivalence_pct, str(arm),
                    set(base_all["status"]), set(g["status"]),
                )
            )  # fmt: skip
        rows.append(row)
    out = pd.DataFrame(rows).reindex(columns=SUMMARY_COLUMNS)
    if out.empty:
        return out
    out = with_accuracy_deltas(out)
    order = out["cell_id"].map({c: i for i, c in enumerate(cells)})
    out = out.assign(_c=order, _a=out["arm"] != BASELINE).sort_values(["_c", "_a", "arm"], kind="stable")
    return out.drop(columns=["_c", "_a"]).reset_index(drop=True)


def contrast_table(
    runs_df: pd.DataFrame, contrasts: list | tuple, equivalence_pct: float = 1.0
) -> pd.DataFrame:
    """contrasts.csv: per cell and [arm, reference] of the sweep's ``contrasts``, the arm against
    the reference arm, with the estimator of summary.csv's Δ columns: the two arms' runs of the
    same round are a pair (every round runs every arm), a 95% t-interval on the per-pair
    log-ratios (no stopping rule of its own: the rounds are those the baseline comparisons
    planned; verdicts need 3 pairs)."""
    df = with_trainer(runs_df.reindex(columns=RUNS_COLUMNS))
    ok_all = df[in_statistics(df)]
    rows = []
    for cell_id, g in df.groupby("cell_id", sort=False, dropna=False):
        shape = ok_all[ok_all["cell_id"] == cell_id]
        shape = shape if len(shape) else g
        for arm, ref in contrasts:
            a_all, r_all = g[g["arm"] == arm], g[g["arm"] == ref]
            if a_all.empty and r_all.empty:
                continue
            a_ok = ok_all[(ok_all["cell_id"] == cell_id) & (ok_all["arm"] == arm)]
            r_ok = ok_all[(ok_all["cell_id"] == cell_id) & (ok_all["arm"] == ref)]
            row = {
                "cell_id": cell_id,
                **{c: _first(shape[c]) for c in CELL_COLUMNS},
                "arm": arm,
                "reference": ref,
            }
            row.update(
                delta_columns(
                    r_ok, a_ok, None, equivalence_pct, arm, set(r_all["status"]), set(a_all["status"]), ref
                )
            )
            rows.append(row)
    return pd.DataFrame(rows).reindex(columns=CONTRAST_COLUMNS)


def vram_per_card_table(records: list[RunRecord]) -> pd.DataFrame:
    """vram_per_card.csv: one row per (run, card) from each run's vram.json, idle cards included."""
    frames = [
        vram_devices(r.vram).assign(run_id=r.run_id, cell_id=r.cell_id, arm=r.arm, repeat=r.repeat)
        for r in records
    ]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=VRAM_PER_CARD_COLUMNS)
    return pd.concat(frames, ignore_index=True).reindex(columns=VRAM_PER_CARD_COLUMNS)


def scaling_table(summary: pd.DataFrame) -> pd.DataFrame:
    """scaling.csv: for every series of cells that differ only in world size (gpus x nodes), one
    row per arm and size: samples/s, per-GPU samples/s, efficiency vs the smallest size of the
    same arm (100 = per-GPU throughput held), the arm's Δ vs baseline with its CI, and the
    busiest card's peak VRAM. Empty when no series has two sizes."""
    df = with_trainer(summary.reindex(columns=SUMMARY_COLUMNS))
    df["nodes"] = pd.to_numeric(df["nodes"], errors="coerce").fillna(1)
    df["gpus"] = pd.to_numeric(df["gpus"], errors="coerce")
    df["world_size"] = df["gpus"] * df["nodes"]
    df["samples_per_s_per_gpu"] = df["samples_per_s_mean"] / df["world_size"]
    frames = []
    for _, series in df.groupby(SCALING_KEY, sort=False, dropna=False):
        if series["world_size"].nunique() < 2:
            continue
        for _, arm_rows in series.groupby("arm", sort=False):
            arm_rows = arm_rows.sort_values("world_size")
            ok = arm_rows[arm_rows["samples_per_s_per_gpu"].notna()]
            ref = ok["samples_per_s_per_gpu"].iloc[0] if len(ok) else NAN
            frames.append(
                arm_rows.assign(scaling_efficiency_pct=100 * arm_rows["samples_per_s_per_gpu"] / ref)
            )
    if not frames:
        return pd.DataFrame(columns=SCALING_COLUMNS)
    return pd.concat(frames, ignore_index=True).reindex(columns=SCALING_COLUMNS)
