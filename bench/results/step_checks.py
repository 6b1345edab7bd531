"""metrics.jsonl checked against the run's own facts before a throughput is computed from it:
every value a throughput is computed from null or a finite number >= 0 (a step time > 0), within
what a step can be (LIMITS: no absurd number reaches the statistics); a measured step's time
present (missing is noted as NaN is); the samples of a step what the cell fixes (batch ×
accumulation × GPUs × nodes); steady step times within PLAUSIBLE_RATIO of the run's median; step
numbers unique, contiguous from 1 and within the planned steps. ``step_problem`` names the first line that breaks one, with its value; the run
then stays out of the statistics (records.run_row's note). And the warnings about a counted run's
steps: allocator retries, an outlier step."""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

import pandas as pd

from bench import fmt
from bench.record import CellDoc
from bench.results.columns import OUTLIER_RATIO

# metrics.jsonl's fields a throughput is computed from: each null or a finite number >= 0.
THROUGHPUT_FIELDS = ("step_time_s", "samples", "tokens", "samples_per_s", "tokens_per_s")
# A steady step this many times shorter than its run's median is no measurement (1e-9 s), nor one
# SLOW_RATIO times longer (1e308 s); a slow step of a disturbed machine is one — 12x on a lent GPU,
# 50x for a 20 ms CPU step on a loaded machine —: it is counted, with the outlier warning.
PLAUSIBLE_RATIO = 50.0
SLOW_RATIO = 1000.0
# What no step of any run can be, whatever its median: an optimizer step of a microsecond or of
# more than 11 days, a billion samples, ... (a damaged record; its ratios would overflow the
# statistics). (lowest, highest) per field.
LIMITS = {
    "step_time_s": (1e-6, 1e6),
    "samples": (0, 1e9),
    "tokens": (0, 1e15),
    "samples_per_s": (0, 1e15),
    "tokens_per_s": (0, 1e21),
}


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _where(n: int, row: dict) -> str:
    return f"line {n} (step {json.dumps(row.get('step'))})"


def _bad_value(rows: list[tuple[int, dict]], warmup: int) -> str | None:
    """The first value that is no number (NaN, a string, negative); a measured step (past the
    warm-up) without its time is named the same way: its step would drop out of the mean unseen."""
    for n, row in rows:
        for f in THROUGHPUT_FIELDS:
            v = row.get(f)
            floor = "> 0" if f == "step_time_s" else ">= 0"
            if v is None and f == "step_time_s" and _number(row.get("step")) and row["step"] > warmup:
                return f"{_where(n, row)}: {f} missing (null or absent), not a finite number {floor}"
            if v is None:
                continue
            if not _number(v) or v < 0 or (f == "step_time_s" and v == 0):
                return f"{_where(n, row)}: {f} = {json.dumps(v)}, not a finite number {floor}"
    return None


def _absurd(rows: list[tuple[int, dict]]) -> str | None:
    """The first value outside what any step can be (LIMITS)."""
    for n, row in rows:
        for f, (low, high) in LIMITS.items():
            v = row.get(f)
            if _number(v) and not low <= v <= high:
                return f"{_where(n, row)}: {f} = {v:.4g}, not within {low:g} to {high:g} (no step is)"
    return None


def _numbering(rows: list[tuple[int, dict]], planned: Any) -> str | None:
    seen: dict[Any, int] = {}
    expected = 1
    for n, row in rows:
        step = row.get("step")
        if step in seen:
            return f"line {n}: step {json.dumps(step)} again (first at line {seen[step]})"
        seen[step] = n
        if not _number(step) or step != expected:
            what = "missing" if _number(step) and step > expected else "out of order"
            return f"line {n}: step {json.dumps(step)} where step {expected} belongs (steps {what})"
        if isinstance(planned, int) and step > planned:
            return f"line {n}: step {step} beyond the {planned} steps the cell plans"
        expected += 1
    return None


def samples_per_step(cell: CellDoc) -> int | None:
    """The samples one optimizer step takes, as the cell fixes them; None when it does not say."""
    keys = [cell.batch_size, cell.accumulation_steps, cell.gpus]
    if not all(_number(v) and v > 0 for v in keys):
        return None
    nodes = cell.nodes if _number(cell.nodes) else 1
    return int(keys[0] * keys[1] * keys[2] * nodes)


def _samples(rows: list[tuple[int, dict]], cell: CellDoc) -> str | None:
    want = samples_per_step(cell)
    if want is None:
        return None
    for n, row in rows:
        v = row.get("samples")
        if v is not None and v != want:
            acc, gpus, nodes = cell.accumulation_steps, cell.gpus, cell.nodes or 1
            return (
                f"{_where(n, row)}: samples = {json.dumps(v)}, where the cell fixes {want} a step "
                f"(batch {cell.batch_size} × {acc} accumulation × {gpus} GPUs × {nodes} nodes)"
            )
    return None


def _plausible(rows: list[tuple[int, dict]], warmup: int) -> str | None:
    steady = [
        (n, r)
        for n, r in rows
        if _number(r.get("step")) and r["step"] > warmup and _number(r.get("step_time_s"))
    ]
    times = [r["step_time_s"] for _, r in steady]
    if len(times) < 2:
        return None
    median = statistics.median(times)
    for n, row in steady:
        t = row["step_time_s"]
        if not median / PLAUSIBLE_RATIO <= t <= median * SLOW_RATIO:
            return (
                f"{_where(n, row)}: step_time_s = {t:.4g}, not within 1/{PLAUSIBLE_RATIO:g} to "
                f"{SLOW_RATIO:g}× the run's median step {median:.4g} s"
            )
    return None


def step_problem(rows: list[tuple[int, dict]], cell: CellDoc) -> str | None:
    """The first fact of metrics.jsonl (its numbered rows as written: bench.record.numbered_metrics)
    the run's own cell contradicts, as ``metrics.jsonl line 5 (step 4): step_time_s = -0.4, not a
    finite number > 0``; None when none."""
    warmup = cell.warmup_steps if _number(cell.warmup_steps) else 0
    for check in (
        _bad_value(rows, warmup),
        _numbering(rows, cell.steps),
        _samples(rows, cell),
        _plausible(rows, warmup),
        _absurd(rows),
    ):
        if check:
            return f"metrics.jsonl {check}"
    return None


def retries_warning(m: pd.DataFrame) -> str | None:
    """The caching allocator had to free its cache and retry (slow steps; an OOM is near)."""
    retries = m["alloc_retries"].max() if len(m) else float("nan")
    if not retries or math.isnan(retries):
        return None
    return (
        f"the allocator retried {int(retries)} allocation(s) after freeing its cache (slower steps, near OOM)"
    )


def outlier_warning(steady: pd.DataFrame) -> str | None:
    """The steady step furthest over OUTLIER_RATIO x the run's median step time, if any."""
    t = steady["step_time_s"].dropna()
    if len(t) < 3:
        return None
    median = t.median()
    worst = t.idxmax()
    if not median > 0 or t[worst] <= OUTLIER_RATIO * median:
        return None
    step = int(steady.loc[worst, "step"])
    return (
        f"unstable: step {step} took {t[worst]:.3g} s, {t[worst] / median:.1f}x the run's median "
        f"{median:.3g} s: a disturbed machine or a warm-up not over (its clocks are in this row; "
        "raise warmup_steps if it is always an early step)"
    )


def foreign_warning(vram: dict | None) -> str | None:
    """Processes not of the suite that held memory on the polled cards (vram.json's processes)."""
    procs = [
        p for p in (vram or {}).get("processes") or [] if isinstance(p, dict) and p.get("owner") != "suite"
    ]
    if not procs:
        return None
    seen = ", ".join(
        f"pid {p.get('pid')} on card {p.get('card')} ({p.get('owner')}, {fmt.f(p.get('max_used_gib'), '.2f')} GiB, "
        f"seen {p.get('first_seen')} the run)"
        for p in procs[:3]
    )
    more = f" and {len(procs) - 3} more" if len(procs) > 3 else ""
    return f"another process held memory on the cards: {seen}{more}; its numbers may be disturbed"
