"""The A/B estimator, the stopping rule and the verdict wording (docs/method.md).

The unit of replication is a run (one process): steps of one run share its compile,
autotune choices and allocator state, so they are never treated as independent samples.
A *pair* (a *round* when there are more than two arms) is a baseline run and an arm run
back to back. Per pair the log-ratio ``ln(arm / baseline)`` of throughput; Δ is the ratio
of geometric means ``exp(mean log-ratio) - 1`` with a Student-t interval on the
log-ratios, back-transformed to percent.

Precision target: Stein's two-stage procedure. A pilot of ``n0`` pairs gives the sample
standard deviation ``s0`` of the log-ratios; the total number of pairs is
``N = max(n0, ceil((t[n0-1] * s0 / h)^2))`` for a log-scale half-width ``h`` that reads as
the target in percentage points once back-transformed around the pilot's ratio, capped at
``max_pairs``. The interval ``mean_N ± t[n0-1] * s0 / sqrt(N)`` then has 95% coverage for
normal log-ratios, whatever N the pilot chose (exact in Stein's original, where N depends on
s0 alone; here N also depends weakly on the pilot's mean through that back-transform, which
the coverage test bounds). The decision depends on the pilot alone, so a resumed sweep
reaches the same N.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from scipy import stats as _st

from bench.results.verdicts import Speed

CONFIDENCE = 0.95
NAN = float("nan")


def t_quantile(df: int) -> float:
    """Two-sided 95% Student-t quantile for ``df`` degrees of freedom."""
    return float(_st.t.ppf(0.5 + CONFIDENCE / 2, df))


def log_halfwidth(pct: float, ratio: float = 1.0) -> float:
    """The log-scale half-width h whose back-transformed interval around ``ratio`` is ``pct``
    percentage points wide on each side: 100 * ratio * sinh(h) = pct.

    The reported interval is [ratio * e^-h - 1, ratio * e^h - 1] in percent, so at a +16%
    effect a log half-width of ln(1.01) reads as ±1.16 points, not ±1.0.
    """
    return math.asinh(pct / (100.0 * ratio))


def to_pct(log_value: float) -> float:
    return 100.0 * math.expm1(log_value)


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else NAN
    return mean, sd


@dataclass
class Delta:
    """Relative change of an arm vs the baseline from paired runs (percent, 95% CI)."""

    n: int
    pct: float = NAN
    lo: float = NAN
    hi: float = NAN
    method: str = ""
    per_pair: list[float] = field(default_factory=list)

    @property
    def halfwidth(self) -> float:
        return (self.hi - self.lo) / 2 if not math.isnan(self.lo) else NAN


def paired_log_delta(
    log_ratios: Sequence[float], pilot_sd: float | None = None, pilot_df: int | None = None
) -> Delta:
    """Δ% from per-pair log-ratios: a t-interval on their mean, back-transformed.

    With ``pilot_sd``/``pilot_df`` (Stein's second stage) the interval uses the pilot's
    standard deviation and degrees of freedom instead of the sample's own.
    """
    lr = [float(x) for x in log_ratios if not math.isnan(float(x))]
    per = [to_pct(x) for x in lr]
    if not lr:
        return Delta(0)
    mean, sd = _mean_sd(lr)
    method = "paired t on log-ratios"
    if pilot_sd is not None and pilot_df is not None and pilot_df >= 1:
        sd, df = pilot_sd, pilot_df
        method = f"Stein two-stage (pilot of {pilot_df + 1} pairs)"
    else:
        df = len(lr) - 1
    if df < 1 or math.isnan(sd):
        return Delta(len(lr), to_pct(mean), method=method, per_pair=per)
    half = t_quantile(df) * sd / math.sqrt(len(lr))
    return Delta(len(lr), to_pct(mean), to_pct(mean - half), to_pct(mean + half), method, per)


def welch_log_delta(a: Sequence[float], b: Sequence[float]) -> Delta:
    """Δ% of B vs A from unpaired runs (two sweeps): Welch's interval on log throughput."""
    la = [math.log(x) for x in a if x > 0]
    lb = [math.log(x) for x in b if x > 0]
    if not la or not lb:
        return Delta(0)
    (ma, sa), (mb, sb) = _mean_sd(la), _mean_sd(lb)
    n = min(len(la), len(lb))
    point = to_pct(mb - ma)
    if len(la) < 2 or len(lb) < 2:
        return Delta(n, point, method="welch t on log throughput")
    va, vb = sa**2 / len(la), sb**2 / len(lb)
    se = math.sqrt(va + vb)
    if se == 0:
        return Delta(n, point, point, point, "welch t on log throughput")
    df = (va + vb) ** 2 / (va**2 / (len(la) - 1) + vb**2 / (len(lb) - 1))
    half = float(_st.t.ppf(0.5 + CONFIDENCE / 2, df)) * se
    return Delta(n, point, to_pct(mb - ma - half), to_pct(mb - ma + half), "welch t on log throughput")


@dataclass(frozen=True)
class SteinDecision:
    """What the pilot decided for one cell: total pairs, and the pilot's sd and degrees of freedom."""

    pairs: int  # total pairs to run (pilot included), after the cap
    wanted: int  # what the rule asked for before the cap
    pilot_sd: float | None  # of the log-ratios; None when the pilot had fewer than 2 usable pairs
    pilot_df: int | None
    capped: bool
    reason: str


def stein_pairs(
    pilot_log_ratios: Sequence[float], halfwidth_pct: float, min_pairs: int, max_pairs: int
) -> SteinDecision:
    """Stein's first stage: the number of pairs that reaches ``halfwidth_pct`` (see module doc)."""
    lr = [float(x) for x in pilot_log_ratios if not math.isnan(float(x))]
    if len(lr) < 2:
        return SteinDecision(
            min_pairs, min_pairs, None, None, False, f"{len(lr)} usable pilot pair(s): no estimate of spread"
        )
    mean, sd = _mean_sd(lr)
    df = len(lr) - 1
    h = log_halfwidth(halfwidth_pct, math.exp(mean))
    wanted = max(min_pairs, math.ceil((t_quantile(df) * sd / h) ** 2 - 1e-9))
    pairs = min(wanted, max_pairs)
    capped = wanted > max_pairs
    reason = f"pilot sd {100 * sd:.2f}% over {len(lr)} pairs -> {wanted} pairs"
    return SteinDecision(
        pairs, wanted, sd, df, capped, reason + (f", capped at {max_pairs}" if capped else "")
    )


def speed_verdict(d: Delta, min_pairs: int, equivalence_pct: float) -> str:
    """Wording for Δ throughput: never "no significant difference".

    Fewer than ``min_pairs`` pairs: "too few pairs (n): +17.0%, +17.1%". A CI inside
    ±equivalence_pct: "within ±X%". A CI above / below 0: "faster" / "slower". Otherwise
    "inconclusive" with the interval.
    """
    return _verdict(d, min_pairs, equivalence_pct, (Speed.FASTER.value, Speed.SLOWER.value), "%")


def _verdict(d: Delta, min_pairs: int, band: float, words: tuple[str, str], unit: str) -> str:
    if d.n == 0 or math.isnan(d.pct):
        return f"{Speed.NOT_AVAILABLE.value} (no complete pair)"
    if d.n < max(2, min_pairs) or math.isnan(d.lo):
        shown = ", ".join(f"{v:+.1f}{unit}" if unit == "%" else f"{v:+.2f}{unit}" for v in d.per_pair)
        return f"{Speed.TOO_FEW.value} ({d.n}): {shown}"
    spec = "+.1f" if unit == "%" else "+.2f"
    ci = f"[{d.lo:{spec}}, {d.hi:{spec}}]{unit}"
    if -band <= d.lo and d.hi <= band:
        return (
            f"{Speed.WITHIN.value}{band:g}{unit}" if unit == "%" else f"{Speed.WITHIN.value}{band:.2f}{unit}"
        )
    if d.lo > 0:
        return words[0]
    if d.hi < 0:
        return words[1]
    return f"{Speed.INCONCLUSIVE.value}: CI {ci} includes 0"


def memory_verdict(d: Delta, min_pairs: int, band_gib: float) -> str:
    """Wording for Δ peak VRAM in GiB (``Delta`` holding GiB, not percent)."""
    return _verdict(d, min_pairs, band_gib, (Speed.HEAVIER.value, Speed.LEANER.value), " GiB")


def paired_abs_delta(base: Sequence[float], other: Sequence[float]) -> Delta:
    """Absolute paired difference (e.g. GiB) with a t-interval; per-pair values kept."""
    diffs = [o - b for b, o in zip(base, other) if not (math.isnan(b) or math.isnan(o))]
    if not diffs:
        return Delta(0)
    mean, sd = _mean_sd(diffs)
    if len(diffs) < 2:
        return Delta(1, mean, method="paired t", per_pair=diffs)
    half = t_quantile(len(diffs) - 1) * sd / math.sqrt(len(diffs))
    return Delta(len(diffs), mean, mean - half, mean + half, "paired t", diffs)
