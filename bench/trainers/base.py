"""What a trainer plug is: the part of the suite that knows one kind of trainer.

A trainer is a package ``bench/trainers/<name>/`` whose ``TRAINER`` (a :class:`Trainer`) is
registered by one line in ``bench/trainers/__init__.py``. It owns everything specific to that
trainer: how it reads a cell's facts from its training config (a CellReader, handed to the
config loader: bench/config/cellfacts.py), the keys the driver sets on it, which arms it can
express and how each becomes its command line, its input preparation, its run wrapper and log
reader. Its plug (:class:`TrainerPlug`) checks a cell before anything is written, builds the
command of one run of one arm, prepares the run's inputs (an offline cache), and reads the run's
output back into the run records every report uses (``run.json`` with a status and reason,
``metrics.jsonl`` with one row per optimizer step; docs/run-contract.md). Everything else —
pairing, the precision rule, VRAM polling, loss parity, timeouts, kill and resume, capacity,
reports — is shared and never asks which plug ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Protocol

from bench.config import Cell, CellReader, Run, SweepConfig
from bench.config.schema import SweepKeys
from bench.record import RunDoc


class TrainerPlug(Protocol):
    name: str

    def missing_packages(self, cfg: SweepConfig) -> list[str]:
        """Python packages this machine lacks for the plug's trainer (checked before anything is written)."""
        ...

    def check_cells(self, cfg: SweepConfig, cells, out_dir: Path, cache_dir_for) -> None:
        """Validate each of its cells and every arm with the trainer itself; SweepError with one
        line on bad input."""
        ...

    def compile_key(self, cfg: SweepConfig, kind: str) -> str | None:
        """The name of the compile cache its runs share (cache/compile/<key>/); None: the driver's
        own (its torch and Triton: the trainer runs in the driver's environment)."""
        ...

    def preload(self, cfg: SweepConfig) -> list[str]:
        """Modules a warm fork server imports once for all runs; [] when runs cannot be forked."""
        ...

    def train_command(self, cfg: SweepConfig, run: Run, rdir: Path, cache_dir: Path | None) -> list[str]:
        """The whole command line of one run (launcher included), writing into ``rdir``."""
        ...

    def prepare_command(self, cfg: SweepConfig, cell: Cell, cache_dir: Path) -> list[str]:
        """The command that writes a cell's offline cache into ``cache_dir``."""
        ...

    def cache_problem(self, cfg: SweepConfig, cell: Cell, out_dir: Path, cdir: Path) -> str | None:
        """Why an existing offline cache cannot be used, or None."""
        ...

    def reconcile(self, rdir: Path, run: Run, rc: int, timed_out: bool, started: str) -> RunDoc:
        """Turn what the run left in ``rdir`` into its final run records (bench/record.py); returns
        its run.json."""
        ...


class TakesTurns(Protocol):
    """What a plug whose reader ``takes_turns`` adds: its runs as the two runs of a lockstep pair."""

    def lockstep_command(self, argv: list[str], pair_dir: Path, role: int, last: int) -> list[str]:
        """``argv`` (train_command's) as one run of a lockstep pair (``pairing: lockstep``): taking
        turns on the card with the other run, one optimizer step each, through ``pair_dir``'s
        FIFOs; ``role`` 0 steps first; the turns end after step ``last``. The config refuses
        lockstep for a trainer whose reader does not take turns."""
        ...

    def open_turns(self, pair_dir: Path) -> None:
        """Make what the pair's two runs take turns through in ``pair_dir`` (before either starts)."""
        ...

    def close_turns(self, pair_dir: Path) -> None:
        """Remove what open_turns made once the pair has ended (a pair directory keeps only files)."""
        ...


def protocol_gaps(obj: object, proto: type) -> list[str]:
    """The members of ``proto`` (a Protocol: its annotated attributes and its methods) that ``obj``
    lacks, a method that is not callable counted as lacking."""
    wanted = list(getattr(proto, "__annotations__", {}))
    methods = [n for n, v in vars(proto).items() if callable(v) and not n.startswith("_")]
    gaps = [n for n in wanted if not hasattr(obj, n)]
    return gaps + [n for n in methods if not callable(getattr(obj, n, None))]


def trainer_gaps(name: str, reader: object, plug: object | None = None) -> str | None:
    """One line naming what a registered trainer's reader (CellReader) or plug (TrainerPlug, and
    TakesTurns where its reader takes turns) lacks; None when both are whole."""
    parts = []
    lacks = protocol_gaps(reader, CellReader)
    if lacks:
        parts.append(f"its cell reader lacks {', '.join(lacks)} (bench/config/cellfacts.py's CellReader)")
    unknown = sorted(set(getattr(reader, "sweep_keys", ())) - {f.name for f in fields(SweepKeys)})
    if unknown:
        parts.append(f"its cell reader's sweep_keys names {', '.join(unknown)}: no sweep key (SweepKeys)")
    if plug is not None:
        lacks = protocol_gaps(plug, TrainerPlug)
        if getattr(reader, "takes_turns", False):
            lacks += protocol_gaps(plug, TakesTurns)
        if lacks:
            parts.append(f"its plug lacks {', '.join(lacks)} (bench/trainers/base.py's TrainerPlug)")
    return f"trainer {name}: {'; '.join(parts)}" if parts else None


@dataclass(frozen=True)
class Trainer:
    """A registered trainer: its name (a sweep config's ``trainer:``), how it reads cells, and
    its plug for a sweep (``make_plug(cfg, info)``; ``info``: the machine, bench.probe.hardware)."""

    name: str
    reader: CellReader
    make_plug: Callable[[SweepConfig, dict], TrainerPlug]
    doc: str = ""
