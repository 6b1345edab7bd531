"""PNG plots of a sweep's tables (matplotlib's Agg canvas, no pyplot state): throughput and
peak VRAM per card, each bar labelled with its arm's Δ; scaling; capacity; and `bench compare`'s
figure. Each function writes one file atomically and returns its path; missing arms, NaNs and
CPU runs without VRAM data give a plot with a visible note instead of an error. ``throughput_bars``
and ``vram_labels`` are the data the first two draw. The run-level plots (loss, step times) are
bench.results.runplots'; the headline forest plot is bench.results.forest's.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bench import fmt
from bench.arms import BASELINE
from bench.results.canvas import LABEL_BOX, NO_VRAM_NOTE, grid, note, save, wrap
from bench.results.canvas import arms_in_order as _arms
from bench.results.canvas import color as _color
from bench.results.columns import DEFAULT_TRAINER
from bench.results.forest import cell_label, compare_forest_rows, delta_text, plot_forest
from bench.results.tables import with_trainer

THROUGHPUT_BAR_COLUMNS = ["cell", "arm", "x", "mean", "err_low", "err_high", "label"]


def _trainer_note(trainer: str) -> str:
    """`` (specforge-cli)`` after a panel's title for another trainer's cells; nothing for ours."""
    return "" if trainer == DEFAULT_TRAINER else f" ({trainer})"


def throughput_bars(summary: pd.DataFrame) -> pd.DataFrame:
    """The bars of throughput.png: per (cell, arm) with an ok run its mean samples/s at x, the
    95% CI as error lengths (the lower one clipped at 0 samples/s), and the arm's Δ vs baseline
    with its paired CI as the label ("" for the baseline)."""
    cells = list(dict.fromkeys(summary["cell_id"]))
    arms = _arms(summary["arm"])
    width = 0.8 / max(1, len(arms))
    rows = []
    for k, arm in enumerate(arms):
        s = summary[summary["arm"] == arm].set_index("cell_id")
        for i, cell in enumerate(cells):
            if cell not in s.index or fmt.isnan(s.at[cell, "samples_per_s_mean"]):
                continue
            r = s.loc[cell]
            mean = float(r["samples_per_s_mean"])
            lo, hi = fmt.num(r["samples_per_s_ci95_low"]), fmt.num(r["samples_per_s_ci95_high"])
            label = "" if arm == BASELINE else delta_text(
                r["delta_samples_per_s_pct"], r["delta_samples_per_s_pct_ci95_low"], r["delta_samples_per_s_pct_ci95_high"]
            )  # fmt: skip
            rows.append({
                "cell": cell, "arm": arm, "x": i + (k - (len(arms) - 1) / 2) * width, "mean": mean,
                "err_low": 0.0 if math.isnan(lo) else min(mean - lo, mean), "err_high": 0.0 if math.isnan(hi) else hi - mean,
                "label": label or ("" if arm == BASELINE else str(r["verdict_speed"]) if isinstance(r["verdict_speed"], str) else ""),
            })  # fmt: skip
    return pd.DataFrame(rows, columns=THROUGHPUT_BAR_COLUMNS)


def plot_throughput(summary: pd.DataFrame, path: str | Path) -> Path:
    """Samples/s per cell, arms side by side, error bars = 95% CI over repeats (clipped at 0),
    each arm's bar labelled with its Δ vs the baseline; legend entries only for arms with bars."""
    cells = list(dict.fromkeys(summary["cell_id"]))
    arms = _arms(summary["arm"])
    fig = Figure(figsize=(max(7.0, (1.2 + 1.1 * len(arms)) * len(cells) + 1.5), 5.0), layout="constrained")
    ax = fig.subplots()
    bars = throughput_bars(summary)
    if bars.empty:
        note(ax, "no throughput data (no run finished ok)")
    width = 0.8 / max(1, len(arms))
    for arm in _arms(bars["arm"]):
        b = bars[bars["arm"] == arm]
        ax.bar(
            b["x"],
            b["mean"],
            width,
            yerr=[b["err_low"], b["err_high"]],
            capsize=4,
            label=arm,
            color=_color(arm, arms),
        )
        for r in b.itertuples():
            if r.label:
                ax.annotate(r.label.replace(" [", "\n["), (r.x, r.mean + r.err_high), xytext=(0, 3), textcoords="offset points",
                            ha="center", va="bottom", fontsize=7.5, bbox=LABEL_BOX)  # fmt: skip
    for i, cell in enumerate(cells):  # an arm of a cell with no ok run: said where its bar would be
        for k, arm in enumerate(arms):
            if len(bars) and not ((bars["cell"] == cell) & (bars["arm"] == arm)).any():
                x = i + (k - (len(arms) - 1) / 2) * width
                ax.text(
                    x,
                    0,
                    f" {arm}: no ok run",
                    rotation=90,
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    color="0.35",
                )
    if cells:
        labels = [wrap(cell_label(r)) for r in summary.drop_duplicates("cell_id").itertuples()]
        ax.set_xticks(np.arange(len(cells)), labels, fontsize=9)
        ax.set_xlim(-0.5, len(cells) - 0.5)
    top = (bars["mean"] + bars["err_high"]).max() if len(bars) else 1.0
    ax.set_ylim(0, 1.22 * top)
    ax.set_ylabel("samples/s (steady state)")
    ax.set_title("Throughput per cell (error bars: 95% CI over runs; labels: Δ vs baseline, paired 95% CI)")
    if len(bars):
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save(fig, path)


def vram_labels(vram_df: pd.DataFrame) -> pd.DataFrame:
    """The labels of vram_per_card.png: per (cell, card, arm other than the baseline) the arm's
    peak minus the baseline's on that card (max over repeats each), as "+1.97" / "-5.21" GiB."""
    data = vram_df.dropna(subset=["peak_used_gib"])
    if data.empty:
        return pd.DataFrame(columns=["cell_id", "card", "arm", "delta_gib", "label"])
    data, _ = _cards(data)
    peaks = data.groupby(["cell_id", "card", "arm"], sort=False)["peak_used_gib"].max().reset_index()
    base = peaks[peaks["arm"] == BASELINE].set_index(["cell_id", "card"])["peak_used_gib"]
    other = peaks[peaks["arm"] != BASELINE].copy()
    other["delta_gib"] = [
        r.peak_used_gib - base.get((r.cell_id, r.card), math.nan) for r in other.itertuples()
    ]
    other["label"] = [delta_text(d, math.nan, math.nan, "+.2f", "") for d in other["delta_gib"]]
    return other[["cell_id", "card", "arm", "delta_gib", "label"]].reset_index(drop=True)


def plot_vram_per_card(vram_df: pd.DataFrame, path: str | Path) -> Path:
    """Peak used GiB on every card per arm (max over repeats), one panel per cell; idle cards
    shown; the idle baseline drawn as a black bar across each bar; other arms' bars labelled with
    their Δ GiB vs the baseline on the same card."""
    data = vram_df.dropna(subset=["peak_used_gib"])
    if data.empty:
        fig = Figure(figsize=(6, 3), layout="constrained")
        ax = fig.subplots()
        note(ax, NO_VRAM_NOTE)
        ax.set_title("Peak VRAM per card")
        return save(fig, path)
    cells = list(dict.fromkeys(vram_df["cell_id"]))
    arms = _arms(data["arm"])
    labels = vram_labels(vram_df).set_index(["cell_id", "card", "arm"])["label"]
    fig, axes = grid(
        len(cells),
        "Peak VRAM per card (polled; max over repeats; black line = idle baseline, median over runs; labels: Δ GiB vs baseline)",
        width=6.0,
        height=4.2,
    )
    for ax, cell in zip(axes, cells):
        c = data[data["cell_id"] == cell]
        ax.set_title(wrap(str(cell), 60), fontsize=9)
        if c.empty:
            note(ax, NO_VRAM_NOTE)
            continue
        c, cards = _cards(c)
        cell_arms = [a for a in arms if (c["arm"] == a).any()]
        width = 0.8 / len(cell_arms)
        for k, arm in enumerate(cell_arms):
            a = (
                c[c["arm"] == arm]
                .groupby("card")
                .agg({"peak_used_gib": "max", "baseline_used_gib": "median"})
                .reindex(cards)
            )
            x = np.arange(len(cards)) + (k - (len(cell_arms) - 1) / 2) * width
            ax.bar(x, a["peak_used_gib"].fillna(0), width, label=arm, color=_color(arm, arms))
            ax.hlines(a["baseline_used_gib"], x - width / 2, x + width / 2, color="k", lw=2.5, zorder=3,
                      label="idle baseline" if k == 0 else None)  # fmt: skip
            for xi, card, peak in zip(x, cards, a["peak_used_gib"]):
                text = labels.get((cell, card, arm), "")
                if text and not fmt.isnan(peak):
                    ax.annotate(f"{text} GiB", (xi, peak), xytext=(0, 3), textcoords="offset points", ha="center",
                                va="bottom", fontsize=7.5, bbox=LABEL_BOX)  # fmt: skip
        ax.set_xticks(np.arange(len(cards)), cards)
        ax.set_xlabel("node:card" if ":" in cards[0] else "card")
        ax.set_ylabel("peak used (GiB)")
        ax.margins(y=0.15)
        ax.legend(fontsize=8, loc="lower right")
    return save(fig, path)


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


def plot_scaling(scaling: pd.DataFrame, path: str | Path) -> Path:
    """Samples/s vs world size per arm, one panel per series, with the ideal (linear) line."""
    series = list(
        with_trainer(scaling).groupby(["profile", "mode", "batch_size", "seq_len", "trainer"], sort=False)
    )
    fig, axes = grid(max(1, len(series)), "Scaling over world size (dashed: linear from the smallest size)")
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
    return save(fig, path)


def plot_capacity(runs: pd.DataFrame, capacity: pd.DataFrame, path: str | Path) -> Path:
    """Peak VRAM vs the searched value per arm (OOM probes marked at the card's size), one panel
    per series, with the card's capacity drawn."""
    axis = capacity["axis"].iloc[0]
    other = "seq_len" if axis == "batch_size" else "batch_size"
    groups = list(with_trainer(runs).groupby(["profile", "mode", other, "gpus", "trainer"], sort=False))
    fig, axes = grid(max(1, len(groups)), f"Capacity: peak VRAM vs {axis} (x: out of memory)")
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
    return save(fig, path)


def plot_compare(
    df: pd.DataFrame, path: str | Path, label_a: str, label_b: str, threshold_pct: float | None = None
) -> Path:
    """`bench compare`'s figure: a forest plot of B vs A per row found in both, samples/s Δ (%)
    with its 95% CI (Welch, from the runs beside each summary; the point alone without them) and
    the peak VRAM change beside it (over idle: gross polled memory holds what the card held before);
    with ``threshold_pct``, the --fail-if-slower gate's line at -PCT%."""
    return plot_forest(
        compare_forest_rows(df),
        path,
        f"B vs A, per row found in both\nA: {label_a}\nB: {label_b}",
        band_pct=0.0,
        xlabel="Δ samples/s, B vs A (%), 95% CI (runs of two sweeps: unpaired, Welch)",
        threshold_pct=threshold_pct,
    )
