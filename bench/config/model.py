"""The validated sweep: SweepConfig, its cells (Cell), their runs (Run), a precision target
(Precision) and a capacity search (Capacity), as frozen dataclasses; and how a cell is named.

Built by bench/config/loader.py from a checked sweep config; the arms' properties are read from
bench/arms.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bench.arms import ARM_NAMES, Arm, arm_named
from bench.config.schema import SweepKeys


@dataclass(frozen=True)
class Precision:
    """Run pairs until the 95% CI of Δ samples/s has this half-width (percentage points)."""

    ci_halfwidth_pct: float
    min_pairs: int  # Stein's pilot (n0)
    max_pairs: int  # cap


@dataclass(frozen=True)
class Capacity:
    """Find per arm the largest batch size (or sequence length) that trains without OOM."""

    axis: str  # batch_size | seq_len
    start: int
    max: int
    granularity: int  # probed values are multiples of this
    steps: int  # optimizer steps per probe (the first is dropped as warm-up)


@dataclass(frozen=True)
class Cell:
    """One point of the grid: a training config at one batch size, sequence length and GPU count."""

    cell_id: str
    entry: int  # index of the `cells:` entry it came from
    train_config: str  # path handed to the trainer
    profile: str
    mode: str
    batch_size: int
    seq_len: int
    gpus: int
    nodes: int
    steps: int
    warmup_steps: int
    timeout_s: float
    overrides: dict[str, Any]  # the entry's `set:`
    accumulation_steps: int | None
    num_anchors: int | None
    attention_backend: str | None
    config_sha256: str  # of the training config file
    precision: Precision | None = None  # None: a fixed number of repeats
    trainer: str = ""  # the registered trainer that runs it (bench/trainers)
    trainer_tag: str = ""  # "" for the default (first registered) trainer, else its name
    inputs: str = "prepared"  # offline: the plug prepares its cache; "user": the config names its own data
    # the sweep's own arms (user_arms) by name, which its runs may be of; the built-in ones: bench/arms.py
    user_arms: Mapping[str, Arm] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    def arm(self, name: str) -> Arm:
        """The arm called ``name``: the sweep's own or a built-in one."""
        return arm_named(name, self.user_arms)

    def cache_key(self) -> str:
        """Offline caches are shared by the cells (arms, batch sizes, repeats) with the same trainer,
        training config, seq_len and `set` overrides: everything `prepare` is given."""
        parts = [self.config_sha256, self.seq_len, self.overrides]
        parts += [self.trainer_tag] if self.trainer_tag else []
        digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:8]
        tail = f"_{self.trainer_tag}" if self.trainer_tag else ""
        return f"{slug(self.profile)}_s{self.seq_len}_{digest}{tail}"

    @property
    def prepared(self) -> bool:
        """Whether its runs read an offline cache the sweep prepares (cache/<key>/)."""
        return self.mode == "offline" and self.inputs == "prepared"


@dataclass(frozen=True)
class Run:
    run_id: (
        str  # run_id(): its directory's name under runs/ (prime_run_id: prime/, profile_run_id: a profile's)
    )
    cell: Cell
    arm: str
    repeat: int  # 1-based: the pair (round) this run belongs to
    order_index: int  # 0-based position in the run order

    @property
    def spec(self) -> Arm:
        """What the arm is (bench/arms.py's entry, or the sweep's own arm)."""
        return self.cell.arm(self.arm)

    @property
    def liger(self) -> bool:
        return self.spec.liger


# A run's id is its directory's name; every id is built here and read back by parse_run_id.
def run_id(cell_id: str, arm: str, repeat: int) -> str:
    """A measured run's id: ``<cell_id>_<arm>_r<repeat>`` (runs/<id>/)."""
    return f"{cell_id}_{arm}_r{repeat}"


def prime_run_id(cell_id: str, arm: str, index: int) -> str:
    """A priming run's id (sweep key prime_runs; prime/<id>/, never read as a result)."""
    return f"{cell_id}_{arm}_prime{index}"


def profile_run_id(cell_id: str, arm: str) -> str:
    """A profiled run's id (bench kernels --profile)."""
    return f"{cell_id}_{arm}"


_REPEAT_RE = re.compile(r"^(?P<stem>.+)_r(?P<repeat>\d+)$")
_WORD_ARM_RE = re.compile(r"^(?P<cell_id>.+)_(?P<arm>[A-Za-z0-9]+)$")
_ARMS_LONGEST_FIRST = sorted(ARM_NAMES, key=len, reverse=True)


def parse_run_id(text: str) -> dict[str, str] | None:
    """cell_id, arm and repeat (as text) of a run id built by run_id, None when it is not one. The
    arm is matched against the known arm names (bench.arms), longest first, so
    ``..._liger_flce_r3`` is arm liger_flce (not flce of cell ``..._liger``); an arm not known
    there is the last word (letters and digits) before the repeat."""
    m = _REPEAT_RE.match(text)
    if not m:
        return None
    stem, repeat = m["stem"], m["repeat"]
    for arm in _ARMS_LONGEST_FIRST:
        if stem.endswith(f"_{arm}") and len(stem) > len(arm) + 1:
            return {"cell_id": stem[: -len(arm) - 1], "arm": arm, "repeat": repeat}
    w = _WORD_ARM_RE.match(stem)
    return {"cell_id": w["cell_id"], "arm": w["arm"], "repeat": repeat} if w else None


# SweepConfig's own fields: what validation derives; every other attribute is a sweep key
# (bench/config/schema.py: SweepKeys, declared there once), read through to ``keys``.
DERIVED = ("path", "out", "rdzv_endpoint", "rdzv_from", "launcher", "launcher_from", "cells")
DERIVED += ("precision", "capacity", "resolved", "user_arms")


@dataclass(frozen=True)
class SweepConfig:
    """A validated sweep: its keys (``keys``, as SweepKeys declares them, lists as tuples, integers
    of float keys as floats), and what validation derived from them."""

    keys: SweepKeys
    path: Path
    out: str  # the sweep directory: the config's, else results/<name>
    rdzv_endpoint: str | None  # as resolved: the config's, else from the environment
    rdzv_from: str | None  # where rdzv_endpoint came from: the key or the environment variable(s)
    # the command that starts a multi-node run once on every node (e.g. srun ...); () when nodes == 1
    launcher: tuple[str, ...]
    # "launcher" (the config's), "slurm" (none given: each run a Slurm job step), None when nodes == 1
    launcher_from: str | None
    cells: tuple[Cell, ...]
    precision: Precision | None
    capacity: Capacity | None
    resolved: dict[str, Any]  # every key with its default filled in; stored in sweep.json
    # its own arms (the user_arms key, as Arm entries with their keys), by name
    user_arms: Mapping[str, Arm] = field(default_factory=lambda: MappingProxyType({}))

    def __getattr__(self, name: str) -> Any:
        """A sweep key not derived here: SweepKeys' value, frozen (lists as tuples)."""
        keys = self.__dict__.get("keys")
        if keys is None or name not in _KEY_HINTS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return _frozen(getattr(keys, name), _KEY_HINTS[name])

    @property
    def runs_on_cpu(self) -> bool:
        return "cpu" in self.hardware

    @property
    def max_gpus(self) -> int:
        return max(c.gpus for c in self.cells)

    def arm(self, name: str) -> Arm:
        """The arm called ``name``: the sweep's own (user_arms) or a built-in one."""
        return arm_named(name, self.user_arms)

    def polls(self, arm: str) -> bool:
        """Whether runs of this arm are polled for VRAM."""
        return self.poll_vram and self.arm(arm).polls_vram

    @property
    def precision_targets(self) -> dict[str, dict]:
        """Per cell with a precision target: its ci_halfwidth_pct, min_pairs, max_pairs."""
        return {c.cell_id: vars(c.precision) for c in self.cells if c.precision is not None}

    def pilot_pairs(self, cell: Cell) -> int:
        """Pairs every cell runs before any decision: the fixed repeats, or Stein's pilot."""
        return cell.precision.min_pairs if cell.precision else self.repeats


_KEY_HINTS = {n: h for n, h in typing.get_type_hints(SweepKeys).items() if n not in DERIVED}


def _frozen(value: Any, hint: Any) -> Any:
    """A key's value as the run loop reads it: lists (and lists of lists) as tuples, an integer
    given for a float key as a float."""
    if isinstance(value, list):
        return tuple(_frozen(v, None) for v in value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def cell_id_for(cell: Cell, label: str | None) -> str:
    """`<profile>_<mode>_bs<batch>_s<seq_len>`, plus `_g<gpus>`, `_n<nodes>`, `_<trainer>` (other
    than the default one) and `_<label>` when set."""
    cell_id = f"{slug(cell.profile)}_{cell.mode}_bs{cell.batch_size}_s{cell.seq_len}"
    if cell.gpus > 1:
        cell_id += f"_g{cell.gpus}"
    if cell.nodes > 1:
        cell_id += f"_n{cell.nodes}"
    if cell.trainer_tag:
        cell_id += f"_{cell.trainer_tag}"
    return f"{cell_id}_{label}" if label else cell_id


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"
