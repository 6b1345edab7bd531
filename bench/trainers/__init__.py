"""Trainer plugs (bench/trainers/base.py says what a plug is). ``plug_for`` picks the one that
runs a cell: a run-contract trainer (``trainer_module``; ``specforge``, ours, by default) or the
SpecForge CLI (``trainer: specforge-cli``, bench/trainers/specforge_cli.py)."""

from __future__ import annotations

from bench.config import Cell, SweepConfig
from bench.config.upstream import SPECFORGE_CLI
from bench.trainers.base import TrainerPlug
from bench.trainers.contract import ContractPlug
from bench.trainers.embedded import EMBEDDED


def plug_for(cfg: SweepConfig, cell: Cell | None = None, info: dict | None = None) -> TrainerPlug:
    """The plug that runs ``cell`` (None: the sweep's run-contract trainer); ``info``: the machine."""
    if cell is not None and cell.trainer == SPECFORGE_CLI:
        # imported here: `python -m bench.trainers.specforge_run` (and _inputs) must not find
        # themselves imported by this package before they run
        from bench.trainers.specforge_cli import SpecForgeCliPlug

        return SpecForgeCliPlug(info=dict(info or {}))
    if cfg.trainer_module == EMBEDDED.module:
        return EMBEDDED
    return ContractPlug(cfg.trainer_module)


def plugs_for(cfg: SweepConfig, info: dict | None = None) -> dict[str, TrainerPlug]:
    """One plug per trainer the sweep's cells name, in the order they first appear."""
    plugs: dict[str, TrainerPlug] = {}
    for cell in cfg.cells:
        if cell.trainer not in plugs:
            plugs[cell.trainer] = plug_for(cfg, cell, info)
    return plugs
