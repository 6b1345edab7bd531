"""The real SpecForge CLI (PyPI ``specforge``) as a trainer: facts.py reads its cells, plug.py
builds and reads back its runs, run.py wraps each run, log.py parses its step lines, inputs.py
prepares its offline inputs from one of our training configs. Nothing heavy is imported here:
``python -m bench.trainers.specforge_cli.wrapper`` (and ``.inputs``) must not find themselves
imported by this package before they run."""

from __future__ import annotations

from bench.trainers.base import Trainer
from bench.trainers.specforge_cli.facts import SpecForgeReader


def _plug(cfg, info: dict):
    from bench.trainers.specforge_cli.plug import SpecForgeCliPlug

    return SpecForgeCliPlug(info=info)


TRAINER = Trainer(
    name=SpecForgeReader.name,
    reader=SpecForgeReader(),
    make_plug=_plug,
    doc="the SpecForge CLI in your own environment: baseline and Liger",
)
