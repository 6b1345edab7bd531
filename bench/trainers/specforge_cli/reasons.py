"""Why a SpecForge run did not end ok, in words a SpecForge user can act on: read from what the
wrapper recorded (``specforge.json``: SpecForge's own exit status, the last step it logged, its
first lines) and its log, over the shared timeout / OOM classification (bench/trainers/outcome.py).

- killed: by which signal and after which step (a SIGKILL with no traceback is often the
  kernel's OOM killer), never a raw step line;
- no recognised step line: says so, with SpecForge's first lines (another SpecForge version's
  log format, or output going elsewhere);
- a crash: the last line of SpecForge's own traceback (``ValueError: ...``);
- exited 0 before its last step: the step it stopped at;
- a rank that died under torchrun (several ranks): the rank torchrun names as the root cause,
  how it ended, and the last step every rank logged.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import bench.trainers.outcome as outcome
from bench.config import Run
from bench.record import read_metrics

_EXC_RE = re.compile(
    r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)\b:?.*)$"
)
_STEP_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?step \d+: \{")


_ROOT_CAUSE = re.compile(r"^\s*rank\s*: (\d+) \(local_rank: \d+\)")
_EXITCODE = re.compile(r"^\s*exitcode\s*: (-?\d+)")


def failed_rank(lines: list[str]) -> tuple[int, int] | None:
    """(rank, exit code) of torchrun's "Root Cause (first observed failure)" block, else None."""
    for i, ln in enumerate(lines):
        if ln.startswith("Root Cause"):
            rank = code = None
            for nxt in lines[i + 1 : i + 8]:
                rank = rank if rank is not None else (m.group(1) if (m := _ROOT_CAUSE.match(nxt)) else None)
                code = code if code is not None else (m.group(1) if (m := _EXITCODE.match(nxt)) else None)
            if rank is not None and code is not None:
                return int(rank), int(code)
    return None


def rank_died(lines: list[str], exit_doc: dict, run: Run, rc: int) -> dict | None:
    """The reason of a multi-rank run torchrun ended because one rank failed."""
    found = failed_rank(lines) if run.cell.gpus > 1 else None
    if found is None:
        return None
    rank, code = found
    how = f"was killed by {signal_name(-code)}" if code < 0 else f"exited with status {code}"
    exc = last_exception(lines)
    return {
        "status": "error",
        "reason": f"rank {rank} of {run.cell.gpus} {how} {at_step(exit_doc, run.cell.steps)}"
        + (f": {exc}" if exc and code > 0 else "")
        + f"; torchrun stopped the other ranks (exit code {rc})",
    }


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def killed_by(exit_doc: dict) -> int | None:
    """The signal that ended SpecForge itself (not one this suite sent it), or None."""
    code = exit_doc.get("exit_code")
    if not isinstance(code, int) or (exit_doc.get("stop") or {}).get("stopped"):
        return None
    if code < 0:
        return -code
    if code in (128 + signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGHUP):  # SpecForge's own unwind
        return code - 128
    return None


def last_exception(lines: list[str]) -> str | None:
    """The last exception line of SpecForge's traceback (``ValueError: ...``), cut to 300 characters."""
    for ln in reversed(lines):
        if _STEP_LINE.match(ln):
            continue
        m = _EXC_RE.match(ln)
        if m and "ChildFailedError" not in ln and "SignalException" not in ln:
            return m.group(1)[:300]
    return None


def at_step(exit_doc: dict, steps: int) -> str:
    last = exit_doc.get("last_step")
    return f"after step {last} of {steps}" if isinstance(last, int) else "before its first step"


def no_step_line(exit_doc: dict) -> str:
    head = " | ".join(exit_doc.get("first_lines") or []) or "no output at all"
    return (
        f"no step line recognised in SpecForge's {exit_doc.get('output_lines', 0)} lines of output "
        f"(expected 'step N: {{...}}', SpecForge 0.2.0's format with training.log_interval=1); "
        f"its first lines: {head[:600]}"
    )


def failure(rdir: Path, run: Run, rc: int, timed_out: bool, exit_doc: dict) -> dict | None:
    """``{status, reason}`` of a run that is not ok, or None when it is (every step logged)."""
    steps = run.cell.steps
    if timed_out:
        return outcome.failure(rdir, run, rc, timed_out)
    lines = outcome.run_lines(rdir, run)
    if any(outcome.OOM_RE.search(ln) for ln in lines):
        return outcome.failure(rdir, run, rc, timed_out)
    if not exit_doc:  # the wrapper itself was killed: what metrics.jsonl saw
        rows = read_metrics(rdir)
        exit_doc = {
            "exit_code": -(rc - 128) if rc > 128 else rc,
            "last_step": rows[-1].step if rows else None,
        }
    sig = killed_by(exit_doc)
    if sig is not None:
        hint = " (no traceback: a SIGKILL nobody sent is often the kernel's OOM killer, see dmesg)"
        sent = exit_doc.get("signals_received") or []
        by = f"{signal_name(sig)}" + (f", passed on from the driver's {signal_name(sent[0])}" if sent else "")
        return {
            "status": "error",
            "reason": f"SpecForge was killed by {by} {at_step(exit_doc, steps)}"
            + (hint if sig == signal.SIGKILL and not sent else ""),
        }
    if rc != 0 and (died := rank_died(lines, exit_doc, run, rc)) is not None:
        return died
    if rc != 0:
        exc = last_exception(lines)
        if exc is None and exit_doc and not exit_doc.get("last_step"):
            return {
                "status": "error",
                "reason": f"{no_step_line(exit_doc)} ({outcome.how_it_ended(rdir, run, rc)})",
            }
        if exc is None:
            return outcome.failure(rdir, run, rc, timed_out)
        return {
            "status": "error",
            "reason": f"SpecForge failed {at_step(exit_doc, steps)}: {exc} (exit code {rc})",
        }
    if exit_doc and exit_doc.get("last_step") is None:
        return {"status": "error", "reason": no_step_line(exit_doc)}
    short = outcome.short_metrics(rdir, run)
    if short and exit_doc and isinstance(exit_doc.get("last_step"), int) and exit_doc["last_step"] < steps:
        short = f"SpecForge exited by itself {at_step(exit_doc, steps)} (its data or max_steps?); {short}"
    return {"status": "error", "reason": short} if short else None
