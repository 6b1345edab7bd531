"""The A/A check's verdict (bench/results/deltas.py): the small-n rules of every arm, then a CI
that must contain 0 and be no wider than the cell's target (precision, else equivalence_pct)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from bench.results.deltas import delta_columns
from bench.results.tables import summary_table


def runs(per_pair_pct: list[float], base: float = 10.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(baseline ok runs, aa ok runs): pair i's aa run is per_pair_pct[i] % off its baseline."""

    def frame(values: list[float]) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "repeat": list(range(1, len(values) + 1)),
                "samples_per_s": values,
                "s_per_step_mean": [2.0 / v for v in values],
                "peak_vram_gib": [20.0] * len(values),
                "torch_peak_allocated_gib": [18.0] * len(values),
            }
        )

    return frame([base] * len(per_pair_pct)), frame([base * (1 + p / 100) for p in per_pair_pct])


def verdict(per_pair_pct: list[float], target: dict | None = None, equivalence_pct: float = 1.0, **kw) -> str:
    base_ok, aa_ok = runs(per_pair_pct)
    row = delta_columns(base_ok, aa_ok, target, equivalence_pct, "aa", {"ok"}, {"ok"}, **kw)
    return row["verdict_speed"]


def test_two_wide_pairs_are_too_few_not_a_pass():
    # the case: 2 pairs, a CI of about ±118 points that of course contains 0
    v = verdict([+5.0, -4.3])
    assert not v.startswith("A/A check passed")
    assert v.startswith("A/A check not passed: too few pairs (2): +5.0%, -4.3%")


def test_below_the_precision_pilot_is_too_few_pairs():
    target = {"ci_halfwidth_pct": 1.0, "min_pairs": 5, "max_pairs": 12}
    v = verdict([0.1, -0.1, 0.05, -0.05], target)  # 4 < min_pairs, however narrow
    assert v.startswith("A/A check not passed: too few pairs (4)")


def test_a_ci_wider_than_the_target_is_inconclusive():
    pairs = [+2.0, -2.5, +1.5, -1.0, +0.5]  # contains 0, about ±2.2 points
    v = verdict(pairs)
    assert v.startswith("A/A check not passed: this machine is too noisy to resolve ±1 here (CI ±")
    # the target is the precision target's half-width when the sweep has one
    target = {"ci_halfwidth_pct": 3.0, "min_pairs": 5, "max_pairs": 12}
    assert verdict(pairs, target).startswith("A/A check passed: CI contains 0 (±")
    # else equivalence_pct
    assert verdict(pairs, equivalence_pct=3.0).startswith("A/A check passed")


def test_a_narrow_ci_around_zero_passes_with_the_old_wording():
    v = verdict([-0.13, -0.54, -0.20, +0.31, -0.84])  # about h200-noise's pairs: ±0.54 points
    assert v == "A/A check passed: CI contains 0 (±0.54 points)"


def test_a_ci_that_excludes_zero_fails():
    assert verdict([+3.0, +3.2, +2.9, +3.1, +3.05]).startswith("A/A check FAILED: CI excludes 0")


def test_an_aa_arm_against_another_reference_is_an_ordinary_contrast():
    v = verdict([+5.0, -4.3, +1.0], ref="nopoll")
    assert not v.startswith("A/A") and v.startswith("inconclusive")


def test_summary_table_carries_the_rule():
    base_ok, aa_ok = runs([+5.0, -4.3])
    rows = []
    for arm, df in (("baseline", base_ok), ("aa", aa_ok)):
        for r in df.itertuples():
            rows.append(
                {
                    "run_id": f"c_{arm}_r{r.repeat}", "cell_id": "c", "arm": arm, "repeat": r.repeat,
                    "status": "ok", "samples_per_s": r.samples_per_s, "s_per_step_mean": r.s_per_step_mean,
                    "peak_vram_gib": r.peak_vram_gib, "torch_peak_allocated_gib": r.torch_peak_allocated_gib,
                }
            )  # fmt: skip
    summary = summary_table(pd.DataFrame(rows)).set_index("arm")
    aa = summary.loc["aa"]
    assert aa.n_pairs == 2 and aa.delta_samples_per_s_halfwidth_pct > 50
    assert aa.verdict_speed.startswith("A/A check not passed: too few pairs (2)")


@pytest.mark.parametrize("n", [3, 8])
def test_enough_quiet_pairs_pass_at_any_n_from_the_minimum(n):
    pairs = [0.05 * math.sin(i) for i in range(n)]
    assert verdict(pairs).startswith("A/A check passed: CI contains 0")


def test_the_summary_line_says_the_machine_is_too_noisy_not_that_a_check_failed():
    """The CPU `make bench`'s first verdict read "A/A check not passed"; it says why, with the number."""
    import pandas as pd

    from bench.results.prsummary import delta_line

    pairs = [+2.0, -2.5, +1.5, -1.0, +0.5]
    r = pd.DataFrame([{
        "arm": "aa", "n_pairs": 5.0, "delta_samples_per_s_pct": 0.1, "delta_samples_per_s_pct_ci95_low": -2.1,
        "delta_samples_per_s_pct_ci95_high": 2.3, "verdict_speed": verdict(pairs), "loss_parity": "pass (5/5)",
        "delta_peak_vram_gib": float("nan"),
    }]).iloc[0]  # fmt: skip
    line = delta_line(r)
    assert "(5 pairs; A/A: this machine is too noisy to resolve ±1 here)" in line and "not passed" not in line
