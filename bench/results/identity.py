"""Workload identity: which runs measured the same work. A run's identity is its cell columns
(trainer, profile, mode, batch, sequence, accumulation, anchors, GPUs, nodes), its arm and a
digest of its training config, `set:` overrides and, for a sweep's own arm (user_arms), the
keys that arm sets (workload_digest: two sweeps' "eager" arms that set different keys are two
workloads); and a run's cell.json
must be the workload sweep.json planned for its cell (plan_problem), else the run is not counted.

sweep.json's ``cells`` (written by the driver since 2026-12-01) is the plan; a sweep from before
has none, and its runs are held to its ``config.cells`` entries and to the other runs of their cell.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

from bench.record import CellDoc
from bench.results.columns import CELL_COLUMNS

# cell.json's keys that fix a run's work; against sweep.json's plan also what is measured of it.
WORKLOAD_KEYS = (*CELL_COLUMNS, "set", "train_config")
PLAN_KEYS = (*WORKLOAD_KEYS, "steps", "warmup_steps")
_UNSET = "<absent>"


def _planned_sha(cell: CellDoc, sweep: dict | None) -> str | None:
    """The training config's sha256 as sweep.json's config recorded it for the entry the run came from."""
    entries = ((sweep or {}).get("config") or {}).get("cells") or []
    entries = [e for e in entries if isinstance(e, dict) and e.get("config") == cell.train_config]
    same_set = [e for e in entries if (e.get("set") or {}) == (cell.set or {})]
    for e in same_set or entries:
        if e.get("config_sha256"):
            return str(e["config_sha256"])
    return None


def workload_digest(cell: CellDoc | None, sweep: dict | None = None) -> str | None:
    """12 hex digits of the run's training config (its sha256, else its path), `set:` overrides and
    a user arm's keys, declared environment and base (cell.json's arm_set, arm_env, arm_base; a
    built-in arm's runs digest as before there were user arms); None without a trusted cell.json."""
    if cell is None:
        return None
    sha = cell.config_sha256 or _planned_sha(cell, sweep)
    mine = {"arm_set": cell.arm_set} if cell.arm_set else {}
    mine |= {"arm_env": cell.arm_env} if cell.arm_env else {}  # a version arm: never a flag arm's workload
    mine |= {"arm_base": cell.arm_base} if cell.arm_base else {}
    doc = {"training_config": sha or cell.train_config, "set": cell.set or {}, **mine}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:12]


def planned_cells(sweep: dict | None) -> dict[str, dict]:
    """sweep.json's plan per cell_id ({} for a sweep written before the driver recorded it)."""
    cells = (sweep or {}).get("cells")
    return {str(k): v for k, v in cells.items() if isinstance(v, dict)} if isinstance(cells, dict) else {}


def _shown(v: Any) -> str:
    return json.dumps(v, sort_keys=True) if isinstance(v, dict | list) else repr(v)


def differences(cell: CellDoc, planned: dict, keys=PLAN_KEYS) -> list[str]:
    """``accumulation_steps 8, planned 2`` for each key of ``keys`` the two disagree on."""
    out = []
    held = cell.to_json()
    for k in keys:
        if k not in planned:
            continue
        have, want = held.get(k, _UNSET), planned[k]
        if have != want and not (_is_num(have) and _is_num(want) and float(have) == float(want)):
            out.append(f"{k} {_shown(have)}, planned {_shown(want)}")
    return out


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def plan_problem(cell: CellDoc, sweep: dict | None) -> str | None:
    """Why a trusted cell.json is not the workload sweep.json planned for its cell, or None."""
    plan = planned_cells(sweep).get(str(cell.cell_id))
    if plan is not None:
        diff = differences(cell, plan)
        return (
            f"cell.json is not the workload sweep.json plans for its cell ({'; '.join(diff)})"
            if diff
            else None
        )
    entries = [e for e in ((sweep or {}).get("config") or {}).get("cells") or [] if isinstance(e, dict)]
    if entries and not any((e.get("set") or {}) == (cell.set or {}) for e in entries):
        return f"cell.json's set {_shown(cell.set or {})} is no cells entry's set in sweep.json's config"
    return None


def odd_ones_out(cells: dict[str, CellDoc]) -> dict[str, str]:
    """Per run_id, why its cell.json differs from the workload most runs of its cell share (a run
    copied in from another sweep, or edited): the check of a sweep without a plan of its cells."""
    by_cell: dict[str, list[str]] = {}
    for run_id, cell in cells.items():
        by_cell.setdefault(str(cell.cell_id), []).append(run_id)
    out = {}
    for cell_id, ids in by_cell.items():
        shapes = Counter(_shape(cells[r]) for r in ids)
        (common, n), *rest = shapes.most_common()
        if not rest or n <= len(ids) / 2:
            continue
        ref = cells[next(r for r in ids if _shape(cells[r]) == common)]
        for r in ids:
            if _shape(cells[r]) != common:
                diff = differences(cells[r], ref.to_json(), WORKLOAD_KEYS)
                out[r] = f"cell.json differs from the other {n} runs of {cell_id} ({'; '.join(diff)})"
    return out


def _shape(cell: CellDoc) -> tuple:
    held = cell.to_json()
    return tuple((k, _shown(held.get(k, _UNSET))) for k in WORKLOAD_KEYS)
