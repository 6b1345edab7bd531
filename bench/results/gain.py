"""The gain's own change between two sweeps: an arm's paired Δ samples/s against its cell's
baseline in B minus the same in A, in percentage points, with a 95% CI (`bench compare
--fail-if-gain-drops POINTS`: what a kernel PR must not lose is the gain itself).

Each side's gain is the ratio of geometric means over its pairs (summary.csv's Δ); the two
sides' pairs are independent, so the CI of the difference is Welch's on the delta method's
standard errors (100·e^m·sd/√n each side), symmetric around the point: it always holds it.

A sweep's own arm (user_arms) declares keys that are part of its workload digest and not of its
baseline's: its pairs are made with the baseline of its cell (the cell plus the arm's declared keys)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.arms import BASELINE
from bench.results import stats
from bench.results.columns import WORKLOAD_DIGEST
from bench.results.compare_inputs import KEY_COLUMNS, row_key

MIN_PAIRS = 3  # a side, for a CI of the difference


def side_log_ratios(runs: pd.DataFrame | None, key: tuple, by_cell: bool = False) -> list[float]:
    """ln(arm / baseline) samples/s per pair (repeat) of the arm whose identity is ``key``. Its
    baseline is the row of the same identity but the arm; ``by_cell`` (a sweep's own arm, whose
    declared keys are in its workload digest and not in its baseline's): the baseline runs of the
    arm's own cells (cell_id) whose identity is the arm's apart from the digest."""
    if runs is None or runs.empty:
        return []
    arm_i = KEY_COLUMNS.index("arm")
    base_key = (*key[:arm_i], BASELINE, *key[arm_i + 1 :])
    keys = runs.apply(lambda r: row_key(r.to_dict()), axis=1)
    if by_cell:
        shape = _without_digest(key)
        cells = set(runs.loc[keys == key, "cell_id"].astype(str))
        base_rows = (runs["arm"] == BASELINE) & runs["cell_id"].astype(str).isin(cells)
        base_rows &= keys.map(lambda k: _without_digest(k) == shape)
    else:
        base_rows = keys == base_key

    def by_repeat(rows: pd.Series) -> pd.Series:
        return runs[rows].groupby("repeat")["samples_per_s"].mean()

    arm, base = by_repeat(keys == key), by_repeat(base_rows)
    common = arm.index.intersection(base.index)
    with np.errstate(divide="ignore", invalid="ignore"):
        lr = np.log(arm[common].astype(float) / base[common].astype(float))
    return [float(x) for x in lr if math.isfinite(x)]


def _without_digest(key: tuple) -> tuple:
    """An identity's cell columns: without its workload digest and arm."""
    return tuple(v for c, v in zip(KEY_COLUMNS, key) if c not in (WORKLOAD_DIGEST, "arm"))


def gain_change(lr_a: list[float], lr_b: list[float]) -> stats.Delta:
    """B's gain minus A's in points (``pct``), its 95% CI (``lo``, ``hi``), ``n`` the fewer pairs."""
    n = min(len(lr_a), len(lr_b))
    if not lr_a or not lr_b:
        return stats.Delta(0)
    ma, mb = float(np.mean(lr_a)), float(np.mean(lr_b))
    point = stats.to_pct(mb) - stats.to_pct(ma)
    if min(len(lr_a), len(lr_b)) < 2:
        return stats.Delta(n, point, method="welch on per-pair log-ratios")
    va = (100 * math.exp(ma)) ** 2 * float(np.var(lr_a, ddof=1)) / len(lr_a)
    vb = (100 * math.exp(mb)) ** 2 * float(np.var(lr_b, ddof=1)) / len(lr_b)
    se = math.sqrt(va + vb)
    if se == 0:
        return stats.Delta(n, point, point, point, "welch on per-pair log-ratios")
    df = (va + vb) ** 2 / (va**2 / (len(lr_a) - 1) + vb**2 / (len(lr_b) - 1))
    half = stats.t_quantile(df) * se
    return stats.Delta(n, point, point - half, point + half, "welch on per-pair log-ratios")
