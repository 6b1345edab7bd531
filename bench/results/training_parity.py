"""Training parity: whether an arm trains like the baseline, judged against the A/A floor.

A parity sweep (the sweep key ``parity:``, docs/method.md) trains every arm for hundreds of
steps on data the draft can learn, with one seed, one data order and one schedule, and runs the
``aa`` arm: the baseline again. On a GPU two baseline runs drift apart by themselves (reductions
are not deterministic and training amplifies every difference); that A/A divergence is the
floor an arm's divergence from the baseline is held to. Per metric (loss, accuracy, gradient
norm), per cell and arm:

- the divergence at step t is |x_arm(t) − x_baseline(t)| of the same round (pair); the floor's
  is |x_aa(t) − x_baseline(t)|, or with the ``aa_eps`` arm (the baseline with every weight moved
  by one unit in the last place) the larger of that and |x_aa_eps(t) − x_baseline(t)|: how far
  this cell's training carries one rounding step, which is what an arm that only sums in another
  order can be held to where the machine itself is deterministic (its A/A floor exactly 0); over
  several rounds, the largest of each at every step;
- the steps are cut into windows (``window`` steps, default a tenth of the steps and at least
  10); in each window the RMS of the arm's divergence must stay within ``margin`` times the
  floor's RMS; without an ``aa_eps`` run, plus a small absolute term (``loss_atol``,
  ``accuracy_atol``; for the gradient norm ``grad_norm_rtol`` times the baseline's mean in the
  window), the last resort standing for the sensitivity nobody measured (a deterministic
  machine's A/A floor is exactly 0). With an ``aa_eps`` run the floor is that measurement, and
  adding the stand-in to it would let through what it measured as beyond rounding: on one H200
  the 1% learning-rate error ``lr_off`` moved the gradient norm 7 times the ε-floor, inside the
  bfloat16 term alone (results/h200-parity-unbiased/);
- the arm is *equivalent* when every window is within; else *not equivalent*, naming the worst
  window. No verdict without an A/A run, or when the baseline's loss did not fall by
  ``min_loss_drop_pct`` (nothing was learned, so nothing was compared).

The windowed RMS estimates how far two trajectories are apart at that point of training (one
step's |Δ| is noise: an A/A step can agree by chance); comparing window by window follows the
divergence as it grows. The margin of 2 allows for the floor being measured from one A/A pair:
an arm that only reorders floating-point sums has the A/A pair's distribution of divergence,
and the ratio of two such windowed RMS values rarely exceeds 2.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

import bench.config.typed as typed
from bench.arms import AA, AA_EPS, BASELINE, FLOOR_ARMS
from bench.config.schema import UNIT_ROUNDOFF, ParityKeys
from bench.results.columns import TRAINING_PARITY_COLUMNS
from bench.results.records import RunRecord

METRICS = ("loss", "accuracy", "grad_norm")


GRAD_NORM_RTOL_MIN = 1e-3  # the last-resort term's lower bound (float32's roundoff is far below it)


def settings(sweep: dict) -> dict[str, Any] | None:
    """The sweep's parity section with its defaults filled in, or None (not a parity sweep). A null
    ``grad_norm_rtol`` is one rounding step of the dtype the forward computes in (``compute_dtype``,
    else bfloat16 on a GPU sweep and float32 on a CPU one), at least GRAD_NORM_RTOL_MIN: a fixed
    1e-3 is finer than bfloat16's 2^-8, so a kernel that only sums in another order could fail it
    where the floor is 0 (a deterministic machine, no aa_eps run)."""
    config = sweep.get("config") or {}
    raw = config.get("parity")
    if not isinstance(raw, dict):
        return None
    p = {**typed.defaults(ParityKeys), **raw}
    if p.get("compute_dtype") is None:
        hardware = config.get("hardware") or []
        p["compute_dtype"] = (
            "float32" if "cpu" in (hardware if isinstance(hardware, list) else [hardware]) else "bfloat16"
        )
    p["grad_norm_rtol"] = grad_norm_rtol(p)
    return p


def grad_norm_rtol(p: dict) -> float:
    """The gradient norm's relative last-resort term: the key's value, else one rounding step of
    ``compute_dtype`` (bfloat16 when unknown), at least GRAD_NORM_RTOL_MIN."""
    if p.get("grad_norm_rtol") is not None:
        return float(p["grad_norm_rtol"])
    return max(GRAD_NORM_RTOL_MIN, UNIT_ROUNDOFF[p.get("compute_dtype") or "bfloat16"])


def window_of(steps: int, given: int | None) -> int:
    return int(given) if given else max(10, steps // 10)


def series(records: list[RunRecord]) -> dict[str, dict[str, dict[int, pd.DataFrame]]]:
    """cell -> arm -> round -> the run's per-step metrics (step, loss, accuracy, grad_norm)."""
    out: dict[str, dict[str, dict[int, pd.DataFrame]]] = {}
    for r in records:
        m = r.metrics
        if m.empty or r.repeat is None:
            continue
        cols = ["step", *(c for c in METRICS if c in m.columns)]
        frame = m[cols].drop_duplicates("step").set_index("step").sort_index()
        out.setdefault(str(r.cell_id), {}).setdefault(str(r.arm), {})[int(r.repeat)] = frame
    return out


def divergence(runs: dict[str, dict[int, pd.DataFrame]], arm: str, metric: str) -> pd.Series:
    """Per step, the largest |x_arm − x_baseline| over the rounds that ran both (NaN-free steps)."""
    parts = []
    for rnd, base in runs.get(BASELINE, {}).items():
        other = runs.get(arm, {}).get(rnd)
        if other is None or metric not in base or metric not in other:
            continue
        parts.append((other[metric] - base[metric]).abs().dropna())
    if not parts:
        return pd.Series(dtype=float)
    return pd.concat(parts, axis=1).max(axis=1, skipna=False).dropna()


def baseline_mean(runs: dict[str, dict[int, pd.DataFrame]], metric: str) -> pd.Series:
    frames = [f[metric] for f in runs.get(BASELINE, {}).values() if metric in f]
    return pd.concat(frames, axis=1).mean(axis=1) if frames else pd.Series(dtype=float)


def windows(steps: list[int], width: int) -> list[list[int]]:
    """Consecutive windows of ``width`` steps; a last window shorter than half joins the one before."""
    chunks = [steps[i : i + width] for i in range(0, len(steps), width)]
    if len(chunks) > 1 and len(chunks[-1]) < width / 2:
        tail = chunks.pop()
        chunks[-1] = chunks[-1] + tail
    return chunks


def rms(values: pd.Series) -> float:
    return float(np.sqrt(np.mean(np.square(values.to_numpy(dtype=float))))) if len(values) else math.nan


def tolerance(metric: str, p: dict, sensed: bool) -> float:
    """The absolute (for grad_norm: relative) last-resort term; 0 where an aa_eps run measured the
    sensitivity it stands for (``sensed``)."""
    if sensed:
        return 0.0
    return grad_norm_rtol(p) if metric == "grad_norm" else float(p[f"{metric}_atol"])


def allowed(floor: pd.Series, base: pd.Series, metric: str, p: dict, sensed: bool = False) -> float:
    """What a window's RMS divergence may reach: margin x the floor's RMS, plus the last-resort
    term when no aa_eps run measured the floor (``sensed``)."""
    term = tolerance(metric, p, sensed)
    return p["margin"] * rms(floor) + (term * float(base.abs().mean()) if metric == "grad_norm" else term)


def floor_of(runs: dict[str, dict[int, pd.DataFrame]], metric: str) -> tuple[pd.Series, bool]:
    """The floor per step: the A/A run's divergence from the baseline, or, with an aa_eps run, the
    larger of the two (the ε-A/A run measures how far training carries one rounding step, which a
    deterministic machine's A/A pair, exactly 0, cannot show); empty without an A/A run. And whether
    an aa_eps run measured it (``sensed``: the last-resort terms then stand down)."""
    plain = divergence(runs, AA, metric)
    nudged = divergence(runs, AA_EPS, metric)
    sensed = not nudged.empty
    if plain.empty or not sensed:
        return plain, sensed
    both = pd.concat([plain, nudged], axis=1).dropna()
    return both.max(axis=1), sensed


def first_non_finite(
    runs: dict[str, dict[int, pd.DataFrame]], arm: str, metric: str
) -> tuple[int, float] | None:
    """The first (step, value) at which a run of ``arm`` logged ``metric`` as NaN or ±inf, once the
    metric is logged at all (a trainer that never logs it has no such step); None if none."""
    worst: tuple[int, float] | None = None
    for frame in runs.get(arm, {}).values():
        if metric not in frame:
            continue
        x = pd.to_numeric(frame[metric], errors="coerce")
        finite = np.isfinite(x.to_numpy(dtype=float))
        if not finite.any():
            continue
        bad = x.index[(~finite) & (np.cumsum(finite) > 0)]  # after its first finite value
        if len(bad) and (worst is None or int(bad[0]) < worst[0]):
            worst = (int(bad[0]), float(x.loc[bad[0]]))
    return worst


def judge(runs: dict[str, dict[int, pd.DataFrame]], arm: str, metric: str, p: dict, steps: int) -> dict:
    """One row of training_parity.csv (without the cell's identity). A NaN or infinite value in the
    arm's or the baseline's runs fails the comparison at its step: dropping it would judge only the
    steps before the training broke."""
    floor, sensed = floor_of(runs, metric)
    for who in (arm, BASELINE):
        broken = first_non_finite(runs, who, metric)
        if broken is not None:
            row = {"arm": arm, "metric": metric, "margin": p["margin"], "steps_compared": 0}
            row["tolerance"] = tolerance(metric, p, sensed)
            row["rounds"] = len(set(runs.get(arm, {})) & set(runs.get(BASELINE, {})))
            whose = "the arm's" if who == arm else "the baseline's"
            return {**row, "verdict": f"not equivalent: step {broken[0]}: {whose} {metric} is {broken[1]}"}
    d, base = divergence(runs, arm, metric), baseline_mean(runs, metric)
    common = sorted(set(d.index) & set(floor.index) & set(base.index))
    row: dict[str, Any] = {"arm": arm, "metric": metric, "steps_compared": len(common), "margin": p["margin"]}
    row["tolerance"] = tolerance(metric, p, sensed)
    row["rounds"] = len(set(runs.get(arm, {})) & set(runs.get(BASELINE, {})))
    if d.empty:
        return {**row, "verdict": f"no verdict: {unpaired(runs, arm, metric)}"}
    row.update(max_abs_delta=float(d.max()), last_abs_delta=float(d.iloc[-1]))
    if floor.empty:
        return {**row, "verdict": f"no verdict: no A/A run ({AA}) to measure the floor"}
    row.update(max_abs_delta_floor=float(floor.max()), last_abs_delta_floor=float(floor.iloc[-1]))
    width = window_of(steps, p.get("window"))
    chunks = windows(common, width)
    scored = []
    for chunk in chunks:
        limit = allowed(floor.loc[chunk], base.loc[chunk], metric, p, sensed)
        spread = rms(d.loc[chunk])
        scored.append((spread / limit if limit > 0 else (0.0 if spread == 0 else math.inf), chunk, limit))
    ratio, worst, limit = max(scored, key=lambda s: s[0])
    row.update(window_steps=width, windows=len(chunks), windows_within=sum(s[0] <= 1 for s in scored))
    row.update(worst_window=f"{int(worst[0])}-{int(worst[-1])}", worst_allowed=limit)
    row.update(worst_rms_arm=rms(d.loc[worst]), worst_rms_floor=rms(floor.loc[worst]))
    if ratio <= 1:
        row["verdict"] = "equivalent"
    else:
        row["verdict"] = (
            f"not equivalent: steps {row['worst_window']}, RMS |Δ| {row['worst_rms_arm']:.3g} > "
            f"{limit:.3g} allowed (A/A floor RMS {row['worst_rms_floor']:.3g})"
        )
    return row


def unpaired(runs: dict[str, dict[int, pd.DataFrame]], arm: str, metric: str) -> str:
    """Why an arm's divergence from the baseline is empty, in the runs' own terms: a side with no
    run, a side that never logged the metric (or only NaN), or no round that ran both."""
    for who, name in ((arm, "the arm's"), (BASELINE, "the baseline's")):
        frames = list(runs.get(who, {}).values())
        if not frames:
            return f"no run of {who} to compare"
        values = [pd.to_numeric(f[metric], errors="coerce").dropna() for f in frames if metric in f]
        if not any(len(v) for v in values):
            return f"{name} runs logged no {metric} at any step"
    return "no run of the arm paired with a baseline run of the same round"


def learned(runs: dict[str, dict[int, pd.DataFrame]], p: dict, steps: int) -> dict[str, Any]:
    """The baseline's loss at its first step, over its last window, and the fall in %."""
    loss = baseline_mean(runs, "loss").dropna()
    if loss.empty or first_non_finite(runs, BASELINE, "loss") is not None:
        return {}  # a baseline that broke (NaN, inf) learned nothing to compare: judge() says where
    first, last = float(loss.iloc[0]), float(loss.iloc[-window_of(steps, p.get("window")) :].mean())
    drop = 100.0 * (first - last) / first if first else math.nan
    return {"loss_first_baseline": first, "loss_last_baseline": last, "loss_drop_pct": drop}


def planned_arms(sweep: dict) -> list[str]:
    """The arms the sweep config planned (its ``arms`` and ``user_arms``): each gets its rows, so
    that an arm whose runs all dropped out (failed, cut short, unreadable) reads "no verdict",
    never vanishes from the table."""
    config = sweep.get("config") or {}
    arms = config.get("arms") if isinstance(config.get("arms"), list) else []
    user = config.get("user_arms") if isinstance(config.get("user_arms"), dict) else {}
    return [str(a) for a in dict.fromkeys([*arms, *user])]


def training_parity_table(records: list[RunRecord], sweep: dict) -> pd.DataFrame:
    """training_parity.csv: per cell, arm (not the baseline, not the A/A arm) and metric, the
    verdict against the A/A floor; empty when the sweep is not a parity sweep."""
    p = settings(sweep)
    if p is None:
        return pd.DataFrame(columns=TRAINING_PARITY_COLUMNS)
    cells = {str(r.cell_id): r for r in records if r.cell}
    planned = planned_arms(sweep)
    rows = []
    found = series(records)
    for cell_id in dict.fromkeys([*found, *cells]):  # a cell whose runs all dropped out keeps its rows
        runs = found.get(cell_id, {})
        rec = cells.get(cell_id)
        cell = rec.cell if rec else None  # every record in cells has one
        ident = {
            "cell_id": cell_id,
            "profile": cell.profile if cell else None,
            "mode": cell.mode if cell else None,
        }
        ident["trainer"] = rec.trainer if rec else None
        steps = int(cell.steps or 0) if cell else 0
        fell = learned(runs, p, steps)
        for arm in dict.fromkeys([*planned, *runs]):
            if arm in (BASELINE, *FLOOR_ARMS):
                continue
            for metric in METRICS:
                row = {**ident, **fell, **judge(runs, arm, metric, p, steps)}
                if fell and fell["loss_drop_pct"] < p["min_loss_drop_pct"] and row["verdict"] == "equivalent":
                    row["verdict"] = (
                        f"no verdict: the baseline's loss fell {fell['loss_drop_pct']:.0f}%, under the "
                        f"{p['min_loss_drop_pct']:g}% a learning run shows"
                    )
                rows.append(row)
    return pd.DataFrame(rows).reindex(columns=TRAINING_PARITY_COLUMNS)
