"""Pairs that span two Slurm allocations: the runs of one round (one run of each arm of a cell,
meant to run back to back on the same nodes) whose cell.json ``slurm.allocation`` differ — a
sweep stopped (scancel, the time limit, a requeue) between its arms and resumed in another
allocation, maybe on other nodes. Their runs get a note in runs.csv (and so in the report)."""

from __future__ import annotations

from bench.results.records import RunRecord


def _allocation(rec: RunRecord) -> str | None:
    slurm = rec.cell.slurm if rec.cell else None
    key = slurm.get("allocation") if isinstance(slurm, dict) else None
    return str(key) if key is not None else None


def split_pair_notes(records: list[RunRecord]) -> dict[str, str]:
    """run_id -> the note of each run whose round ran in more than one Slurm allocation."""
    rounds: dict[tuple, list[tuple[str, str | None]]] = {}
    for rec in records:
        if rec.cell_id is not None and rec.repeat is not None and rec.cell:
            rounds.setdefault((rec.cell_id, rec.repeat), []).append((rec.run_id, _allocation(rec)))
    notes = {}
    for runs in rounds.values():
        allocations = sorted({a for _, a in runs if a is not None})
        if len(allocations) < 2:
            continue
        for run_id, alloc in runs:
            notes[run_id] = (
                f"its pair spans Slurm allocations {', '.join(allocations)} (this run: {alloc or 'none'}): "
                "the arms did not run back to back on the same nodes"
            )
    return notes


def with_split_pairs(row: dict, notes: dict[str, str]) -> dict:
    """A runs.csv row with its split-pair note added to its note."""
    extra = notes.get(row.get("run_id"))
    if extra is None:
        return row
    return {**row, "note": f"{row['note']}; {extra}" if row.get("note") else extra}
