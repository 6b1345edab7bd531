"""Sweep configs: load and validate one into a SweepConfig (loader.py, keys declared in schema.py,
checked by the typed engine in typed.py, each cell read by its trainer's CellReader:
cellfacts.py), and plan its runs (plan.py). Import from here."""

from bench.config.cellfacts import CellReader, Readers, pick
from bench.config.loader import load_config, validate
from bench.config.model import (
    Capacity,
    Cell,
    Precision,
    Run,
    SweepConfig,
    cell_id_for,
    parse_run_id,
    prime_run_id,
    profile_run_id,
    run_id,
)
from bench.config.plan import diff_resolved, format_set_value, plan, plan_rounds, round_runs
from bench.config.schema import CPU_MAX_PROCS, MODES, ORDERS
from bench.errors import SweepError

__all__ = [
    "CPU_MAX_PROCS",
    "MODES",
    "ORDERS",
    "Capacity",
    "CellReader",
    "Readers",
    "Cell",
    "Precision",
    "Run",
    "SweepConfig",
    "SweepError",
    "cell_id_for",
    "diff_resolved",
    "format_set_value",
    "load_config",
    "parse_run_id",
    "pick",
    "plan",
    "plan_rounds",
    "prime_run_id",
    "profile_run_id",
    "round_runs",
    "run_id",
    "validate",
]
