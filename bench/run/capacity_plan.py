"""The capacity search's plan: the series of cells it searches, the cell at one probed value,
and the next value to probe given the outcomes so far (a pure function of them, so a killed
search resumes to the same answer)."""

from __future__ import annotations

from dataclasses import replace

from bench.config import Capacity, Cell, SweepConfig, cell_id_for


def next_value(history: dict[int, str], cap: Capacity) -> int | None:
    """The next value to probe given {value: status} so far, or None when the search is over."""
    if any(s not in ("ok", "oom") for s in history.values()):
        return None  # an error or timeout is no answer about memory: stop, say so
    fits = [v for v, s in history.items() if s == "ok"]
    lo = max(fits, default=None)
    fails = [v for v, s in history.items() if s == "oom" and (lo is None or v > lo)]
    hi = min(fails, default=None)
    g = cap.granularity
    if lo is None and hi is None:
        return cap.start
    if lo is None:  # even the smallest probe so far OOMs: halve
        smaller = (hi // 2) // g * g
        return smaller if smaller >= g and smaller not in history else None
    if hi is None:  # everything so far fits: double, up to the cap
        if lo >= cap.max:
            return None
        return min(lo * 2, cap.max)
    if hi - lo <= g:
        return None
    mid = (lo + hi) // 2 // g * g
    return mid if lo < mid < hi else None


def probe_cell(cfg: SweepConfig, cell: Cell, value: int) -> Cell:
    """The cell at one probed value, trained for ``capacity.steps`` steps (the first dropped)."""
    cap = cfg.capacity
    assert cap is not None
    probed = replace(cell, **{cap.axis: value}, steps=cap.steps, warmup_steps=1)
    return replace(probed, cell_id=cell_id_for(probed, None))


def series(cfg: SweepConfig) -> list[tuple[str, Cell]]:
    """One (series id, representative cell) per cell with the searched axis left out."""
    cap = cfg.capacity
    assert cap is not None
    seen: dict[str, Cell] = {}
    for cell in cfg.cells:
        other = f"s{cell.seq_len}" if cap.axis == "batch_size" else f"bs{cell.batch_size}"
        key = f"{cell.profile}_{cell.mode}_{other}" + (f"_g{cell.gpus}" if cell.gpus > 1 else "")
        seen.setdefault(key, cell)
    return list(seen.items())
