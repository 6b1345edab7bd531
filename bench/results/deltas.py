"""The Δ columns: one arm's ok runs of a cell against a reference arm's (the baseline, or a
contrast's reference), paired by round; Stein's stopping rule per cell (stein_decisions) and
the verdicts, in words, when one side has no ok run. Method: docs/method.md, bench.results.stats.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from bench.arms import AA, BASELINE
from bench.results import stats
from bench.results.columns import RUNS_COLUMNS
from bench.results.verdicts import Speed, speed_kind

NAN = float("nan")


def _by_repeat(ok: pd.DataFrame, col: str) -> pd.Series:
    return ok.drop_duplicates("repeat", keep="last").set_index("repeat")[col]


def log_ratios(base_ok: pd.DataFrame, ok: pd.DataFrame, col: str = "samples_per_s") -> pd.Series:
    """Per pair (repeat) where both runs are ok and have ``col``: ln(arm's / baseline's), samples/s
    unless ``col`` says another ratio scale (energy_j_per_sample)."""
    b, o = _by_repeat(base_ok, col), _by_repeat(ok, col)
    common = b.index.intersection(o.index)
    with np.errstate(divide="ignore", invalid="ignore"):
        lr = np.log(o[common].astype(float) / b[common].astype(float))
    return lr[np.isfinite(lr)].sort_index()


def savings_ms(base_ok: pd.DataFrame, ok: pd.DataFrame) -> tuple[stats.Delta, stats.Delta]:
    """Per pair, the time the arm saves against the reference (reference minus arm, in ms; > 0:
    the arm is faster): per optimizer step (mean steady step time) and per sample (1/samples/s)."""

    def paired(col: str, ms) -> stats.Delta:
        b, o = _by_repeat(base_ok, col).astype(float), _by_repeat(ok, col).astype(float)
        common = b.index.intersection(o.index)
        with np.errstate(divide="ignore"):
            return stats.paired_abs_delta(list(ms(o[common])), list(ms(b[common])))

    return paired("s_per_step_mean", lambda s: 1e3 * s), paired("samples_per_s", lambda r: 1e3 / r)


def _pilot_decision(lr: pd.Series, target: dict) -> stats.SteinDecision:
    pilot = lr[lr.index <= target["min_pairs"]]
    return stats.stein_pairs(
        list(pilot), target["ci_halfwidth_pct"], target["min_pairs"], target["max_pairs"]
    )


def speed_delta(lr: pd.Series, target: dict | None) -> tuple[stats.Delta, stats.SteinDecision | None]:
    """Δ samples/s from one arm's per-pair log-ratios (``lr``, indexed by repeat): the paired
    t-interval, or, for a cell with a precision ``target``, Stein's interval with the spread and
    degrees of freedom of the arm's pilot (its repeats up to min_pairs; the pilot's own t-interval
    while it is all there is); with the pilot's decision (None without a target). The report's
    estimator, and the sweep console's running Δ (bench/run/console.py)."""
    decision = _pilot_decision(lr, target) if target else None
    if decision is not None and decision.pilot_sd is not None:
        return stats.paired_log_delta(list(lr), decision.pilot_sd, decision.pilot_df), decision
    return stats.paired_log_delta(list(lr)), decision


def stein_decisions(runs_df: pd.DataFrame, targets: dict[str, dict]) -> dict[str, stats.SteinDecision]:
    """Per cell with a precision target: how many pairs Stein's rule asks for after the pilot.

    Every non-baseline arm of the cell is judged from its own pilot log-ratios; the cell runs
    as many pairs as its most demanding arm needs. Arms with no usable pilot pair (e.g. a
    skipped Liger arm) do not extend the cell.
    """
    df = runs_df.reindex(columns=RUNS_COLUMNS)
    ok = df[df["status"] == "ok"]
    out: dict[str, stats.SteinDecision] = {}
    for cell_id, target in targets.items():
        cell_ok = ok[ok["cell_id"] == cell_id]
        base = cell_ok[cell_ok["arm"] == BASELINE]
        arms = [a for a in dict.fromkeys(df.loc[df["cell_id"] == cell_id, "arm"]) if a != BASELINE]
        decisions = [_pilot_decision(log_ratios(base, cell_ok[cell_ok["arm"] == a]), target) for a in arms]
        usable = [d for d in decisions if d.pilot_sd is not None]
        if usable:
            out[cell_id] = max(usable, key=lambda d: d.wanted)
        else:
            out[cell_id] = stats.stein_pairs(
                [], target["ci_halfwidth_pct"], target["min_pairs"], target["max_pairs"]
            )
    return out


def _one_sided(
    base_ok, ok, base_statuses: set, statuses: set, arm: str, ref: str = BASELINE
) -> dict[str, Any]:
    """Verdicts when one arm (or both) has no ok run: which arm fits is itself the finding.
    ``ref``: the arm compared against (the baseline, or a contrast's reference)."""
    base_oom = base_ok.empty and "oom" in base_statuses
    arm_oom = ok.empty and "oom" in statuses
    no_base = not base_statuses  # e.g. a capacity probe only one arm's search reached
    if base_oom and arm_oom:
        text = "both arms OOM"
    elif base_oom and not ok.empty:
        text = f"{arm} fits, {ref} OOM"
    elif base_oom:  # the arm has no ok run either (unfinished, failed): nothing says it fits
        text = f"{ref} OOM; " + (f"no {arm} run" if not statuses else f"no ok {arm} run")
    elif arm_oom and not base_ok.empty:
        text = f"{ref} fits, {arm} OOM"
    elif arm_oom:
        text = f"{arm} OOM; " + (f"no {ref} run" if no_base else f"no ok {ref} run")
    elif ok.empty:
        text = "n/a (no ok runs)"
    else:
        text = f"n/a (no {ref} run)" if no_base else f"n/a (no ok {ref})"
    return {"verdict_speed": text, "verdict_memory": text}


def not_in_effect(base_ok: pd.DataFrame, ok: pd.DataFrame, arm: str, ref: str = BASELINE) -> str | None:
    """The verdict when a run of either arm trained a model without its arm's kernels (runs.csv's
    arm_in_effect says "no: ..."): no Δ, since it would compare something else; None otherwise."""
    said = []
    for name, runs in ((arm, ok), (ref, base_ok)):
        col = runs["arm_in_effect"] if "arm_in_effect" in runs else pd.Series(dtype=object)
        bad = col[col.astype(str).str.startswith("no")]
        if len(bad):
            said.append(f"{len(bad)} of {len(runs)} {name} runs: {str(bad.iloc[0]).removeprefix('no: ')}")
    return f"{Speed.NOT_IN_EFFECT.value} ({'; '.join(said)})" if said else None


def not_proven(base_ok: pd.DataFrame, ok: pd.DataFrame, arm: str, ref: str = BASELINE) -> str | None:
    """The verdict when no run says otherwise but a run of either arm recorded nothing of whether
    its arm took effect (runs.csv's arm_in_effect blank: no module census, or keys set and nothing
    of what the trainer resolved them to): its Δ is a measurement, but not of a proven arm, so no
    verdict rests on it. None when every ok run said "yes", or the table has no such column (a
    table of runs from before the record: nothing to hold it to)."""
    said = []
    for name, runs in ((arm, ok), (ref, base_ok)):
        if "arm_in_effect" not in runs:
            return None
        blank = runs["arm_in_effect"].isna() | (runs["arm_in_effect"].astype(str).str.strip() == "")
        if blank.any():
            said.append(f"{int(blank.sum())} of {len(runs)} {name} runs")
    what = "recorded nothing of whether the arm took effect; no verdict"
    return f"{Speed.NOT_PROVEN.value} ({', '.join(said)} {what})" if said else None


def delta_columns(
    base_ok: pd.DataFrame,
    ok: pd.DataFrame,
    target: dict | None,
    equivalence_pct: float,
    arm: str = "",
    base_statuses: set | None = None,
    statuses: set | None = None,
    ref: str = BASELINE,
) -> dict[str, Any]:
    """Columns comparing one arm's ok runs with the baseline's (or ``ref``'s) ok runs of the same cell.

    Δ samples/s: ratio of geometric means over pairs, t-interval on the per-pair log-ratios
    (Stein's interval with the pilot's spread when the cell has a precision target); runs of
    the two arms that share no pair fall back to Welch's interval on log throughput.
    """
    if ok.empty or base_ok.empty:
        return _one_sided(base_ok, ok, base_statuses or set(), statuses or set(), arm, ref)
    failed = not_in_effect(base_ok, ok, arm, ref)
    if failed:
        return {"verdict_speed": failed, "verdict_memory": failed}
    min_pairs = target["min_pairs"] if target else 3
    lr = log_ratios(base_ok, ok)
    row: dict[str, Any] = {}
    if len(lr):
        sps, decision = speed_delta(lr, target)
        if decision is not None:
            row.update(
                precision_target_pct=target["ci_halfwidth_pct"],
                pairs_planned=decision.pairs,
                pairs_wanted=decision.wanted,
                hit_pair_cap=decision.capped,
            )
    else:
        sps = stats.welch_log_delta(
            list(base_ok["samples_per_s"].dropna()), list(ok["samples_per_s"].dropna())
        )
    row.update(
        {
            "n_pairs": sps.n,
            "delta_samples_per_s_pct": sps.pct,
            "delta_samples_per_s_pct_ci95_low": sps.lo,
            "delta_samples_per_s_pct_ci95_high": sps.hi,
            "delta_samples_per_s_halfwidth_pct": sps.halfwidth,
            "delta_samples_per_s_pct_per_pair": " ".join(f"{v:+.2f}" for v in sps.per_pair) or None,
            "verdict_speed": stats.speed_verdict(sps, min_pairs, equivalence_pct)
            if not math.isnan(sps.pct)
            else "n/a (no throughput data)",
            "ci_method": sps.method,
        }
    )
    row.update(_memory_and_time(base_ok, ok, min_pairs, equivalence_pct))
    row.update(energy_delta(base_ok, ok))
    if arm == AA and ref == BASELINE:  # the baseline against itself: a check, not a finding
        aa_target = target["ci_halfwidth_pct"] if target else equivalence_pct
        row["verdict_speed"] = aa_verdict(sps, min_pairs, aa_target, row["verdict_speed"])
    else:  # the Δs stay (measured); the verdicts wait for runs that show the arm in effect
        unproven = not_proven(base_ok, ok, arm, ref)
        if unproven:
            row["verdict_speed"] = unproven
            if speed_kind(row.get("verdict_memory")) is not Speed.NOT_AVAILABLE:  # "no VRAM data" stays
                row["verdict_memory"] = unproven
    return row


def aa_verdict(sps: stats.Delta, min_pairs: int, target_pct: float, speed: str) -> str:
    """The A/A check's verdict (docs/method.md): the small-n rules of every arm first (``speed``,
    the arm's own verdict, says "too few pairs (n): ..." below ``min_pairs``), then FAILED when the
    CI excludes 0, and passed only when it contains 0 and is no wider than ``target_pct`` (the
    cell's precision target, else equivalence_pct): a wide CI contains 0 whatever the noise."""
    if math.isnan(sps.pct) or speed_kind(speed) in (Speed.TOO_FEW, Speed.NOT_AVAILABLE):
        return f"{Speed.AA_NOT_PASSED.value}: {speed}"
    if not sps.lo <= 0 <= sps.hi:
        return (
            f"{Speed.AA_FAILED.value}: CI excludes 0 (a false positive: the suite's noise is underestimated)"
        )
    if sps.halfwidth > target_pct:
        return (
            f"{Speed.AA_TOO_NOISY.value} to resolve ±{target_pct:g} here "
            f"(CI ±{sps.halfwidth:.2f} points, contains 0; more pairs or a quieter machine would)"
        )
    return f"{Speed.AA_PASSED.value}: CI contains 0 (±{sps.halfwidth:.2f} points)"


def energy_delta(base_ok: pd.DataFrame, ok: pd.DataFrame) -> dict[str, Any]:
    """Δ energy per sample (J/sample, the arm vs the reference) with the estimator of Δ samples/s:
    per pair the log-ratio, the ratio of geometric means with a t-interval on the log-ratios. Pairs
    only (a pair with a run without energy drops out), and the plain interval: Stein's rule chose
    the number of pairs for samples/s, not for energy."""
    col = "energy_j_per_sample"  # absent from tables of runs recorded without it: no pair
    d = stats.paired_log_delta(list(log_ratios(base_ok, ok, col)) if col in base_ok and col in ok else [])
    return {
        "energy_n_pairs": d.n,
        "delta_energy_per_sample_pct": d.pct,
        "delta_energy_per_sample_pct_ci95_low": d.lo,
        "delta_energy_per_sample_pct_ci95_high": d.hi,
    }


def _memory_and_time(
    base_ok: pd.DataFrame, ok: pd.DataFrame, min_pairs: int, equivalence_pct: float
) -> dict[str, Any]:
    """Δ peak VRAM (paired, GiB and %), its verdict, and the time saved per step and per sample."""
    b_vram, o_vram = _by_repeat(base_ok, "peak_vram_gib"), _by_repeat(ok, "peak_vram_gib")
    common = b_vram.index.intersection(o_vram.index)
    vram = stats.paired_abs_delta(list(b_vram[common]), list(o_vram[common]))
    per_step, per_sample = savings_ms(base_ok, ok)
    base_vram = base_ok["peak_vram_gib"].mean()
    band_gib = equivalence_pct / 100 * base_vram if base_vram > 0 else 0.0
    return {
        "delta_peak_vram_gib": vram.pct,
        "delta_peak_vram_gib_ci95_low": vram.lo,
        "delta_peak_vram_gib_ci95_high": vram.hi,
        "delta_peak_vram_pct": 100 * vram.pct / base_vram if base_vram > 0 else NAN,
        "delta_torch_peak_allocated_gib": ok["torch_peak_allocated_gib"].mean()
        - base_ok["torch_peak_allocated_gib"].mean(),
        "saved_ms_per_step": per_step.pct,
        "saved_ms_per_step_ci95_low": per_step.lo,
        "saved_ms_per_step_ci95_high": per_step.hi,
        "saved_ms_per_sample": per_sample.pct,
        "saved_ms_per_sample_ci95_low": per_sample.lo,
        "saved_ms_per_sample_ci95_high": per_sample.hi,
        "verdict_memory": stats.memory_verdict(vram, min_pairs, band_gib)
        if not math.isnan(vram.pct)
        else "n/a (no VRAM data)",
    }
