"""Adding a trainer is one folder plus one registry line: the toy trainer package (tests/toy_trainer/),
registered in one line, runs a CPU sweep through the shared run loop and reports."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

import bench.trainers
from bench.errors import SweepError
from bench.run.sweep import run_sweep


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setattr(
        bench.trainers, "TRAINERS", (*bench.trainers.TRAINERS, "tests.toy_trainer")
    )  # the line


def toy_sweep(tmp_path, arms=("baseline", "aa")):
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
