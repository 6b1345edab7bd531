"""The user's own offline data, checked before anything starts: a run trains on steps × batch ×
accumulation × GPUs samples, all inside one epoch (an epoch boundary inside the measured steps
would time a DataLoader restart; with ``num_epochs: 1`` SpecForge would simply stop short). The
samples are SpecForge's offline feature files under ``data.hidden_states_path`` (``.ckpt`` and
``.ckpt.gz``, walked recursively, as SpecForge 0.2.0 lists them)."""

from __future__ import annotations

import os
from pathlib import Path

import bench.config.yamlio as yamlio
from bench.config import Cell, SweepConfig, pick
from bench.errors import SweepError

SUFFIXES = (".ckpt", ".ckpt.gz")


def count_samples(path: Path) -> int:
    return sum(1 for _root, _dirs, files in os.walk(path) for f in files if f.endswith(SUFFIXES))


def check_data(cfg: SweepConfig, cell: Cell, needed: int) -> None:
    """SweepError (one line, both numbers) when the user's data holds fewer samples than a run needs."""
    where = f"{cfg.path}: cells[{cell.entry}] ({cell.cell_id})"
    train = yamlio.load(Path(cell.train_config).read_text())
    raw = pick(cell.overrides, train, "data.hidden_states_path")
    path = Path(str(raw)).expanduser()
    if not path.is_dir():
        raise SweepError(
            f"{where}: data.hidden_states_path: {str(path)!r} is not a directory of feature files"
        )
    held = count_samples(path)
    if held < needed:
        shape = (
            f"steps {cell.steps} × batch {cell.batch_size} × accumulation {cell.accumulation_steps or 1} "
            f"× GPUs {cell.gpus}"
        )
        raise SweepError(
            f"{where}: your data holds {held} samples ({path}) but a run needs {needed} ({shape}) in one "
            "epoch, so that no epoch boundary falls inside the measured steps; give fewer steps, a smaller "
            "batch, or more data"
        )
