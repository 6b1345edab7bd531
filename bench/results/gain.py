"""The gain's own change between two sweeps: an arm's paired Δ samples/s against its cell's
baseline in B minus the same in A, in percentage points, with a 95% CI (`bench compare
--fail-if-gain-drops POINTS`: what a kernel PR must not lose is the gain itself).

Each side's gain is the ratio of geometric means over its pairs (summary.csv's Δ); the two
sides' pairs are independent, so the CI of the difference is Welch's on the delta method's
standard errors (100·e^m·sd/√n each side), symmetric around the point: it always holds it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.arms import BASELINE
from bench.results import stats
from bench.results.compare_inputs import KEY_COLUMNS, row_key

MIN_PAIRS = 3  # a side, for a CI of the difference


def side_log_ratios(runs: pd.DataFrame | None, key: tuple) -> list[float]:
    """ln(arm / baseline) samples/s per pair (repeat) of the arm whose identity is ``key``."""
    if runs is None or runs.empty:
        return []
    arm_i = KEY_COLUMNS.index("arm")
    base_key = (*key[:arm_i], BASELINE, *key[arm_i + 1 :])
    keys = runs.apply(lambda r: row_key(r.to_dict()), axis=1)

    def by_repeat(k: tuple) -> pd.Series:
        rows = runs[keys == k]
        return rows.groupby("repeat")["samples_per_s"].mean()

    arm, base = by_repeat(key), by_repeat(base_key)
    common = arm.index.intersection(base.index)
    with np.errstate(divide="ignore", invalid="ignore"):
        lr = np.log(arm[common].astype(float) / base[common].astype(float))
    return [float(x) for x in lr if math.isfinite(x)]


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
