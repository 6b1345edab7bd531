"""bench.results.stats: the paired estimator, Stein's stopping rule and its coverage, verdict wording."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy import stats as st

from bench.results import stats


def test_stein_rule_matches_its_formula():
    pilot = [0.010, 0.025, 0.004, 0.018, 0.012]  # log-ratios
    d = stats.stein_pairs(pilot, halfwidth_pct=1.0, min_pairs=5, max_pairs=40)
    sd = np.std(pilot, ddof=1)
    # the log half-width that reads as ±1 point around the pilot's ratio once back-transformed
    h = math.asinh(1.0 / (100 * math.exp(np.mean(pilot))))
    expected = math.ceil((st.t.ppf(0.975, 4) * sd / h) ** 2)
    assert d.pairs == d.wanted == max(5, expected) and not d.capped
    assert d.pilot_sd == pytest.approx(sd) and d.pilot_df == 4
    capped = stats.stein_pairs(pilot, halfwidth_pct=0.1, min_pairs=5, max_pairs=12)
    assert capped.pairs == 12 and capped.wanted > 12 and capped.capped and "capped at 12" in capped.reason
    # a quiet pilot needs no more pairs than the pilot itself
    assert stats.stein_pairs([0.1, 0.1001, 0.0999], 1.0, 3, 10).pairs == 3
    # fewer than two usable pairs: no estimate of spread, no extension
    none = stats.stein_pairs([0.1, float("nan")], 1.0, 4, 10)
    assert none.pairs == 4 and none.pilot_sd is None and "no estimate" in none.reason


def test_stein_interval_reaches_the_target_and_uses_the_pilot_spread():
    rng = random.Random(3)
    pilot = [rng.gauss(0.05, 0.01) for _ in range(5)]
    d = stats.stein_pairs(pilot, 1.0, 5, 50)
    full = pilot + [rng.gauss(0.05, 0.01) for _ in range(d.pairs - 5)]
    delta = stats.paired_log_delta(full, d.pilot_sd, d.pilot_df)
    half_log = st.t.ppf(0.975, 4) * d.pilot_sd / math.sqrt(d.pairs)
    # the rule's promise: ±1 point around the pilot's ratio, once back-transformed
    assert 100 * math.exp(np.mean(pilot)) * math.sinh(half_log) <= 1.0 + 1e-9
    assert delta.lo == pytest.approx(100 * math.expm1(np.mean(full) - half_log))
    assert delta.hi == pytest.approx(100 * math.expm1(np.mean(full) + half_log))
    assert delta.method == "Stein two-stage (pilot of 5 pairs)"


@pytest.mark.parametrize("sd", [0.004, 0.011, 0.03])
def test_stein_procedure_covers_the_true_delta(sd):
    """200 simulated adaptive sweeps with a known Δ (+12%) and per-pair spread: the 95% CI
    covers the truth in at least 93% of them, whatever N each pilot chose."""
    rng = random.Random(20261130)
    true_log = math.log(1.12)
    covered, pairs = 0, []
    for _ in range(200):
        draw = [rng.gauss(true_log, sd) for _ in range(5)]
        d = stats.stein_pairs(draw, 1.0, 5, 60)
        draw += [rng.gauss(true_log, sd) for _ in range(d.pairs - 5)]
        delta = stats.paired_log_delta(draw, d.pilot_sd, d.pilot_df)
        covered += delta.lo <= 12.0 <= delta.hi
        pairs.append(d.pairs)
    assert covered / 200 >= 0.93
    if sd == 0.011:  # the H200's measured spread needs about ten pairs for ±1 point
        assert 6 <= np.median(pairs) <= 16


def test_target_is_in_points_of_the_reported_percentage():
    """At a +16% effect a log half-width of ln(1.01) reads as about ±1.16 points; the rule
    sizes N so the back-transformed interval is ±1 point (found on the H200: ±1.03 at +15.8%)."""
    pilot = [math.log(1.158) + x for x in (-0.0025, -0.0025, -0.0095, 0.0070, 0.0074)]
    d = stats.stein_pairs(pilot, 1.0, 5, 40)
    delta = stats.paired_log_delta(pilot + [math.log(1.158)] * (d.pairs - 5), d.pilot_sd, d.pilot_df)
    assert delta.halfwidth <= 1.0 + 1e-9
    assert d.pairs > stats.stein_pairs([x - math.log(1.158) for x in pilot], 1.0, 5, 40).pairs


def test_paired_and_welch_intervals_match_scipy():
    a, b = [10.0, 10.4, 9.8, 10.1], [11.0, 11.6, 10.9, 11.3]
    lr = np.log(np.array(b) / np.array(a))
    ci = st.ttest_1samp(lr, 0).confidence_interval(0.95)
    d = stats.paired_log_delta(list(lr))
    assert (d.lo, d.hi) == pytest.approx((100 * np.expm1(ci.low), 100 * np.expm1(ci.high)))
    assert d.pct == pytest.approx(100 * np.expm1(lr.mean()))
    w = stats.welch_log_delta(a, b)
    ci = st.ttest_ind(np.log(b), np.log(a), equal_var=False).confidence_interval(0.95)
    assert (w.lo, w.hi) == pytest.approx((100 * np.expm1(ci.low), 100 * np.expm1(ci.high)))


@pytest.mark.parametrize(
    ("per_pair", "expected"),
    [
        ([0.170, 0.171], "too few pairs (2): +18.5%, +18.6%"),
        ([0.15, 0.16, 0.155, 0.158], "faster"),
        ([-0.05, -0.052, -0.049], "slower"),
        ([0.001, -0.002, 0.0005, 0.0, 0.001], "within ±1%"),
        ([0.02, -0.03, 0.01], "inconclusive"),
    ],
)
def test_speed_verdict_wording(per_pair, expected):
    verdict = stats.speed_verdict(stats.paired_log_delta(per_pair), min_pairs=3, equivalence_pct=1.0)
    assert verdict.startswith(expected)
    assert "no significant difference" not in verdict


def test_memory_verdict_in_gib():
    d = stats.paired_abs_delta([35.4, 35.3, 35.4], [30.2, 30.2, 30.1])
    assert d.pct == pytest.approx(-5.2) and stats.memory_verdict(d, 3, 0.35) == "leaner"
    same = stats.paired_abs_delta([30.0, 30.0, 30.0], [30.01, 29.99, 30.0])
    assert stats.memory_verdict(same, 3, 0.3) == "within ±0.30 GiB"
