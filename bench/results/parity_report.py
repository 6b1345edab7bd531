"""The training-parity section of report.md (the seeds' form: losses at chosen steps, the A/A
floor beside the arm's divergence, the verdict per metric) and its figure, training_parity.png:
every arm's loss curve with the band the A/A floor allows around the baseline's, and |Δ loss|
of each arm against the baseline beside the A/A floor, per step."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd

from bench import fmt
from bench.arms import AA, AA_EPS, ARMS, BASELINE, NEGATIVE_CONTROLS
from bench.results import canvas
from bench.results.records import RunRecord
from bench.results.training_parity import (
    allowed,
    baseline_mean,
    divergence,
    floor_of,
    series,
    settings,
    window_of,
    windows,
)
from bench.results.verdicts import parity_failed


def _loss_at(runs: dict, arm: str, step: int) -> float:
    vals = [f.loc[step, "loss"] for f in runs.get(arm, {}).values() if step in f.index and "loss" in f]
    return float(sum(vals) / len(vals)) if vals else float("nan")


def parity_section(table: pd.DataFrame, records: list[RunRecord], sweep: dict) -> list[str]:
    """## Training parity: per cell, the losses at ``at_steps`` (with |Δ| of each arm and of the
    A/A run from the baseline), then each arm's verdict per metric; [] when not a parity sweep."""
    p = settings(sweep)
    if p is None or table.empty:
        return []
    lines = ["## Training parity (against the A/A floor)", ""]
    lines += [
        f"Each arm trained with the baseline's seed, data order and schedule; `{AA}` is the baseline "
        f"again. Rule: in every window of steps, the RMS of the arm's |Δ| from the baseline stays within "
        f"{p['margin']:g} × the A/A run's RMS |Δ| plus {p['loss_atol']:g} (loss), {p['accuracy_atol']:g} "
        f"(accuracy), {p['grad_norm_rtol']:.3g} × the baseline's value (gradient norm: one rounding step of "
        f"{p['compute_dtype']}, the dtype the forward computes in, at least 0.001); docs/method.md.",
        "",
    ]
    if any(AA_EPS in runs for runs in series(records).values()):
        lines += [
            f"With `{AA_EPS}` (the baseline with every weight moved by one unit in the last place), the "
            f"floor at each step is the larger of the `{AA}` and `{AA_EPS}` runs' |Δ|: how far this "
            "cell's training carries one rounding step.",
            "",
        ]
    for cell_id, runs in series(records).items():
        rows = table[table["cell_id"] == cell_id]
        if rows.empty:
            continue
        arms = [a for a in canvas.arms_in_order(runs) if a not in (BASELINE, AA)]
        first = rows.iloc[0]
        lines += [f"### {cell_id}", ""]
        lines.append(
            f"The baseline's loss fell {fmt.f(first['loss_drop_pct'], '.0f')}% "
            f"({fmt.f(first['loss_first_baseline'], '.4f')} at step 1 → "
            f"{fmt.f(first['loss_last_baseline'], '.4f')} over the last window)."
        )
        lines.append("")
        header = ["step", "baseline", AA, *arms, f"|Δ| {AA} (floor)", *(f"|Δ| {a}" for a in arms)]
        body = []
        for step in p["at_steps"]:
            base = _loss_at(runs, BASELINE, step)
            vals = {a: _loss_at(runs, a, step) for a in (AA, *arms)}
            body.append(
                [str(step), fmt.f(base, ".4f"), *(fmt.f(vals[a], ".4f") for a in (AA, *arms))]
                + [fmt.f(abs(vals[a] - base), ".2e") for a in (AA, *arms)]
            )
        lines += fmt.table(header, body) + [""]
        verdicts = [["arm", "metric", "worst window", "RMS |Δ| arm", "allowed", "A/A floor RMS", "verdict"]]
        for r in rows.itertuples():
            verdicts.append(
                [
                    str(r.arm),
                    str(r.metric),
                    fmt.md(r.worst_window) if isinstance(r.worst_window, str) else fmt.DASH,
                    fmt.f(r.worst_rms_arm, ".2e"),
                    fmt.f(r.worst_allowed, ".2e"),
                    fmt.f(r.worst_rms_floor, ".2e"),
                    fmt.md(r.verdict),
                ]
            )
        lines += fmt.table(verdicts[0], verdicts[1:]) + [""]
        lines += [line + "\n" for line in control_lines(rows)]
    lines += ["Plot: training_parity.png; data: training_parity.csv.", ""]
    return lines


def control_lines(rows: pd.DataFrame) -> list[str]:
    """Per negative-control arm of a cell (lr_off: the learning rate 1% higher), whether the rule
    caught it: its power on this cell. Not caught, the cell's "equivalent" verdicts say less than
    they seem; never a parity failure of the sweep (the arm is wrong on purpose)."""
    out = []
    for arm in (a for a in dict.fromkeys(rows["arm"]) if a in NEGATIVE_CONTROLS):
        mine = rows[rows["arm"] == arm]
        caught = [str(m) for m, v in zip(mine["metric"], mine["verdict"], strict=True) if parity_failed(v)]
        if caught:
            out.append(
                f"Negative control `{arm}` ({ARMS[arm].doc.split(':')[0]}): caught, not equivalent on {', '.join(caught)}."
            )
        else:
            out.append(
                f"Negative control `{arm}` ({ARMS[arm].doc.split(':')[0]}): **not caught**: on this cell the rule "
                "would pass that error too, so its 'equivalent' verdicts say less than they seem (more steps, or a "
                "cell that learns more, give it power)."
            )
    return out


def parity_console(table: pd.DataFrame, width: int = 100) -> list[str]:
    """The parity verdicts for the console: per cell and arm, one line with each metric's verdict
    (the worst window where it is not equivalent) and how far the baseline's loss fell."""
    lines: list[str] = []
    for (cell_id, arm), rows in table.groupby(["cell_id", "arm"], sort=False):
        first = rows.iloc[0]
        said = []
        for r in rows.itertuples():
            verdict = str(r.verdict)
            if verdict.startswith("not equivalent"):
                verdict = f"not equivalent (steps {r.worst_window})"
            said.append(f"{r.metric} {verdict}")
        head = f"training parity, {arm} vs baseline, {cell_id} ({fmt.integer(first['steps_compared'])} steps"
        head += f", loss fell {fmt.f(first['loss_drop_pct'], '.0f')}%): "
        tail = ""
        if arm in NEGATIVE_CONTROLS:  # wrong on purpose: whether the rule saw it is the finding
            caught = any(parity_failed(v) for v in rows["verdict"])
            tail = (
                " (a negative control: caught)"
                if caught
                else " (a negative control: NOT caught, the rule has no power here)"
            )
        lines += textwrap.wrap(head + "; ".join(said) + tail, width=width, subsequent_indent="    ")
    return ["", *lines] if lines else []


def plot_training_parity(records: list[RunRecord], sweep: dict, path: Path) -> Path:
    """Per cell, two panels: loss curves with the A/A band, and |Δ loss| per step against the floor."""
    p = settings(sweep) or {}
    cells = series(records)
    fig, axes = canvas.grid(
        2 * max(1, len(cells)), "Training parity: each arm against the A/A floor", ncols=2
    )
    for i, (cell_id, runs) in enumerate(cells.items()):
        curves, deltas = axes[2 * i], axes[2 * i + 1]
        arms = canvas.arms_in_order(runs)
        base = baseline_mean(runs, "loss").dropna()
        floor = divergence(runs, AA, "loss")
        held, sensed = floor_of(runs, "loss")  # what the verdict holds the arms to (with aa_eps: the larger)
        steps = sorted(set(base.index) & set(floor.index) & set(held.index))
        width = window_of(len(base), p.get("window"))
        band = pd.Series(index=steps, dtype=float)
        for chunk in windows(steps, width) if steps else []:
            band.loc[chunk] = allowed(held.loc[chunk], base.loc[chunk], "loss", p, sensed) if p else 0.0
        if steps:
            curves.fill_between(
                steps, base.loc[steps] - band, base.loc[steps] + band, color="0.8", label="A/A band"
            )
            deltas.step(steps, band.to_numpy(), where="mid", color="0.4", ls="--", label="allowed")
            exact = bool((floor.loc[steps] == 0).all())
            label = f"{AA} (floor{': identical to the baseline, drawn at 1e-12' if exact else ''})"
            deltas.plot(steps, floor.loc[steps].clip(lower=1e-12), color="0.6", lw=1, label=label)
        for arm in arms:
            loss = pd.concat([f["loss"] for f in runs[arm].values()], axis=1).mean(axis=1)
            curves.plot(loss.index, loss.to_numpy(), color=canvas.color(arm, arms), lw=1, label=arm)
            if arm not in (BASELINE, AA):
                d = divergence(runs, arm, "loss")
                deltas.plot(
                    d.index, d.clip(lower=1e-12).to_numpy(), color=canvas.color(arm, arms), lw=1, label=arm
                )
        curves.set_title(canvas.wrap(cell_id, 60), fontsize=9)
        curves.set_xlabel("step")
        curves.set_ylabel("loss")
        curves.legend(fontsize=7)
        deltas.set_yscale("log")
        deltas.set_title("|Δ loss| vs baseline", fontsize=9)
        deltas.set_xlabel("step")
        deltas.legend(fontsize=7)
    return canvas.save(fig, path)
