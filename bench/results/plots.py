"""PNG plots of a sweep (matplotlib's Agg canvas, no pyplot state). Each function writes one file
atomically and returns its path; missing arms, NaNs and CPU runs without VRAM data give a plot
with a visible note instead of an error.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from bench import fmt
from bench.arms import BASELINE
from bench.fileio import atomic_write_bytes
from bench.results.columns import DEFAULT_TRAINER
from bench.results.records import RunRecord
from bench.results.tables import with_trainer

ARM_COLORS = {"baseline": "tab:blue", "liger": "tab:orange"}
NO_VRAM_NOTE = "no VRAM data (CPU run / poller unavailable)"


def _save(fig: Figure, path: str | Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


def _arms(values: Iterable) -> list[str]:
    """Arms in display order: baseline first, then the rest alphabetically."""
    return sorted({str(a) for a in values if isinstance(a, str)}, key=lambda a: (a != BASELINE, a))


def _color(arm: str, arms: list[str]) -> str:
    return ARM_COLORS.get(arm, f"C{2 + arms.index(arm) % 8}")


def _trainer_note(trainer: str) -> str:
    """`` (specforge-cli)`` after a panel's title for another trainer's cells; nothing for ours."""
    return "" if trainer == DEFAULT_TRAINER else f" ({trainer})"


def _note(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="0.3")
    ax.set_xticks([])
    ax.set_yticks([])


def _grid(n: int, title: str) -> tuple[Figure, list[Axes]]:
    """A figure with one panel per cell (at most 3 across); unused panels hidden."""
    ncols = max(1, min(n, 3))
    nrows = max(1, math.ceil(n / ncols))
    fig = Figure(figsize=(5.2 * ncols, 3.8 * nrows), layout="constrained")
    axes = list(fig.subplots(nrows, ncols, squeeze=False).flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, axes


def _cells(records: list[RunRecord]) -> list[str]:
    return list(dict.fromkeys(str(r.cell_id) for r in records))


def plot_throughput(summary: pd.DataFrame, path: str | Path) -> Path:
    """Samples/s per cell, arms side by side, error bars = 95% CI over repeats."""
    fig = Figure(figsize=(max(6.0, 1.8 * summary["cell_id"].nunique() + 2), 4.5), layout="constrained")
    ax = fig.subplots()
    cells = list(dict.fromkeys(summary["cell_id"]))
    arms = _arms(summary["arm"])
    if not cells or summary["samples_per_s_mean"].isna().all():
        _note(ax, "no throughput data (no run finished ok)")
    width = 0.8 / max(1, len(arms))
    for k, arm in enumerate(arms):
        s = summary[summary["arm"] == arm].set_index("cell_id").reindex(cells)
        x = np.arange(len(cells)) + (k - (len(arms) - 1) / 2) * width
        mean = s["samples_per_s_mean"].to_numpy(dtype=float)
        lo = np.nan_to_num(mean - s["samples_per_s_ci95_low"].to_numpy(dtype=float))
        hi = np.nan_to_num(s["samples_per_s_ci95_high"].to_numpy(dtype=float) - mean)
        has = ~np.isnan(mean)
        ax.bar(
            x[has], mean[has], width, yerr=[lo[has], hi[has]], capsize=4, label=arm, color=_color(arm, arms)
        )
        for xi in x[~has]:
            ax.text(xi, 0, f"{arm}:\nno ok run", ha="center", va="bottom", fontsize=7, color="0.4")
    if cells:
        ax.set_xticks(np.arange(len(cells)), [str(c).replace("_", "\n", 1) for c in cells], fontsize=8)
        ax.set_xlim(-0.5, len(cells) - 0.5)
    ax.set_ylabel("samples/s (steady state)")
    ax.set_title("Throughput per cell (error bars: 95% CI over repeats)")
    if arms:
        ax.legend()
    return _save(fig, path)


def plot_vram_per_card(vram_df: pd.DataFrame, path: str | Path) -> Path:
    """Peak used GiB on every card per arm (max over repeats), one panel per cell; idle cards shown."""
    data = vram_df.dropna(subset=["peak_used_gib"])
    if data.empty:
        fig = Figure(figsize=(6, 3), layout="constrained")
        ax = fig.subplots()
        _note(ax, NO_VRAM_NOTE)
        ax.set_title("Peak VRAM per card")
        return _save(fig, path)
    cells = list(dict.fromkeys(vram_df["cell_id"]))
    arms = _arms(data["arm"])
    fig, axes = _grid(len(cells), "Peak VRAM per card (polled; max over repeats; tick = idle baseline)")
    for ax, cell in zip(axes, cells):
        c = data[data["cell_id"] == cell]
        if c.empty:
            _note(ax, NO_VRAM_NOTE)
            ax.set_title(str(cell), fontsize=9)
            continue
        c, cards = _cards(c)
        cell_arms = [a for a in arms if (c["arm"] == a).any()]
        width = 0.8 / len(cell_arms)
        for k, arm in enumerate(cell_arms):
            a = c[c["arm"] == arm].groupby("card")[["peak_used_gib", "baseline_used_gib"]].max()
            a = a.reindex(cards)
            x = np.arange(len(cards)) + (k - (len(cell_arms) - 1) / 2) * width
            ax.bar(x, a["peak_used_gib"].fillna(0), width, label=arm, color=_color(arm, arms))
            ax.scatter(x, a["baseline_used_gib"], marker="_", color="k", s=60, zorder=3)
        ax.set_xticks(np.arange(len(cards)), cards)
        ax.set_xlabel("node:card" if ":" in cards[0] else "card")
        ax.set_ylabel("peak used (GiB)")
        ax.set_title(str(cell), fontsize=9)
        ax.legend(fontsize=8)
    return _save(fig, path)


def _cards(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The rows with a ``card`` label ("3"; "1:3" for card 3 of node 1 when they span nodes) and
    the labels in order (nodes by index, then name; cards by index)."""
    nodes = rows["node"].astype(str) if "node" in rows else pd.Series("0", index=rows.index)
    index = rows["card_index"].astype(int)
    spans = nodes.nunique() > 1
    labels = [f"{n}:{i}" if spans else str(i) for n, i in zip(nodes, index)]
    order = sorted(
        set(zip(nodes, index)), key=lambda k: (not k[0].isdigit(), int(k[0]) if k[0].isdigit() else 0, k)
    )
    return rows.assign(card=labels), [f"{n}:{i}" if spans else str(i) for n, i in order]


def plot_loss_curves(records: list[RunRecord], path: str | Path) -> Path:
    """Loss vs step for every run, arms overlaid per cell; the dropped warm-up region is shaded."""
    cells = _cells(records)
    fig, axes = _grid(max(1, len(cells)), "Loss curves (baseline solid, other arms dashed)")
    if not cells:
        _note(axes[0], "no runs")
    arms = _arms(r.arm for r in records)
    for ax, cell in zip(axes, cells):
        runs = [r for r in records if str(r.cell_id) == cell and r.metrics["loss"].notna().any()]
        ax.set_title(cell, fontsize=9)
        if not runs:
            _note(ax, "no losses logged")
            continue
        warmup = max(r.warmup_steps for r in runs)
        if warmup > 0:
            ax.axvspan(0.5, warmup + 0.5, color="0.85", label=f"warm-up ({warmup} steps, dropped)")
        labelled = set()
        for r in runs:
            arm = str(r.arm)
            ax.plot(
                r.metrics["step"],
                r.metrics["loss"],
                color=_color(arm, arms) if arm in arms else "0.5",
                linestyle="-" if arm == BASELINE else "--",
                alpha=0.8,
                label=None if arm in labelled else arm,
            )
            labelled.add(arm)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_step_time_dist(records: list[RunRecord], path: str | Path) -> Path:
    """Box plots of steady-state step times per arm (ok runs, repeats pooled), one panel per cell."""
    cells = _cells(records)
    fig, axes = _grid(max(1, len(cells)), "Steady-state step time (warm-up dropped; repeats pooled)")
    if not cells:
        _note(axes[0], "no runs")
    for ax, cell in zip(axes, cells):
        ax.set_title(cell, fontsize=9)
        runs = [r for r in records if str(r.cell_id) == cell]
        ok = [r for r in runs if r.status == "ok"]
        arms = [a for a in _arms(r.arm for r in ok) if any(len(r.steady) for r in ok if r.arm == a)]
        if not arms:
            _note(ax, "no steady-state steps (no run finished ok)")
            continue
        missing = [a for a in _arms(r.arm for r in runs) if a not in arms]
        if missing:
            ax.text(
                0.02, 0.98, f"no data: {', '.join(missing)}", transform=ax.transAxes, va="top", fontsize=8
            )
        data = [np.concatenate([r.steady["step_time_s"].to_numpy() for r in ok if r.arm == a]) for a in arms]
        box = ax.boxplot(data, patch_artist=True)
        for patch, arm in zip(box["boxes"], arms):
            patch.set_facecolor(_color(arm, arms))
            patch.set_alpha(0.6)
        ax.set_xticks(range(1, len(arms) + 1), arms)
        ax.set_ylabel("s/step")
    return _save(fig, path)


def plot_scaling(scaling: pd.DataFrame, path: str | Path) -> Path:
    """Samples/s vs world size per arm, one panel per series, with the ideal (linear) line."""
    series = list(
        with_trainer(scaling).groupby(["profile", "mode", "batch_size", "seq_len", "trainer"], sort=False)
    )
    fig, axes = _grid(max(1, len(series)), "Scaling over world size (dashed: linear from the smallest size)")
    for ax, (key, g) in zip(axes, series):
        arms = _arms(g["arm"])
        for arm in arms:
            a = g[g["arm"] == arm].sort_values("world_size")
            ax.plot(a["world_size"], a["samples_per_s_mean"], marker="o", label=arm, color=_color(arm, arms))
            ok = a[a["samples_per_s_per_gpu"].notna()]
            if len(ok):
                ideal = ok["samples_per_s_per_gpu"].iloc[0] * a["world_size"]
                ax.plot(a["world_size"], ideal, ls="--", lw=1, color=_color(arm, arms))
        ax.set_xticks(sorted(g["world_size"].dropna().unique()))
        ax.set_xlabel("GPUs (world size)")
        ax.set_ylabel("samples/s")
        ax.set_title(
            f"{key[0]} {key[1]} bs{fmt.integer(key[2])} s{fmt.integer(key[3])}{_trainer_note(key[4])}",
            fontsize=9,
        )
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_capacity(runs: pd.DataFrame, capacity: pd.DataFrame, path: str | Path) -> Path:
    """Peak VRAM vs the searched value per arm (OOM probes marked at the card's size), one panel
    per series, with the card's capacity drawn."""
    axis = capacity["axis"].iloc[0]
    other = "seq_len" if axis == "batch_size" else "batch_size"
    groups = list(with_trainer(runs).groupby(["profile", "mode", other, "gpus", "trainer"], sort=False))
    fig, axes = _grid(max(1, len(groups)), f"Capacity: peak VRAM vs {axis} (x: out of memory)")
    for ax, ((profile, mode, fixed, gpus, trainer), g) in zip(axes, groups):
        arms = _arms(g["arm"])
        total = capacity[(capacity["profile"] == profile) & (capacity["mode"] == mode)][
            "card_total_gib"
        ].max()
        for arm in arms:
            a = g[g["arm"] == arm].sort_values(axis)
            ok = a[a["status"] == "ok"]
            ax.plot(ok[axis], ok["peak_vram_gib"], marker="o", label=arm, color=_color(arm, arms))
            oom = a[a["status"] == "oom"]
            if len(oom) and not math.isnan(total):
                ax.scatter(oom[axis], [total] * len(oom), marker="x", color=_color(arm, arms))
        if not math.isnan(total):
            ax.axhline(total, ls="--", lw=1, color="0.3", label="card capacity")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(axis)
        ax.set_ylabel("peak VRAM, busiest card (GiB)")
        ax.set_title(
            f"{profile} {mode} {other} {fmt.integer(fixed)}, {fmt.integer(gpus)} GPU(s){_trainer_note(trainer)}",
            fontsize=9,
        )
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_compare(df: pd.DataFrame, path: str | Path, label_a: str, label_b: str) -> Path:
    """Two panels for `bench compare`: samples/s and peak VRAM, A vs B, one bar pair per row."""
    fig = Figure(figsize=(max(7.0, 0.9 * len(df) + 3), 7), layout="constrained")
    axes = fig.subplots(2, 1)
    labels = [
        f"{r.profile} {r.mode}\nbs{fmt.integer(r.batch_size)} s{fmt.integer(r.seq_len)} {r.arm}"
        for r in df.itertuples()
    ]
    x = np.arange(len(df))
    for ax, col, ylabel in (
        (axes[0], "samples_per_s", "samples/s"),
        (axes[1], "peak_vram_gib", "peak VRAM (GiB, polled)"),
    ):
        a = df[f"{col}_a"].to_numpy(dtype=float)
        b = df[f"{col}_b"].to_numpy(dtype=float)
        if np.isnan(a).all() and np.isnan(b).all():
            _note(ax, NO_VRAM_NOTE if col == "peak_vram_gib" else "no data")
            ax.set_title(ylabel)
            continue
        ax.bar(x - 0.2, np.nan_to_num(a), 0.4, label="A", color="tab:gray")
        ax.bar(x + 0.2, np.nan_to_num(b), 0.4, label="B", color="tab:green")
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel(ylabel)
        ax.margins(y=0.15)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"A: {label_a}\nB: {label_b}", fontsize=8)
    return _save(fig, path)
