"""Predicted vs measured: per Liger arm, the step-time saving its swapped modules' timings add
up to, beside the Δ the sweep measured for the cell (its summary.csv). Which modules an arm
swaps is bench/arms.py's data."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from bench import fmt
from bench.arms import ARMS, BASELINE, LIGER_ARMS
from bench.kernels import roofline
from bench.kernels.shapes import KINDS


def swapped_kinds(arm: str) -> tuple[str, ...]:
    """The module kinds ``arm`` replaces by Liger's and nothing else (bench.arms.Arm.swapped_kinds)."""
    return ARMS[arm].swapped_kinds


def read_summary(sweep_dir: Path) -> pd.DataFrame | None:
    """The sweep's summary.csv, or None when it has none (yet)."""
    path = sweep_dir / "summary.csv"
    try:
        return pd.read_csv(path)
    except (OSError, ValueError):
        return None


def _summary_row(summary: pd.DataFrame | None, cell_id: str, arm: str) -> dict:
    """The summary.csv row of (cell, arm) as a dict, {} when the sweep has none."""
    if summary is None or not {"cell_id", "arm"} <= set(summary.columns):
        return {}
    hit = summary[(summary["cell_id"] == cell_id) & (summary["arm"] == arm)]
    return hit.iloc[0].to_dict() if len(hit) else {}


def predictions(rows: pd.DataFrame, cell_id: str, summary: pd.DataFrame | None) -> list[dict]:
    """Per Liger arm: the step-time saving the module timings predict (the saving per step of every
    swapped site, summed), beside the sweep's measured Δ for the cell where summary.csv has it."""
    cell = rows[(rows["cell_id"] == cell_id) & (rows["impl"] == "liger")]
    base_step = fmt.num(_summary_row(summary, cell_id, BASELINE).get("s_per_step_median"))
    out = []
    for arm in LIGER_ARMS:
        kinds = swapped_kinds(arm)
        swapped = cell[cell["kind"].isin(kinds)]
        complete = len(swapped) > 0 and (swapped["status"] == "ok").all()
        saving_s = float(swapped["saving_per_step_ms"].sum()) / 1e3 if complete else math.nan
        m = _summary_row(summary, cell_id, arm)
        out.append(
            {
                "arm": arm,
                "swaps": " + ".join(KINDS[k] for k in kinds),
                "predicted_saving_ms": saving_s * 1e3,
                "baseline_s_per_step": base_step,
                "predicted_delta_samples_per_s_pct": roofline.samples_per_s_delta_pct(base_step, saving_s),
                "measured_saving_ms": (base_step - fmt.num(m.get("s_per_step_median"))) * 1e3,
                "measured_delta_samples_per_s_pct": fmt.num(m.get("delta_samples_per_s_pct")),
                "measured_ci95_low": fmt.num(m.get("delta_samples_per_s_pct_ci95_low")),
                "measured_ci95_high": fmt.num(m.get("delta_samples_per_s_pct_ci95_high")),
                "not_predicted": "" if complete else _why_not(swapped),
                "in_sweep": bool(m),
            }
        )
    return out


def _why_not(swapped: pd.DataFrame) -> str:
    bad = swapped[swapped["status"] != "ok"]
    reasons = list(dict.fromkeys(str(r) for r in bad.get("reason", pd.Series(dtype=object)).dropna()))
    return "; ".join(reasons) or "no timed Liger module"
