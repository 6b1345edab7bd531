"""The run contract as a trainer: any Python module that honours docs/run-contract.md, named by
the sweep's ``trainer_module`` (a sweep or cell's ``trainer: contract``)."""

from __future__ import annotations

from bench.errors import SweepError
from bench.trainers.base import Trainer
from bench.trainers.contract.facts import ContractReader
from bench.trainers.contract.plug import ContractPlug


def make_plug(cfg, info: dict) -> ContractPlug:
    if not cfg.trainer_module:
        raise SweepError(
            f"{cfg.path}: trainer_module: the {ContractReader.name} trainer runs the module you name "
            "(trainer_module: my_trainer, which honours docs/run-contract.md)"
        )
    return ContractPlug(module=cfg.trainer_module)


TRAINER = Trainer(
    name=ContractReader.name,
    reader=ContractReader(),
    make_plug=make_plug,
    doc="any module honouring the run contract (trainer_module): Liger on or off",
)
