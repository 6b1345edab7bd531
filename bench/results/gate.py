"""The gates of `bench compare A B`: ``--fail-if-slower PCT`` judges each row's samples/s on its
95% CI of B vs A; ``--fail-if-gain-drops POINTS`` judges each arm's gain over its baseline (B's
paired Δ minus A's, bench/results/gain.py) on the CI of that difference (docs/reference.md, "The
regression gate").

A row fails when the whole CI lies below the threshold (or, for speed, when B has no ok run of a
row A has); it passes when the whole CI lies above it; a CI across it is inconclusive; a row
without per-run values on both sides (point estimates), with too few runs, only in A, of two
different workloads, or whose arm was not in effect on a side (its runs measured something else)
cannot be decided, which is never a pass. One line per row, then one verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from bench import fmt
from bench.arms import AA, BASELINE
from bench.results.columns import DEFAULT_TRAINER
from bench.results.verdicts import parity_failed

EXIT_FAILED = 3  # the gate failed (2 is bad input, 1 an environment fault)
PASS, FAIL, INCONCLUSIVE, UNDECIDED = "pass", "fail", "inconclusive", "not decided"
DIFFERENT = "different workloads"


@dataclass(frozen=True)
class Decision:
    """The gate's outcome for one row of the comparison, and why, in words."""

    name: str
    outcome: str  # PASS, FAIL, INCONCLUSIVE or UNDECIDED
    detail: str


def parse_threshold(value: str | float, flag: str = "--fail-if-slower") -> float:
    """A gate's threshold: a finite number in [0, 100); ValueError (one line) otherwise."""
    try:
        pct = float(value)
    except (TypeError, ValueError):
        pct = math.nan
    if not (math.isfinite(pct) and 0 <= pct < 100):
        if flag == "--fail-if-slower":
            raise ValueError(
                f"--fail-if-slower: {value!r} is not a percentage in [0, 100) "
                "(5 fails a row whose B is slower than A by more than 5%)"
            )
        raise ValueError(
            f"{flag}: {value!r} is not a number of points in [0, 100) "
            "(2 fails an arm whose gain over its baseline is 2 points lower in B than in A)"
        )
    return pct


def row_name(r) -> str:
    """A comparison row as words: its cell's shape, then its arm."""
    trainer = "" if r.trainer == DEFAULT_TRAINER else f"{r.trainer} "
    extra = ""
    for col, tag in (("accumulation_steps", "acc"), ("num_anchors", "anchors")):
        v = getattr(r, col, None)
        if v is not None and not fmt.isnan(v):
            extra += f" {tag}{fmt.integer(v)}"
    nodes = getattr(r, "nodes", 1)
    if not fmt.isnan(nodes) and fmt.num(nodes) > 1:
        extra += f" nodes{fmt.integer(nodes)}"
    return (
        f"{trainer}{r.profile} {r.mode} bs{fmt.integer(r.batch_size)} seq{fmt.integer(r.seq_len)}{extra} "
        f"gpus{fmt.integer(r.gpus)} arm {r.arm}"
    )


def _not_comparable(r, name: str, off: str | None = None) -> Decision | None:
    """Why a row cannot pass: an arm that fails parity on either side (its speed is not a gain),
    an arm not in effect on either side (``off``: "arm not in effect in A (...)": its runs measured
    something else), two different workloads, a row only in A."""
    for side in ("A", "B"):
        verdict = getattr(r, f"parity_{side.lower()}", None)
        if parity_failed(verdict):
            return Decision(name, FAIL, f"{side}'s arm fails parity ({verdict.removeprefix('FAIL: ')})")
    if off:
        return Decision(name, UNDECIDED, off)
    if r.present == DIFFERENT:
        return Decision(name, UNDECIDED, f"not compared: different workloads ({r.workloads_differ})")
    if r.present == "A only":
        return Decision(name, UNDECIDED, "only in A: B has no such row")
    return None


def decide(
    df: pd.DataFrame, pct: float, min_runs: int, off: list[str | None] | None = None
) -> list[Decision | None]:
    """Per row of a comparison (COMPARE_COLUMNS): its Decision; None for a row only in B (new, not
    held). ``off``: per row, why its arm was not in effect on a side (compare.py), or None."""
    off = off or [None] * len(df)
    return [_decide_row(r, pct, min_runs, why) for r, why in zip(df.itertuples(), off, strict=True)]


def _decide_row(r, pct: float, min_runs: int, off: str | None) -> Decision | None:
    if r.present == "B only":
        return None
    name = row_name(r)
    if other := _not_comparable(r, name, off):
        return other
    if math.isnan(r.samples_per_s_a):
        return Decision(name, UNDECIDED, "A has no ok run to hold B to")
    if math.isnan(r.samples_per_s_b):
        return Decision(name, FAIL, f"B has no ok run (A: {r.samples_per_s_a:.2f} samples/s)")
    lacking = [side for side, n in (("A", r.n_runs_a), ("B", r.n_runs_b)) if math.isnan(n)]
    if lacking:
        return Decision(
            name,
            UNDECIDED,
            f"point estimate only: no per-run data for {' and '.join(lacking)} (a summary.csv without its "
            "runs.csv): no CI, no verdict",
        )
    if min(r.n_runs_a, r.n_runs_b) < min_runs:
        return Decision(
            name, UNDECIDED, f"too few runs for a CI ({r.n_runs_a:g} vs {r.n_runs_b:g}; {min_runs} a side)"
        )
    return _on_ci(name, r.samples_per_s_delta_pct, r.samples_per_s_delta_pct_ci95_low,
                  r.samples_per_s_delta_pct_ci95_high, pct, "%", "B slower by")  # fmt: skip


def _on_ci(name: str, delta: float, lo: float, hi: float, limit: float, unit: str, slower: str) -> Decision:
    if math.isnan(lo) or math.isnan(hi):
        return Decision(name, UNDECIDED, "no CI")
    ci = f"[{lo:+.1f}, {hi:+.1f}]"
    if hi < -limit:
        return Decision(name, FAIL, f"{slower} {-delta:.1f}{unit} {ci}")
    if lo >= -limit:
        return Decision(name, PASS, f"{delta:+.1f}{unit} {ci}: CI above -{limit:g}{unit}")
    return Decision(name, INCONCLUSIVE, f"{delta:+.1f}{unit} {ci}: the CI straddles -{limit:g}{unit}")


def decide_gain(
    df: pd.DataFrame,
    points: float,
    min_pairs: int,
    off: list[str | None] | None = None,
    pairing: list[str | None] | None = None,
) -> list[Decision | None]:
    """Per non-baseline row: the gain gate's Decision on B's gain minus A's; None for the rest.
    ``off``: per row, why its arm was not in effect (never a pass); ``pairing``: per row, how a
    sweep's own arm's gain was paired (said in its line), or None."""
    off, pairing = off or [None] * len(df), pairing or [None] * len(df)
    out: list[Decision | None] = []
    for r, why, how in zip(df.itertuples(), off, pairing, strict=True):
        if r.arm in (BASELINE, AA) or r.present == "B only":
            out.append(None)
            continue
        name = row_name(r)
        other = _not_comparable(r, name, why)
        lost = math.isnan(r.samples_per_s_b) and not math.isnan(r.delta_samples_per_s_pct_a)
        if other is None and lost:  # A measured the arm's gain; B has no ok run of it: nothing kept
            other = Decision(
                name, FAIL, f"B has no ok run of the arm (its gain in A: {r.delta_samples_per_s_pct_a:+.1f}%)"
            )
        if other is None:
            other = _gain_undecided(r, name, min_pairs)
        if other is None:
            gain = (
                f"gain {fmt.f(r.delta_samples_per_s_pct_a, '+.1f')}% in A, {fmt.f(r.delta_samples_per_s_pct_b, '+.1f')}% "
                f"in B{f' ({how})' if how else ''}: "
            )
            d = _on_ci(name, r.gain_change_points, r.gain_change_points_ci95_low, r.gain_change_points_ci95_high,
                       points, " points", "gain lower by")  # fmt: skip
            other = Decision(d.name, d.outcome, gain + d.detail)
        out.append(other)
    return out


def _gain_undecided(r, name: str, min_pairs: int) -> Decision | None:
    """Why a row's gain change cannot be judged: no per-run data, no pair of the arm with its
    baseline in a side's runs, or too few pairs; None when it can be."""
    pairs = (fmt.num(r.n_pairs_a, 0), fmt.num(r.n_pairs_b, 0))
    if math.isnan(r.gain_change_points):
        if math.isnan(r.n_runs_a) or math.isnan(r.n_runs_b):
            return Decision(
                name, UNDECIDED, "no paired gain on both sides (per-run data of both arms needed)"
            )
        lacking = " and ".join(s for s, n in zip("AB", pairs) if not n)
        return Decision(
            name, UNDECIDED, f"no pair of the arm and its baseline in {lacking or 'A or B'}'s runs"
        )
    if min(pairs) < min_pairs:
        return Decision(
            name, UNDECIDED, f"too few pairs for a CI ({pairs[0]:g} vs {pairs[1]:g}; {min_pairs} a side)"
        )
    return None


def verdict(
    gates: list[tuple[str, list[Decision | None]]], fail_if_inconclusive: bool = False, within: str = ""
) -> tuple[list[str], str, int]:
    """The gates' lines (per gate a heading and one line per row), the final line and the exit
    status: 0 passed, EXIT_FAILED failed, 2 when a gate could judge no row at all (the inputs
    cannot answer: the final line is then an error's message)."""
    lines: list[str] = []
    everything: list[Decision] = []
    for heading, decisions in gates:
        rows = [d for d in decisions if d is not None]
        lines += ["", heading]
        lines += [f"  {'FAILED' if d.outcome == FAIL else d.outcome:<12} {d.name}: {d.detail}" for d in rows]
        if not any(d.outcome in (PASS, INCONCLUSIVE, FAIL) for d in rows):
            why = f", e.g. {rows[0].name}: {rows[0].detail}" if rows else ": no row is in both A and B"
            flag = heading.split(")")[0].removeprefix("Gate (")
            return (
                lines,
                (
                    f"gate: {flag}: cannot decide any row ({len(rows)} not decided{why}); it needs rows of one "
                    "workload in both A and B and the ok runs of each side in a runs.csv, given or beside each "
                    "summary.csv"
                ),
                2,
            )
        everything += rows
    by = {o: [d for d in everything if d.outcome == o] for o in (PASS, FAIL, INCONCLUSIVE, UNDECIDED)}
    if by[FAIL]:
        first = by[FAIL][0]
        more = len(by[FAIL]) - 1
        tail = f" (and {more} more row{'s' if more > 1 else ''})" if more else ""
        return lines, f"gate: FAILED: {first.name} {first.detail}{tail}", EXIT_FAILED
    counts = "".join(f"; {len(by[o])} {o}" for o in (INCONCLUSIVE, UNDECIDED) if by[o])
    if fail_if_inconclusive and (by[INCONCLUSIVE] or by[UNDECIDED]):
        return lines, f"gate: FAILED (--fail-if-inconclusive): {counts[2:]}", EXIT_FAILED
    n = len(by[PASS])
    return (
        lines,
        f"gate: passed ({n} row{'' if n == 1 else 's'} within {within or 'the thresholds'}{counts})",
        0,
    )


def slower_heading(pct: float) -> str:
    return (
        f"Gate (--fail-if-slower {pct:g}): a row fails when B is slower than A by more than {pct:g}% "
        f"with its whole 95% CI below -{pct:g}%"
    )


def gain_heading(points: float) -> str:
    return (
        f"Gate (--fail-if-gain-drops {points:g}): an arm fails when its gain over the baseline is lower "
        f"in B than in A by more than {points:g} points with the whole 95% CI of the difference below -{points:g}"
    )
