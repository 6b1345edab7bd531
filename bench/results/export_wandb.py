"""`bench export --to wandb`: a sweep as W&B runs, offline unless the user's environment says
otherwise (WANDB_MODE: their configuration; only then is anything sent). Project and group are
the sweep's name; one W&B run per benchmark run (name: the run id; tags ``arm:<arm>``,
``cell:<cell_id>``, ...; config: its tags, cell and the sweep's; history: its steps as
``step/<metric>``; summary: its runs.csv numbers) and a run ``summary`` (job type summary) whose
W&B summary holds each summary.csv number as ``<cell_id>/<arm>/<column>`` and each verdict's words.

Offline runs go to OUT/wandb/offline-run-*/ (``wandb sync`` uploads them; ``wandb leet`` views
them). The export machine's own system metrics, console and code are not recorded: the runs
happened elsewhere, and their hosts and versions are in each run's config. wandb's error reports
are off for the call unless the user set WANDB_ERROR_REPORTING.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from bench.results.export_data import SweepExport, TrackerRun, env_defaults, fresh_dir, need

SUMMARY_RUN = "summary"
TAG_KEYS = ("arm", "cell_id", "trainer", "status", "repeat")
_TAG_MAX = 64  # W&B's longest tag
_BAD_PROJECT = re.compile(r"[/\\#?%:]")
# wandb-core's error reports and observability (to W&B): off unless the user set the variable.
REPORTS_OFF = {"WANDB_ERROR_REPORTING": "false"}


def mode() -> str:
    """The user's WANDB_MODE, else offline."""
    return os.environ.get("WANDB_MODE") or "offline"


def _settings(wandb, offline: bool):
    """What the export machine would add of its own left out; only settings this wandb knows."""
    wanted = {
        "console": "off", "save_code": False, "silent": offline, "x_disable_stats": True,
        "x_disable_meta": True, "x_disable_machine_info": True, "x_save_requirements": False,
    }  # fmt: skip
    known = getattr(wandb.Settings, "model_fields", None)
    return wandb.Settings(**{k: v for k, v in wanted.items() if known is None or k in known})


def _tags(run: TrackerRun) -> list[str]:
    return [f"{k.removesuffix('_id')}:{run.tags[k]}"[:_TAG_MAX] for k in TAG_KEYS if k in run.tags]


def _start(wandb, sweep: SweepExport, out: Path, name: str, **kw):
    project = _BAD_PROJECT.sub("-", sweep.name)[:128]
    offline = mode() in ("offline", "dryrun")
    return wandb.init(
        mode=mode(), dir=str(out), project=project, group=project, name=name,
        settings=_settings(wandb, offline), **kw,
    )  # fmt: skip


def _run(wandb, sweep: SweepExport, out: Path, run: TrackerRun) -> None:
    config = {**sweep.tags, **run.tags, **run.params}
    w = _start(wandb, sweep, out, run.name, job_type="run", tags=_tags(run), config=config)
    try:
        for step, _, values in run.steps:
            w.log(values, step=step)
        w.summary.update(run.totals)
    finally:
        w.finish(exit_code=0 if run.ok else 1)


def _summary(wandb, sweep: SweepExport, out: Path) -> None:
    w = _start(wandb, sweep, out, SUMMARY_RUN, job_type=SUMMARY_RUN, tags=[SUMMARY_RUN], config=sweep.tags)
    try:
        values: dict[str, float | str] = {}
        for row in sweep.summary:
            values |= {f"{row.key}/{k}": v for k, v in row.numbers.items()}
            values |= {f"{row.key}/{k}": v for k, v in row.words.items()}
        w.summary.update(values)
    finally:
        w.finish()


def export(sweep: SweepExport, out: Path) -> list[str]:
    """Write (or, in the user's online mode, send) the runs; the lines to print."""
    with env_defaults(REPORTS_OFF):
        wandb = need("wandb", "wandb", "wandb")
        fresh_dir(out)
        for run in sweep.runs:
            _run(wandb, sweep, out, run)
        _summary(wandb, sweep, out)
    if mode() in ("offline", "dryrun"):
        return [f"offline runs: {out / 'wandb'}; upload them with `wandb sync {out / 'wandb'}/offline-run-*`"]
    return [f"WANDB_MODE={mode()}: your W&B configuration decided where they went"]
