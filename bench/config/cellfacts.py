"""What the config layer asks of a trainer about its cells, without naming any trainer.

A sweep config names a trainer per cell; the trainers are registered above this layer
(bench/trainers: one package each). ``load_config`` is handed a mapping from trainer name to a
:class:`CellReader` (the first entry is the default trainer) and asks each cell's reader what
the cell's training config says (profile, mode, the shapes it trains), which ``set:`` keys the
driver owns for it, and whether it can express the sweep's arms; its attributes say whether its
runs can take turns and which trainer-specific sweep keys they honour. Every answer that refuses is
one line, which the loader puts after the sweep config's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from bench.arms import Arm

# The facts every reader gives for a cell (read_cell's dict): the training config's profile and
# mode, "prepared" (the sweep prepares its offline inputs) or "user" (the config names its own),
# and the shape keys as the runs will see them (None: the trainer's default).
FACTS = ("profile", "mode", "inputs", "accumulation_steps", "num_anchors", "attention_backend")


class CellReader(Protocol):
    """One trainer's reading of the sweep config's cells (bench/trainers/<name>/facts.py)."""

    name: str
    module: str | None  # the Python module its runs launch, for a sweep's null trainer_module
    takes_turns: bool  # its runs can take turns on one card (a sweep's pairing: lockstep)
    # the sweep keys (bench/config/schema.py's SweepKeys) that not every trainer honours and its runs
    # do (e.g. trainer_gc_freeze, a run wrapper's lever); such a key set off its default in a sweep
    # none of whose cells runs a trainer listing it is refused (bench/config/capabilities.py)
    sweep_keys: frozenset[str]

    def read_cell(self, train: Any, cfg_path: Path, sets: dict, nodes: int, where: str) -> dict | str:
        """The cell's FACTS from its training config (``train``: the parsed YAML, any type; ``sets``:
        the cell's overrides, which win over the file), or one line on why it cannot be a cell
        (``where``: ``cells[i]``)."""
        ...

    def refuse_set(self, key: str, facts: dict) -> str | None:
        """Why a cell's ``set:`` may not set ``key`` (the driver sets it for every run), or None."""
        ...

    def refuse_arm_key(self, key: str, facts: dict) -> str | None:
        """Why a sweep's own arm (user_arms) may not set ``key`` on this trainer (the driver sets it,
        or a built-in arm owns it), or None."""
        ...

    def refuse_arms(self, arms: list[Arm], where: str) -> str | None:
        """One line naming the arms this trainer cannot express (and what it would need), or None."""
        ...


Readers = Mapping[str, CellReader]


def pick(overrides: dict, train: Any, dotted: str) -> Any:
    """A setting as the run will see it: the cell's override, else the config file's value."""
    if dotted in overrides:
        return overrides[dotted]
    node: Any = train
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node
