"""How our trainer's cells are read: the run contract's profile and mode, and the shapes our
training config trains (accumulation, anchors, attention), the cell's ``set:`` over the file;
every arm of bench/arms.py is expressible (embedded/keys.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.arms import Arm
from bench.config import pick
from bench.distribution import DEFAULT_TRAINER, OUR_TRAINER_MODULE
from bench.trainers.contract.facts import profile_and_mode
from bench.trainers.embedded.keys import ARM_REFUSED_KEYS, ATTENTION_KEY, DRIVER_KEYS

MODULE = OUR_TRAINER_MODULE  # python -m specforge, from this checkout


class EmbeddedReader:
    name = DEFAULT_TRAINER
    module = MODULE
    takes_turns = False  # no hook in its process for pairing: lockstep
    sweep_keys: frozenset[str] = frozenset()  # none of the trainer-specific sweep keys

    def read_cell(self, train: Any, cfg_path: Path, sets: dict, nodes: int, where: str) -> dict | str:
        facts = profile_and_mode(train, cfg_path, where)
        if isinstance(facts, str):
            return facts
        return {
            **facts,
            "accumulation_steps": pick(sets, train, "training.accumulation_steps"),
            "num_anchors": pick(sets, train, "training.num_anchors"),
            "attention_backend": pick(sets, train, ATTENTION_KEY),
        }

    def refuse_set(self, key: str, facts: dict) -> str | None:
        return f"set by the driver; {DRIVER_KEYS[key]}" if key in DRIVER_KEYS else None

    def refuse_arm_key(self, key: str, facts: dict) -> str | None:
        """The driver's own keys and the Liger kernels' (the built-in Liger arms); a user arm may set
        the other keys a built-in arm sets (compile, attention, the optimizer, ...)."""
        return f"set by the driver; {ARM_REFUSED_KEYS[key]}" if key in ARM_REFUSED_KEYS else None

    def refuse_arms(self, arms: list[Arm], where: str) -> str | None:
        return None  # our trainer has a key for every arm's intent
