"""Column declarations (registry: bench/results/columns.py): summary.csv (one row per cell × arm)
and the tables drawn from its rows: contrasts.csv, trainers.csv and scaling.csv."""

from __future__ import annotations

from bench.results.columns_runs import ARM, CELL, CELL_ID, PROVENANCE, WORKLOAD_DIGEST
from bench.results.columns_spec import BOOL, FLOAT, INT, TEXT, Column, Table


def ci(stem: str, unit: str, how: str = "", of: str | None = None) -> tuple[Column, ...]:
    """``<stem>_ci95_low`` and ``_high``: the bounds of the 95% confidence interval of column ``of``
    (default ``stem``)."""
    return tuple(
        Column(f"{stem}_ci95_{end}", FLOAT, unit, f"the {word} bound of `{of or stem}`'s 95% CI{how}")
        for end, word in (("low", "lower"), ("high", "upper"))
    )


N_OK = Column(
    "n_ok", INT, "",
    "the arm's runs that entered the statistics (the report's \"runs ok\"): ok runs whose throughput was "
    "measured",
)  # fmt: skip
SAMPLES_PER_S_MEAN = Column(
    "samples_per_s_mean", FLOAT, "samples/s",
    "mean of runs.csv's `samples_per_s` over the arm's runs in the statistics (with its std and CI)",
)  # fmt: skip
PEAK_VRAM = Column("peak_vram_gib", FLOAT, "GiB", "", of="peak_vram_gib", how="mean")
# The Δ columns: an arm against its reference arm, paired by round (summary.csv: the cell's
# baseline; contrasts.csv: the row's `reference`). bench/results/deltas.py.
N_PAIRS = Column(
    "n_pairs", INT, "",
    "the pairs Δ samples/s is computed from (both runs in the statistics); when the arms share no pair, "
    "the smaller arm's run count",
)  # fmt: skip
DELTA_SPS = (
    Column(
        "delta_samples_per_s_pct", FLOAT, "%",
        "Δ samples/s of the arm against the reference arm: the ratio of geometric means over pairs, − 1",
    ),
    *ci(
        "delta_samples_per_s_pct", "%",
        ": Student-t on the per-pair log-ratios (Stein's interval with the pilot's spread where the cell "
        "has a precision target), back-transformed",
    ),
    Column("delta_samples_per_s_halfwidth_pct", FLOAT, "points", "half the CI's width"),
    Column("delta_samples_per_s_pct_per_pair", TEXT, "%", "each pair's Δ samples/s, space-separated"),
)  # fmt: skip
DELTA_VRAM = (
    Column(
        "delta_peak_vram_gib", FLOAT, "GiB",
        "the arm's peak_vram_gib minus the reference's, the mean over pairs",
    ),
    *ci("delta_peak_vram_gib", "GiB", ": a paired t-interval"),
    Column("delta_peak_vram_pct", FLOAT, "%", "delta_peak_vram_gib as a share of the reference's mean peak"),
)  # fmt: skip
VERDICT_SPEED = Column(
    "verdict_speed", TEXT, "",
    "faster / slower / within ±X% / inconclusive / too few pairs (n): values; the `aa` arm: A/A check "
    "passed (the CI contains 0 and is no wider than the precision target, else `equivalence_pct`) / FAILED "
    "(the CI excludes 0) / not passed (too few pairs, or a CI wider than that target: inconclusive), "
    "docs/method.md; when an arm has no ok run: `liger fits, baseline OOM`, `baseline fits, liger OOM`, "
    "`both arms OOM`; else `n/a (no ok runs)`, `n/a (no ok baseline)`, `n/a (no baseline run)` or `n/a "
    "(no throughput data)`",
)  # fmt: skip
VERDICT_MEMORY = Column(
    "verdict_memory", TEXT, "",
    "leaner / heavier / within ±x GiB (`equivalence_pct` of the reference's mean peak) / …; `n/a (no VRAM "
    "data)` when neither arm was polled",
)  # fmt: skip
CI_METHOD = Column(
    "ci_method", TEXT, "",
    "`paired t on log-ratios`, `Stein two-stage (pilot of n pairs)`, or `welch t on log throughput` when "
    "the arms share no pair",
)  # fmt: skip

SUMMARY_TABLE = Table(
    "summary.csv",
    "one row per cell × arm: the arm's runs in the statistics (records.in_statistics), and its Δ columns "
    "against the baseline arm of the cell (the reference arm); the provenance columns join each distinct "
    "value of the arm's runs",
    (
        CELL_ID, *CELL, WORKLOAD_DIGEST, ARM,
        Column("n_runs", INT, "", "the arm's rows in runs.csv, `not run` rows included"),
        N_OK,
        SAMPLES_PER_S_MEAN,
        Column(
            "samples_per_s_std", FLOAT, "samples/s",
            "the sample standard deviation of those runs' samples/s",
        ),
        *ci("samples_per_s", "samples/s", " (Student-t over the runs)", of="samples_per_s_mean"),
        Column("tokens_per_s_mean", FLOAT, "tokens/s", "", of="tokens_per_s", how="mean"),
        Column(
            "s_per_step_mean", FLOAT, "s",
            "mean of runs.csv's `s_per_step_mean` over the arm's runs in the statistics (with its CI)",
        ),
        Column("s_per_step_median", FLOAT, "s", "", of="s_per_step_median", how="median"),
        *ci("s_per_step", "s", " (Student-t over the runs)", of="s_per_step_mean"),
        PEAK_VRAM,
        Column("peak_vram_gib_max", FLOAT, "GiB", "", of="peak_vram_gib", how="max"),
        Column(
            "peak_vram_delta_gib", FLOAT, "GiB",
            "what `bench compare` compares (the busiest card above its idle baseline)",
            of="peak_vram_delta_gib", how="mean",
        ),
        Column("torch_peak_allocated_gib", FLOAT, "GiB", "", of="torch_peak_allocated_gib", how="mean"),
        Column("torch_peak_reserved_gib", FLOAT, "GiB", "", of="torch_peak_reserved_gib", how="mean"),
        Column("mfu_mean", FLOAT, "", "", of="mfu", how="mean"),
        Column("loss_last_mean", FLOAT, "", "", of="loss_last", how="mean"),
        Column("accuracy_last_mean", FLOAT, "", "", of="accuracy_last", how="mean"),
        Column(
            "accuracy_by_position_last_mean", TEXT, "",
            "per position, the mean of runs.csv's `accuracy_by_position_last` over the arm's runs in the "
            "statistics that logged them, space-separated (as many positions as the shortest)",
        ),
        Column(
            "energy_j_per_sample_mean", FLOAT, "J/sample",
            "mean of runs.csv's `energy_j_per_sample` over the arm's runs in the statistics that have one",
        ),
        Column("energy_source", TEXT, "", "their sources; how many runs had none, and why"),
        N_PAIRS, *DELTA_SPS,
        Column(
            "precision_target_pct", FLOAT, "points",
            "the cell's precision target (`ci_halfwidth_pct`): precision sweeps",
        ),
        Column(
            "pairs_planned", INT, "",
            "the pairs Stein's rule planned for the cell after its pilot, capped",
        ),
        Column("pairs_wanted", INT, "", "the pairs the rule asked for before the cap (`max_pairs`)"),
        Column("hit_pair_cap", BOOL, "", "whether the cap cut them"),
        *DELTA_VRAM,
        Column(
            "delta_torch_peak_allocated_gib", FLOAT, "GiB",
            "the arm's mean torch_peak_allocated_gib minus the reference's",
        ),
        Column("energy_n_pairs", INT, "", "the pairs whose two runs both have an energy"),
        Column(
            "delta_energy_per_sample_pct", FLOAT, "%",
            "Δ J/sample like Δ samples/s, the ratio of geometric means over the pairs whose two runs both "
            "have an energy",
        ),
        *ci("delta_energy_per_sample_pct", "%", ": the plain paired t-interval"),
        Column(
            "saved_ms_per_step", FLOAT, "ms",
            "per pair, the reference's mean steady step time minus the arm's, the mean over pairs; > 0 means "
            "the arm is faster — the absolute saving, which carries over to another trainer's step where a "
            "percentage does not",
        ),
        *ci("saved_ms_per_step", "ms", ": a paired t-interval"),
        Column("saved_ms_per_sample", FLOAT, "ms", "the same per sample, 1000 / samples/s"),
        *ci("saved_ms_per_sample", "ms", ": a paired t-interval"),
        VERDICT_SPEED, VERDICT_MEMORY,
        Column(
            "loss_parity", TEXT, "",
            "`pass (n/n)`, or `FAIL in k of n pairs (…)` from loss_parity.csv: the arm trains differently, "
            "so its speed Δ is not like for like; the report's verdict says so too. `aa_eps`: `floor, not "
            "judged (…)`; `lr_off`: `negative control (…)`; blank for the baseline",
        ),
        Column(
            "delta_accuracy_last", FLOAT, "",
            "the arm's accuracy_last_mean minus the baseline's: accuracy parity beside loss parity",
        ),
        CI_METHOD,
        *(c for c in PROVENANCE if c.name != "gpu_count"),
    ),
)  # fmt: skip

CONTRASTS_TABLE = Table(
    "contrasts.csv",
    "only with the sweep's `contrasts`: per cell and [arm, reference], the arm against the reference arm, "
    "as summary.csv's Δ columns are against the baseline (the two arms' runs of one round are a pair)",
    (
        CELL_ID, *CELL, ARM,
        Column("reference", TEXT, "", "the arm it is compared with"),
        N_PAIRS, *DELTA_SPS, *DELTA_VRAM, VERDICT_SPEED, VERDICT_MEMORY, CI_METHOD,
    ),
)  # fmt: skip

# One cell shape run by two trainers: per arm and ordered pair (source, target), the target's Δ
# samples/s predicted from the source's saving per step and the target's own baseline step time.
TRAINERS_TABLE = Table(
    "trainers.csv",
    "only when two trainers ran the same cell (cells equal on the cell columns but `trainer`; with a "
    '"Two trainers, one cell" section in the report): per non-baseline arm both ran and each ordered pair '
    "of trainers. The same absolute saving is a smaller share of a longer step, so a slower trainer gains "
    "fewer percent from the same kernels",
    (
        Column("source_cell_id", TEXT, "", "the cell whose saving predicts"),
        Column("target_cell_id", TEXT, "", "the cell whose Δ is predicted"),
        Column("source_trainer", TEXT, "", "the source cell's trainer"),
        Column("target_trainer", TEXT, "", "the target cell's trainer"),
        *(c for c in CELL if c.name != "trainer"),
        ARM,
        Column("source_n_pairs", INT, "", "the source's summary.csv `n_pairs`"),
        Column("source_saved_ms_per_step", FLOAT, "ms", "summary.csv's `saved_ms_per_step` of the source"),
        *ci("source_saved_ms_per_step", "ms"),
        Column("target_baseline_s_per_step", FLOAT, "s", "the target's baseline `s_per_step_mean`"),
        Column(
            "predicted_delta_samples_per_s_pct", FLOAT, "%",
            "100 · (T / (T − saved) − 1) with T the target's baseline step",
        ),
        *ci("predicted_delta_samples_per_s_pct", "%", ": from the saving's CI alone"),
        Column("target_n_pairs", INT, "", "the target's summary.csv `n_pairs`"),
        Column(
            "measured_delta_samples_per_s_pct", FLOAT, "%",
            "the target's own Δ samples/s from summary.csv",
        ),
        *ci("measured_delta_samples_per_s_pct", "%", ": its paired CI from summary.csv"),
        Column(
            "measured_ci_contains_prediction", BOOL, "",
            "whether the measured CI holds the predicted point (blank when either is missing)",
        ),
    ),
)  # fmt: skip

# Cells that differ only in their world size (gpus x nodes) form one scaling series (one trainer's).
SCALING_TABLE = Table(
    "scaling.csv",
    "only when cells differ only in world size (e.g. `gpus_per_run: [1, 2]`; with `scaling.png` and a "
    "Scaling section in the report; a series is one trainer's): one row per arm and size, from summary.csv",
    (
        *(c for c in CELL if c.name not in ("gpus", "nodes")), ARM,
        *(c for c in CELL if c.name in ("gpus", "nodes")),
        Column("world_size", INT, "", "gpus × nodes"),
        N_OK, SAMPLES_PER_S_MEAN,
        Column("samples_per_s_per_gpu", FLOAT, "samples/s", "samples_per_s_mean / world_size"),
        Column(
            "scaling_efficiency_pct", FLOAT, "%",
            "per-GPU samples/s as % of the same arm's at the smallest world size",
        ),
        *DELTA_SPS[:3],
        PEAK_VRAM,
    ),
)  # fmt: skip
