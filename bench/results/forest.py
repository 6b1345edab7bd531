"""The headline figure of a sweep or a compare: a forest plot. One row per compared thing (a
cell's arm against its baseline; a row of B against A), its Δ (%) as a point with its 95% CI,
labelled "+16.2% [+15.3, +17.2]", the equivalence band shaded, A/A rows drawn as the shaded
noise floor they are, and a second panel with Δ peak VRAM. ``sweep_forest_rows`` and
``compare_forest_rows`` give the rows the figure draws (FOREST_COLUMNS); ``plot_forest`` draws
them, and only them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from bench import fmt
from bench.arms import AA, BASELINE
from bench.results.canvas import LABEL_BOX, save
from bench.results.columns import DEFAULT_TRAINER
from bench.results.verdicts import Speed, parity_failed, speed_kind

FOREST_COLUMNS = [
    "label", "kind", "parity_failed", "n_pairs", "delta_pct", "ci_low", "ci_high", "delta_text", "verdict",
    "vram_gib", "vram_low", "vram_high", "vram_text",
]  # fmt: skip
VERDICT_COLORS = {Speed.FASTER: "tab:green", Speed.SLOWER: "tab:red", Speed.WITHIN: "0.35"}
NO_POINT = "0.55"


def delta_text(point: Any, lo: Any, hi: Any, spec: str = "+.1f", unit: str = "%") -> str:
    """``+16.2% [+15.3, +17.2]``; the point alone without a CI; "" without a point."""
    if fmt.isnan(point):
        return ""
    text = f"{fmt.f(point, spec)}{unit}"
    return text if fmt.isnan(lo) or fmt.isnan(hi) else f"{text} [{fmt.f(lo, spec)}, {fmt.f(hi, spec)}]"


def cell_label(r: Any) -> str:
    """``qwen3.5-4b-dflash offline bs2 s2048`` (+ ``, 2 GPUs`` / ``, 2×2 GPUs`` / the trainer when not ours)."""
    text = f"{r.profile} {r.mode} bs{fmt.integer(r.batch_size)} s{fmt.integer(r.seq_len)}"
    gpus, nodes = fmt.num(getattr(r, "gpus", 1), 1), fmt.num(getattr(r, "nodes", 1), 1)
    if nodes > 1:
        text += f", {fmt.integer(gpus)}×{fmt.integer(nodes)} GPUs"
    elif gpus > 1:
        text += f", {fmt.integer(gpus)} GPUs"
    trainer = getattr(r, "trainer", DEFAULT_TRAINER)
    if isinstance(trainer, str) and trainer != DEFAULT_TRAINER:
        text += f" ({trainer})"
    return text


def _vram_text(point: Any, pct: Any) -> str:
    if fmt.isnan(point):
        return "no VRAM data"
    return f"{fmt.f(point, '+.2f')} GiB" + ("" if fmt.isnan(pct) else f" ({fmt.f(pct, '+.1f')}%)")


def _pairs(n: Any) -> str:
    return "" if fmt.isnan(n) else f" ({fmt.integer(n)} pair{'s' if fmt.num(n) != 1 else ''})"


def sweep_forest_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """Every non-baseline arm of every cell, in summary order: Δ samples/s (%) and Δ peak VRAM
    with their paired CIs; a row without a Δ says why in ``delta_text`` (its verdict)."""
    rows = []
    for r in summary[summary["arm"] != BASELINE].itertuples():
        text = delta_text(
            r.delta_samples_per_s_pct, r.delta_samples_per_s_pct_ci95_low, r.delta_samples_per_s_pct_ci95_high
        )
        verdict = r.verdict_speed if isinstance(r.verdict_speed, str) else ""
        rows.append({
            "label": f"{cell_label(r)} · {r.arm}" + _pairs(r.n_pairs),
            "kind": "aa" if r.arm == AA else "arm",
            "parity_failed": parity_failed(r.loss_parity),
            "n_pairs": fmt.num(r.n_pairs),
            "delta_pct": fmt.num(r.delta_samples_per_s_pct),
            "ci_low": fmt.num(r.delta_samples_per_s_pct_ci95_low),
            "ci_high": fmt.num(r.delta_samples_per_s_pct_ci95_high),
            "delta_text": text or verdict or "no Δ",
            "verdict": verdict,
            "vram_gib": fmt.num(r.delta_peak_vram_gib),
            "vram_low": fmt.num(r.delta_peak_vram_gib_ci95_low),
            "vram_high": fmt.num(r.delta_peak_vram_gib_ci95_high),
            "vram_text": _vram_text(r.delta_peak_vram_gib, r.delta_peak_vram_pct),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=FOREST_COLUMNS)


def _draw_delta(
    ax: Axes,
    rows: pd.DataFrame,
    y: np.ndarray,
    band_pct: float,
    xlabel: str,
    threshold_pct: float | None = None,
) -> None:
    if threshold_pct is not None:
        ax.axvline(
            -threshold_pct, color="tab:red", ls="--", lw=1.2, label=f"gate: fails below -{threshold_pct:g}%"
        )
    if band_pct > 0:
        ax.axvspan(
            -band_pct, band_pct, color="tab:green", alpha=0.12, lw=0, label=f"±{band_pct:g}% equivalence band"
        )
    ax.axvline(0, color="0.4", lw=0.8)
    for yi, r in zip(y, rows.itertuples()):
        has_ci = not (fmt.isnan(r.ci_low) or fmt.isnan(r.ci_high))
        color = VERDICT_COLORS.get(speed_kind(r.verdict), "black")
        if r.kind == "aa":
            color = "tab:red" if "FAILED" in r.verdict else "0.2"
        if r.kind == "aa" and has_ci:  # the suite's own noise floor: a shaded span, not a claim
            ax.barh(
                yi,
                r.ci_high - r.ci_low,
                left=r.ci_low,
                height=0.5,
                color="0.75",
                alpha=0.7,
                label="A/A (noise floor)",
            )
        if fmt.isnan(r.delta_pct):
            ax.annotate(
                r.delta_text,
                (0, yi),
                xytext=(6, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
                color=NO_POINT,
            )
            continue
        # a point outside its interval (a damaged file's) is drawn with the bar clipped, never a crash
        err = [[max(0.0, r.delta_pct - r.ci_low)], [max(0.0, r.ci_high - r.delta_pct)]] if has_ci else None
        ax.errorbar(
            r.delta_pct, yi, xerr=err, fmt="o", color=color, capsize=4, ms=6, mfc=color if has_ci else "white"
        )
        if r.parity_failed:  # its speed compares two different trainings: said on the point
            ax.errorbar(r.delta_pct, yi, fmt="X", color="tab:red", ms=9, label="fails loss parity")
        right = r.ci_high if has_ci else r.delta_pct
        ax.annotate(
            r.delta_text + ("  FAILS loss parity" if r.parity_failed else ""),
            (right, yi),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=9,
            bbox=LABEL_BOX,
        )
    ax.set_xlabel(xlabel)
    ax.margins(x=0.35)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    if unique:
        ax.legend(unique.values(), unique.keys(), fontsize=8, loc="best", framealpha=0.9)


def _draw_vram(ax: Axes, rows: pd.DataFrame, y: np.ndarray) -> None:
    ax.axvline(0, color="0.4", lw=0.8)
    if rows["vram_gib"].isna().all():
        ax.text(0.5, 0.5, "no VRAM data\n(CPU run / poller unavailable)", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, color="0.3")  # fmt: skip
        ax.set_xticks([])
    for yi, r in zip(y, rows.itertuples()):
        if fmt.isnan(r.vram_gib):
            continue
        has_ci = not (fmt.isnan(r.vram_low) or fmt.isnan(r.vram_high))
        err = [[max(0.0, r.vram_gib - r.vram_low)], [max(0.0, r.vram_high - r.vram_gib)]] if has_ci else None
        ax.errorbar(r.vram_gib, yi, xerr=err, fmt="s", color="tab:purple", capsize=4, ms=6)
        ax.annotate(r.vram_text, (max(r.vram_gib, r.vram_high if has_ci else r.vram_gib), yi), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=9, bbox=LABEL_BOX)  # fmt: skip
    ax.set_xlabel("Δ peak VRAM, busiest card (GiB)")
    ax.margins(x=0.6)


def plot_forest(rows: pd.DataFrame, path: str | Path, title: str, band_pct: float = 1.0,
                xlabel: str = "Δ samples/s vs baseline (%), paired 95% CI",
                threshold_pct: float | None = None) -> Path:  # fmt: skip
    """Draw ``rows`` (FOREST_COLUMNS) top to bottom: Δ (%) with CIs left, Δ peak VRAM right."""
    n = max(1, len(rows))
    fig = Figure(figsize=(12, 1.4 + 0.55 * n), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True, width_ratios=[3, 1.6])
    y = np.arange(len(rows))[::-1].astype(float)
    if rows.empty:
        left.text(0.5, 0.5, "nothing to compare (no arm besides the baseline)", ha="center", va="center",
                  transform=left.transAxes, color="0.3")  # fmt: skip
    else:
        _draw_delta(left, rows, y, band_pct, xlabel, threshold_pct)
        _draw_vram(right, rows, y)
    left.set_yticks(y, list(rows["label"]), fontsize=9)
    left.set_ylim(-0.7, len(rows) - 0.3)
    fig.suptitle(title, fontsize=10)
    return save(fig, path, dpi=100)


def compare_forest_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of a compare.csv found in both A and B: B vs A samples/s (%) with the Welch CI
    (none without per-run values) and B − A peak VRAM (no CI: runs of two sweeps are not paired)."""
    rows = []
    for r in df[df["present"] == "both"].itertuples():
        lo, hi = r.samples_per_s_delta_pct_ci95_low, r.samples_per_s_delta_pct_ci95_high
        vram = r.vram_over_idle_b_minus_a_gib
        pct_vram = 100 * fmt.num(vram) / fmt.num(r.vram_over_idle_gib_a)
        verdict = r.verdict if isinstance(r.verdict, str) else ""
        rows.append({
            "label": f"{cell_label(r)} · {r.arm}",
            "kind": "arm",
            "parity_failed": False,
            "n_pairs": np.nan,
            "delta_pct": fmt.num(r.samples_per_s_delta_pct),
            "ci_low": fmt.num(lo),
            "ci_high": fmt.num(hi),
            "delta_text": delta_text(r.samples_per_s_delta_pct, lo, hi) or verdict or "no Δ",
            "verdict": verdict.replace("B ", "", 1),
            "vram_gib": fmt.num(vram),
            "vram_low": np.nan,
            "vram_high": np.nan,
            "vram_text": _vram_text(vram, pct_vram),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=FOREST_COLUMNS)
