"""Adding a trainer is one folder plus one registry line: the toy trainer package (tests/toy_trainer/),
registered in one line, runs a CPU sweep through the shared run loop and reports."""

from __future__ import annotations

import types

import pandas as pd
import pytest
import yaml

import bench.trainers
import tests.toy_trainer as toy
from bench.errors import SweepError
from bench.run.sweep import run_sweep
from bench.trainers.base import Trainer, trainer_gaps


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setattr(
        bench.trainers, "TRAINERS", (*bench.trainers.TRAINERS, "tests.toy_trainer")
    )  # the line


def toy_sweep(tmp_path, arms=("baseline", "aa"), **top):
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump({"name": "linreg", "features": 16}))
    doc = {
        "name": "toy",
        "hardware": "cpu",
        "trainer": "toy",
        "arms": list(arms),
        "repeats": 3,
        "steps": 6,
        "warmup_steps": 1,
        "cells": [{"config": str(tmp_path / "toy.yaml"), "batch_size": 4, "seq_len": 1}],
        **top,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_toy_trainer_registered_in_one_line_runs_a_cpu_sweep(tmp_path, toy_registered, monkeypatch):
    monkeypatch.setenv("BENCH_NO_PLOTS", "1")
    out = tmp_path / "out"
    assert run_sweep(toy_sweep(tmp_path), out=out) == 0
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 6 and (runs.status == "ok").all() and (runs.trainer == "toy").all()
    assert (runs.steps_measured == 5).all() and (runs.samples_per_s > 0).all()
    assert (runs.profile == "linreg").all()
    summary = pd.read_csv(out / "summary.csv").set_index("arm")
    assert summary.loc["aa", "n_ok"] == 3  # the A/A comparison: a Δ with its CI
    assert (
        summary.loc["aa", "delta_samples_per_s_pct_ci95_low"] <= summary.loc["aa", "delta_samples_per_s_pct"]
    )


def test_the_toy_trainer_refuses_arms_it_cannot_express(tmp_path, toy_registered):
    with pytest.raises(SweepError, match="arms: liger: the toy trainer has no kernels to swap"):
        bench.trainers.load_config(toy_sweep(tmp_path, arms=("baseline", "liger")))


def test_an_unregistered_trainer_is_refused(tmp_path):
    with pytest.raises(
        SweepError, match="trainer: expected one of embedded, specforge-cli, contract, got 'toy'"
    ):
        bench.trainers.load_config(toy_sweep(tmp_path))


def test_every_registered_trainer_and_the_toy_one_hold_what_the_suite_asks_of_them(toy_registered):
    """Each trainer's cell reader against the config layer's CellReader, its plug against
    TrainerPlug (and TakesTurns where its reader takes turns), read off the Protocols themselves:
    a member added there and missed by a trainer fails here, before any sweep trips on it."""
    cfg = types.SimpleNamespace(trainer_module="tests.fake_trainer", path="sweep.yaml")
    trainers = bench.trainers.registered()
    assert set(trainers) == {"embedded", "specforge-cli", "contract", "toy"}
    for name, t in trainers.items():
        assert trainer_gaps(name, t.reader, t.make_plug(cfg, {})) is None
    assert trainers["specforge-cli"].reader.takes_turns  # and its plug has lockstep_command (checked)


class DriftedReader:
    """The toy trainer's reader as it was before the config layer asked about turns and user arms."""

    name, module = toy.NAME, None
    read_cell, refuse_set, refuse_arms = (
        toy.ToyReader.read_cell, toy.ToyReader.refuse_set, toy.ToyReader.refuse_arms
    )  # fmt: skip


def test_a_trainer_that_drifted_from_the_protocol_is_refused_in_one_line(
    tmp_path, toy_registered, monkeypatch
):
    monkeypatch.setattr(
        toy, "TRAINER", Trainer(name=toy.NAME, reader=DriftedReader(), make_plug=toy.TRAINER.make_plug)
    )
    with pytest.raises(
        SweepError
    ) as err:  # was: AttributeError: 'ToyReader' object has no attribute 'takes_turns'
        bench.trainers.load_config(toy_sweep(tmp_path, pairing="lockstep"))
    assert str(err.value) == (
        "trainer toy: its cell reader lacks takes_turns, sweep_keys, refuse_arm_key (bench/config/cellfacts.py's "
        "CellReader); registered by tests.toy_trainer"
    )


def test_a_lockstep_sweep_of_the_toy_trainer_is_refused_for_what_it_is(tmp_path, toy_registered):
    with pytest.raises(
        SweepError, match=r"pairing: lockstep .* needs trainer: specforge-cli; cell linreg.* runs toy"
    ):
        bench.trainers.load_config(toy_sweep(tmp_path, pairing="lockstep"))
