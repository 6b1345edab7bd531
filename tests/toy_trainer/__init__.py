"""A toy trainer package, to show (and test) that adding a trainer is one folder plus one line.

Its trainer (train.py) fits a small linear model by SGD in pure Python and prints one
``TOY {json}`` line per optimizer step; its own config is a YAML file with ``name`` and
``features``. This package owns everything the suite needs to know about it: how a cell's facts
are read from that config (ToyReader), which arms it can express (the baseline and the A/A arm:
it has no kernels to swap), its command line, and the reading-back of its log into the run
records (ToyPlug.reconcile). The test registers it with one line:
``monkeypatch.setattr(bench.trainers, "TRAINERS", (*bench.trainers.TRAINERS, "tests.toy_trainer"))``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import bench.trainers.outcome as outcome
from bench.procs.launcher import log_lines, now
from bench.record import MetricRow, MetricsWriter, RunDoc, write_run
from bench.trainers.base import Trainer

NAME = "toy"
PREFIX = "TOY "


class ToyReader:
    name = NAME
    module = None
    takes_turns = False  # no hook in its process for a lockstep pair
    sweep_keys: frozenset[str] = frozenset()  # none of the trainer-specific sweep keys

    def read_cell(self, train, cfg_path: Path, sets: dict, nodes: int, where: str) -> dict | str:
        if not isinstance(train.get("name"), str) or not isinstance(train.get("features"), int):
            return f"{where}.config: {str(cfg_path)!r}: a toy config has a 'name' and integer 'features'"
        if nodes > 1:
            return f"nodes: the {NAME} trainer runs on one machine"
        return {
            "profile": train["name"],
            "mode": "online",  # it makes its data as it goes: nothing to prepare
            "inputs": "user",
            "accumulation_steps": None,
            "num_anchors": None,
            "attention_backend": None,
        }

    def refuse_set(self, key: str, facts: dict) -> str | None:
        return "the toy trainer takes no overrides" if key else None

    def refuse_arm_key(self, key: str, facts: dict) -> str | None:
        return f"the {NAME} trainer has no keys an arm of yours could set"

    def refuse_arms(self, arms, where: str) -> str | None:
        unfit = [a.name for a in arms if a.liger or a.changes]
        return f"arms: {', '.join(unfit)}: the {NAME} trainer has no kernels to swap" if unfit else None


@dataclass
class ToyPlug:
    name: str = NAME

    def missing_packages(self, cfg) -> list[str]:
        return []

    def check_cells(self, cfg, cells, out_dir: Path, cache_dir_for) -> None:
        return None  # its configs were read by ToyReader; nothing else to ask

    def compile_key(self, cfg, kind: str) -> str | None:
        return None

    def preload(self, cfg) -> list[str]:
        return []  # runs start as new interpreters

    def train_command(self, cfg, run, rdir: Path, cache_dir: Path | None) -> list[str]:
        c = run.cell
        args = ["--config", c.train_config, "--steps", str(c.steps), "--batch", str(c.batch_size)]
        return [sys.executable, "-m", "tests.toy_trainer.train", *args, "--seed", str(run.repeat)]

    def prepare_command(self, cfg, cell, cache_dir: Path) -> list[str]:
        raise AssertionError("the toy trainer prepares nothing")

    def cache_problem(self, cfg, cell, out_dir: Path, cdir: Path) -> str | None:
        return None

    def reconcile(self, rdir: Path, run, rc: int, timed_out: bool, started: str) -> RunDoc:
        """Its ``TOY`` lines into metrics.jsonl, then run.json: ok when it exited 0 with every step."""
        with MetricsWriter(rdir) as metrics:
            lines = [ln[len(PREFIX) :] for ln in log_lines(rdir / "stdout.log") if ln.startswith(PREFIX)]
            metrics.write(MetricRow.from_json(json.loads(ln), metrics.path) for ln in lines)
        doc = RunDoc.of(status="ok", reason=None, arm=run.arm, start_time=started, end_time=now())
        doc = doc.updated(world_size=1, exit_code=rc, trainer={"name": NAME}, config=None)
        if rc != 0 or timed_out:
            doc = doc.updated(**outcome.failure(rdir, run, rc, timed_out))
        elif short := outcome.short_metrics(rdir, run):
            doc = doc.updated(status="error", reason=short)
        write_run(rdir, doc)
        return doc


TRAINER = Trainer(name=NAME, reader=ToyReader(), make_plug=lambda cfg, info: ToyPlug(), doc="a test's toy")
