"""Sweep configs: load and validate one into a SweepConfig (sweep.py, keys declared in schema.py,
checked by the typed engine in typed.py), and plan its runs (plan.py). Import from here."""

from bench.config.model import Capacity, Cell, Precision, Run, SweepConfig, cell_id_for
from bench.config.plan import diff_resolved, format_set_value, plan, plan_rounds, round_runs
from bench.config.schema import CPU_MAX_PROCS, MODES, ORDERS
from bench.config.sweep import load_config, validate
from bench.errors import SweepError

__all__ = [
    "CPU_MAX_PROCS",
    "MODES",
    "ORDERS",
    "Capacity",
    "Cell",
    "Precision",
    "Run",
    "SweepConfig",
    "SweepError",
    "cell_id_for",
    "diff_resolved",
    "format_set_value",
    "load_config",
    "plan",
    "plan_rounds",
    "round_runs",
    "validate",
]
