"""report.md's sections of results, each a list of Markdown lines: the main table (one row per
cell and arm), arm against arm, scaling, capacity, precision, loss parity, the runs that did
not finish ok and the plots. Values are formatted by bench.fmt; the tables are bench.results'."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from bench import fmt
from bench.arms import BASELINE
from bench.results.columns import PARITY_CRITERION
from bench.results.parity import loss_parity_gaps
from bench.results.records import RunRecord, in_statistics
from bench.results.verdicts import Speed, parity_failed, speed_kind

MAIN_TABLE_HEADER = [
    "profile", "mode", "batch", "seq", "gpus", "arm", "runs ok", "samples/s", "s/step", "peak VRAM (GiB, polled)",
    "torch peak alloc (GiB)", "loss @ last step", "Δ samples/s (95% CI)", "Δ peak VRAM (95% CI)", "verdict",
]  # fmt: skip
PARITY_TABLE_HEADER = [
    "profile", "mode", "batch", "seq", "gpus", "arm", "repeat", "steps compared", "max |Δ loss| (step)",
    "|Δ loss| @ last step", "loss baseline", "loss arm", "tolerance", "result",
]  # fmt: skip
PLOT_FILES = {
    "forest.png": "Headline: Δ samples/s and Δ peak VRAM per arm, paired 95% CIs",
    "throughput.png": "Throughput (samples/s, 95% CI)",
    "vram_per_card.png": "Peak VRAM per card",
    "loss_curves.png": "Loss curves",
    "step_time_dist.png": "Steady-state step times",
}


def _delta_cell(point: Any, lo: Any, hi: Any, spec: str, unit: str, extra: str = "") -> str:
    """``+10.2% [+8.1, +12.3]``: a point estimate with its CI when there is one."""
    if fmt.isnan(point):
        return "—"
    text = f"{fmt.f(point, spec)}{unit}{extra}"
    return text if fmt.isnan(lo) else f"{text} [{fmt.f(lo, spec)}, {fmt.f(hi, spec)}]"


def _why(r: Any) -> str:
    """A runs.csv row's reason, else its note (an ok run left out of the statistics says why there)."""
    return r.reason if pd.notna(r.reason) else r.note if pd.notna(r.note) else "no reason recorded"


def _not_run_reasons(runs: pd.DataFrame, cell_id: Any, arm: Any) -> str:
    g = runs[(runs["cell_id"] == cell_id) & (runs["arm"] == arm) & ~in_statistics(runs)]
    reasons = dict.fromkeys(f"{r.status}: {_why(r)}" for r in g.itertuples())
    return f"no ok run ({'; '.join(reasons)})" if reasons else "no ok run"


def with_trainer_column(df: pd.DataFrame, header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table of ``rows`` (one per row of ``df``), with a trainer column first when ``df``
    holds more than one trainer's cells (two trainers of one shape would read alike without it)."""
    trainers = df["trainer"] if "trainer" in df else pd.Series(dtype=object)
    if trainers.nunique() < 2:
        return fmt.table(header, rows)
    return fmt.table(["trainer", *header], [[fmt.md(t), *r] for t, r in zip(trainers, rows, strict=True)])


def _world(gpus: Any, nodes: Any) -> str:
    """``2`` GPUs, or ``2×2`` for 2 GPUs on each of 2 nodes."""
    n = fmt.num(nodes)
    return fmt.integer(gpus) if math.isnan(n) or n <= 1 else f"{fmt.integer(gpus)}×{fmt.integer(n)}"


def scaling_section(scaling: pd.DataFrame) -> list[str]:
    """Per series of world sizes: samples/s, per GPU, efficiency vs the smallest size, Δ with CI, VRAM."""
    if not len(scaling):
        return []
    rows = [
        [
            fmt.md(r.profile), fmt.md(r.mode), fmt.integer(r.batch_size), fmt.integer(r.seq_len), fmt.md(r.arm), _world(r.gpus, r.nodes),
            fmt.f(r.samples_per_s_mean, ".2f"), fmt.f(r.samples_per_s_per_gpu, ".2f"), fmt.f(r.scaling_efficiency_pct, ".1f"),
            _delta_cell(r.delta_samples_per_s_pct, r.delta_samples_per_s_pct_ci95_low,
                        r.delta_samples_per_s_pct_ci95_high, "+.1f", "%"),
            fmt.f(r.peak_vram_gib, ".2f"),
        ]
        for r in scaling.itertuples()
    ]  # fmt: skip
    header = ["profile", "mode", "batch", "seq", "arm", "gpus", "samples/s", "per GPU", "efficiency %",
              "Δ samples/s vs baseline (95% CI)", "peak VRAM per card (GiB)"]  # fmt: skip
    note = (
        "Efficiency: per-GPU samples/s as a percentage of the same arm's at the smallest world size "
        "(100 = perfect scaling). Plot: scaling.png; data: scaling.csv."
    )
    return ["## Scaling", "", *with_trainer_column(scaling, header, rows), "", note, ""]


def _fit_ratio(r: Any) -> str:
    """``1.67×``, ``≥ 2.00×`` / ``≤ 0.50×`` when one search reached its max, or why there is none."""
    if r.arm == BASELINE:
        return "—"
    bound = getattr(r, "fit_ratio_bound", None)
    if isinstance(bound, str) and bound.startswith("unknown"):
        return "both fit the search's max"
    if fmt.isnan(r.fit_ratio_vs_baseline):
        return "—"
    sign = {"at least": "≥ ", "at most": "≤ "}.get(bound, "") if isinstance(bound, str) else ""
    return f"{sign}{r.fit_ratio_vs_baseline:.2f}×"


def capacity_section(capacity: pd.DataFrame) -> list[str]:
    """Per series and arm: the largest value that fit, the first that did not, and the ratio."""
    if not len(capacity):
        return []
    rows = [
        [
            fmt.md(r.series), _world(r.gpus, r.nodes), fmt.md(r.arm), fmt.integer(r.largest_fit), fmt.integer(r.first_oom), fmt.integer(r.probes), fmt.md(r.stopped_by),
            fmt.f(r.peak_vram_gib_at_largest, ".2f"), fmt.f(r.card_total_gib, ".1f"), fmt.f(r.samples_per_s_at_largest, ".2f"),
            _fit_ratio(r),
        ]
        for r in capacity.itertuples()
    ]  # fmt: skip
    axis = capacity["axis"].iloc[0]
    header = ["series", "gpus", "arm", f"largest {axis} that fits", "first OOM", "probes", "stopped by",
              "peak VRAM at largest (GiB)", "card (GiB)", "samples/s at largest", "vs baseline"]  # fmt: skip
    return ["## Capacity", "", *fmt.table(header, rows), "", "Plot: capacity.png; data: capacity.csv.", ""]


def main_table(summary: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """The seeds'-style table: one row per (cell, arm)."""
    rows = []
    for r in summary.itertuples():
        if r.arm == BASELINE:
            d_sps, d_vram, verdict = "—", "—", "baseline"
        else:
            d_sps = _delta_cell(
                r.delta_samples_per_s_pct, r.delta_samples_per_s_pct_ci95_low, r.delta_samples_per_s_pct_ci95_high,
                "+.1f", "%",
            )  # fmt: skip
            d_vram = _delta_cell(
                r.delta_peak_vram_gib, r.delta_peak_vram_gib_ci95_low, r.delta_peak_vram_gib_ci95_high,
                "+.2f", " GiB", f" ({fmt.f(r.delta_peak_vram_pct, '+.1f')}%)",
            )  # fmt: skip
            same = r.verdict_speed == r.verdict_memory  # e.g. "liger fits, baseline OOM"
            verdict = r.verdict_speed if same else f"speed: {r.verdict_speed}; memory: {r.verdict_memory}"
            if parity_failed(r.loss_parity):  # not the same training: say so beside the speed
                verdict += f"; loss parity {r.loss_parity}"
        if r.n_ok == 0:
            verdict = _not_run_reasons(runs, r.cell_id, r.arm)
            if r.arm != BASELINE and speed_kind(r.verdict_speed) is Speed.OOM:
                verdict = f"{r.verdict_speed}; {verdict}"
        rows.append(
            [
                fmt.md(r.profile), fmt.md(r.mode), fmt.integer(r.batch_size), fmt.integer(r.seq_len), _world(r.gpus, r.nodes),
                fmt.md(r.arm), f"{fmt.integer(r.n_ok)}/{fmt.integer(r.n_runs)}", fmt.f(r.samples_per_s_mean, ".2f"), fmt.f(r.s_per_step_mean, ".3f"), fmt.f(r.peak_vram_gib, ".2f"),
                fmt.f(r.torch_peak_allocated_gib, ".2f"), fmt.f(r.loss_last_mean, ".4f"), d_sps, d_vram, fmt.md(verdict),
            ]
        )  # fmt: skip
    return with_trainer_column(summary, MAIN_TABLE_HEADER, rows)


def contrast_section(contrasts: pd.DataFrame, summary: pd.DataFrame | None = None) -> list[str]:
    """Arm against arm (the sweep's ``contrasts``), paired by round like the baseline comparisons;
    an arm whose loss parity against the baseline fails (summary) is flagged here too."""
    if not len(contrasts):
        return []
    parity = {}
    if summary is not None and "loss_parity" in summary:
        parity = {
            (c, a): str(p) for c, a, p in zip(summary["cell_id"], summary["arm"], summary["loss_parity"])
        }
    rows = []
    for r in contrasts.itertuples():
        same = r.verdict_speed == r.verdict_memory
        verdict = r.verdict_speed if same else f"speed: {r.verdict_speed}; memory: {r.verdict_memory}"
        for arm in (r.arm, r.reference):
            if parity_failed(parity.get((r.cell_id, arm))):
                verdict += f"; {arm}'s loss parity against the baseline FAILED"
        rows.append(
            [
                fmt.md(r.profile), fmt.md(r.mode), fmt.integer(r.batch_size), fmt.integer(r.seq_len), _world(r.gpus, r.nodes),
                fmt.md(r.arm), fmt.md(r.reference), fmt.integer(r.n_pairs),
                _delta_cell(r.delta_samples_per_s_pct, r.delta_samples_per_s_pct_ci95_low,
                            r.delta_samples_per_s_pct_ci95_high, "+.1f", "%"),
                _delta_cell(r.delta_peak_vram_gib, r.delta_peak_vram_gib_ci95_low, r.delta_peak_vram_gib_ci95_high,
                            "+.2f", " GiB", f" ({fmt.f(r.delta_peak_vram_pct, '+.1f')}%)"),
                fmt.md(verdict),
            ]
        )  # fmt: skip
    header = ["profile", "mode", "batch", "seq", "gpus", "arm", "against", "pairs", "Δ samples/s (95% CI)",
              "Δ peak VRAM (95% CI)", "verdict"]  # fmt: skip
    note = (
        "Each arm against another (the sweep's `contrasts`): the two arms' runs of one round form a pair, "
        "Δ is the ratio of geometric means with a t-interval on the per-pair log-ratios, as for the "
        "baseline comparisons; the rounds are those the baseline comparisons planned. Data: contrasts.csv."
    )
    return ["## Arm against arm", "", *with_trainer_column(contrasts, header, rows), "", note, ""]


def parity_table(parity: pd.DataFrame) -> list[str]:
    rows = [
        [
            fmt.md(r.profile), fmt.md(r.mode), fmt.integer(r.batch_size), fmt.integer(r.seq_len), _world(r.gpus, r.nodes), fmt.md(r.arm),
            fmt.integer(r.repeat), fmt.integer(r.steps_compared), f"{fmt.f(r.max_abs_delta, '.2e')} ({fmt.integer(r.max_abs_delta_step)})",
            fmt.f(r.last_step_abs_delta, ".2e"), fmt.f(r.loss_last_baseline, ".4f"), fmt.f(r.loss_last_arm, ".4f"),
            fmt.f(r.tolerance, "g"),
            "pass" if r.passed else "FAIL",
        ]
        for r in parity.itertuples()
    ]  # fmt: skip
    return with_trainer_column(parity, PARITY_TABLE_HEADER, rows)


def precision_section(summary: pd.DataFrame, sweep: dict) -> list[str]:
    """The precision rule and, per cell and arm, the pairs it asked for and the half-width reached."""
    targets = sweep.get("precision_targets") or {}
    if not targets:
        return []
    lines = [
        "## Precision",
        "",
        "Stein's two-stage rule: every cell runs a pilot of `min_pairs` pairs; the pilot's spread of the "
        "per-pair log-ratios fixes the total N = max(n0, ⌈(t·s0/h)²⌉) (capped at `max_pairs`) that gives a 95% "
        "CI of half-width h (h chosen so that the back-transformed interval is ±target percentage points "
        "around the pilot's ratio); the interval uses the pilot's s0 and its t quantile (n0−1 degrees of "
        "freedom), so its coverage does not depend on how many pairs the pilot asked for. A cell runs as many "
        "pairs as its most demanding arm wants. A resumed sweep recomputes the same N from the same pilot.",
        "",
    ]
    rows = []
    for r in summary[summary["arm"] != BASELINE].itertuples():
        t = targets.get(r.cell_id)
        if not t:
            continue
        used, planned = fmt.num(r.n_pairs), fmt.num(r.pairs_planned)
        if r.hit_pair_cap is True:
            state = "cap hit: target not reached"
        elif not math.isnan(planned) and not math.isnan(used) and used < planned:
            state = f"unfinished: {int(planned - used)} more pair(s) planned (--resume)"
        else:
            state = (
                "target met" if fmt.num(r.delta_samples_per_s_halfwidth_pct) <= t["ci_halfwidth_pct"] else "—"
            )
        rows.append(
            [
                fmt.md(r.cell_id), fmt.md(r.arm), f"±{t['ci_halfwidth_pct']:g}", str(t["min_pairs"]),
                fmt.integer(r.pairs_wanted), str(t["max_pairs"]), fmt.integer(r.n_pairs),
                f"±{fmt.f(r.delta_samples_per_s_halfwidth_pct, '.2f')}", state,
            ]
        )  # fmt: skip
    header = ["cell", "arm", "target (points)", "pilot pairs", "pairs this arm wants", "cap", "pairs used",
              "half-width achieved", "state"]  # fmt: skip
    return [*lines, *fmt.table(header, rows), ""]


def loss_parity_section(
    parity: pd.DataFrame, records: list[RunRecord], runs: pd.DataFrame | None = None
) -> list[str]:
    """The loss parity table with its criterion, and the (cell, repeat)s not compared and why
    (``runs``: runs.csv's table of ``records``, when the caller has it)."""
    lines = ["## Loss parity", ""]
    if len(parity):
        lines += parity_table(parity)
        lines += [
            "",
            f"Criterion: `{PARITY_CRITERION}`; max |Δ loss| is over every common step, warm-up included.",
        ]
    else:
        lines += ["No (cell, repeat) has losses from both arms."]
    gaps = loss_parity_gaps(records, runs)
    if gaps:
        lines += ["", "Not compared:", *(f"- {fmt.md(g)}" for g in gaps)]
    return lines


def not_ok_section(runs: pd.DataFrame) -> list[str]:
    """The runs that did not finish ok with their reasons, then the notes on ok runs."""
    lines = ["## Runs that did not finish ok", ""]
    bad = runs[runs["status"] != "ok"]
    if len(bad):
        lines += fmt.table(
            ["run", "status", "reason", "note"],
            [
                [fmt.md(r.run_id), fmt.md(r.status), fmt.md(r.reason), fmt.md(r.note)]
                for r in bad.itertuples()
            ],
        )
    else:
        lines += [f"All {len(runs)} runs finished ok."]
    noted = runs[(runs["status"] == "ok") & runs["note"].notna()]
    if len(noted):
        lines += [
            "",
            "Notes on ok runs:",
            *(f"- {fmt.md(r.run_id)}: {fmt.md(r.note)}" for r in noted.itertuples()),
        ]
    return lines


def plots_section(drawn: bool = True) -> list[str]:
    """The plots every report has (the headline figure first), and where the data is; a line
    saying they were not drawn when BENCH_NO_PLOTS was set."""
    pictures = [f"![{title}]({name})" for name, title in PLOT_FILES.items()]
    return [
        "## Plots",
        "",
        *(
            pictures
            if drawn
            else ["Not drawn: `BENCH_NO_PLOTS` was set (`python -m bench report DIR` without it draws them)."]
        ),
        "",
        "Data: runs.csv, summary.csv, loss_parity.csv, vram_per_card.csv (columns: see the README).",
        "",
    ]


def energy_section(summary: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """Energy per sample per cell and arm (the run's cards over its measured steps) and its Δ vs the
    baseline with the paired 95% CI; one n/a line, with the reason, when no run has a reading."""
    if "energy_j_per_sample_mean" not in summary or summary["energy_j_per_sample_mean"].isna().all():
        reasons = runs["energy_source"].dropna() if "energy_source" in runs else pd.Series(dtype=object)
        return [f"Energy per sample: {fmt.md(reasons.iloc[0]) if len(reasons) else 'n/a (no runs)'}.", ""]
    rows = []
    for r in summary.itertuples():
        delta = "—"
        if r.arm != BASELINE:
            delta = _delta_cell(
                r.delta_energy_per_sample_pct, r.delta_energy_per_sample_pct_ci95_low,
                r.delta_energy_per_sample_pct_ci95_high, "+.1f", "%",
            )  # fmt: skip
            n = fmt.num(r.energy_n_pairs)
            delta = "n/a" if delta == "—" else f"{delta} ({int(n)} pair{'s' if n != 1 else ''})"
        j = r.energy_j_per_sample_mean
        per_sample = "n/a" if fmt.isnan(j) else fmt.f(j, ".2f")
        rows.append(
            [
                fmt.md(r.profile), fmt.md(r.mode), fmt.integer(r.batch_size), fmt.integer(r.seq_len), _world(r.gpus, r.nodes),
                fmt.md(r.arm), per_sample, delta, fmt.md(r.energy_source),
            ]
        )  # fmt: skip
    header = ["profile", "mode", "batch", "seq", "gpus", "arm", "J/sample", "Δ energy/sample (95% CI)",
              "source"]  # fmt: skip
    dt = pd.to_numeric(runs.loc[in_statistics(runs), "power_interval_s"], errors="coerce").median()
    note = (
        "Energy per sample: the joules of the run's cards over its measured steps (their energy counters, "
        "else the integral of their power) over the samples of those steps; Δ is the ratio of geometric means "
        f"over pairs with a t-interval on the per-pair log-ratios. Readings every {fmt.f(dt, '.2f')} s "
        "(median); columns energy_* in runs.csv and summary.csv."
    )
    sources = runs.loc[in_statistics(runs), "energy_source"].dropna().astype(str)
    if sources.str.contains("own turns").any():  # lockstep pairs (bench/results/energy.py)
        note += (
            " In lockstep pairs both runs share the card, so a run's energy is the card's over its own "
            "measured turns alone (lockstep.jsonl's start and end of each), the counter read every 0.1 s "
            "and interpolated at each turn's two ends; a run with a turn the readings cannot attribute "
            "has none, its source saying which turn and why."
        )
    return ["**Energy per sample**", "", *with_trainer_column(summary, header, rows), "", note, ""]
