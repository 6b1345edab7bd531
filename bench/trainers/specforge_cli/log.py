"""Reading the SpecForge CLI's stdout into the run contract's metrics rows.

With ``training.log_interval=1`` SpecForge prints one line per optimizer step and rank::

    step 3: {'acc': 0.0, 'loss': 6.27, 'grad_norm': 0.70, 'lr': 0.0001,
             'perf/optimizer_step_time_s': 0.0612, 'perf/global_samples_per_second': 65.3,
             'perf/data_wait_time_s': 0.0039, 'perf/train_compute_time_s': 0.0573, ...}

(a Python dict of floats, or of lists of floats). Every rank prints its own line, unlabelled, to
the one stdout torchrun passes through; ``print`` writes the text and its newline in two writes,
so two ranks' lines often arrive as one: ``step 1: {...}step 1: {...}`` then an empty line
(tests/data/specforge-0.2.0-cpu-2rank-stdout.log): parse_step_lines splits them. Its step time is host wall time from the end
of the previous logged step to the end of this one; at every step the logger turns the loss
into a Python float, which waits for the device, so in steady state the window is the step's
device time too. SpecForge logs no memory: the driver's poller measures it. A line cut short
(a run killed mid-write) or any other output is not a step.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from bench.record import MetricRow, RecordError

_STEP_RE = re.compile(r"^step (\d+): \{(.*)\}\s*$")
_ITEM_RE = re.compile(r"'([^']+)': (\[[^\]]*\]|[^,\[\]]+)(?:, |$)")


def parse_step_line(line: str) -> tuple[int, dict[str, Any]] | None:
    """(step, its numbers) of one ``step N: {...}`` line, None for any other line. A list value
    (per-position accuracies) is kept as a list of floats; ``nan``/``inf`` read as floats."""
    m = _STEP_RE.match(line.strip())
    if not m:
        return None
    body, values = m.group(2), {}
    pos = 0
    while pos < len(body):
        item = _ITEM_RE.match(body, pos)
        if item is None:
            return None  # not the logger's dict (a torn line)
        key, raw = item.group(1), item.group(2).strip()
        try:
            if raw.startswith("["):
                values[key] = [float(x) for x in raw[1:-1].split(",") if x.strip()]
            else:
                values[key] = float(raw)
        except ValueError:
            return None
        pos = item.end()
    return int(m.group(1)), values


_RANKS_JOINED = re.compile(r"(?<=\})(?=step \d+: \{)")


def parse_step_lines(line: str) -> list[tuple[int, dict[str, Any]]]:
    """Every step record of one line of output: several when ranks' lines were joined."""
    return [p for p in map(parse_step_line, _RANKS_JOINED.split(line.strip())) if p is not None]


_POSITION_KEY = re.compile(
    r"^(?:acc|accuracy_position)_(\d+)$"
)  # EAGLE3's acc_i, DSpark's accuracy_position_i
_POSITION_LISTS = ("acces", "acc", "accuracy_position")


def positions(values: dict[str, Any]) -> list[float] | None:
    """The per-position accuracies of one step line, in position order: ``acc_0``, ``acc_1``, ...
    (or ``accuracy_position_i``) when logged as scalars, else a logged list; None when there are none.
    SpecForge 0.2.0's DFlash strategy logs only the overall ``acc``."""
    found = {
        int(m.group(1)): v
        for k, v in values.items()
        if (m := _POSITION_KEY.match(k)) and isinstance(v, float)
    }
    if found:
        return [found[i] for i in sorted(found)]
    for key in _POSITION_LISTS:
        if isinstance(values.get(key), list) and values[key]:
            return list(values[key])
    return None


def _scalar(values: dict[str, Any], key: str) -> float | None:
    v = values.get(key)
    return v if isinstance(v, float) else (sum(v) / len(v) if isinstance(v, list) and v else None)


def metrics_row(step: int, ranks: list[dict[str, float]], seq_len: int, elapsed_s: float, t: float) -> dict:
    """One metrics.jsonl row from the lines every rank printed for ``step``: the slowest rank's
    step time (the step ends when the last rank's does), the samples SpecForge counted (its
    global samples/s times its window), the mean loss over ranks."""
    first = ranks[0]
    step_time = max(r.get("perf/optimizer_step_time_s", math.nan) for r in ranks)
    rate = first.get("perf/global_samples_per_second", math.nan)
    window = first.get("perf/optimizer_step_time_s", math.nan)
    samples = round(rate * window) if math.isfinite(rate * window) else None
    ok_time = math.isfinite(step_time) and step_time > 0
    per_s = samples / step_time if samples is not None and ok_time else None
    losses = [r["loss"] for r in ranks if "loss" in r]
    return {
        "step": step,
        "loss": sum(losses) / len(losses) if losses else None,
        "accuracy": _scalar(first, "acc"),
        "accuracy_by_position": positions(first),
        "step_time_s": step_time if ok_time else None,
        "samples": samples,
        "tokens": samples * seq_len if samples is not None else None,
        "samples_per_s": per_s,
        "tokens_per_s": per_s * seq_len if per_s is not None else None,
        "lr": first.get("lr"),
        "grad_norm": first.get("grad_norm"),
        "torch_peak_allocated_gib": None,  # SpecForge logs no memory; VRAM is polled
        "torch_peak_reserved_gib": None,
        "mfu": None,
        "elapsed_s": elapsed_s,
        "time": t,
        "data_wait_time_s": max(r.get("perf/data_wait_time_s", math.nan) for r in ranks),
        "train_compute_time_s": max(r.get("perf/train_compute_time_s", math.nan) for r in ranks),
        "ranks_logged": len(ranks),
    }


@dataclass
class StepCollector:
    """Gathers the per-rank lines of each step: a step is complete when ``world`` ranks printed it,
    or when a later step's line arrives (a rank that prints nothing), or at the end (``flush``)."""

    world: int
    seq_len: int
    pending: dict[int, list[dict[str, float]]] = field(default_factory=dict)

    def add(self, step: int, values: dict[str, float], elapsed_s: float, t: float) -> list[dict[str, Any]]:
        self.pending.setdefault(step, []).append(values)
        done = [s for s in sorted(self.pending) if s < step or len(self.pending[s]) >= self.world]
        return [metrics_row(s, self.pending.pop(s), self.seq_len, elapsed_s, t) for s in done]

    def flush(self, elapsed_s: float, t: float) -> list[dict[str, Any]]:
        done = sorted(self.pending)
        return [metrics_row(s, self.pending.pop(s), self.seq_len, elapsed_s, t) for s in done]


def metric_records(rows: list[dict[str, Any]]) -> list[MetricRow]:
    """The rows as metrics.jsonl's records; one holding a value of a type the record refuses (a log
    line read oddly) is left out with a line on stderr: the run then lacks that step, and says so."""
    out = []
    for row in rows:
        try:
            out.append(MetricRow.from_json(row, f"step {row.get('step')}'s metrics row"))
        except RecordError as e:
            print(f"bench: not logged: {e}", file=sys.stderr, flush=True)
    return out
