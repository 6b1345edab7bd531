"""The column lists (schemas) of the tables a sweep's results are built from and written as:
metrics.jsonl's fields as read, runs.csv, summary.csv, contrasts.csv, scaling.csv, trainers.csv,
loss_parity.csv and vram_per_card.csv (docs/run-contract.md); the report's file names. Names only, no logic."""

from __future__ import annotations

from bench.distribution import DEFAULT_TRAINER  # noqa: F401  (re-read by results modules: the trainer a cell.json without "trainer" ran)
from bench.record import METRIC_FIELDS  # noqa: F401  (declared by bench.record.MetricRow; re-read from here)

# A steady step this many times its run's median step time is an outlier (hyperfine warns alike).
OUTLIER_RATIO = 1.5
# Read-only GPU state of the run's busiest card, sampled by the poller: min/median/max over the
# measured steps (vram.jsonl's timed state rows against metrics' "time"), else over the whole run
# (vram.json); state_window says which.
STATE_FIELDS = ["sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w"]
STATE_COLUMNS = [f"{f}_{s}" for f in STATE_FIELDS for s in ("min", "median", "max")] + ["state_window"]
# The energy of a run's measured steps, summed over the run's cards (bench/results/energy.py):
# joules, joules per sample, where they come from ("energy counter", "power integral", or
# "n/a (why)"), how many cards, and the median interval between the readings used.
ENERGY_COLUMNS = ["energy_j", "energy_j_per_sample", "energy_source", "energy_cards", "power_interval_s"]
STARTUP_COLUMNS = [
    "startup_s", "imports_s", "imports_preloaded", "first_step_s", "to_first_measured_step_s",
    "compile_cache_warm", "exit_s", "run_wall_s",
]  # fmt: skip


CELL_COLUMNS = [
    "trainer",
    "profile",
    "mode",
    "batch_size",
    "seq_len",
    "accumulation_steps",
    "num_anchors",
    "gpus",
    "nodes",
]
# A cell's shape: what two trainers' cells must share to be the same cell run by both (trainers.csv).
SHAPE_COLUMNS = [c for c in CELL_COLUMNS if c != "trainer"]
# A digest of what else fixes a cell's work: its training config (the file's sha256) and its `set:`
# overrides (bench/results/identity.py). With the cell columns and the arm: a row's workload identity.
WORKLOAD_DIGEST = "workload_digest"
IDENTITY_COLUMNS = [*CELL_COLUMNS, WORKLOAD_DIGEST, "arm"]
# Cells that differ only in their world size (gpus x nodes) form one scaling series (one trainer's).
SCALING_KEY = ["trainer", "profile", "mode", "batch_size", "seq_len", "accumulation_steps", "num_anchors"]
SCALING_COLUMNS = [
    *SCALING_KEY, "arm", "gpus", "nodes", "world_size", "n_ok", "samples_per_s_mean", "samples_per_s_per_gpu",
    "scaling_efficiency_pct", "delta_samples_per_s_pct", "delta_samples_per_s_pct_ci95_low",
    "delta_samples_per_s_pct_ci95_high", "peak_vram_gib",
]  # fmt: skip
PROVENANCE_COLUMNS = [
    "hostname", "gpu_name", "gpu_count", "driver_version", "cuda_version", "torch_version", "triton_version",
    "transformers_version", "liger_version", "git_commit",
]  # fmt: skip

RUNS_COLUMNS = [
    "run_id", "cell_id", *IDENTITY_COLUMNS, "repeat", "order_index", "status", "reason", "note",
    "steps_total", "warmup_steps", "steps_measured",
    "s_per_step_mean", "s_per_step_median", "s_per_step_std", "s_per_step_p10", "s_per_step_p90",
    "samples_per_s", "tokens_per_s", "mfu",
    "peak_vram_gib", "peak_vram_sum_gib", "peak_vram_delta_gib", "vram_status",
    "torch_peak_allocated_gib", "torch_peak_reserved_gib", "loss_last", "accuracy_last",
    "accuracy_by_position_last", *STARTUP_COLUMNS, *STATE_COLUMNS, *ENERGY_COLUMNS, "start_time", "end_time", *PROVENANCE_COLUMNS,
]  # fmt: skip
RUNS_TEXT_COLUMNS = {
    "run_id", "cell_id", "trainer", "profile", "mode", "arm", WORKLOAD_DIGEST, "status", "reason", "note", "vram_status",
    "start_time", "end_time", "state_window", "compile_cache_warm", "imports_preloaded", "energy_source",
    "accuracy_by_position_last",
    *PROVENANCE_COLUMNS,
} - {"gpu_count"}  # fmt: skip

SUMMARY_PROVENANCE_COLUMNS = [c for c in PROVENANCE_COLUMNS if c != "gpu_count"]
SUMMARY_COLUMNS = [
    "cell_id", *IDENTITY_COLUMNS, "n_runs", "n_ok",
    "samples_per_s_mean", "samples_per_s_std", "samples_per_s_ci95_low", "samples_per_s_ci95_high",
    "tokens_per_s_mean", "s_per_step_mean", "s_per_step_median", "s_per_step_ci95_low", "s_per_step_ci95_high",
    "peak_vram_gib", "peak_vram_gib_max", "peak_vram_delta_gib", "torch_peak_allocated_gib", "torch_peak_reserved_gib",
    "mfu_mean", "loss_last_mean", "accuracy_last_mean", "accuracy_by_position_last_mean",
    "energy_j_per_sample_mean", "energy_source",
    "n_pairs", "delta_samples_per_s_pct", "delta_samples_per_s_pct_ci95_low", "delta_samples_per_s_pct_ci95_high",
    "delta_samples_per_s_halfwidth_pct", "delta_samples_per_s_pct_per_pair",
    "precision_target_pct", "pairs_planned", "pairs_wanted", "hit_pair_cap",
    "delta_peak_vram_gib", "delta_peak_vram_gib_ci95_low", "delta_peak_vram_gib_ci95_high",
    "delta_peak_vram_pct", "delta_torch_peak_allocated_gib",
    "energy_n_pairs", "delta_energy_per_sample_pct", "delta_energy_per_sample_pct_ci95_low",
    "delta_energy_per_sample_pct_ci95_high",
    "saved_ms_per_step", "saved_ms_per_step_ci95_low", "saved_ms_per_step_ci95_high",
    "saved_ms_per_sample", "saved_ms_per_sample_ci95_low", "saved_ms_per_sample_ci95_high",
    "verdict_speed", "verdict_memory", "loss_parity", "delta_accuracy_last", "ci_method",
    *SUMMARY_PROVENANCE_COLUMNS,
]  # fmt: skip

LOSS_PARITY_COLUMNS = [
    "cell_id", "trainer", "profile", "mode", "batch_size", "seq_len", "gpus", "nodes", "arm", "repeat",
    "steps_compared",
    "max_abs_delta", "max_abs_delta_step", "last_step", "last_step_abs_delta",
    "loss_last_baseline", "loss_last_arm", "tolerance", "criterion", "passed",
]  # fmt: skip
PARITY_CRITERION = "last_step_abs_delta <= tolerance"

VRAM_PER_CARD_COLUMNS = [
    "run_id", "cell_id", "arm", "repeat", "node", "card_index", "card_name", "total_gib",
    "baseline_used_gib", "peak_used_gib", "peak_delta_gib",
]  # fmt: skip


CONTRAST_COLUMNS = [
    "cell_id", *CELL_COLUMNS, "arm", "reference", "n_pairs", "delta_samples_per_s_pct",
    "delta_samples_per_s_pct_ci95_low", "delta_samples_per_s_pct_ci95_high",
    "delta_samples_per_s_halfwidth_pct", "delta_samples_per_s_pct_per_pair", "delta_peak_vram_gib",
    "delta_peak_vram_gib_ci95_low", "delta_peak_vram_gib_ci95_high", "delta_peak_vram_pct",
    "verdict_speed", "verdict_memory", "ci_method",
]  # fmt: skip

# One cell shape run by two trainers: per arm and ordered pair (source, target), the target's Δ
# samples/s predicted from the source's saving per step and the target's own baseline step time.
TRAINERS_COLUMNS = [
    "source_cell_id", "target_cell_id", "source_trainer", "target_trainer", *SHAPE_COLUMNS, "arm",
    "source_n_pairs", "source_saved_ms_per_step", "source_saved_ms_per_step_ci95_low",
    "source_saved_ms_per_step_ci95_high", "target_baseline_s_per_step",
    "predicted_delta_samples_per_s_pct", "predicted_delta_samples_per_s_pct_ci95_low",
    "predicted_delta_samples_per_s_pct_ci95_high", "target_n_pairs", "measured_delta_samples_per_s_pct",
    "measured_delta_samples_per_s_pct_ci95_low", "measured_delta_samples_per_s_pct_ci95_high",
    "measured_ci_contains_prediction",
]  # fmt: skip

# The files `bench report` writes at the top of a sweep directory: always, and only when the
# sweep has them (contrasts, two trainers of one cell, several world sizes, a capacity search, a
# parity section).
# README.md's and docs/run-contract.md's layouts name each one (tests/test_docs_match.py).
REPORT_FILES = [
    "runs.csv", "summary.csv", "loss_parity.csv", "vram_per_card.csv", "manifest.json", "report.md", "forest.png",
    "throughput.png", "vram_per_card.png", "loss_curves.png", "step_time_dist.png",
]  # fmt: skip
OPTIONAL_REPORT_FILES = [
    "contrasts.csv", "trainers.csv", "scaling.csv", "scaling.png", "capacity.csv", "capacity.png",
    "training_parity.csv", "training_parity.png",
]  # fmt: skip
