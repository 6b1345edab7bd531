"""Two trainers, one cell: where a sweep ran the same cell shape with two trainer plugs, each
arm's absolute saving per optimizer step measured with one trainer (the source) predicts the
other's (the target's) Δ samples/s from the target's own baseline step time — trainers.csv and
its report section, beside the Δ the target measured. A percentage does not carry over between
trainers; the time a kernel saves per step, to first order, does.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pandas as pd

from bench import fmt
from bench.arms import BASELINE
from bench.results.columns import DEFAULT_TRAINER, SHAPE_COLUMNS, TRAINERS_COLUMNS
from bench.results.tables import with_trainer

NAN = float("nan")


def predicted_pct(base_s: Any, saved_ms: Any) -> float:
    """Δ samples/s (%) of a step of ``base_s`` seconds made ``saved_ms`` ms shorter:
    100 · (base / (base − saved) − 1); NaN when either is missing or the saving is the whole step."""
    base, saved = fmt.num(base_s), fmt.num(saved_ms) / 1e3
    if math.isnan(base) or math.isnan(saved) or base <= 0 or base - saved <= 0:
        return NAN
    return 100 * (base / (base - saved) - 1)


def _stem(cell_id: str, trainer: str) -> str:
    """The cell id without its trainer's part (``…_s2048_specforge-cli_x`` → ``…_s2048_x``)."""
    return cell_id if trainer == DEFAULT_TRAINER else cell_id.replace(f"_{trainer}", "", 1)


def cell_pairs(summary: pd.DataFrame) -> list[tuple[str, str]]:
    """(source, target) cell ids of every ordered pair of cells of one shape (SHAPE_COLUMNS) run
    by two different trainers. Where a trainer has several cells of the shape (labelled cells),
    only cells whose ids agree once the trainer's name is taken out are paired."""
    cells = with_trainer(summary).drop_duplicates("cell_id")
    pairs = []
    for _, shape in cells.groupby(SHAPE_COLUMNS, sort=False, dropna=False):
        per_trainer = shape["trainer"].value_counts()
        for s, t in itertools.permutations(shape.itertuples(), 2):
            if s.trainer == t.trainer:
                continue
            alone = per_trainer[s.trainer] == 1 and per_trainer[t.trainer] == 1
            if alone or _stem(s.cell_id, s.trainer) == _stem(t.cell_id, t.trainer):
                pairs.append((s.cell_id, t.cell_id))
    return pairs


def _contains(lo: Any, hi: Any, point: float) -> bool | None:
    if fmt.isnan(lo) or fmt.isnan(hi) or math.isnan(point):
        return None
    return bool(fmt.num(lo) <= point <= fmt.num(hi))


def _row(source: pd.Series, target: pd.Series, target_base_s: float) -> dict[str, Any]:
    """One trainers.csv row: ``source``'s and ``target``'s summary rows of one arm."""
    point = predicted_pct(target_base_s, source["saved_ms_per_step"])
    measured = [target[f"delta_samples_per_s_pct{s}"] for s in ("", "_ci95_low", "_ci95_high")]
    return {
        "source_cell_id": source["cell_id"],
        "target_cell_id": target["cell_id"],
        "source_trainer": source["trainer"],
        "target_trainer": target["trainer"],
        **{c: target[c] for c in SHAPE_COLUMNS},
        "arm": target["arm"],
        "source_n_pairs": source["n_pairs"],
        "source_saved_ms_per_step": source["saved_ms_per_step"],
        "source_saved_ms_per_step_ci95_low": source["saved_ms_per_step_ci95_low"],
        "source_saved_ms_per_step_ci95_high": source["saved_ms_per_step_ci95_high"],
        "target_baseline_s_per_step": target_base_s,
        "predicted_delta_samples_per_s_pct": point,
        "predicted_delta_samples_per_s_pct_ci95_low": predicted_pct(
            target_base_s, source["saved_ms_per_step_ci95_low"]
        ),
        "predicted_delta_samples_per_s_pct_ci95_high": predicted_pct(
            target_base_s, source["saved_ms_per_step_ci95_high"]
        ),
        "target_n_pairs": target["n_pairs"],
        "measured_delta_samples_per_s_pct": measured[0],
        "measured_delta_samples_per_s_pct_ci95_low": measured[1],
        "measured_delta_samples_per_s_pct_ci95_high": measured[2],
        "measured_ci_contains_prediction": _contains(measured[1], measured[2], point),
    }


def trainers_table(summary: pd.DataFrame) -> pd.DataFrame:
    """trainers.csv from summary.csv: per pair of cells of cell_pairs and every non-baseline arm
    both ran, the target's Δ samples/s predicted from the source's saved_ms_per_step (its CI
    bounds give the prediction's interval; the target's own baseline spread is not in it) and the
    target's baseline mean s/step, beside the target's measured Δ and its paired CI. Empty when no
    two trainers ran one shape."""
    df = with_trainer(summary)
    rows = []
    for s_id, t_id in cell_pairs(df):
        s_rows, t_rows = (df[df["cell_id"] == c].set_index("arm", drop=False) for c in (s_id, t_id))
        base_s = fmt.num(t_rows["s_per_step_mean"].get(BASELINE))
        for arm in t_rows.index:
            if arm != BASELINE and arm in s_rows.index:
                rows.append(_row(s_rows.loc[arm], t_rows.loc[arm], base_s))
    out = pd.DataFrame(rows).reindex(columns=TRAINERS_COLUMNS)
    return out.astype({"measured_ci_contains_prediction": object})


def _interval(point: Any, lo: Any, hi: Any, spec: str, unit: str = "") -> str:
    if fmt.isnan(point):
        return fmt.DASH
    text = f"{fmt.f(point, spec)}{unit}"
    return text if fmt.isnan(lo) or fmt.isnan(hi) else f"{text} [{fmt.f(lo, spec)}, {fmt.f(hi, spec)}]"


def trainers_section(table: pd.DataFrame) -> list[str]:
    """report.md's "Two trainers, one cell": one row per trainers.csv row, and what it means."""
    if not len(table):
        return []
    held = {True: "yes", False: "no"}
    rows = [
        [
            fmt.md(r.profile), fmt.md(r.mode), fmt.integer(r.batch_size), fmt.integer(r.seq_len),
            fmt.integer(r.gpus), fmt.md(r.arm), fmt.md(r.source_trainer), fmt.md(r.target_trainer),
            _interval(r.source_saved_ms_per_step, r.source_saved_ms_per_step_ci95_low,
                      r.source_saved_ms_per_step_ci95_high, ".1f"),
            fmt.f(r.target_baseline_s_per_step, ".3f"),
            _interval(r.predicted_delta_samples_per_s_pct, r.predicted_delta_samples_per_s_pct_ci95_low,
                      r.predicted_delta_samples_per_s_pct_ci95_high, "+.1f", "%"),
            _interval(r.measured_delta_samples_per_s_pct, r.measured_delta_samples_per_s_pct_ci95_low,
                      r.measured_delta_samples_per_s_pct_ci95_high, "+.1f", "%"),
            held.get(r.measured_ci_contains_prediction, fmt.DASH),
        ]
        for r in table.itertuples()
    ]  # fmt: skip
    header = ["profile", "mode", "batch", "seq", "gpus", "arm", "from", "to", "saved per step in from (ms, 95% CI)",
              "baseline s/step in to", "predicted Δ samples/s in to (95% CI)",
              "measured Δ samples/s in to (95% CI)", "measured CI holds the prediction"]  # fmt: skip
    note = (
        "The same cell run by two trainers. The time an arm saves per optimizer step with one trainer "
        "(from) predicts the other's (to) Δ samples/s from that trainer's own baseline step T: "
        "100 · (T / (T − saved) − 1). The same absolute saving is a smaller share of a longer step, so "
        "the slower trainer gains fewer percent; a measured CI that holds the prediction says the saving "
        "carried over. The prediction's interval is the saving's CI (T's own spread is not in it). "
        "Data: trainers.csv."
    )
    return ["## Two trainers, one cell", "", *fmt.table(header, rows), "", note, ""]
