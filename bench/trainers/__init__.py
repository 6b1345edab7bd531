"""The registered trainers, one line each, and the plug that runs a cell.

Each entry names a package whose ``TRAINER`` (bench/trainers/base.py says what it holds) is
registered under its own name; the first is the default trainer of a sweep config that names
none. Adding a trainer is its package plus one line here. ``load_config`` is the config loader with every registered
trainer's cell reader handed in; ``plug_for`` / ``plugs_for`` give the plugs of a sweep's cells.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from bench.config import Cell, SweepConfig
from bench.config import load_config as _load_config
from bench.errors import SweepError
from bench.trainers.base import Trainer, TrainerPlug, trainer_gaps

TRAINERS = (
    "bench.trainers.embedded",  # our DFlash trainer (specforge/), the default
    "bench.trainers.specforge_cli",  # the real SpecForge CLI (PyPI specforge), your environment
    "bench.trainers.contract",  # any module honouring docs/run-contract.md (trainer_module)
)

__all__ = ["TRAINERS", "Trainer", "TrainerPlug", "load_config", "plug_for", "plugs_for", "registered"]


def registered() -> dict[str, Trainer]:
    """The registered trainers by name, the default first; a trainer whose cell reader does not
    hold what the config layer asks of it is refused in one line (bench/trainers/base.py's
    trainer_gaps), never an AttributeError in the middle of a config's checks."""
    trainers = [importlib.import_module(module).TRAINER for module in TRAINERS]
    for t, module in zip(trainers, TRAINERS):
        gaps = trainer_gaps(t.name, t.reader)
        if gaps:
            raise SweepError(f"{gaps}; registered by {module}")
    return {t.name: t for t in trainers}


def load_config(path: str | Path) -> SweepConfig:
    """A sweep config, validated with every registered trainer's reading of its cells."""
    return _load_config(path, {name: t.reader for name, t in registered().items()})


def plug_for(cfg: SweepConfig, cell: Cell | None = None, info: dict | None = None) -> TrainerPlug:
    """The plug that runs ``cell`` (None: the sweep's own trainer); ``info``: the machine."""
    name = cell.trainer if cell is not None else cfg.trainer
    trainer = registered()[name]
    plug = trainer.make_plug(cfg, dict(info or {}))
    gaps = trainer_gaps(name, trainer.reader, plug)
    if gaps:
        raise SweepError(gaps)
    return plug


def plugs_for(cfg: SweepConfig, info: dict | None = None) -> dict[str, TrainerPlug]:
    """One plug per trainer the sweep's cells name, in the order they first appear."""
    plugs: dict[str, TrainerPlug] = {}
    for cell in cfg.cells:
        if cell.trainer not in plugs:
            plugs[cell.trainer] = plug_for(cfg, cell, info)
    return plugs
