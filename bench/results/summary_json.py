"""summary.json: a sweep's verdict as data, beside summary.csv (docs/summary-json.md).

Built from the tables `bench report` already computed (summary.csv's, contrasts.csv's and
training_parity.csv's DataFrames; no statistic is computed here): the sweep's identity (sweep.json),
its versions (summary.csv's provenance columns), and per cell its identity and per arm its means,
Δs with their CIs and verdicts. Every field but the few sweep.json ones is a column of the registry
(bench/results/columns.py): its name, JSON type and description come from that one declaration.
A verdict is a value, ``{"kind": <member name of verdicts.Speed or Parity>, "text": <its words>}``
(null where the CSV cell is blank); numbers are rounded as the CSVs write them (6 significant
digits), a missing one is null.

The JSON Schema (bench/results/summary.schema.json) is generated from the same declarations and
enums by :func:`schema`; ``python -m bench.results.summary_json`` writes it again (a test holds
the shipped file equal to it). Writing summary.json needs no jsonschema.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from bench.fileio import atomic_write_text
from bench.results.columns import CELL_COLUMNS, SUMMARY_PROVENANCE_COLUMNS, TABLES, WORKLOAD_DIGEST
from bench.results.columns_spec import BOOL, FLOAT, INT, TEXT, Column, Table
from bench.results.tables import join_unique
from bench.results.verdicts import Parity, Speed, parity_kind, speed_kind

SUMMARY_JSON = "summary.json"
SCHEMA_PATH = Path(__file__).with_name("summary.schema.json")
SCHEMA_VERSION = 1

_SUMMARY, _CONTRASTS, _PARITY = (TABLES[f] for f in ("summary.csv", "contrasts.csv", "training_parity.csv"))
CELL_FIELDS = ["cell_id", *CELL_COLUMNS]
# Per arm: summary.csv's columns, in its order; the verdicts are {kind, text} objects. The workload
# digest is the row's (an arm's runs may predate it): with the cell's columns and the arm, its identity.
ARM_FIELDS = [
    "arm", WORKLOAD_DIGEST, "n_runs", "n_ok", "samples_per_s_mean", "s_per_step_mean", "peak_vram_gib",
    "n_pairs", "delta_samples_per_s_pct", "delta_samples_per_s_pct_ci95_low",
    "delta_samples_per_s_pct_ci95_high", "ci_method",
    "delta_peak_vram_gib", "delta_peak_vram_gib_ci95_low", "delta_peak_vram_gib_ci95_high",
    "verdict_speed", "verdict_memory", "loss_parity",
]  # fmt: skip
CONTRAST_FIELDS = [
    "arm", "reference", "n_pairs", "delta_samples_per_s_pct", "delta_samples_per_s_pct_ci95_low",
    "delta_samples_per_s_pct_ci95_high", "ci_method", "delta_peak_vram_gib", "delta_peak_vram_gib_ci95_low",
    "delta_peak_vram_gib_ci95_high", "verdict_speed", "verdict_memory",
]  # fmt: skip
TRAINING_PARITY_FIELDS = ["metric", "rounds", "windows", "windows_within", "verdict"]
# The verdict columns and the enum whose members name their kinds.
VERDICTS: dict[str, type[Speed] | type[Parity]] = {
    "verdict_speed": Speed,
    "verdict_memory": Speed,
    "loss_parity": Parity,
    "verdict": Parity,  # training_parity.csv's
}
_KIND = {Speed: speed_kind, Parity: parity_kind}
# sweep.json's keys copied into "sweep" (name falls back to the directory's).
SWEEP_FIELDS = {
    "name": ("string", "the sweep's name (sweep.json's `name`, else the directory's)"),
    "git_commit": ("string", "the suite's commit that ran the sweep (sweep.json's `git_commit`)"),
    "argv": ("array", "the command line that ran the sweep (sweep.json's `argv`)"),
    "config_path": ("string", "the sweep config it ran (sweep.json's `config_path`)"),
    "created": ("string", "when the sweep directory was created, ISO 8601 (sweep.json's `created`)"),
}


def _number(value: Any, kind: str) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    if kind == INT:
        return int(value)
    if kind == FLOAT:
        value = float(value)
        return float(f"{value:.6g}") if math.isfinite(value) else None  # as the CSVs round it
    if kind == BOOL:
        return bool(value)
    return str(value)


def verdict(text: Any, enum: type[Speed] | type[Parity]) -> dict | None:
    """``{"kind", "text"}`` of a written verdict; None for none (blank). ValueError for words no
    member of ``enum`` names: a producer's new words need their member (bench/results/verdicts.py)."""
    if not isinstance(text, str) or not text:
        return None
    kind = _KIND[enum](text)
    if kind is None:
        raise ValueError(f"verdict {text!r}: no {enum.__name__} member names it (bench/results/verdicts.py)")
    return {"kind": kind.name, "text": text}


def _record(row: pd.Series, fields: list[str], table: Table) -> dict:
    out = {}
    for name in fields:
        value = row.get(name)
        out[name] = (
            verdict(value, VERDICTS[name]) if name in VERDICTS else _number(value, table.column(name).type)
        )
    return out


def _rows(df: pd.DataFrame | None, cell_id: str) -> list[pd.Series]:
    if df is None or not len(df):
        return []
    return [row for _, row in df[df["cell_id"] == cell_id].iterrows()]


def _versions(summary: pd.DataFrame) -> dict:
    """Each provenance column's distinct values over the sweep's rows, joined as summary.csv joins an arm's."""
    out = {}
    for name in SUMMARY_PROVENANCE_COLUMNS:
        vals = [] if name not in summary else [v for v in summary[name] if isinstance(v, str) and v]
        out[name] = join_unique(pd.Series([p for v in vals for p in v.split(", ")], dtype=object))
    return out


def summary_doc(sweep: dict, sweep_dir: Path, tables: dict[str, pd.DataFrame]) -> dict:
    """summary.json's document from sweep.json and the report's tables."""
    summary = tables["summary"]
    parity = tables.get("training_parity")
    cells = []
    for cell_id in dict.fromkeys(summary["cell_id"]):
        rows = _rows(summary, cell_id)
        cell = {name: _number(rows[0].get(name), _SUMMARY.column(name).type) for name in CELL_FIELDS}
        cell["arms"] = []
        for row in rows:
            arm = _record(row, ARM_FIELDS, _SUMMARY)
            arm["training_parity"] = [
                _record(p, TRAINING_PARITY_FIELDS, _PARITY)
                for p in _rows(parity, cell_id)
                if p["arm"] == row["arm"]
            ]
            cell["arms"].append(arm)
        cell["contrasts"] = [
            _record(c, CONTRAST_FIELDS, _CONTRASTS) for c in _rows(tables.get("contrasts"), cell_id)
        ]
        cells.append(cell)
    ident = {key: sweep.get(key) for key in SWEEP_FIELDS}
    ident["name"] = ident["name"] or sweep_dir.name
    return {
        "schema_version": SCHEMA_VERSION,
        "sweep": ident,
        "versions": _versions(summary),
        "has_training_parity": parity is not None and len(parity) > 0,
        "cells": cells,
    }


def write_summary_json(sweep: dict, sweep_dir: Path, tables: dict[str, pd.DataFrame]) -> Path:
    """Write ``sweep_dir``/summary.json atomically (never a NaN: allow_nan=False raises first); an
    earlier build's is removed first, so a build that fails here leaves none that disagrees."""
    path = Path(sweep_dir) / SUMMARY_JSON
    path.unlink(missing_ok=True)
    text = json.dumps(summary_doc(sweep, Path(sweep_dir), tables), indent=2, allow_nan=False)
    atomic_write_text(path, text + "\n")
    return path


# ---------------------------------------------------------------- the schema

_JSON_TYPE = {TEXT: "string", INT: "integer", FLOAT: "number", BOOL: "boolean"}
_NEVER_NULL = ("cell_id", "arm", "reference", "metric")  # the rows' keys; any other field may be null


def _property(column: Column) -> dict:
    if column.name in VERDICTS:
        ref = "speed_verdict" if VERDICTS[column.name] is Speed else "parity_verdict"
        return {"description": column.text, "$ref": f"#/$defs/{ref}"}
    kind = _JSON_TYPE[column.type]
    kinds = kind if column.name in _NEVER_NULL else [kind, "null"]
    unit = f" ({column.unit})" if column.unit else ""
    return {"description": column.text + unit, "type": kinds}


def _object(fields: list[str], table: Table, extra: dict | None = None) -> dict:
    props = {name: _property(table.column(name)) for name in fields} | (extra or {})
    return {"type": "object", "additionalProperties": False, "required": list(props), "properties": props}


def _verdict_def(enum: type[Speed] | type[Parity], what: str) -> dict:
    return {
        "description": f"a {what} verdict: `kind` is the bench.results.verdicts.{enum.__name__} member its "
        "words start with, `text` the words summary.csv writes; null where there is none",
        "oneOf": [
            {"type": "null"},
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["kind", "text"],
                "properties": {
                    "kind": {"enum": [m.name for m in enum]},
                    "text": {"type": "string", "minLength": 1},
                },
            },
        ],
    }


def schema() -> dict:
    """summary.json's JSON Schema (draft 2020-12), from the registry's columns and the verdict enums."""
    parity = _object(TRAINING_PARITY_FIELDS, _PARITY)
    arm = _object(
        ARM_FIELDS,
        _SUMMARY,
        {
            "training_parity": {
                "description": "training_parity.csv's rows of the arm, one per metric (empty when the sweep "
                "has no `parity:` section or the arm is not judged: the baseline and the A/A arms)",
                "type": "array",
                "items": parity,
            }
        },
    )
    contrast = _object(CONTRAST_FIELDS, _CONTRASTS)
    cell = _object(
        CELL_FIELDS,
        _SUMMARY,
        {
            "arms": {
                "description": "summary.csv's rows of the cell, in its order",
                "type": "array",
                "items": arm,
            },
            "contrasts": {
                "description": "contrasts.csv's rows of the cell (empty without the sweep's `contrasts`)",
                "type": "array",
                "items": contrast,
            },
        },
    )
    sweep = {
        name: {"description": text, "type": [kind, "null"]}
        | ({"items": {"type": "string"}} if kind == "array" else {})
        for name, (kind, text) in SWEEP_FIELDS.items()
    }
    sweep["name"]["type"] = "string"
    versions = {name: _property(_SUMMARY.column(name)) for name in SUMMARY_PROVENANCE_COLUMNS}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "summary.json: a sweep's verdict as data (`bench report`)",
        "type": "object",
        "additionalProperties": False,
        "required": ["schema_version", "sweep", "versions", "has_training_parity", "cells"],
        "properties": {
            "schema_version": {"const": SCHEMA_VERSION},
            "sweep": {
                "description": "the sweep's identity, from sweep.json (null where it has none)",
                "type": "object",
                "additionalProperties": False,
                "required": list(sweep),
                "properties": sweep,
            },
            "versions": {
                "description": "summary.csv's provenance columns over all its rows: each distinct value, "
                "joined by `, ` (null when no run recorded one)",
                "type": "object",
                "additionalProperties": False,
                "required": list(versions),
                "properties": versions,
            },
            "has_training_parity": {
                "description": "whether the report wrote training_parity.csv",
                "type": "boolean",
            },
            "cells": {"description": "one per cell, summary.csv's order", "type": "array", "items": cell},
        },
        "$defs": {
            "speed_verdict": _verdict_def(Speed, "speed or memory"),
            "parity_verdict": _verdict_def(Parity, "loss or training parity"),
        },
    }


def schema_text() -> str:
    return json.dumps(schema(), indent=2) + "\n"


if __name__ == "__main__":  # python -m bench.results.summary_json [PATH]: write the schema again
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_PATH
    atomic_write_text(out, schema_text())
    print(out)
