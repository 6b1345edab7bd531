"""Training parity never loses an arm or misnames why it has no verdict: an arm whose runs all
dropped out of the statistics keeps its rows ("no verdict", the reason), and a metric that no run
logged says so instead of blaming the pairing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

import bench.config.typed as typed
from bench.config.schema import ParityKeys
from bench.record import CellDoc, RunDoc
from bench.results.records import RunRecord
from bench.results.training_parity import judge, training_parity_table

STEPS = 60


def learning(**drop) -> pd.DataFrame:
    t = np.arange(1, STEPS + 1)
    frame = pd.DataFrame(
        {"loss": 5.0 - 0.05 * t, "accuracy": 0.01 * t / STEPS, "grad_norm": 1.0 + 0 * t}, index=t
    )
    return frame.drop(columns=[k for k, v in drop.items() if v])


def record(arm: str, repeat: int = 1, metrics: pd.DataFrame | None = None) -> RunRecord:
    cell = CellDoc.of(
        run_id=f"c_{arm}_r{repeat}", cell_id="c", arm=arm, repeat=repeat, steps=STEPS, profile="tiny"
    )
    frame = (learning() if metrics is None else metrics).rename_axis("step").reset_index()
    return RunRecord(Path(cell.run_id), cell, RunDoc.of(status="ok"), frame, None)


SWEEP = {
    "config": {"arms": ["baseline", "aa", "liger", "lr_off"], "hardware": "cpu", "parity": {"window": 10}}
}


def test_an_arm_whose_runs_all_dropped_out_keeps_its_rows_with_no_verdict():
    # lr_off's runs failed or were unreadable: nothing of it reaches the statistics
    table = training_parity_table([record("baseline"), record("aa"), record("liger")], SWEEP)
    rows = table.set_index(["arm", "metric"])["verdict"]
    assert rows[("liger", "loss")] == "equivalent"  # identical curves: RMS 0 within any floor
    assert [rows[("lr_off", m)] for m in ("loss", "accuracy", "grad_norm")] == [
        "no verdict: no run of lr_off to compare"
    ] * 3


def test_a_metric_no_run_logged_says_so_rather_than_blaming_the_pairing():
    p = {**typed.defaults(ParityKeys), "window": 10}
    runs = {"baseline": {1: learning()}, "aa": {1: learning()}, "x": {1: learning(grad_norm=True)}}
    assert judge(runs, "x", "grad_norm", p, STEPS)["verdict"] == (
        "no verdict: the arm's runs logged no grad_norm at any step"
    )
    runs["baseline"][1] = learning(accuracy=True)
    assert judge(runs, "x", "accuracy", p, STEPS)["verdict"] == (
        "no verdict: the baseline's runs logged no accuracy at any step"
    )
    runs = {"baseline": {1: learning()}, "aa": {1: learning()}, "x": {2: learning()}}  # rounds 1 and 2
    assert judge(runs, "x", "loss", p, STEPS)["verdict"] == (
        "no verdict: no run of the arm paired with a baseline run of the same round"
    )


def test_an_ok_run_cut_short_is_named_on_the_console_not_only_counted_ok(tmp_path, capsys, monkeypatch):
    """ "runs: 8 ok" counts a run whose records were cut short; the console says it weighs nothing."""
    from bench.run.console import report
    from tests.helpers import committed_sweep

    monkeypatch.setenv("BENCH_NO_PLOTS", "1")
    sweep = committed_sweep("h100-specforge-ab-default", tmp_path / "s")
    victim = sorted((sweep / "runs").iterdir())[1]
    lines = (victim / "metrics.jsonl").read_text().splitlines()
    (victim / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")  # 2 of its 13 steps
    report(sweep)
    out = capsys.readouterr().out
    assert "warning: 1 ok run(s) left out of the statistics (runs.csv's note):" in out
    assert f"  {victim.name}: " in out
