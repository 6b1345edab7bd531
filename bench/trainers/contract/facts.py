"""How a run-contract trainer's cells are read: the contract asks its training configs for a
top-level ``profile`` (a name) and ``mode`` (offline or online) and nothing else; the driver owns
the contract's keys (CONTRACT_KEYS); its arms are Liger on or off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.arms import Arm
from bench.config import MODES
from bench.trainers.contract.plug import CONTRACT_KEYS, NAME

# Keys of the training config the driver fixes per cell: another training config changes them.
CELL_KEYS = {"profile": "use another training config", "mode": "use another training config"}


def profile_and_mode(train: Any, cfg_path: Path, where: str) -> dict | str:
    """The contract's two facts of a training config, or why it has none."""
    if not isinstance(train.get("profile"), str) or not train["profile"].strip():
        return f"{where}.config: {str(cfg_path)!r} has no top-level 'profile' string"
    if train.get("mode") not in MODES:
        return f"{where}.config: {str(cfg_path)!r} needs a top-level 'mode' of offline or online"
    return {"profile": train["profile"], "mode": train["mode"], "inputs": "prepared"}


def contract_arm(arm: Arm) -> bool:
    """Whether the contract alone expresses the arm: Liger off, or on with its two kernels (no
    nudged weights: the contract has no key for them). A sweep's own arm (user_arms) is the
    trainer's own keys, given as --set."""
    return arm.liger_switch_only and not arm.perturb


class ContractReader:
    module = None  # the sweep names it: trainer_module
    takes_turns = False  # no hook in its process for pairing: lockstep
    sweep_keys: frozenset[str] = frozenset()  # none of the trainer-specific sweep keys
    name = NAME

    def read_cell(self, train: Any, cfg_path: Path, sets: dict, nodes: int, where: str) -> dict | str:
        facts = profile_and_mode(train, cfg_path, where)
        if isinstance(facts, str):
            return facts
        return {**facts, "accumulation_steps": None, "num_anchors": None, "attention_backend": None}

    def refuse_set(self, key: str, facts: dict) -> str | None:
        hint = {**CELL_KEYS, **CONTRACT_KEYS}.get(key)
        return f"set by the driver; {hint}" if hint else None

    def refuse_arm_key(self, key: str, facts: dict) -> str | None:
        return self.refuse_set(key, facts)

    def refuse_arms(self, arms: list[Arm], where: str) -> str | None:
        unfit = [a.name for a in arms if not contract_arm(a)]
        if not unfit:
            return None
        return (
            f"arms: {', '.join(unfit)} cannot run on {where} (trainer {self.name}): the run contract has one "
            "Liger switch, --use-liger-kernel; use the embedded trainer's schema for the others"
        )
