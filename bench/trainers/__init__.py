"""Trainer plugs (bench/trainers/base.py says what a plug is). ``plug_for`` picks the one a
sweep names; today every sweep runs a run-contract trainer, ``specforge`` (ours) by default."""

from __future__ import annotations

from bench.config import SweepConfig
from bench.trainers.base import TrainerPlug
from bench.trainers.contract import ContractPlug
from bench.trainers.embedded import EMBEDDED


def plug_for(cfg: SweepConfig) -> TrainerPlug:
    """The plug that runs this sweep's trainer: ours, or any module honouring the run contract."""
    if cfg.trainer_module == EMBEDDED.module:
        return EMBEDDED
    return ContractPlug(cfg.trainer_module)
