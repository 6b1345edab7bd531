"""PNG plots drawn from the runs themselves: loss curves with a |Δ loss| panel per cell (each
arm's distance from its pair's baseline, step by step, on a log scale against the tolerance;
failing arms marked), and steady-state step-time distributions that outliers cannot squash
(boxes without fliers, the axis fitted to the whiskers, every outlier drawn or counted).
``loss_gaps`` and ``step_time_view`` are the data they draw. Only runs that entered the
statistics are drawn (parity.in_statistics_records).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bench.arms import BASELINE
from bench.results.canvas import arms_in_order, color, grid, note, save, wrap
from bench.results.parity import DEFAULT_TOLERANCE, arm_pairs, in_statistics_records, pair_deltas
from bench.results.records import RunRecord

LOSS_GAP_COLUMNS = ["cell_id", "arm", "repeat", "step", "abs_delta", "tolerance", "passed"]
LOG_FLOOR = 1e-7  # |Δ loss| of 0 (bit-identical losses) is drawn here on the log axis


def measured(records: list[RunRecord], runs: pd.DataFrame | None = None) -> list[RunRecord]:
    """The runs that entered the statistics (``runs``: runs.csv's table of ``records``, if at hand)."""
    return in_statistics_records(records, runs)


def _cells(records: list[RunRecord]) -> list[str]:
    return list(dict.fromkeys(str(r.cell_id) for r in records))


def loss_gaps(
    records: list[RunRecord], runs: pd.DataFrame | None = None, default_tolerance: float = DEFAULT_TOLERANCE
) -> pd.DataFrame:
    """Per (cell, arm, repeat, step): |loss of the arm − loss of the baseline of the same pair|,
    the cell's tolerance and whether the pair passes (parity.pair_deltas, as loss_parity.csv
    decides: |Δ| at the last common step ≤ tolerance)."""
    frames = []
    for arms in arm_pairs(measured(records, runs)).values():
        base = arms.get(BASELINE)
        for arm, other in arms.items():
            if base is None or arm == BASELINE:
                continue
            j, tol = pair_deltas(base, other, default_tolerance)
            if j.empty:
                continue
            frames.append(pd.DataFrame({
                "cell_id": str(base.cell_id), "arm": arm, "repeat": base.repeat, "step": j["step"],
                "abs_delta": j["abs_delta"], "tolerance": tol, "passed": bool(j["abs_delta"].iloc[-1] <= tol),
            }))  # fmt: skip
    if not frames:
        return pd.DataFrame(columns=LOSS_GAP_COLUMNS)
    return pd.concat(frames, ignore_index=True)[LOSS_GAP_COLUMNS]


def _loss_panel(ax, runs: list[RunRecord], arms: list[str]) -> None:
    warmup = max(r.warmup_steps for r in runs)
    if warmup > 0:
        ax.axvspan(
            0.5, warmup + 0.5, color="0.88", label=f"warm-up ({warmup} step{'s' * (warmup != 1)}, dropped)"
        )
    labelled = set()
    for r in runs:
        arm = str(r.arm)
        ax.plot(r.metrics["step"], r.metrics["loss"], color=color(arm, arms), linestyle="-" if arm == BASELINE else "--",
                alpha=0.8, label=None if arm in labelled else arm)  # fmt: skip
        labelled.add(arm)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7.5)


def _gap_panel(ax, gaps: pd.DataFrame, arms: list[str]) -> None:
    if gaps.empty:
        note(ax, "no arm to compare with the baseline")
        return
    labelled: set[str] = set()
    for (arm, _repeat), g in gaps.groupby(["arm", "repeat"], sort=False):
        failed = not g["passed"].iloc[0]
        fails = not gaps[gaps["arm"] == arm]["passed"].all()
        label = None if arm in labelled else f"{arm}: FAILS parity" if fails else arm
        labelled.add(arm)
        y = g["abs_delta"].clip(lower=LOG_FLOOR)
        ax.plot(g["step"], y, color=color(arm, arms), marker="x" if failed else None, lw=2.2 if failed else 1.2,
                alpha=0.85, label=label)  # fmt: skip
    tol = gaps["tolerance"].max()
    ax.axhline(tol, color="tab:red", ls=":", lw=1.2, label=f"tolerance {tol:g}")
    ax.axhspan(LOG_FLOOR * 0.5, LOG_FLOOR * 1.5, color="0.9", lw=0)
    ax.set_yscale("log")
    ax.set_ylim(LOG_FLOOR * 0.5, max(tol * 20, gaps["abs_delta"].max() * 2))
    ax.set_xlabel("step")
    ax.set_ylabel(f"|Δ loss| vs baseline (0 drawn at {LOG_FLOOR:g})")
    ax.legend(fontsize=7.5)


def plot_loss_curves(records: list[RunRecord], path: str | Path, runs: pd.DataFrame | None = None) -> Path:
    """Per cell two panels: loss vs step (baseline solid, other arms dashed, warm-up shaded) and
    each arm's |Δ loss| vs its pair's baseline on a log scale with the tolerance line."""
    runs_all = measured(records, runs)
    cells = _cells(runs_all)
    fig, axes = grid(2 * max(1, len(cells)), "Loss (left) and |Δ loss| vs the baseline of the same pair (right)",
                     width=5.2, height=3.6, ncols=2)  # fmt: skip
    if not cells:
        note(axes[0], "no ok runs")
        axes[1].set_visible(False)
    arms = arms_in_order(r.arm for r in records)  # every arm: the colours of the other plots
    gaps = loss_gaps(records, runs)
    for k, cell in enumerate(cells):
        left, right = axes[2 * k], axes[2 * k + 1]
        runs = [r for r in runs_all if str(r.cell_id) == cell and r.metrics["loss"].notna().any()]
        left.set_title(wrap(cell, 60), fontsize=9)
        right.set_title("|Δ loss| (log)", fontsize=9)
        if not runs:
            note(left, "no losses logged")
            note(right, "no losses logged")
            continue
        _loss_panel(left, runs, arms)
        _gap_panel(right, gaps[gaps["cell_id"] == cell], arms)
    return save(fig, path)


def step_time_view(values: dict[str, np.ndarray]) -> dict[str, object]:
    """The y-range that shows every box's whiskers (1.5 IQR) with a margin, and per arm the
    steps above it: {"ylim": (lo, hi), "above": {arm: [values]}, "outliers": {arm: [values]}}."""
    lows, highs, above, outliers = [], [], {}, {}
    for arm, v in values.items():
        q1, q3 = np.percentile(v, [25, 75])
        iqr = q3 - q1
        inside = v[(v >= q1 - 1.5 * iqr) & (v <= q3 + 1.5 * iqr)]
        lows.append(inside.min())
        highs.append(inside.max())
        outliers[arm] = sorted(v[(v < q1 - 1.5 * iqr) | (v > q3 + 1.5 * iqr)].tolist())
    lo, hi = min(lows), max(highs)
    pad = max(hi - lo, 1e-3 * max(hi, 1e-9)) * 0.25
    ylim = (lo - pad, hi + pad)
    for arm, out in outliers.items():
        above[arm] = [x for x in out if x > ylim[1]]
    return {"ylim": ylim, "above": above, "outliers": outliers}


def plot_step_time_dist(records: list[RunRecord], path: str | Path, runs: pd.DataFrame | None = None) -> Path:
    """Box plots of steady-state step times per arm (measured runs, repeats pooled), one panel
    per cell; outliers drawn as points, those past the axis counted at its top edge."""
    cells = _cells(records)
    included = measured(records, runs)
    fig, axes = grid(
        max(1, len(cells)), "Steady-state step time (warm-up dropped; repeats pooled; o: outlier steps)"
    )
    if not cells:
        note(axes[0], "no runs")
    for ax, cell in zip(axes, cells):
        ax.set_title(wrap(cell, 60), fontsize=9)
        ok = [r for r in included if str(r.cell_id) == cell]
        arms = [a for a in arms_in_order(r.arm for r in ok) if any(len(r.steady) for r in ok if r.arm == a)]
        if not arms:
            note(ax, "no steady-state steps (no run finished ok)")
            continue
        missing = [
            a for a in arms_in_order(r.arm for r in records if str(r.cell_id) == cell) if a not in arms
        ]
        if missing:
            ax.text(
                0.02, 0.98, f"no data: {', '.join(missing)}", transform=ax.transAxes, va="top", fontsize=8
            )
        data = {
            a: np.concatenate([r.steady["step_time_s"].to_numpy(dtype=float) for r in ok if r.arm == a])
            for a in arms
        }
        view = step_time_view(data)
        box = ax.boxplot(list(data.values()), patch_artist=True, showfliers=False)
        for i, (patch, arm) in enumerate(zip(box["boxes"], arms), start=1):
            patch.set_facecolor(color(arm, arms))
            patch.set_alpha(0.6)
            shown = [x for x in view["outliers"][arm] if x <= view["ylim"][1]]
            ax.scatter(
                [i] * len(shown), shown, marker="o", facecolors="none", edgecolors="0.2", s=18, zorder=3
            )
            far = view["above"][arm]
            if far:
                ax.annotate(f"▲ {len(far)} above\n(max {max(far):.2f} s)", (i, view["ylim"][1]), xytext=(0, -2),
                            textcoords="offset points", ha="center", va="top", fontsize=7.5, color="tab:red")  # fmt: skip
        ax.set_ylim(*view["ylim"])
        ax.set_xticks(
            range(1, len(arms) + 1),
            arms,
            rotation=20 if len(arms) > 3 else 0,
            ha="right" if len(arms) > 3 else "center",
        )
        ax.set_ylabel("s/step")
    return save(fig, path)
