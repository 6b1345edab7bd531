"""Exact, hand-computed cases for the statistics that a test-strength audit's mutants got past:
a NaN log-ratio dropped (never read as 0), the equivalence band and the A/A check's "contains 0"
with their ends included, Stein's rule taking the most demanding arm and flagging the cap only
when the pilot asked for more, and the gain gate (its delta-method CI, its too-few-pairs guard).

Every expected number is worked out in the comments from the formulas of docs/method.md and the
printed Student-t table (two-sided 95%: t(2) = 4.303, t(4) = 2.776), never read off the code."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from bench.results import gain, gate, stats
from bench.results.deltas import aa_verdict, log_ratios, stein_decisions
from bench.results.verdicts import Speed, speed_kind

T2, T4 = 4.303, 2.776  # the printed table's t(0.975; df = 2) and t(0.975; df = 4)
NAN = float("nan")


# -- a NaN log-ratio is dropped, not counted as 0 ---------------------------------------------


def test_a_nan_log_ratio_is_dropped_from_the_paired_interval():
    """[0.1, NaN, 0.2, 0.3]: the three real pairs, mean 0.2, sd 0.1, df 2. Δ = e^0.2 - 1 = +22.140%;
    half-width 4.303 * 0.1 / √3 = 0.24843, so the CI is [e^-0.04843 - 1, e^0.44843 - 1] =
    [-4.727%, +56.583%]. Read as 0, the NaN would give 4 pairs and Δ = e^0.15 - 1 = +16.18%."""
    d = stats.paired_log_delta([0.1, NAN, 0.2, 0.3])
    assert d.n == 3 and len(d.per_pair) == 3
    assert d.pct == pytest.approx(22.140, abs=1e-3)
    assert d.lo == pytest.approx(-4.727, abs=5e-3) and d.hi == pytest.approx(56.583, abs=1e-2)


def test_a_nan_pilot_pair_is_dropped_from_steins_rule():
    """The pilot [0.1, NaN, 0.2, 0.3] has three usable pairs: sd 0.1, df 2 (as 0 it would be four,
    df 3, sd 0.1258)."""
    d = stats.stein_pairs([0.1, NAN, 0.2, 0.3], 1.0, 3, 10)
    assert d.pilot_df == 2 and d.pilot_sd == pytest.approx(0.1, abs=1e-12)


def test_a_pair_with_a_nan_throughput_has_no_log_ratio():
    """Repeat 2's arm run has no samples/s: its pair drops out, the others are ln(11/10), ln(12/10)."""
    base = pd.DataFrame({"repeat": [1, 2, 3], "samples_per_s": [10.0, 10.0, 10.0]})
    arm = pd.DataFrame({"repeat": [1, 2, 3], "samples_per_s": [11.0, NAN, 12.0]})
    lr = log_ratios(base, arm)
    assert list(lr.index) == [1, 3]
    assert list(lr) == pytest.approx([math.log(1.1), math.log(1.2)])


def test_a_gain_sides_nan_throughput_has_no_log_ratio():
    from bench.results.compare_inputs import row_key

    row = {"cell_id": "c", "trainer": "embedded", "profile": "p", "mode": "offline", "batch_size": 2}
    row |= {"seq_len": 64, "gpus": 1, "accumulation_steps": 1, "num_anchors": 8, "nodes": 1}
    rows = [
        {**row, "arm": arm, "repeat": r, "samples_per_s": v}
        for arm, values in (("baseline", [10.0, 10.0, 10.0]), ("liger", [11.0, NAN, 12.0]))
        for r, v in zip((1, 2, 3), values, strict=True)
    ]
    runs = pd.DataFrame(rows)
    key = row_key({**row, "arm": "liger"})
    assert gain.side_log_ratios(runs, key) == pytest.approx([math.log(1.1), math.log(1.2)])


# -- boundaries: the band's and the A/A check's ends belong to them ----------------------------


def test_a_ci_exactly_on_the_band_is_within():
    """docs/method.md: "within ±X%" when the whole CI lies inside ±equivalence_pct; [-1, +1] does."""
    d = stats.Delta(5, 0.0, -1.0, 1.0, per_pair=[0.0] * 5)
    assert stats.speed_verdict(d, 3, 1.0) == "within ±1%"
    gib = stats.Delta(5, 0.0, -0.5, 0.5, per_pair=[0.0] * 5)
    assert stats.memory_verdict(gib, 3, 0.5) == "within ±0.50 GiB"
    wider = stats.Delta(5, 0.0, -1.0, 1.01, per_pair=[0.0] * 5)
    assert stats.speed_verdict(wider, 3, 1.0) == "inconclusive: CI [-1.0, +1.0]% includes 0"


@pytest.mark.parametrize(("lo", "hi"), [(0.0, 1.0), (-1.0, 0.0)])
def test_an_aa_ci_with_an_end_at_zero_contains_zero(lo, hi):
    """A CI [0, 1] (or [-1, 0]) contains 0: its half-width is 0.5 ≤ the target 1, so the check passes."""
    d = stats.Delta(5, (lo + hi) / 2, lo, hi, per_pair=[0.5] * 5)
    assert (
        aa_verdict(d, 3, 1.0, stats.speed_verdict(d, 3, 1.0))
        == "A/A check passed: CI contains 0 (±0.50 points)"
    )
    off = stats.Delta(5, 0.5, 0.001, 1.0, per_pair=[0.5] * 5)
    assert speed_kind(aa_verdict(off, 3, 1.0, stats.speed_verdict(off, 3, 1.0))) is Speed.AA_FAILED


# -- Stein's rule: the cap flag, and the most demanding arm ------------------------------------

# A pilot of three log-ratios [-0.01, 0, +0.01]: mean 0 (ratio 1), sd 0.01, df 2. For ±1 point the
# log half-width is h = asinh(1 / 100) = 0.0099998, so N = ⌈(4.303 · 0.01 / 0.0099998)²⌉ = ⌈18.52⌉ = 19.
SPREAD = [-0.01, 0.0, 0.01]


def test_the_cap_flag_is_set_only_when_the_pilot_asked_for_more_than_the_cap():
    at_cap = stats.stein_pairs(SPREAD, 1.0, 3, 19)
    assert (at_cap.wanted, at_cap.pairs, at_cap.capped) == (19, 19, False)
    assert "capped" not in at_cap.reason
    over = stats.stein_pairs(SPREAD, 1.0, 3, 18)
    assert (over.wanted, over.pairs, over.capped) == (19, 18, True)
    assert over.reason.endswith("capped at 18")


def _cell_runs(arms: dict[str, list[float]]) -> pd.DataFrame:
    """Runs of cell c: per arm its samples/s in repeats 1, 2, 3 (all ok)."""
    rows = [
        {"cell_id": "c", "arm": arm, "repeat": r, "status": "ok", "samples_per_s": v}
        for arm, values in arms.items()
        for r, v in enumerate(values, start=1)
    ]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("order", [("liger", "aa"), ("aa", "liger")])
def test_a_multi_arm_cell_runs_the_pairs_its_most_demanding_arm_wants(order):
    """liger's pilot log-ratios are SPREAD (19 pairs wanted); aa's are all ln(1.01) (sd 0: the pilot's
    3 suffice). With a cap of 10 the cell runs 10 pairs, capped, 19 wanted: docs/method.md, "each
    arm's pilot asks for its own N and the cell runs the largest"."""
    values = {
        "liger": [100 * math.exp(x) for x in SPREAD],
        "aa": [101.0, 101.0, 101.0],
    }
    runs = _cell_runs({"baseline": [100.0] * 3, **{a: values[a] for a in order}})
    d = stein_decisions(runs, {"c": {"ci_halfwidth_pct": 1.0, "min_pairs": 3, "max_pairs": 10}})["c"]
    assert (d.pairs, d.wanted, d.capped) == (10, 19, True)


# -- the gain gate: its CI by hand, and its too-few-pairs guard -------------------------------


def test_the_gain_changes_ci_carries_each_sides_delta_method_factor():
    """Both sides: log-ratios m + [-0.01, 0, 0.01] with m = ln 1.25 (a +25% gain), so the point is 0.
    Each side's variance of its gain in points: (100 · e^m)² · sd² / n = 125² · 1e-4 / 3 = 0.520833;
    se = √(2 · 0.520833) = 1.020621; equal variances and n give Welch's df = 2 (n - 1) = 4, so the
    half-width is 2.776 · 1.020621 = 2.8333 points (without A's factor 125² it would be
    √(1e-4 · 1e4 / 3 + 0.520833) = 0.9242 at df 3.8, ±2.59)."""
    m = math.log(1.25)
    side = [m - 0.01, m, m + 0.01]
    g = gain.gain_change(side, list(side))
    assert g.n == 3 and g.pct == pytest.approx(0.0, abs=1e-9)
    assert g.hi == pytest.approx(2.8333, abs=2e-3) and g.lo == pytest.approx(-2.8333, abs=2e-3)
    assert g.hi == pytest.approx(T4 * math.sqrt(2 * 125**2 * 1e-4 / 3), abs=2e-3)
    # A's gain smaller by 10 points: the point moves by exactly that, A's factor shrinks to 115
    a = [x - math.log(1.25) + math.log(1.15) for x in side]
    g2 = gain.gain_change(a, list(side))
    assert g2.pct == pytest.approx(10.0, abs=1e-9)
    va, vb = 115**2 * 1e-4 / 3, 125**2 * 1e-4 / 3  # 0.440833, 0.520833
    se = math.sqrt(va + vb)  # 0.980646
    assert g2.hi - g2.pct == pytest.approx(se * 2.78, abs=0.02)  # df 3.97: t between 2.776 and 2.80


def _gain_row(pairs_a: float, pairs_b: float) -> pd.DataFrame:
    """One compared arm whose gain fell from +16% in A to +6% in B, CI [-12, -8] points."""
    row = {
        "present": "both", "arm": "liger", "trainer": "embedded", "profile": "p", "mode": "offline",
        "batch_size": 2, "seq_len": 64, "gpus": 1, "parity_a": None, "parity_b": None,
        "samples_per_s_b": 10.0, "delta_samples_per_s_pct_a": 16.0, "delta_samples_per_s_pct_b": 6.0,
        "n_pairs_a": pairs_a, "n_pairs_b": pairs_b, "gain_change_points": -10.0,
        "gain_change_points_ci95_low": -12.0, "gain_change_points_ci95_high": -8.0,
    }  # fmt: skip
    return pd.DataFrame([row])


def test_the_gain_gate_does_not_decide_on_too_few_pairs_a_side():
    (few,) = gate.decide_gain(_gain_row(2, 5), 2.0, gain.MIN_PAIRS)
    assert few.outcome == gate.UNDECIDED
    assert few.detail == "too few pairs for a CI (2 vs 5; 3 a side)"
    (enough,) = gate.decide_gain(_gain_row(3, 3), 2.0, gain.MIN_PAIRS)  # 3 a side: decided
    assert enough.outcome == gate.FAIL and "gain lower by 10.0 points [-12.0, -8.0]" in enough.detail


def test_the_stein_interval_for_a_case_by_hand():
    """A second stage of 5 pairs [0.01]*5 with the pilot's sd 0.01 over 3 pairs (df 2): half-width
    4.303 · 0.01 / √5 = 0.019243, so Δ = e^0.01 - 1 = +1.005% in [e^-0.009243 - 1, e^0.029243 - 1]
    = [-0.920%, +2.968%]."""
    d = stats.paired_log_delta([0.01] * 5, 0.01, 2)
    assert d.n == 5 and d.method == "Stein two-stage (pilot of 3 pairs)"
    assert d.pct == pytest.approx(1.005, abs=1e-3)
    assert d.lo == pytest.approx(-0.920, abs=2e-3) and d.hi == pytest.approx(2.968, abs=2e-3)
    half = T2 * 0.01 / math.sqrt(5)  # the same by the table's t
    assert d.lo == pytest.approx(100 * math.expm1(0.01 - half), abs=2e-3)
