"""Column declarations (registry: bench/results/columns.py): capacity.csv (`bench capacity`),
training_parity.csv (a parity sweep) and compare.csv (`bench compare --out`)."""

from __future__ import annotations

from bench.results.columns_runs import ARM, CELL, CELL_ID, TRAINER, WORKLOAD_DIGEST
from bench.results.columns_spec import FLOAT, INT, TEXT, Column, Table
from bench.results.columns_summary import ci


def _cell(*names: str) -> tuple[Column, ...]:
    return tuple(c for c in CELL if c.name in names)


CAPACITY_TABLE = Table(
    "capacity.csv",
    "`bench capacity`: per series and arm, the largest batch size (or sequence length) that trained, read "
    "back from the search's probes in runs.csv",
    (
        Column(
            "series", TEXT, "",
            "`<profile>_<mode>_s<seq_len>` (a search of the batch size) or `_bs<batch_size>` (of the "
            "sequence), plus `_g<gpus>` and `_n<nodes>` above 1; another trainer's ends `_<trainer>`",
        ),
        *_cell("trainer", "profile", "mode", "gpus", "nodes"),
        Column("axis", TEXT, "", "what the search varies: `batch_size` or `seq_len`"),
        ARM,
        Column("largest_fit", INT, "", "the largest value of the axis whose probe trained (status ok)"),
        Column("first_oom", INT, "", "the smallest value above it whose probe ran out of memory"),
        Column("probes", INT, "", "the arm's probes (runs) in the series"),
        Column("stopped_by", TEXT, "", "oom / max reached / the error that ended the arm's search"),
        Column(
            "peak_vram_gib_at_largest", FLOAT, "GiB",
            "runs.csv's `peak_vram_gib` of the largest fit's probe",
        ),
        Column("samples_per_s_at_largest", FLOAT, "samples/s", "its `samples_per_s`"),
        Column("card_total_gib", FLOAT, "GiB", "the memory of that probe's busiest card (vram_per_card.csv)"),
        Column(
            "fit_ratio_vs_baseline", FLOAT, "",
            "largest_fit over the baseline's in the series; blank where fit_ratio_bound gives none",
        ),
        Column(
            "fit_ratio_bound", TEXT, "",
            "`exact`, to the granularity, when both searches found an OOM; `at least` / `at most` when only "
            "the arm's / only the baseline's search reached `max`; `unknown: both fit the max`, with no "
            "ratio, when both did",
        ),
    ),
)  # fmt: skip

_FLOOR = (
    "the A/A floor: the `aa` run's |Δ| from the baseline, or with an `aa_eps` run the larger of that and the "
    "`aa_eps` run's"
)
TRAINING_PARITY_TABLE = Table(
    "training_parity.csv",
    "a sweep with a `parity:` section: per cell, arm (neither the baseline nor a floor arm, `aa` and "
    "`aa_eps`) and metric, the arm's divergence from the baseline judged window by window against "
    "the A/A floor (docs/method.md). A divergence at a step is the largest |x_arm − x_baseline| over the "
    "rounds that ran both",
    (
        CELL_ID, TRAINER, *_cell("profile", "mode"), ARM,
        Column("metric", TEXT, "", "`loss`, `accuracy` or `grad_norm`"),
        Column("rounds", INT, "", "the rounds that ran both the arm and the baseline"),
        Column(
            "steps_compared", INT, "",
            "the steps where the arm's divergence, the floor and the baseline are all known",
        ),
        Column(
            "window_steps", INT, "",
            "a window's width in steps: the section's `window`, else a tenth of the steps, at least 10",
        ),
        Column(
            "windows", INT, "",
            "the windows the compared steps are cut into (a short last one joins the one before)",
        ),
        Column("windows_within", INT, "", "the windows whose RMS divergence is within worst_allowed's rule"),
        Column(
            "worst_window", TEXT, "",
            "the window furthest over (or nearest to) what it may reach, `first-last` step",
        ),
        Column("worst_rms_arm", FLOAT, "", "the RMS of the arm's divergence in that window"),
        Column("worst_rms_floor", FLOAT, "", f"the RMS of {_FLOOR}, in that window"),
        Column(
            "worst_allowed", FLOAT, "",
            "what the window's RMS divergence may reach: `margin` × the floor's RMS plus `tolerance` (for "
            "grad_norm: `tolerance` × the baseline's mean in the window)",
        ),
        Column("max_abs_delta", FLOAT, "", "the arm's largest divergence over all steps"),
        Column("max_abs_delta_floor", FLOAT, "", "the floor's largest"),
        Column("last_abs_delta", FLOAT, "", "the arm's divergence at the last step"),
        Column("last_abs_delta_floor", FLOAT, "", "the floor's at the last step"),
        Column("loss_first_baseline", FLOAT, "", "the baseline's loss at its first step (mean over rounds)"),
        Column("loss_last_baseline", FLOAT, "", "the baseline's mean loss over its last window"),
        Column("loss_drop_pct", FLOAT, "%", "the fall from the first to the last, as % of the first"),
        Column(
            "margin", FLOAT, "",
            "the section's `margin`: how many times the floor's RMS a window may reach",
        ),
        Column(
            "tolerance", FLOAT, "",
            "the last-resort term: `loss_atol` or `accuracy_atol`; for grad_norm the relative "
            "`grad_norm_rtol`; 0 when an `aa_eps` run measured the floor (the term stands for that measurement)",
        ),
        Column(
            "verdict", TEXT, "",
            "`equivalent` when every window is within; `not equivalent: …` naming the worst window, or the "
            "step where a run logged NaN or inf; `no verdict: …` without a run of the arm paired with a "
            "baseline, without an A/A run, or when the baseline's loss fell less than `min_loss_drop_pct`",
        ),
    ),
)  # fmt: skip


def _sides(name: str, unit: str, what: str) -> tuple[Column, ...]:
    return tuple(Column(f"{name}_{s}", FLOAT, unit, f"{what}, side {s.upper()}") for s in ("a", "b"))


COMPARE_TABLE = Table(
    "compare.csv",
    "`bench compare A B --out DIR`: one row per workload in A or B, A's order first. The workload "
    "identity (the cell columns, workload_digest, arm) is what rows are paired on: only rows equal on "
    "every key are compared; a file from before a key existed reads `trainer` as `embedded`, `nodes` as 1 "
    "and the others as unknown",
    (
        *CELL, WORKLOAD_DIGEST, ARM,
        Column(
            "present", TEXT, "",
            "`both`, `A only`, `B only`, or `different workloads`: an A row and a B row of one trainer, "
            "profile, mode and arm that differ in another key, never compared and never passed by a gate",
        ),
        Column(
            "workloads_differ", TEXT, "",
            "the keys that differ, e.g. `accumulation_steps 4 in A, 2 in B`",
        ),
        Column("estimate", TEXT, "", "`per-run data (Welch)`, or `point estimate (summary.csv only)`"),
        *_sides("samples_per_s", "samples/s", "summary.csv's `samples_per_s_mean`"),
        Column("samples_per_s_ratio_b_over_a", FLOAT, "", "1 + samples_per_s_delta_pct / 100"),
        Column(
            "samples_per_s_delta_pct", FLOAT, "%",
            "B vs A: where both sides have runs, the ratio of geometric means of their runs' samples/s (runs "
            "of two sweeps are not paired); a summary alone: the ratio of means, labelled a point estimate",
        ),
        *ci("samples_per_s_delta_pct", "%", ": Welch's interval on log throughput"),
        Column(
            "n_runs_a", INT, "",
            "side A's runs with a samples/s of the row's workload (blank: no runs.csv)",
        ),
        Column("n_runs_b", INT, "", "the same of side B"),
        Column(
            "verdict", TEXT, "",
            "B faster / B slower / within ±1% / inconclusive / too few runs (fewer than 3 a side) / `n/a "
            "(…)` / `not compared: different workloads` / `arm not in effect in A|B: …` (no verdict, no "
            "gain, never a gate's pass)",
        ),
        *_sides("s_per_step", "s", "summary.csv's `s_per_step_mean`"),
        *_sides("vram_over_idle_gib", "GiB", "summary.csv's `peak_vram_delta_gib`"),
        Column(
            "vram_over_idle_b_minus_a_gib", FLOAT, "GiB",
            "peak VRAM of the busiest card above its idle baseline, B minus A: what the runs used, whatever "
            "the lent card held before",
        ),
        *_sides("peak_vram_gib", "GiB", "summary.csv's `peak_vram_gib`"),
        Column("peak_vram_b_minus_a_gib", FLOAT, "GiB", "the gross polled peaks, B minus A"),
        *(
            Column(f"delta_samples_per_s_pct{part}_{s}", FLOAT, "%", f"{what}, side {s.upper()}")
            for s in ("a", "b")
            for part, what in (
                ("", "the arm's own gain: its paired Δ samples/s vs its baseline, from its summary"),
                ("_ci95_low", "the lower bound of that gain's 95% CI"),
                ("_ci95_high", "the upper bound of that gain's 95% CI"),
            )
        ),
        Column("n_pairs_a", INT, "", "side A's pairs of the arm and its baseline (per-run data)"),
        Column("n_pairs_b", INT, "", "side B's"),
        Column("gain_change_points", FLOAT, "points", "B's gain minus A's"),
        *ci("gain_change_points", "points", ": Welch's on the two sides' delta-method standard errors"),
        Column(
            "parity_a", TEXT, "",
            "side A's parity of the row's arm: `FAIL: ` and why, from its summary.csv's `loss_parity` and "
            "the training_parity.csv beside it; `pass`; or blank where the side has none",
        ),
        Column("parity_b", TEXT, "", "the same of side B"),
        Column(
            "gate", TEXT, "",
            "`--fail-if-slower`'s outcome for the row: pass / fail / inconclusive / not decided (blank "
            "without that gate)",
        ),
        Column("gain_gate", TEXT, "", "`--fail-if-gain-drops`'s outcome for the row, alike"),
    ),
)  # fmt: skip
