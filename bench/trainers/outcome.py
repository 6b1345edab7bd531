"""How a run that did not record its own end ended: timeout, out of memory or error, with a
one-line reason read from its log. Shared by every plug (a trainer's exceptions look alike)."""

from __future__ import annotations

import re
from pathlib import Path

from bench.config import Run
from bench.fileio import read_json
from bench.procs.launcher import exit_text, log_lines, now
from bench.record import RunDoc, read_metrics, read_metrics_counted, write_run

# A run that ended: its run.json holds one of these statuses ("running" is not one).
TERMINAL = ("ok", "oom", "error", "timeout", "skipped")
OOM_RE = re.compile(r"CUDA out of memory|HIP out of memory|OutOfMemoryError")
# The allocator's first sentence; the rest (capacity, free, reserved, advice) stays in stdout.log.
OOM_SENTENCE_RE = re.compile(r"(?:CUDA|HIP) out of memory\. Tried to allocate [\d.]+ [KMGTP]?i?B")
_LABEL_RE = re.compile(r"^\d+: ")  # srun --label's task prefix
_EXCEPTION_RE = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b.*)$")


def short_oom(line: str) -> str:
    """``CUDA out of memory. Tried to allocate 2.00 GiB`` out of an allocator message, else the line cut to 200."""
    m = OOM_SENTENCE_RE.search(line)
    return m.group(0) if m else line[:200]


def torchrun_reason(lines: list[str]) -> str | None:
    """For a torchrun tree whose rank failed: "rank R: <its exception line>" from torchrun's
    "Root Cause" summary and the last exception printed before it; None for other logs."""
    try:
        root = max(i for i, ln in enumerate(lines) if ln.startswith("Root Cause (first observed failure)"))
    except ValueError:
        return None
    rank = next((ln.split(":", 1)[1].split()[0] for ln in lines[root:] if ln.startswith("rank")), "?")
    start = next((i for i in range(root, -1, -1) if "ChildFailedError" in lines[i]), root)
    for ln in reversed(lines[:start]):
        m = _EXCEPTION_RE.match(ln)
        if m and "ChildFailedError" not in ln and "SignalException" not in ln:
            return f"rank {rank}: {m.group(1)}"
    return f"rank {rank} failed"


def failure(rdir: Path, run: Run, rc: int, timed_out: bool, oom_exit: int | None = None) -> dict:
    """``{status, reason}`` of a run that ended without an end status of its own: a timeout (at
    which step), an OOM (the allocator's sentence; or exit ``oom_exit``), else an error with the
    last meaningful log line and how the process ended."""
    if timed_out:
        rows = read_metrics(rdir)
        at = f"at step {rows[-1].step}/{run.cell.steps}" if rows else "before the first step"
        return {"status": "timeout", "reason": f"timed out after {run.cell.timeout_s:g} s {at}"}
    lines = run_lines(rdir, run)
    oom = [ln for ln in lines if OOM_RE.search(ln)]
    if (oom_exit is not None and rc == oom_exit) or oom:
        return {"status": "oom", "reason": short_oom((oom or lines or [f"exit code {rc}"])[-1])}
    last = torchrun_reason(lines) or (lines[-1] if lines else "no output")
    return {"status": "error", "reason": f"{last} ({how_it_ended(rdir, run, rc)})"}


def run_lines(rdir: Path, run: Run) -> list[str]:
    """The meaningful lines at the end of a run's stdout.log; of a multi-node run without srun's
    ``N: `` task labels, the per-node wrappers' lines and srun's and slurmstepd's own."""
    lines = log_lines(rdir / "stdout.log")
    if run.cell.nodes <= 1:
        return lines
    lines = [_LABEL_RE.sub("", ln, count=1).strip() for ln in lines]
    return [ln for ln in lines if not ln.startswith(("bench.nodevram", "srun: ", "slurmstepd"))]


def how_it_ended(rdir: Path, run: Run, rc: int) -> str:
    """How the process ended: its exit status; for a multi-node run the first node whose agent
    failed, from that node's summary (its wrapper's), and the launcher's status after it. srun's
    status is the highest of its tasks' (143 when the others were ended by SIGTERM), not the
    failing rank's."""
    if run.cell.nodes <= 1:
        return exit_text(rc)
    vram = read_json(rdir / "vram.json")
    nodes = vram.get("nodes") if isinstance(vram, dict) else None
    failed = [
        n
        for n in nodes or []
        if isinstance(n, dict) and isinstance(n.get("agent_exit"), int) and n["agent_exit"] > 0
    ]
    if failed:
        return f"node {failed[0].get('node')}'s agent: {exit_text(failed[0]['agent_exit'])}; the launcher's {exit_text(rc)}"
    return f"the launcher's {exit_text(rc)}"


def short_metrics(rdir: Path, run: Run) -> str | None:
    """Why an "ok" run's metrics.jsonl cannot back its result (steps missing, unreadable lines), or None."""
    rows, bad = read_metrics_counted(rdir)
    steps = {r.step for r in rows if r.step is not None}
    if len(steps) >= run.cell.steps and not bad:
        return None
    found = f"metrics.jsonl holds {len(steps)} of {run.cell.steps} steps"
    return found + (f" and {bad} unreadable line(s)" if bad else "") + "; the run is not counted"


def record(rdir: Path, run: Run, status: str, reason: str) -> str:
    """run.json written by the driver for a run that never started (skipped, no cache); its outcome line."""
    write_run(
        rdir,
        RunDoc.of(status=status, reason=reason, arm=run.arm, start_time=None, end_time=now(), config=None),
    )
    return f"{status}: {reason}"
