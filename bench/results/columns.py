"""The column registry: every column of every CSV the suite writes (runs.csv, summary.csv,
loss_parity.csv, vram_per_card.csv, contrasts.csv, trainers.csv, scaling.csv, capacity.csv,
training_parity.csv, compare.csv) is declared once, as a Column (name, type, unit, meaning:
bench/results/columns_spec.py) in its Table, in the order it is written: bench/results/columns_runs.py,
columns_summary.py and columns_other.py. Every column list the code uses (RUNS_COLUMNS,
SUMMARY_COLUMNS, ..., RUNS_TEXT_COLUMNS) is derived here from those tables, and docs/columns.md is
generated from them (bench/results/columns_doc.py). Also here: metrics.jsonl's fields as read, and
the report's file names. No logic.

Adding a column is one declaration plus `make golden`:

1. Declare it in its table's tuple, where it is to be written. A summary.csv column that is the mean,
   median or max of a runs.csv column over an arm's runs in the statistics says so (``of``, ``how``)
   and needs nothing else (bench.results.tables.summary_table computes it). Any other column needs
   the code that computes its value (runs.csv: bench.results.records.run_row; summary.csv:
   tables.summary_table or deltas.delta_columns; the other tables: their builders).
2. `make golden`: rebuilds every committed sweep's CSVs and report (tests/test_results_golden.py
   holds them byte for byte) and writes docs/columns.md again (tests/test_docs_match.py holds it).

tests/test_layout.py fails when a CSV the report writes has a column not declared here, or when a
module outside the registry defines its own list of column names for a table.
"""

from __future__ import annotations

from bench.distribution import DEFAULT_TRAINER  # noqa: F401  (re-read by results modules: the trainer a cell.json without "trainer" ran)
from bench.record import METRIC_FIELDS  # noqa: F401  (declared by bench.record.MetricRow; re-read from here)
from bench.results import columns_other, columns_runs, columns_summary
from bench.results.columns_spec import Column, Table

# A steady step this many times its run's median step time is an outlier (hyperfine warns alike).
OUTLIER_RATIO = 1.5

# Every CSV the suite writes, by file name, in docs/columns.md's order.
TABLES: dict[str, Table] = {
    t.file: t
    for t in (
        columns_runs.RUNS_TABLE,
        columns_summary.SUMMARY_TABLE,
        columns_runs.LOSS_PARITY_TABLE,
        columns_runs.VRAM_PER_CARD_TABLE,
        columns_summary.CONTRASTS_TABLE,
        columns_summary.TRAINERS_TABLE,
        columns_summary.SCALING_TABLE,
        columns_other.CAPACITY_TABLE,
        columns_other.TRAINING_PARITY_TABLE,
        columns_other.COMPARE_TABLE,
    )
}


def names(columns: tuple[Column, ...]) -> list[str]:
    return [c.name for c in columns]


# Read-only GPU state of the run's busiest card, sampled by the poller: min/median/max over the
# measured steps (vram.jsonl's timed state rows against metrics' "time"), else over the whole run
# (vram.json); state_window says which.
STATE_FIELDS = list(columns_runs.STATE_FIELDS)
STATE_COLUMNS = names(columns_runs.STATE)
# The energy of a run's measured steps, summed over the run's cards (bench/results/energy.py).
ENERGY_COLUMNS = names(columns_runs.ENERGY)
STARTUP_COLUMNS = names(columns_runs.STARTUP)

CELL_COLUMNS = names(columns_runs.CELL)
# A cell's shape: what two trainers' cells must share to be the same cell run by both (trainers.csv).
SHAPE_COLUMNS = [c for c in CELL_COLUMNS if c != "trainer"]
# A digest of what else fixes a cell's work: its training config (the file's sha256) and its `set:`
# overrides (bench/results/identity.py). With the cell columns and the arm: a row's workload identity.
WORKLOAD_DIGEST = columns_runs.WORKLOAD_DIGEST.name
IDENTITY_COLUMNS = [*CELL_COLUMNS, WORKLOAD_DIGEST, columns_runs.ARM.name]
# Cells that differ only in their world size (gpus x nodes) form one scaling series (one trainer's).
SCALING_KEY = [c for c in CELL_COLUMNS if c not in ("gpus", "nodes")]
PROVENANCE_COLUMNS = names(columns_runs.PROVENANCE)
SUMMARY_PROVENANCE_COLUMNS = [c for c in PROVENANCE_COLUMNS if c != "gpu_count"]

RUNS_COLUMNS = TABLES["runs.csv"].names
# runs.csv's columns kept as text; every other one is parsed as a number (blank: NaN).
RUNS_TEXT_COLUMNS = {c.name for c in TABLES["runs.csv"].columns if not c.numeric}
SUMMARY_COLUMNS = TABLES["summary.csv"].names
# summary.csv's columns that are a plain mean, median or max of a runs.csv column (Column.of, .how).
SUMMARY_AGGREGATES = tuple(c for c in TABLES["summary.csv"].columns if c.of is not None)
LOSS_PARITY_COLUMNS = TABLES["loss_parity.csv"].names
PARITY_CRITERION = "last_step_abs_delta <= tolerance"
VRAM_PER_CARD_COLUMNS = TABLES["vram_per_card.csv"].names
CONTRAST_COLUMNS = TABLES["contrasts.csv"].names
# One cell shape run by two trainers: per arm and ordered pair (source, target), the target's Δ
# samples/s predicted from the source's saving per step and the target's own baseline step time.
TRAINERS_COLUMNS = TABLES["trainers.csv"].names
SCALING_COLUMNS = TABLES["scaling.csv"].names
CAPACITY_COLUMNS = TABLES["capacity.csv"].names
TRAINING_PARITY_COLUMNS = TABLES["training_parity.csv"].names
COMPARE_COLUMNS = TABLES["compare.csv"].names

# The files `bench report` writes at the top of a sweep directory: always, and only when the
# sweep has them (contrasts, two trainers of one cell, several world sizes, a capacity search, a
# parity section).
# README.md's and docs/run-contract.md's layouts name each one (tests/test_docs_match.py).
REPORT_FILES = [
    "runs.csv", "summary.csv", "summary.json", "loss_parity.csv", "vram_per_card.csv", "manifest.json", "report.md",
    "forest.png", "throughput.png", "vram_per_card.png", "loss_curves.png", "step_time_dist.png",
]  # fmt: skip
OPTIONAL_REPORT_FILES = [
    "contrasts.csv", "trainers.csv", "scaling.csv", "scaling.png", "capacity.csv", "capacity.png",
    "training_parity.csv", "training_parity.png",
]  # fmt: skip
