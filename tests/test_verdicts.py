"""Verdicts as values: every verdict a producer writes reads back as its kind, so readers compare
members (bench/results/verdicts.py), never prefixes of their own."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.results import stats
from bench.results.deltas import aa_verdict
from bench.results.parity import parity_verdict
from bench.results.verdicts import DECIDED, Parity, Speed, parity_failed, parity_kind, speed_kind


# The A/A check's kind of the same pairs (docs/method.md's A/A table): a CI that excludes 0 FAILED;
# the WITHIN pairs' CI contains 0 and is ±0.10 wide (sd 0.079 points: 2.776 · 0.079 / √5), within
# the target 1; the INCONCLUSIVE pairs' is ±2.3 (sd 1.85 points), too noisy for ±1; one pair is too few.
@pytest.mark.parametrize(
    ("per_pair", "band", "kind", "aa_kind"),
    [
        ([5.0, 6.0, 5.5, 6.2, 5.1], 1.0, Speed.FASTER, Speed.AA_FAILED),
        ([-5.0, -6.0, -5.5, -6.2, -5.1], 1.0, Speed.SLOWER, Speed.AA_FAILED),
        ([0.1, -0.1, 0.05, -0.05, 0.0], 1.0, Speed.WITHIN, Speed.AA_PASSED),
        ([2.0, -2.5, 1.5, -1.0, 0.5], 1.0, Speed.INCONCLUSIVE, Speed.AA_TOO_NOISY),
        ([5.0], 1.0, Speed.TOO_FEW, Speed.AA_NOT_PASSED),
    ],
)
def test_what_the_statistics_write_reads_back_as_its_kind(per_pair, band, kind, aa_kind):
    import math

    d = stats.paired_log_delta([math.log1p(p / 100) for p in per_pair])
    text = stats.speed_verdict(d, 3, band)
    assert speed_kind(text) is kind
    assert (kind in DECIDED) == text.startswith(("faster", "slower", "within"))
    aa = aa_verdict(d, 3, band, text)
    assert speed_kind(aa) is aa_kind


def test_one_sided_and_parity_words_read_back():
    assert speed_kind("liger fits, baseline OOM") is Speed.OOM and speed_kind("both arms OOM") is Speed.OOM
    assert speed_kind("n/a (no ok runs)") is Speed.NOT_AVAILABLE and speed_kind(float("nan")) is None
    rows = pd.DataFrame(
        {"passed": [True, False], "last_step_abs_delta": [1e-4, 0.3], "tolerance": [0.01, 0.01]}
    )
    assert parity_kind(parity_verdict(rows)) is Parity.FAIL and parity_failed(parity_verdict(rows))
    assert parity_kind(parity_verdict(rows[:1])) is Parity.PASS
    assert parity_kind(parity_verdict(rows, "aa_eps")) is Parity.FLOOR and not parity_failed(
        parity_verdict(rows, "aa_eps")
    )
    assert parity_failed("not equivalent: steps 1-20, RMS |Δ| 0.3 > 0.01 allowed") and not parity_failed(
        "equivalent"
    )
