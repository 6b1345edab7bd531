"""Our DFlash trainer (``specforge/`` in this checkout) as a trainer: the run contract's plug,
with our trainer's keys for every arm (keys.py), our training configs' facts (facts.py), the
packages it imports, and what the warm fork server preloads for it. A sweep's ``trainer_module``
may name another module with our trainer's schema (the test suite's fake trainer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.arms import Arm
from bench.trainers.base import Trainer
from bench.trainers.contract.plug import ContractPlug
from bench.trainers.embedded.facts import MODULE, EmbeddedReader
from bench.trainers.embedded.keys import arm_sets


@dataclass(frozen=True)
class EmbeddedPlug(ContractPlug):
    name: str = EmbeddedReader.name

    def arm_sets(self, arm: Arm) -> dict[str, Any]:
        return arm_sets(arm)


EMBEDDED = EmbeddedPlug(
    module=MODULE,
    packages=("torch", "transformers", "safetensors"),
    imports=("specforge.train",),  # the training module and its heavy imports
    gpu_preload=("liger_kernel.transformers", "torch._inductor.compile_fx"),
    liger_imports=("liger_kernel.transformers:apply_liger_kernel_to_qwen3",),  # specforge/liger.py
)


def make_plug(cfg, info: dict) -> EmbeddedPlug:
    module = cfg.trainer_module or MODULE  # a sweep of another default trainer with cells of ours
    return EMBEDDED if module == MODULE else EmbeddedPlug(module=module)


TRAINER = Trainer(
    name=EmbeddedReader.name,
    reader=EmbeddedReader(),
    make_plug=make_plug,
    doc="our DFlash trainer (specforge/), every arm",
)
