"""The aggregation API in one import: every name bench.results.aggregate has always offered,
re-exported from the modules that now hold it (no logic here). New code imports from the
module that defines a name: columns (the CSV schemas), records (RunRecord, load_run(s),
run_row), tables (runs/summary/contrast/vram/scaling tables), deltas (the Δ columns, Stein's
rule per cell), parity (loss parity).
"""

from __future__ import annotations

from bench.config.model import parse_run_id
from bench.results.columns import (
    CELL_COLUMNS,
    CONTRAST_COLUMNS,
    LOSS_PARITY_COLUMNS,
    METRIC_FIELDS,
    PARITY_CRITERION,
    PROVENANCE_COLUMNS,
    RUNS_COLUMNS,
    RUNS_TEXT_COLUMNS,
    SCALING_COLUMNS,
    SCALING_KEY,
    STARTUP_COLUMNS,
    STATE_COLUMNS,
    STATE_FIELDS,
    SUMMARY_COLUMNS,
    SUMMARY_PROVENANCE_COLUMNS,
    VRAM_PER_CARD_COLUMNS,
)
from bench.results.deltas import log_ratios, stein_decisions
from bench.results.parity import loss_parity_gaps, loss_parity_table, parity_verdict, with_loss_parity
from bench.results.records import (
    NAN,
    RunRecord,
    load_run,
    load_runs,
    measured_window,
    run_row,
    vram_devices,
)
from bench.results.tables import (
    contrast_table,
    join_unique,
    mean_ci,
    runs_table,
    scaling_table,
    summary_table,
    vram_per_card_table,
)

__all__ = [
    "CELL_COLUMNS",
    "CONTRAST_COLUMNS",
    "LOSS_PARITY_COLUMNS",
    "METRIC_FIELDS",
    "NAN",
    "PARITY_CRITERION",
    "PROVENANCE_COLUMNS",
    "RUNS_COLUMNS",
    "RUNS_TEXT_COLUMNS",
    "SCALING_COLUMNS",
    "SCALING_KEY",
    "STARTUP_COLUMNS",
    "STATE_COLUMNS",
    "STATE_FIELDS",
    "SUMMARY_COLUMNS",
    "SUMMARY_PROVENANCE_COLUMNS",
    "VRAM_PER_CARD_COLUMNS",
    "RunRecord",
    "contrast_table",
    "join_unique",
    "load_run",
    "load_runs",
    "log_ratios",
    "loss_parity_gaps",
    "loss_parity_table",
    "mean_ci",
    "measured_window",
    "parity_verdict",
    "parse_run_id",
    "run_row",
    "runs_table",
    "scaling_table",
    "stein_decisions",
    "summary_table",
    "vram_devices",
    "vram_per_card_table",
    "with_loss_parity",
]
