"""Loss parity: per cell, arm and repeat, the arm's logged losses against the baseline's of the
same pair, step by step (loss_parity.csv), the verdict in words that summary.csv carries, and
why a (cell, repeat) has no row. A speed Δ of an arm that fails it compares two trainings.

Only runs that entered the statistics are compared (records.in_statistics: ok, throughput
measured; not a run flagged for a bad value in its metrics, too few steps, or an unconfirmed
identity); a pair with a run left out has no row, and loss_parity_gaps says why.
``in_statistics_records`` is the same filter for anything else drawn from the runs (plots)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from bench import fmt
from bench.arms import ARMS, BASELINE
from bench.record import CellDoc
from bench.results.columns import LOSS_PARITY_COLUMNS, PARITY_CRITERION, RUNS_COLUMNS, SUMMARY_COLUMNS
from bench.results.records import RunRecord, in_statistics, run_row
from bench.results.verdicts import Parity

NAN = float("nan")
DEFAULT_TOLERANCE = 1e-2  # |Δ loss| at the last step, for a cell that sets no loss_tolerance


def excluded_runs(records: list[RunRecord], runs: pd.DataFrame | None = None) -> dict[str, str]:
    """run_id -> why the run is out of the statistics (its status and reason, or its runs.csv
    note), for every record that is. ``runs``: runs.csv's table of these records (run_row per
    record); computed here when None."""
    if runs is None:
        runs = pd.DataFrame([run_row(r) for r in records]).reindex(columns=RUNS_COLUMNS)
    out = runs[~in_statistics(runs)]
    return {
        str(r.run_id): (
            (r.note if isinstance(r.note, str) else "its throughput was not measured")
            if r.status == "ok"
            else f"status {r.status}: {r.reason or '-'}"
        )
        for r in out.itertuples()
    }


def in_statistics_records(records: list[RunRecord], runs: pd.DataFrame | None = None) -> list[RunRecord]:
    """The records whose runs entered the statistics (records.in_statistics over runs.csv's rows):
    what loss parity compares, and what a plot of the runs should draw. ``runs``: runs.csv's table
    of these records, when the caller has it (else each record's row is computed)."""
    out = excluded_runs(records, runs)
    return [r for r in records if r.run_id not in out]


def arm_pairs(records: list[RunRecord]) -> dict[tuple[Any, Any], dict[str, RunRecord]]:
    """(cell, repeat) -> arm -> the record: the runs of each pair."""
    pairs: dict[tuple[Any, Any], dict[str, RunRecord]] = {}
    for r in records:
        pairs.setdefault((r.cell_id, r.repeat), {})[str(r.arm)] = r
    return pairs


def pair_deltas(base: RunRecord, other: RunRecord, default_tolerance: float) -> tuple[pd.DataFrame, float]:
    """A pair's common steps (step, loss_baseline, loss_arm, abs_delta) and its cell's tolerance:
    what loss_parity.csv summarises and the loss plot's |Δ loss| panel draws."""
    j = base.metrics[["step", "loss"]].merge(
        other.metrics[["step", "loss"]], on="step", suffixes=("_baseline", "_arm")
    )
    j["abs_delta"] = (j["loss_arm"] - j["loss_baseline"]).abs()
    cell, other_cell = base.cell or CellDoc(), other.cell or CellDoc()
    tol = cell.loss_tolerance if cell.has("loss_tolerance") else other_cell.loss_tolerance
    return j, fmt.num(tol, default_tolerance)


def _parity_row(base: RunRecord, other: RunRecord, default_tolerance: float) -> dict[str, Any] | None:
    j, tol = pair_deltas(base, other, default_tolerance)
    if j.empty:
        return None
    cell = base.cell or CellDoc()
    delta = j["abs_delta"]
    last = j.iloc[-1]
    last_delta = float(delta.iloc[-1])
    return {
        "cell_id": base.cell_id,
        "trainer": base.trainer,
        **{c: getattr(cell, c) for c in ("profile", "mode", "batch_size", "seq_len", "gpus")},
        "nodes": cell.nodes or 1,  # cells recorded before multi-node have no key
        "arm": other.arm,
        "repeat": base.repeat,
        "steps_compared": len(j),
        "max_abs_delta": delta.max(skipna=False),
        "max_abs_delta_step": j.loc[delta.idxmax(), "step"] if delta.notna().any() else NAN,
        "last_step": last["step"],
        "last_step_abs_delta": last_delta,
        "loss_last_baseline": last["loss_baseline"],
        "loss_last_arm": last["loss_arm"],
        "tolerance": tol,
        "criterion": PARITY_CRITERION,
        "passed": bool(last_delta <= tol),
    }


def _other_arms(arms: dict[str, RunRecord]) -> list[str]:
    return [a for a in arms if a != BASELINE]


def loss_parity_table(
    records: list[RunRecord], default_tolerance: float = DEFAULT_TOLERANCE, runs: pd.DataFrame | None = None
) -> pd.DataFrame:
    """loss_parity.csv: per cell, arm and repeat where the arm and the baseline of the same pair
    both entered the statistics and logged losses, step-by-step |Δ loss|.

    max_abs_delta is over every common step (warm-up included); pass/fail is PARITY_CRITERION.
    Repeats missing a counterpart get no row; see loss_parity_gaps. ``runs``: runs.csv's table of
    these records, when the caller has it (in_statistics_records).
    """
    rows = []
    for arms in arm_pairs(in_statistics_records(records, runs)).values():
        if BASELINE not in arms:
            continue
        for arm in _other_arms(arms):
            row = _parity_row(arms[BASELINE], arms[arm], default_tolerance)
            if row is not None:
                rows.append(row)
    return pd.DataFrame(rows).reindex(columns=LOSS_PARITY_COLUMNS)


def parity_verdict(rows: pd.DataFrame, arm: str | None = None) -> str:
    """One (cell, arm)'s loss parity in words: 'pass (n/n)' or 'FAIL in k of n pairs (...)'. An arm
    that moves the baseline's weights by design (aa_eps, the sensitivity floor) is not judged: its
    |Δ loss| is what one rounding step does to this training, which the tolerance may well be
    finer than (results/h200-parity: 0.0197 at step 200 against 0.01); nor is a negative control
    (lr_off), wrong on purpose: training parity says whether the rule caught it."""
    if not len(rows):
        return ""
    if arm in ARMS and ARMS[arm].lr_scale != 1.0:  # lr_off: wrong on purpose, so a FAIL is its point
        worst = rows["last_step_abs_delta"].max()
        return f"negative control (|Δ loss| at the last step up to {worst:.3g}; training parity says if it was caught)"
    if arm in ARMS and ARMS[arm].perturb:
        return (
            f"{Parity.FLOOR.value} (|Δ loss| at the last step up to {rows['last_step_abs_delta'].max():.3g})"
        )
    failed = rows[~rows["passed"].astype(bool)]
    if not len(failed):
        return f"{Parity.PASS.value} ({len(rows)}/{len(rows)})"
    worst = failed["last_step_abs_delta"].max()
    return (
        f"{Parity.FAIL.value} in {len(failed)} of {len(rows)} pairs (|Δ loss| at the last step up to {worst:.3g}, "
        f"tolerance {failed['tolerance'].iloc[0]:g})"
    )


def with_loss_parity(summary: pd.DataFrame, parity: pd.DataFrame) -> pd.DataFrame:
    """summary.csv's loss_parity column from loss_parity.csv: a speed Δ of an arm that fails it
    compares two different trainings."""
    out = summary.copy()
    out["loss_parity"] = [
        parity_verdict(parity[(parity["cell_id"] == c) & (parity["arm"] == a)], a) if len(parity) else ""
        for c, a in zip(out["cell_id"], out["arm"], strict=True)
    ]
    return out.reindex(columns=SUMMARY_COLUMNS)


def loss_parity_gaps(records: list[RunRecord], runs: pd.DataFrame | None = None) -> list[str]:
    """One line per (cell, repeat) with no loss-parity row, saying why (``runs``: as for
    loss_parity_table)."""
    gaps = []
    excluded = excluded_runs(records, runs)
    for (cell_id, repeat), arms in arm_pairs(records).items():
        where = f"{cell_id} repeat {repeat}"
        if BASELINE not in arms or not _other_arms(arms):
            have = ", ".join(arms) or "none"
            gaps.append(f"{where}: no pair to compare (runs of arms: {have})")
            continue
        for arm in _other_arms(arms):
            pair = (BASELINE, arm)
            empty = [a for a in pair if arms[a].metrics["loss"].dropna().empty]
            out = [a for a in pair if arms[a].run_id in excluded]
            if empty:
                why = "; ".join(
                    f"{a} has no losses (status {arms[a].status}: {arms[a].reason or '-'})" for a in empty
                )
                gaps.append(f"{where}: {why}")
            elif out:  # losses logged, but the run is not one the statistics count
                why = "; ".join(f"{a} is out of the statistics ({excluded[arms[a].run_id]})" for a in out)
                gaps.append(f"{where}: {arm} not compared: {why}")
            elif _parity_row(arms[BASELINE], arms[arm], NAN) is None:
                gaps.append(f"{where}: {arm} and baseline share no logged step")
    return gaps
