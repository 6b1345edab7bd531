"""The regression gate of `bench compare A B --fail-if-slower PCT`: each row of the comparison
judged against the threshold on its 95% CI of B vs A (README, "The regression gate").

A row fails when B is slower than A by more than PCT% with the whole CI below -PCT% (or when
B has no ok run of a row A has); it passes when the whole CI lies above -PCT%; a CI across
-PCT% is inconclusive; a row without per-run values on both sides (or with too few runs, or
only in A) cannot be decided, which is not a pass. One line per row, then one verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from bench import fmt
from bench.results.columns import DEFAULT_TRAINER

EXIT_FAILED = 3  # the gate failed (2 is bad input, 1 an environment fault)
PASS, FAIL, INCONCLUSIVE, UNDECIDED = "pass", "fail", "inconclusive", "not decided"


@dataclass(frozen=True)
class Decision:
    """The gate's outcome for one row of the comparison, and why, in words."""

    name: str
    outcome: str  # PASS, FAIL, INCONCLUSIVE or UNDECIDED
    detail: str


def parse_threshold(value: str | float) -> float:
    """--fail-if-slower's PCT: a finite percentage in [0, 100); ValueError (one line) otherwise."""
    try:
        pct = float(value)
    except (TypeError, ValueError):
        pct = math.nan
    if not (math.isfinite(pct) and 0 <= pct < 100):
        raise ValueError(
            f"--fail-if-slower: {value!r} is not a percentage in [0, 100) "
            "(5 fails a row whose B is slower than A by more than 5%)"
        )
    return pct


def row_name(r) -> str:
    """A comparison row as words: its cell's shape, then its arm."""
    trainer = "" if r.trainer == DEFAULT_TRAINER else f"{r.trainer} "
    return (
        f"{trainer}{r.profile} {r.mode} bs{fmt.integer(r.batch_size)} seq{fmt.integer(r.seq_len)} "
        f"gpus{fmt.integer(r.gpus)} arm {r.arm}"
    )


def decide(df: pd.DataFrame, pct: float, min_runs: int) -> list[Decision | None]:
    """Per row of a comparison (COMPARE_COLUMNS): its Decision; None for a row only in B (new, not held)."""
    return [_decide_row(r, pct, min_runs) for r in df.itertuples()]


def _decide_row(r, pct: float, min_runs: int) -> Decision | None:
    if r.present == "B only":
        return None
    name = row_name(r)
    if r.present == "A only":
        return Decision(name, UNDECIDED, "only in A: B has no such row")
    if math.isnan(r.samples_per_s_a):
        return Decision(name, UNDECIDED, "A has no ok run to hold B to")
    if math.isnan(r.samples_per_s_b):
        return Decision(name, FAIL, f"B has no ok run (A: {r.samples_per_s_a:.2f} samples/s)")
    lacking = [side for side, n in (("A", r.n_runs_a), ("B", r.n_runs_b)) if math.isnan(n)]
    if lacking:
        return Decision(
            name,
            UNDECIDED,
            f"no per-run values for {' and '.join(lacking)} (no usable runs.csv beside its summary.csv): no CI",
        )
    if min(r.n_runs_a, r.n_runs_b) < min_runs:
        return Decision(
            name, UNDECIDED, f"too few runs for a CI ({r.n_runs_a:g} vs {r.n_runs_b:g}; {min_runs} a side)"
        )
    lo, hi = r.samples_per_s_delta_pct_ci95_low, r.samples_per_s_delta_pct_ci95_high
    if math.isnan(lo) or math.isnan(hi):
        return Decision(name, UNDECIDED, "no CI")
    ci = f"[{lo:+.1f}, {hi:+.1f}]"
    delta = r.samples_per_s_delta_pct
    if hi < -pct:
        return Decision(name, FAIL, f"B slower by {-delta:.1f}% {ci}")
    if lo >= -pct:
        return Decision(name, PASS, f"{delta:+.1f}% {ci}: CI above -{pct:g}%")
    return Decision(name, INCONCLUSIVE, f"{delta:+.1f}% {ci}: the CI straddles -{pct:g}%")


def verdict(
    decisions: list[Decision | None], pct: float, fail_if_inconclusive: bool = False
) -> tuple[list[str], str, int]:
    """The gate's lines (a heading, one per row), its final line and the exit status:
    0 passed, EXIT_FAILED failed, 2 when no row could be judged at all (the inputs cannot
    answer: the final line is then an error's message)."""
    rows = [d for d in decisions if d is not None]
    lines = [
        "",
        f"Gate (--fail-if-slower {pct:g}): a row fails when B is slower than A by more than {pct:g}% "
        f"with its whole 95% CI below -{pct:g}%",
    ]
    lines += [f"  {'FAILED' if d.outcome == FAIL else d.outcome:<12} {d.name}: {d.detail}" for d in rows]
    by = {o: [d for d in rows if d.outcome == o] for o in (PASS, FAIL, INCONCLUSIVE, UNDECIDED)}
    if by[FAIL]:
        first = by[FAIL][0]
        more = len(by[FAIL]) - 1
        tail = f" (and {more} more row{'s' if more > 1 else ''})" if more else ""
        return lines, f"gate: FAILED: {first.name} {first.detail}{tail}", EXIT_FAILED
    if not by[PASS] and not by[INCONCLUSIVE]:
        why = f", e.g. {rows[0].name}: {rows[0].detail}" if rows else ": no row is in both A and B"
        final = (
            f"gate: cannot decide any row ({len(rows)} not decided{why}); it needs rows in both A and B "
            "and the ok runs of each side in a runs.csv, given or beside each summary.csv"
        )
        return lines, final, 2
    counts = "".join(f"; {len(by[o])} {o}" for o in (INCONCLUSIVE, UNDECIDED) if by[o])
    if fail_if_inconclusive and (by[INCONCLUSIVE] or by[UNDECIDED]):
        return lines, f"gate: FAILED (--fail-if-inconclusive): {counts[2:]}", EXIT_FAILED
    n = len(by[PASS])
    return lines, f"gate: passed ({n} row{'' if n == 1 else 's'} within -{pct:g}%{counts})", 0
