"""What the sweep prints: the plan (--dry-run), a progress bar with the run in flight, one
outcome line per run, the status counts, and the report's summary (at most 100 columns)."""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.config import Precision, Run
from bench.record import has_run, read_metrics, read_run
from bench.run.sweepdir import run_dir

if TYPE_CHECKING:  # scipy and pandas: imported when a pair finishes, not at start
    from bench.results.stats import Delta, SteinDecision

TICK_S = 1.0


class Progress:
    """A tqdm bar over the sweep's runs; its total grows when the precision rule adds pairs."""

    def __init__(self, total: int, done: int) -> None:
        from tqdm import tqdm

        self.tty = sys.stderr.isatty()
        self.bar = tqdm(total=total, initial=done, unit="run", mininterval=TICK_S, dynamic_ncols=True)

    def grow(self, total: int) -> None:
        if total != self.bar.total:
            self.bar.total = total
            self.bar.refresh()

    def start(self, run: Run) -> None:
        self.bar.set_description(run.run_id, refresh=False)
        self.bar.set_postfix({}, refresh=False)

    def done(self, run: Run, line: str, seconds: float) -> None:
        self.bar.update(1)
        self.bar.write(f"{run.run_id}: {line} ({seconds:.0f} s)")

    def write(self, line: str) -> None:
        self.bar.write(line)

    def close(self) -> None:
        self.bar.close()

    def ticker(self, run: Run, out_dir: Path) -> Callable[[], None]:
        """Called about once a second while a run is going: step k/N and the last s/step in the bar."""
        state = {"last": 0.0}
        every = TICK_S if self.tty else 30.0  # non-TTY output (CI logs): a line every 30 s, not a flood
        bar = self.bar

        def tick() -> None:
            rows = read_metrics(run_dir(out_dir, run))
            step = (rows[-1].step if rows[-1].has("step") else len(rows)) if rows else 0
            post = {"step": f"{step}/{run.cell.steps}"}
            if rows and rows[-1].step_time_s is not None:
                s = rows[-1].step_time_s
                post["s/step"] = f"{s:.3f}"
                left = max(run.cell.steps - int(step), 0)
                post["run eta"] = f"{left * s:.0f}s"
            bar.set_postfix(post, refresh=False)
            now = time.monotonic()
            if now - state["last"] >= every:
                state["last"] = now
                bar.refresh()

        return tick


def outcome_line(rdir: Path) -> str:
    """``ok, 9.69 samples/s, peak VRAM 24.28 GiB (busiest card)``, or the status and its reason."""
    from bench.results.records import load_run, run_row  # the one definition of a run's throughput

    row = run_row(load_run(rdir))
    parts = [str(row["status"]) + (f": {row['reason']}" if row["status"] != "ok" and row["reason"] else "")]
    if _finite(row.get("samples_per_s")):
        parts.append(f"{row['samples_per_s']:.2f} samples/s")
    if _finite(row.get("peak_vram_gib")):
        parts.append(f"peak VRAM {row['peak_vram_gib']:.2f} GiB (busiest card)")
    elif _finite(row.get("torch_peak_reserved_gib")):
        parts.append(f"torch peak reserved {row['torch_peak_reserved_gib']:.2f} GiB")
    return ", ".join(parts)


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


FAILED = ("error", "timeout", "oom")


def running_deltas(out_dir: Path, runs: list[Run], finished: Run) -> list[str]:
    """After a run that completes its pair (every arm of its cell and repeat has run): each arm's Δ
    samples/s vs the baseline over the cell's pairs so far, with the 95% CI the report would state
    now (bench.results.deltas.speed_delta), one line per arm. Without a precision target: the paired
    t on the log-ratios. With the cell's precision target: during the pilot, the pilot's own
    t-interval (``pilot k/n0``); once every pilot run has finished, Stein's interval from the pilot's
    spread and degrees of freedom, with the target and the pairs the rule plans for the cell (the
    plain interval on all pairs so far can read as the target met when the report says missed)."""
    from bench.arms import BASELINE
    from bench.results import deltas
    from bench.results.records import load_run
    from bench.results.tables import runs_table

    cell = finished.cell.cell_id
    mine = [r for r in runs if r.cell.cell_id == cell]
    pair = [r for r in mine if r.repeat == finished.repeat]
    if not all(has_run(run_dir(out_dir, r)) for r in pair):
        return []
    table = runs_table([load_run(run_dir(out_dir, r)) for r in mine if has_run(run_dir(out_dir, r))])
    ok = table[table["status"] == "ok"]
    precision = finished.cell.precision
    target = vars(precision) if precision is not None else None
    pilot_done = precision is not None and all(
        has_run(run_dir(out_dir, r)) for r in mine if r.repeat <= precision.min_pairs
    )
    # the cell's pairs, as the sweep's second stage decides them (its most demanding arm)
    cell_decision = deltas.stein_decisions(table, {cell: target})[cell] if pilot_done else None
    lines = []
    for arm in dict.fromkeys(r.arm for r in mine if r.arm != BASELINE):
        lr = deltas.log_ratios(ok[ok["arm"] == BASELINE], ok[ok["arm"] == arm])
        if not len(lr):
            continue
        d, decision = deltas.speed_delta(lr, target)
        if precision is None:
            ci = _interval(d, ".1f", "") if _finite(d.lo) else " (a CI needs 2 pairs)"
        else:
            note = _precision_note(d, precision, decision, cell_decision)
            ci = _interval(d, ".2f", f", {note}") if _finite(d.lo) else f" (a CI needs 2 pairs; {note})"
        lines.append(
            f"running Δ samples/s, {arm} vs {BASELINE}, {cell}: {d.pct:+.1f}%{ci} after {d.n} pair(s)"
            + _noted(ok[ok["arm"].isin([BASELINE, arm])])
        )
    return lines


WIDE_POINTS = 1000.0  # a running CI wider than ±1000 points says nothing yet: its ends are not printed


def _interval(d: Delta, spec: str, note: str) -> str:
    """`` [lo, hi] (±h points…)``; a CI wider than ±WIDE_POINTS (two pairs, one run disturbed: on
    a shared CPU the first screen read [-100.0, +2665814985.3]) as its width alone, in words."""
    if d.halfwidth > WIDE_POINTS:
        return f" (CI ±{d.halfwidth:.3g} points: too wide to read yet{note})"
    return f" [{d.lo:+.1f}, {d.hi:+.1f}] (±{d.halfwidth:{spec}} points{note})"


def _noted(runs: Any) -> str:
    """``; 1 run noted in runs.csv (unstable: step 3 took …)``: the runs behind the Δ that the
    report flags (a step far over the run's median, too few steps, …), the first note's gist."""
    if "note" not in runs:
        return ""
    notes = [str(n) for n in runs["note"].dropna() if str(n).strip()]
    if not notes:
        return ""
    gist = notes[0].split(";")[0]
    gist = gist if len(gist) <= 70 else gist[:69] + "…"
    return f"; {len(notes)} run{'s' if len(notes) > 1 else ''} noted in runs.csv ({gist})"


def _precision_note(
    d: Delta, precision: Precision, decision: SteinDecision | None, cell_decision: SteinDecision | None
) -> str:
    """Which interval a precision-target cell's running Δ is: the pilot's t (``cell_decision`` None:
    the pilot is not finished), else Stein's from the arm's pilot ``decision``, with the target, the
    pairs planned for the cell and, where the arm's pilot asked for more than the cap, how many."""
    target = f"target ±{precision.ci_halfwidth_pct:g}"
    if cell_decision is None:
        return f"pilot {d.n}/{precision.min_pairs}; {target}"
    how = (
        f"Stein: pilot sd over {decision.pilot_df + 1} pairs"
        if decision.pilot_sd is not None
        else f"paired t, no Stein: {decision.reason}"
    )
    cap = f", cap hit: {decision.wanted} wanted" if decision.capped else ""
    return f"{how}; {target}, {cell_decision.pairs} pairs planned{cap}"


def print_outcome(out_dir: Path, runs: list[Run]) -> int:
    """Print the status counts and skip reasons; returns how many runs failed (error, timeout, oom)."""
    docs = [read_run(run_dir(out_dir, r), tolerant=True) for r in runs]
    counts = Counter(("missing" if d is None or not d.has("status") else d.status) for d in docs)
    print("runs: " + ", ".join(f"{n} {s}" for s, n in counts.most_common()))
    skipped = Counter(d.reason for d in docs if d is not None and d.status == "skipped")
    for reason, n in skipped.items():
        print(f"skipped {n} run(s): {reason}")
    return sum(counts[s] for s in (*FAILED, "missing"))


def report(out_dir: Path) -> int:
    """Build the report from the run directories and print where it is and its main table."""
    out_dir = Path(out_dir)
    try:
        from bench.results import report as report_builder  # pandas, matplotlib: at the end only

        built = report_builder.build_report(out_dir)
    except ValueError as e:  # bad input: no runs, unreadable directory
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        print(
            f"error: building the report failed: {e!r} (retry: python -m bench report {out_dir})",
            file=sys.stderr,
        )
        return 1
    md = out_dir / "report.md"
    summary = built.get("console_summary") if isinstance(built, dict) else None
    print("\n".join(summary) if summary else main_table(built, md))
    print(f"\nreport: {md} (every table; its Summary pastes into a PR)")
    if (out_dir / "forest.png").exists():
        print(f"headline figure: {out_dir / 'forest.png'}")
    if isinstance(built, dict) and "summary" in built:
        from bench.results import parity_gate

        found = parity_gate.failures(built["summary"], built.get("training_parity"))
        if found:  # a faster arm that computes something else is no gain: not a success
            print(f"error: {parity_gate.headline(found)}", file=sys.stderr)
            return parity_gate.PARITY_EXIT
    return 0


def main_table(built: dict | None, md: Path) -> str:
    """The report's main table: as the report built it, else the first markdown table of report.md."""
    lines = (built or {}).get("main_table") if isinstance(built, dict) else None
    if lines:
        return "\n".join(lines)
    try:
        text = md.read_text().splitlines()
    except OSError:
        return ""
    table: list[str] = []
    for line in text:
        if line.lstrip().startswith("|"):
            table.append(line)
        elif table:
            break
    return "\n".join(table)
