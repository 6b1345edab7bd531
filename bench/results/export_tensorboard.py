"""`bench export --to tensorboard`: a sweep as TensorBoard event files, written by tensorboardX
(no torch, no TensorFlow; tensorboard's own ``tensorboard.summary.Writer`` is experimental and
writes scalars only). One log directory per run under OUT (its steps as scalars ``step/<metric>``,
its tags, cell and runs.csv numbers as a text table ``run``) and one, ``summary``, for the sweep's
verdicts (per cell × arm, each summary.csv number as the scalar ``<cell_id>/<arm>/<column>`` at
step 0, and the verdict words as the text table ``verdicts``). Only files under OUT are written.
"""

from __future__ import annotations

from pathlib import Path

from bench.results.export_data import SweepExport, TrackerRun, fresh_dir, need

SUMMARY_RUN = "summary"


def _table(rows: list[tuple[str, str]], header: tuple[str, str] = ("key", "value")) -> str:
    """A Markdown table (TensorBoard's text plugin renders it)."""
    cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = [f"| {header[0]} | {header[1]} |", "|---|---|"]
    return "\n".join(lines + [f"| {cell(k)} | {cell(v)} |" for k, v in rows])


def _run(writer_cls, out: Path, run: TrackerRun) -> None:
    w = writer_cls(logdir=str(out / run.name), flush_secs=3600)
    try:
        for step, when, values in run.steps:
            for key, value in values.items():
                w.add_scalar(key, value, step, walltime=when)
        facts = [*run.tags.items(), *run.params.items(), *((k, f"{v:.6g}") for k, v in run.totals.items())]
        w.add_text("run", _table(facts), 0)
    finally:
        w.close()


def _summary(writer_cls, out: Path, sweep: SweepExport) -> None:
    w = writer_cls(logdir=str(out / SUMMARY_RUN), flush_secs=3600)
    try:
        for row in sweep.summary:
            for key, value in row.numbers.items():
                w.add_scalar(f"{row.key}/{key}", value, 0)
        words = [(f"{row.key} {k}", v) for row in sweep.summary for k, v in row.words.items()]
        w.add_text("verdicts", _table(words, ("cell/arm column", "words")), 0)
        w.add_text("sweep", _table(list(sweep.tags.items())), 0)
    finally:
        w.close()


def export(sweep: SweepExport, out: Path) -> list[str]:
    """Write the event files under ``out`` (one directory per run, and ``summary``); the lines to print."""
    writer_cls = need("tensorboardX", "tensorboard", "tensorboardX").SummaryWriter
    fresh_dir(out)
    for run in sweep.runs:
        _run(writer_cls, out, run)
    _summary(writer_cls, out, sweep)
    return [f"view them: tensorboard --logdir {out}"]
