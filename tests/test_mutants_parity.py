"""Exact, hand-computed cases for what a test-strength audit's mutants got past (or what only the
byte-for-byte golden files named): training parity (the loss-must-fall guard, the floor of both
A/A arms, the allowance, the window), an arm not in effect on the baseline's side, a run whose
warm-up is not the planned one, the energy's power interval and its medians, runs.csv's and
summary.csv's means and medians, and summary.json's parity rows and rounding.

Every expected number is worked out in the comments (docs/method.md's rules), never the code's own
output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import bench.config.typed as typed
from bench.config.schema import ParityKeys
from bench.record import CellDoc
from bench.results.deltas import delta_columns
from bench.results.energy import arm_energy, run_energy
from bench.results.identity import plan_problem
from bench.results.records import RunRecord, load_runs
from bench.results.summary_json import summary_doc
from bench.results.tables import runs_table, summary_table
from bench.results.training_parity import judge, training_parity_table, window_of
from tests.helpers import census

STEPS = 60
P = {**typed.defaults(ParityKeys), "window": 10}  # loss_atol 1e-3, accuracy_atol 5e-3, margin 2


def _frame(loss, accuracy=None, grad_norm=None, steps: int = STEPS) -> pd.DataFrame:
    t = np.arange(1, steps + 1)
    full = lambda v, d: np.broadcast_to(np.asarray(d if v is None else v, dtype=float), t.shape)  # noqa: E731
    return pd.DataFrame(
        {"loss": full(loss, 0), "accuracy": full(accuracy, 0.5), "grad_norm": full(grad_norm, 1.0)}, index=t
    )


def _off(base: pd.DataFrame, metric: str, by: float) -> pd.DataFrame:
    """``base`` with ``metric`` moved by ±``by`` at alternate steps: |Δ| is ``by`` at every step, so
    its RMS over any window is ``by``."""
    out = base.copy()
    out[metric] = out[metric] + by * np.where(out.index % 2, 1.0, -1.0)
    return out


# -- training parity: the loss must fall ------------------------------------------------------


def _records(losses: dict[str, np.ndarray]) -> list[RunRecord]:
    cell = CellDoc.of(cell_id="c", profile="p", mode="offline", steps=STEPS, trainer="embedded")
    out = []
    for arm, loss in losses.items():
        m = _frame(loss).rename_axis("step").reset_index()
        out.append(RunRecord(Path(f"c_{arm}_r1"), cell, None, m, None))
    return out


def test_a_flat_loss_gives_no_verdict_on_every_metric_and_a_falling_one_a_verdict():
    """A baseline whose loss stays at 5.0 fell 0% (under the 30% default): no verdict on loss,
    accuracy and gradient norm alike, though the arm equals the baseline. Falling 0.05 a step, from
    4.95 at step 1 to a mean of 5 - 0.05 · 55.5 = 2.225 over steps 51-60, it fell 55%: equivalent."""
    sweep = {"config": {"hardware": "cpu", "parity": {"window": 10}}}
    flat = np.full(STEPS, 5.0)
    table = training_parity_table(_records({"baseline": flat, "aa": flat, "adamw_plain": flat}), sweep)
    assert list(table.metric) == ["loss", "accuracy", "grad_norm"]
    want = "no verdict: the baseline's loss fell 0%, under the 30% a learning run shows"
    assert list(table.verdict) == [want] * 3
    falling = 5.0 - 0.05 * np.arange(1, STEPS + 1)
    table = training_parity_table(
        _records({"baseline": falling, "aa": falling, "adamw_plain": falling}), sweep
    )
    assert list(table.verdict) == ["equivalent"] * 3
    assert table.loss_drop_pct.iloc[0] == pytest.approx(100 * (4.95 - 2.225) / 4.95)


# -- training parity: the floor, the allowance, the window -------------------------------------


def test_with_both_floor_arms_the_floor_is_the_larger_of_the_two():
    """aa is 0.01 off the baseline at every step, aa_eps 0.001: the floor is 0.01 (RMS 0.01), and with
    an aa_eps run no last-resort term, so a window may reach 2 · 0.01 = 0.02. An arm 0.015 off is
    within; held to aa_eps alone (0.002) it would not be."""
    base = _frame(5.0 - 0.05 * np.arange(1, STEPS + 1))
    runs = {
        "baseline": {1: base},
        "aa": {1: _off(base, "loss", 0.01)},
        "aa_eps": {1: _off(base, "loss", 0.001)},
        "x": {1: _off(base, "loss", 0.015)},
    }
    row = judge(runs, "x", "loss", P, STEPS)
    assert row["verdict"] == "equivalent" and row["tolerance"] == 0.0
    assert row["max_abs_delta_floor"] == pytest.approx(0.01)
    assert row["worst_rms_floor"] == pytest.approx(0.01) and row["worst_allowed"] == pytest.approx(0.02)
    # aa_eps the larger: the floor is aa_eps's
    runs["aa"], runs["aa_eps"] = runs["aa_eps"], runs["aa"]
    assert judge(runs, "x", "loss", P, STEPS)["worst_allowed"] == pytest.approx(0.02)


def test_the_allowance_adds_the_last_resort_term_once():
    """No aa_eps run: a window may reach margin · RMS(floor) + loss_atol = 2 · 0.004 + 0.001 = 0.009.
    An arm 0.0095 off fails (it would pass 0.010, the term added twice), one 0.0085 off passes. For
    the gradient norm the term is grad_norm_rtol × the baseline's mean: 2^-8 · 2.0 = 0.0078125, so
    2 · 0.001 + 0.0078125 = 0.0098125."""
    base = _frame(5.0 - 0.05 * np.arange(1, STEPS + 1), grad_norm=2.0)
    aa = _off(_off(base, "loss", 0.004), "grad_norm", 0.001)
    runs = {"baseline": {1: base}, "aa": {1: aa}, "bad": {1: _off(base, "loss", 0.0095)}}
    runs["good"] = {1: _off(base, "loss", 0.0085)}
    bad = judge(runs, "bad", "loss", P, STEPS)
    assert bad["worst_allowed"] == pytest.approx(0.009) and bad["tolerance"] == pytest.approx(1e-3)
    assert bad["verdict"] == (
        "not equivalent: steps 1-10, RMS |Δ| 0.0095 > 0.009 allowed (A/A floor RMS 0.004)"
    )
    assert judge(runs, "good", "loss", P, STEPS)["verdict"] == "equivalent"
    p = {**P, "grad_norm_rtol": 2.0**-8}
    assert judge(runs, "good", "grad_norm", p, STEPS)["worst_allowed"] == pytest.approx(0.0098125)


def test_the_window_is_a_tenth_of_the_steps_and_at_least_10():
    assert window_of(200, None) == 20 and window_of(50, None) == 10 and window_of(100, None) == 10
    assert window_of(200, 7) == 7
    base = _frame(5.0 - 0.02 * np.arange(1, 201), steps=200)
    runs = {"baseline": {1: base}, "aa": {1: base.copy()}, "x": {1: base.copy()}}
    row = judge(runs, "x", "loss", P | {"window": None}, 200)
    assert (row["window_steps"], row["windows"], row["worst_window"]) == (20, 10, "1-20")


# -- activation: a baseline run not in effect stops the cell's Δ too ----------------------------


def test_a_baseline_run_not_in_effect_gets_the_cell_no_delta():
    """docs/method.md: "a run of the arm (or of its reference) trained a model without the Liger
    modules its arm asks for, or with ones it does not: no Δ"."""
    base = pd.DataFrame(
        {
            "arm_in_effect": ["yes", "no: LigerRMSNorm in the model, not asked for", "yes"],
            "samples_per_s": [1.0, 1.0, 1.0],
            "repeat": [1, 2, 3],
        }
    )
    arm = pd.DataFrame({"arm_in_effect": ["yes"] * 3, "samples_per_s": [1.2] * 3, "repeat": [1, 2, 3]})
    row = delta_columns(base, arm, None, 1.0, arm="liger")
    want = "arm not in effect (1 of 3 baseline runs: LigerRMSNorm in the model, not asked for)"
    assert row == {"verdict_speed": want, "verdict_memory": want}


# -- identity: the warm-up is part of the plan --------------------------------------------------


def test_a_run_with_another_warmup_is_not_the_planned_workload(tmp_path):
    plan = {"cells": {"c": {"steps": 13, "warmup_steps": 1}}}
    cell = CellDoc.of(cell_id="c", steps=13, warmup_steps=3)
    assert plan_problem(cell, plan) == (
        "cell.json is not the workload sweep.json plans for its cell (warmup_steps 3, planned 1)"
    )
    assert plan_problem(cell.updated(warmup_steps=1), plan) is None
    # read back from a sweep directory: an error, out of the statistics
    run = _write_run(tmp_path, "baseline", 1, [1.0] * 13, warmup=3)
    (tmp_path / "sweep.json").write_text(json.dumps({"cells": {CELL: {"steps": 13, "warmup_steps": 1}}}))
    row = runs_table(load_runs(tmp_path)).iloc[0]
    assert row.run_id == run.name and row.status == "error"
    assert row.reason == (
        "cell.json is not the workload sweep.json plans for its cell (warmup_steps 3, planned 1): "
        "a run of another workload, not counted"
    )


# -- energy: the coarsest card's interval, medians of gaps, the arm's mean -----------------------


def _two_cards(peaks=(10.0, 10.0)) -> dict:
    cards = [
        {"index": i, "name": "GPU", "peak_delta_gib": p, "peak_used_gib": p + 0.5}
        for i, p in enumerate(peaks)
    ]
    return {"status": "ok", "devices": cards}


def test_the_power_interval_is_the_coarsest_cards(tmp_path):
    """Card 0's counter read every 0.1 s at 100 W, card 1's every 0.25 s at 200 W, window 0-2 s:
    300 W · 2 s = 600 J, 60 J a sample over 10 samples; the interval stated is card 1's 0.25 s."""
    rows = [{"t": round(k * 0.1, 3), "energy_j": [100.0 * k * 0.1, None]} for k in range(-5, 26)]
    rows += [{"t": k * 0.25, "energy_j": [None, 200.0 * k * 0.25]} for k in range(-2, 11)]
    (tmp_path / "vram.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run_energy(tmp_path, _two_cards(), (0.0, 2.0), 10, 2)
    assert out["energy_source"] == "energy counter" and out["energy_cards"] == 2
    assert out["energy_j"] == pytest.approx(600.0) and out["energy_j_per_sample"] == pytest.approx(60.0)
    assert out["power_interval_s"] == pytest.approx(0.25, abs=1e-9)


def test_the_power_interval_is_the_median_gap_not_the_mean(tmp_path):
    """Readings every 0.25 s over the window 0-2 s and one more at 1.05 s: the gaps from 0 to 2 are
    seven of 0.25 and 0.05, 0.2: median 0.25 (the mean would be 2 / 9 = 0.222)."""
    times = sorted([k * 0.25 for k in range(-2, 11)] + [1.05])
    rows = [{"t": t, "energy_j": [300.0 * t]} for t in times]
    (tmp_path / "vram.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run_energy(tmp_path, _two_cards((10.0,)), (0.0, 2.0), 10, 1)
    assert out["energy_j"] == pytest.approx(600.0) and out["power_interval_s"] == pytest.approx(0.25)


def test_a_lockstep_runs_interval_is_the_median_over_its_own_turns(tmp_path):
    """Three own turns of 1 s (0-1, 2-3, 4-5 s) at 300 W by the counter: 900 J. The readings every
    0.1 s in the first two turns and every 0.25 s in the third give per-turn intervals 0.1, 0.1, 0.25:
    the run's is their median, 0.1 (the mean would be 0.15)."""
    times = [round(k * 0.1, 3) for k in range(0, 31)] + [4 + k * 0.25 for k in range(0, 5)]
    rows = [{"t": t, "energy_j": [300.0 * t]} for t in times]
    (tmp_path / "vram.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    turns = [(0.0, 1.0), (2.0, 3.0), (4.0, 5.0)]
    out = run_energy(tmp_path, _two_cards((10.0,)), None, 9, 1, turns)
    assert out["energy_source"] == "energy counter over own turns"
    assert out["energy_j"] == pytest.approx(900.0) and out["power_interval_s"] == pytest.approx(0.1)


def test_an_arms_energy_per_sample_is_the_mean_of_its_runs():
    """Runs of 1, 2 and 6 J/sample: the mean is 3 (the median would be 2); a run without energy is
    left out and counted."""
    ok = pd.DataFrame(
        {
            "energy_j_per_sample": [1.0, 2.0, 6.0, None],
            "energy_source": ["energy counter"] * 3 + ["n/a (no vram.json)"],
        }
    )
    out = arm_energy(ok)
    assert out["energy_j_per_sample_mean"] == pytest.approx(3.0)
    assert out["energy_source"] == "energy counter; 1 of 4 runs n/a (no vram.json)"


# -- runs.csv and summary.csv: means and medians ------------------------------------------------

CELL = "p_offline_bs2_s64"
T0 = 1000.0  # wall clock at the start of step 1


def _write_run(sweep: Path, arm: str, repeat: int, times: list[float], warmup: int = 1, state=None) -> Path:
    """A run of ``times`` (s per step, 2 samples each) from T0; ``state``: vram.jsonl's state rows
    of its one card, (t, {field: value}) each."""
    run_id = f"{CELL}_{arm}_r{repeat}"
    d = sweep / "runs" / run_id
    d.mkdir(parents=True)
    cell = {"run_id": run_id, "cell_id": CELL, "profile": "p", "mode": "offline", "batch_size": 2, "seq_len": 64,
            "accumulation_steps": 1, "num_anchors": 8, "gpus": 1, "nodes": 1, "arm": arm, "repeat": repeat,
            "order_index": 2 * repeat + (arm != "baseline"), "steps": len(times), "warmup_steps": warmup}  # fmt: skip
    (d / "cell.json").write_text(json.dumps(cell))
    (d / "run.json").write_text(json.dumps({"status": "ok", "arm": arm, "draft_module_types": census(arm)}))
    ends = T0 + np.cumsum(times)
    metrics = [
        {
            "step": i + 1,
            "loss": 7.0 - 0.1 * i,
            "accuracy": 0.1,
            "step_time_s": t,
            "samples": 2,
            "time": float(e),
        }
        for i, (t, e) in enumerate(zip(times, ends, strict=True))
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    card = {"index": 0, "name": "GPU", "total_gib": 80.0, "baseline_used_gib": 0.5, "peak_used_gib": 10.5}
    (d / "vram.json").write_text(json.dumps({"status": "ok", "devices": [{**card, "peak_delta_gib": 10.0}]}))
    rows = [{"t": t, "state": [values]} for t, values in state or []]
    (d / "vram.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_runs_csv_has_the_mean_and_median_step_and_the_clocks_median_over_the_measured_steps(tmp_path):
    """Step 1 (2 s) dropped, then 1, 1, 1, 1, 4 s: mean 8 / 5 = 1.6 s, median 1 s, 10 samples in 8 s.
    The measured steps run from T0 + 2 to T0 + 10; the state rows inside read SM clocks of 1000,
    1000, 1900 MHz (median 1000, the mean would be 1300) and 100, 200, 600 W (median 200, mean 300);
    the row at T0 + 1, in the warm-up, is not one of them."""
    state = [
        (T0 + 1, {"sm_clock_mhz": 5000.0, "power_w": 5000.0}),
        (T0 + 3, {"sm_clock_mhz": 1000.0, "power_w": 100.0}),
        (T0 + 5, {"sm_clock_mhz": 1900.0, "power_w": 600.0}),
        (T0 + 7, {"sm_clock_mhz": 1000.0, "power_w": 200.0}),
    ]
    _write_run(tmp_path, "baseline", 1, [2.0, 1.0, 1.0, 1.0, 1.0, 4.0], state=state)
    row = runs_table(load_runs(tmp_path)).iloc[0]
    assert (row.s_per_step_mean, row.s_per_step_median) == (pytest.approx(1.6), pytest.approx(1.0))
    assert row.samples_per_s == pytest.approx(10 / 8)
    assert row.state_window == "measured steps"
    assert (row.sm_clock_mhz_min, row.sm_clock_mhz_median, row.sm_clock_mhz_max) == (1000.0, 1000.0, 1900.0)
    assert (row.power_w_min, row.power_w_median, row.power_w_max) == (100.0, 200.0, 600.0)


def test_summary_csv_means_the_runs_means_and_medians_their_medians(tmp_path):
    """Baseline runs' steady steps: [1,1,1,1,4] in rounds 1 and 3 (mean 1.6, median 1) and
    [1,2.5,2.5,2.5,2.5] in round 2 (mean 2.2, median 2.5): the runs' means average 5.4 / 3 = 1.8, their
    medians' median is 1.0 (their mean would be 1.5). Liger's: [1,1,1,1,1.5] (mean 1.1) in each round.
    Saved per step, per pair baseline's mean minus liger's: 500, 1100, 500 ms, mean 700."""
    steady = {1: [1.0, 1.0, 1.0, 1.0, 4.0], 2: [1.0, 2.5, 2.5, 2.5, 2.5], 3: [1.0, 1.0, 1.0, 1.0, 4.0]}
    for r in (1, 2, 3):
        _write_run(tmp_path, "baseline", r, [2.0, *steady[r]])
        _write_run(tmp_path, "liger", r, [2.0, 1.0, 1.0, 1.0, 1.0, 1.5])
    summary = summary_table(runs_table(load_runs(tmp_path))).set_index("arm")
    assert summary.loc["baseline", "s_per_step_mean"] == pytest.approx(1.8)
    assert summary.loc["baseline", "s_per_step_median"] == pytest.approx(1.0)
    assert summary.loc["liger", "s_per_step_mean"] == pytest.approx(1.1)
    assert summary.loc["liger", "saved_ms_per_step"] == pytest.approx(700.0)


# -- summary.json: each arm's own parity rows, six significant digits ----------------------------


def test_summary_json_gives_each_arm_its_own_parity_rows_rounded_as_the_csvs():
    cell = {"cell_id": "c", "trainer": "embedded", "profile": "p", "mode": "offline", "batch_size": 2}
    summary = pd.DataFrame(
        [
            {**cell, "arm": "baseline", "n_runs": 3, "samples_per_s_mean": 12.3456789},
            {
                **cell,
                "arm": "liger",
                "n_runs": 3,
                "samples_per_s_mean": 14.0,
                "delta_samples_per_s_pct": 13.40123456,
            },
            {**cell, "arm": "rmsnorm", "n_runs": 3, "samples_per_s_mean": 13.0},
        ]
    )
    parity = pd.DataFrame(
        [
            {"cell_id": "c", "arm": arm, "metric": metric, "rounds": 1, "windows": 10, "windows_within": 10,
             "verdict": "equivalent"}
            for arm in ("liger", "rmsnorm") for metric in ("loss", "accuracy")
        ]
    )  # fmt: skip
    doc = summary_doc({"name": "s"}, Path("s"), {"summary": summary, "training_parity": parity})
    arms = {a["arm"]: a for a in doc["cells"][0]["arms"]}
    assert arms["baseline"]["training_parity"] == []
    for arm in ("liger", "rmsnorm"):
        assert [p["metric"] for p in arms[arm]["training_parity"]] == ["loss", "accuracy"]
    assert arms["baseline"]["samples_per_s_mean"] == 12.3457  # 6 significant digits, as the CSVs
    assert arms["liger"]["delta_samples_per_s_pct"] == 13.4012
    assert doc["has_training_parity"] is True
