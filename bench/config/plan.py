"""A sweep's run order, and what --resume and --set need: round_runs, plan_rounds, plan,
diff_resolved (which keys of two resolved configs differ) and format_set_value."""

from __future__ import annotations

import json
import random
from typing import Any

import bench.config.typed as typed
from bench.config.model import Cell, Run, SweepConfig, run_id
from bench.config.schema import FILLED_KEYS, CellKeys, SweepKeys


def round_runs(cfg: SweepConfig, cell: Cell, repeat: int) -> list[tuple[str, str]]:
    """(run_id, arm) of one pair (round) of a cell, in the order they run.

    ``interleaved``: the arms in config order (baseline first); ``shuffled``: an order drawn
    from ``random.Random("<order_seed>/<cell_id>/<repeat>")``, so every round's order is
    recorded by the seed and the same on --resume, however many rounds the precision rule adds.
    """
    arms = list(cfg.arms)
    if cfg.order == "shuffled":
        random.Random(f"{cfg.order_seed}/{cell.cell_id}/{repeat}").shuffle(arms)
    return [(run_id(cell.cell_id, arm, repeat), arm) for arm in arms]


def plan_rounds(cfg: SweepConfig, rounds: dict[str, int]) -> list[Run]:
    """The run order for ``rounds[cell_id]`` pairs per cell: round-major (round 1 of every cell,
    then round 2, ...), so arms and cells are interleaved and drift cannot look like a speed-up."""
    runs: list[Run] = []
    for repeat in range(1, max(rounds.values(), default=0) + 1):
        for cell in cfg.cells:
            if repeat <= rounds.get(cell.cell_id, 0):
                for run_id, arm in round_runs(cfg, cell, repeat):
                    runs.append(Run(run_id, cell, arm, repeat, len(runs)))
    return runs


def plan(cfg: SweepConfig) -> list[Run]:
    """The runs every sweep of this config makes: ``repeats`` pairs per cell, or Stein's pilot
    (``precision.min_pairs``) when a precision target adds pairs after it (bench/run/sweep.py)."""
    return plan_rounds(cfg, {c.cell_id: cfg.pilot_pairs(c) for c in cfg.cells})


def diff_resolved(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two resolved configs (``out`` and ``contrasts``,
    which change no run, are ignored: a resumed sweep takes the new ones). A key the old config
    lacks because it was added to the schema later counts as its default, so a sweep started by
    an older version resumes unless the key was changed."""
    keys: list[str] = []
    if not prefix:
        defaults = typed.defaults(SweepKeys)
    elif prefix.startswith("cells[") and prefix.count(".") == 1:
        defaults = typed.defaults(CellKeys)
    else:
        defaults = {}
    for key in sorted(set(old) | set(new), key=str):
        if not prefix and key in ("out", "contrasts"):
            continue
        a, b = old.get(key, "<missing>"), new.get(key, "<missing>")
        if key not in old and key in defaults:
            a = b if not prefix and key in FILLED_KEYS else defaults[key]
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            keys += diff_resolved(a, b, f"{name}.")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and key == "cells":
            for i, (x, y) in enumerate(zip(a, b)):
                keys += diff_resolved(x, y, f"{name}[{i}].") if isinstance(x, dict) else []
        elif _jsonish(a) != _jsonish(b):
            keys.append(name)
    return keys


def format_set_value(value: Any) -> str:
    """A `--set key=value` value as YAML would read it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"}[repr(value)]
        text = repr(value)  # YAML 1.1 reads 1e-05 as a string: write 1.0e-05
        mantissa, e, exponent = text.partition("e")
        return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    return str(value)


def _jsonish(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)
