"""The sweep checked against what its cells' trainers can do, as their readers say it
(bench/config/cellfacts.py's CellReader): ``pairing: lockstep`` needs a trainer whose runs take
turns (``takes_turns``), and a sweep key that only some trainers honour (``sweep_keys``: e.g. a
run wrapper's time-to-verdict levers, ``trainer_gc_freeze``) needs a cell one of them runs. Each
refusal is one line, made by the loader's ``fail``."""

from __future__ import annotations

import bench.config.typed as typed
from bench.config.cellfacts import Readers
from bench.config.model import Cell
from bench.config.schema import SweepKeys
from bench.config.typed import Fail


def check_lockstep(top: SweepKeys, cells: list[Cell], readers: Readers, fail: Fail) -> None:
    """``pairing: lockstep`` puts a pair's two runs on one card, taking turns step by step: two
    arms, one GPU and one node per run, a trainer whose runs can take turns (its reader's
    ``takes_turns``), a warm-up step (the first step runs in both at once), runs that start on
    their own (not forked from trainer_python_fork's server, which serves one run at a time)."""
    if top.pairing != "lockstep":
        return
    need = "pairing: lockstep (both runs of a pair on one card, taking turns) needs"
    if len(top.arms) != 2:
        raise fail(f"{need} exactly two arms, got {len(top.arms)}: {', '.join(top.arms)}")
    for c in cells:  # the warm-up each cell runs: its own warmup_steps, else the sweep's
        if c.warmup_steps < 1:
            own = isinstance(top.cells[c.entry], dict) and top.cells[c.entry].get("warmup_steps") is not None
            key = f"cells[{c.entry}].warmup_steps" if own else "warmup_steps"
            raise fail(f"{need} {key} of at least 1: step 1 runs in both runs at once")
    if top.trainer_python_fork:  # the warm server forks one run and waits for it before the next
        raise fail(
            f"{need} runs that start on their own: trainer_python_fork: true forks one run at a time from "
            "its warm server, and each run of a pair would wait for the other until timeout_s; remove "
            "trainer_python_fork, or use pairing: sequential"
        )
    able = [name for name, r in readers.items() if r.takes_turns]
    for c in cells:
        if not readers[c.trainer].takes_turns:
            raise fail(
                f"{need} trainer: {' or '.join(able) or 'none here'}; cell {c.cell_id} runs {c.trainer}"
            )
        if c.gpus != 1 or c.nodes != 1:
            raise fail(
                f"{need} one GPU on one node per run; cell {c.cell_id} has {c.gpus} GPU(s), {c.nodes} node(s)"
            )


def check_trainer_keys(top: SweepKeys, cells: list[Cell], readers: Readers, fail: Fail) -> None:
    """A sweep key that only some trainers honour (in their readers' ``sweep_keys``), set to other
    than its default, needs a cell one of them runs: elsewhere it would change nothing and still
    be recorded as set (sweep.json, the report)."""
    used = list(dict.fromkeys(c.trainer for c in cells))
    defaults = typed.defaults(SweepKeys)
    for key in (k for k in defaults if any(k in r.sweep_keys for r in readers.values())):
        value = getattr(top, key)
        if value == defaults[key] or any(key in readers[t].sweep_keys for t in used):
            continue
        able = " or ".join(name for name, r in readers.items() if key in r.sweep_keys)
        shown = str(value).lower() if isinstance(value, bool) else repr(value)
        raise fail(
            f"{key}: {shown} changes nothing here: only trainer {able} honours it, and this sweep's cells "
            f"run {', '.join(used)}; remove it, or run the cells with trainer: {able}"
        )
