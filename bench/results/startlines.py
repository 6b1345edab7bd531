"""Where a SpecForge CLI run's start goes, read from what it printed before step 1: the wrapper
keeps each of those lines with the time it arrived (specforge.json's ``startup_lines``,
bench/trainers/specforge_cli/wrapper.py). Three phases, split at two lines SpecForge prints on
every run (0.2.0): its first line of output, and ``Loading [...] from ....safetensors`` (the
target's embedding and head being loaded). A run without both lines is left out."""

from __future__ import annotations

import re
import statistics
from typing import Any

from bench import fmt
from bench.fileio import read_json

LOADING = re.compile(r"^Loading \[.*\] from \S+\.safetensors")
STEP = re.compile(r"^step 1\b")
PHASES = ("start → first output", "→ weights loading", "→ step 1 logged")


def phases(lines: Any) -> tuple[float, float, float] | None:
    """The three phases' seconds of one run's ``startup_lines`` ([[t, line], ...]), or None."""
    if not isinstance(lines, list) or not lines:
        return None
    try:
        stamped = [(float(t), str(text)) for t, text in lines]
    except (TypeError, ValueError):
        return None
    first = stamped[0][0]
    loading = next((t for t, text in stamped if LOADING.match(text)), None)
    step = next((t for t, text in stamped if STEP.match(text)), None)
    if loading is None or step is None or not first <= loading <= step:
        return None
    return first, loading - first, step - loading


def start_phases_section(records: list) -> list[str]:
    """Markdown: the median of each phase per cell and arm over ok runs that printed both lines."""
    groups: dict[tuple[str, str, str], list[tuple[float, float, float]]] = {}
    for rec in records:
        if rec.flag is not None or rec.run is None or rec.run.status != "ok":
            continue
        doc = read_json(rec.run_dir / "specforge.json")
        split = phases(doc.get("startup_lines")) if isinstance(doc, dict) else None
        if split is not None:
            how = str(doc.get("start") or "exec")
            groups.setdefault(
                (str(rec.cell.cell_id if rec.cell else None), str(rec.run.arm), how), []
            ).append(split)
    if not groups:
        return []
    rows = []
    for (cell, arm, how), splits in groups.items():
        medians = [statistics.median(s[i] for s in splits) for i in range(3)]
        rows.append([fmt.md(cell), fmt.md(arm), how, str(len(splits)), *(fmt.f(m, ".1f") for m in medians)])
    header = ["cell", "arm", "started", "runs", *(f"{p} (s)" for p in PHASES)]
    return [
        "## Where a SpecForge run's start goes (medians)",
        "",
        "From the lines SpecForge printed before step 1, each stamped when it arrived (specforge.json's "
        "startup_lines): from the start to its first line of output (the interpreter and the imports "
        "before it); to `Loading [...] from ....safetensors` (the rest of the imports, and the draft "
        "and the target's embedding and head built and randomly initialised on the CPU, to be "
        "overwritten by the loaded weights); to step 1's line (the weights, FSDP, the first step "
        "with its compile). `started`: exec (a new interpreter) or warm-server (forked from a server "
        "that imported SpecForge's modules once).",
        "",
        *fmt.table(header, rows),
        "",
    ]
