"""The aggregation (bench.results.records, tables, parity) on hand-made sweep directories with known answers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from bench.results.columns import (
    CONTRAST_COLUMNS,
    LOSS_PARITY_COLUMNS,
    RUNS_COLUMNS,
    SUMMARY_COLUMNS,
    VRAM_PER_CARD_COLUMNS,
)
from bench.results.parity import loss_parity_gaps, loss_parity_table
from bench.results.records import load_runs
from bench.results.tables import contrast_table, runs_table, summary_table, vram_per_card_table
from tests.helpers import census

CELL = "p_offline_bs2_s64"


def write_run(
    sweep: Path,
    arm: str = "baseline",
    repeat: int = 0,
    times: list[float] | None = None,
    *,
    cell_id: str = CELL,
    samples: list[float] | None = None,
    losses: list[float] | None = None,
    warmup: int = 0,
    status: str | None = "ok",
    reason: str | None = None,
    vram: dict | None = None,
    tolerance: float = 0.01,
    torn: bool = False,
    trainer: str | None = None,
) -> Path:
    """One run directory; status None leaves run.json out, times None leaves metrics.jsonl out,
    trainer None leaves cell.json's "trainer" out (as the driver wrote it before a second plug)."""
    run_id = f"{cell_id}_{arm}_r{repeat}"
    d = sweep / "runs" / run_id
    d.mkdir(parents=True)
    cell = {
        "run_id": run_id, "cell_id": cell_id, "profile": "p", "mode": "offline",
        "batch_size": int(samples[0]) if samples else 2,  # samples per step: batch x 1 accumulation x 1 GPU
        "seq_len": 64, "accumulation_steps": 1, "num_anchors": 8, "gpus": 1, "nodes": 1, "arm": arm,
        "repeat": repeat, "order_index": 2 * repeat + (arm != "baseline"), "steps": len(times or []),
        "warmup_steps": warmup, "loss_tolerance": tolerance,
    }  # fmt: skip
    if trainer is not None:
        cell["trainer"] = trainer
    (d / "cell.json").write_text(json.dumps(cell))
    if status is not None:
        prov = {"hostname": "h", "gpu_names": [], "gpu_count": 0, "torch": "2.13.0", "git_commit": "abc"}
        run = {"status": status, "reason": reason, "arm": arm, "start_time": "t0", "end_time": "t1"}
        run["draft_module_types"] = census(arm)  # the arm proven in effect, as a trainer records it
        (d / "run.json").write_text(json.dumps({**run, "provenance": prov}))
    if times is not None:
        n = len(times)
        samples = samples or [2.0] * n
        losses = losses or [10.0 - i * 0.1 for i in range(n)]
        lines = [
            json.dumps(
                {
                    "step": i + 1, "loss": losses[i], "accuracy": 0.01 * i, "step_time_s": t,
                    "samples": samples[i], "tokens": samples[i] * 64, "samples_per_s": samples[i] / t,
                    "torch_peak_allocated_gib": 1.0 + i, "torch_peak_reserved_gib": 2.0 + i, "mfu": None,
                }
            )
            for i, t in enumerate(times)
        ]  # fmt: skip
        text = "\n".join(lines) + "\n" + ('{"step": 99, "loss": 1.' if torn else "")
        (d / "metrics.jsonl").write_text(text)
    if vram is not None:
        (d / "vram.json").write_text(json.dumps(vram))
    return d


def one_run(tmp_path: Path, **kw) -> pd.Series:
    write_run(tmp_path, **kw)
    return runs_table(load_runs(tmp_path)).iloc[0]


def test_warmup_is_dropped_and_step_time_stats(tmp_path):
    steady = [float(t) for t in range(1, 11)]
    row = one_run(tmp_path, times=[100.0] * 5 + steady, warmup=5)
    assert list(runs_table(load_runs(tmp_path)).columns) == RUNS_COLUMNS
    assert (row.steps_total, row.warmup_steps, row.steps_measured) == (15, 5, 10)
    assert row.s_per_step_mean == pytest.approx(5.5)
    assert row.s_per_step_median == pytest.approx(5.5)
    assert row.s_per_step_std == pytest.approx(np.std(steady, ddof=1))
    assert row.s_per_step_p10 == pytest.approx(np.percentile(steady, 10))
    assert row.s_per_step_p90 == pytest.approx(np.percentile(steady, 90))
    assert row.samples_per_s == pytest.approx(20 / 55)
    # ok and counted; its last step (10 s against a median of 5.5 s) is flagged as an outlier
    assert row.status == "ok" and row.note.startswith(
        "unstable: step 15 took 10 s, 1.8x the run's median 5.5 s"
    )


def test_throughput_is_total_work_over_total_time(tmp_path):
    # 10 samples in 1 s, then 10 samples in 9 s: 20/10 = 2.0/s, while the mean of ratios is 5.56/s.
    row = one_run(tmp_path, times=[1.0, 9.0], samples=[10.0, 10.0])
    assert row.samples_per_s == pytest.approx(2.0)
    assert row.tokens_per_s == pytest.approx(2.0 * 64)
    assert np.mean([10 / 1, 10 / 9]) == pytest.approx(5.5556, abs=1e-3)


def test_peaks_and_last_step_values(tmp_path):
    row = one_run(tmp_path, times=[1.0] * 4, losses=[4.0, 3.0, 2.5, 2.25])
    assert row.torch_peak_allocated_gib == 4.0 and row.torch_peak_reserved_gib == 5.0
    assert row.loss_last == 2.25 and row.accuracy_last == pytest.approx(0.03)
    assert math.isnan(row.mfu)


def test_vram_summary_and_per_card_rows(tmp_path):
    vram = {
        "backend": "nvml", "status": "ok", "reason": None, "interval_s": 0.1, "n_samples": 10, "errors": 0,
        "devices": [
            {"index": 0, "name": "H200", "total_gib": 140, "baseline_used_gib": 1.0, "peak_used_gib": 30.0},
            {"index": 1, "name": "H200", "total_gib": 140, "baseline_used_gib": 0.5, "peak_used_gib": 0.5,
             "peak_delta_gib": 0.0},
            {"index": 2, "name": "H200", "total_gib": 140, "baseline_used_gib": 2.0, "peak_used_gib": 20.0},
        ],
    }  # fmt: skip
    row = one_run(tmp_path, times=[1.0] * 3, vram=vram)
    assert row.peak_vram_gib == 30.0
    assert row.peak_vram_sum_gib == pytest.approx(50.5)
    assert row.peak_vram_delta_gib == pytest.approx(29.0)
    assert row.vram_status == "ok"
    cards = vram_per_card_table(load_runs(tmp_path))
    assert list(cards.columns) == VRAM_PER_CARD_COLUMNS
    assert cards["card_index"].tolist() == [0, 1, 2]  # the idle card is kept
    assert cards["peak_delta_gib"].tolist() == pytest.approx([29.0, 0.0, 18.0])


def test_no_vram_file_is_missing_not_an_error(tmp_path):
    row = one_run(tmp_path, times=[1.0] * 3)
    assert row.vram_status == "missing" and math.isnan(row.peak_vram_gib)
    assert vram_per_card_table(load_runs(tmp_path)).empty


def test_too_few_steady_steps_are_flagged_not_measured(tmp_path):
    row = one_run(tmp_path, times=[5.0] * 5 + [1.0], warmup=5)
    assert row.status == "ok" and row.steps_measured == 1
    assert "only 1 steady-state step" in row.note
    assert math.isnan(row.samples_per_s) and math.isnan(row.s_per_step_mean)
    assert row.loss_last == pytest.approx(9.5)


def test_torn_last_metrics_line_is_tolerated(tmp_path):
    row = one_run(tmp_path, times=[1.0, 2.0, 3.0], torn=True)
    assert row.steps_total == 3 and row.samples_per_s == pytest.approx(1.0)


def test_failed_skipped_timeout_and_missing_runs_keep_a_row(tmp_path):
    write_run(tmp_path, "baseline", 0, [1.0] * 4)
    write_run(tmp_path, "baseline", 1, [0.1] * 2, status="oom", reason="CUDA out of memory")
    write_run(tmp_path, "liger", 0, None, status="skipped", reason="liger arm skipped: no GPU")
    write_run(tmp_path, "liger", 1, [1.0] * 2, status="timeout", reason="killed after 600 s")
    write_run(tmp_path, "liger", 2, None, status=None)
    runs = runs_table(load_runs(tmp_path)).set_index("run_id")
    assert len(runs) == 5
    assert runs.loc[f"{CELL}_baseline_r1", ["status", "reason"]].tolist() == ["oom", "CUDA out of memory"]
    assert runs.loc[f"{CELL}_liger_r0", "reason"] == "liger arm skipped: no GPU"
    assert runs.loc[f"{CELL}_liger_r1", "status"] == "timeout"
    assert runs.loc[f"{CELL}_liger_r2", "status"] == "missing"
    assert "run.json missing" in runs.loc[f"{CELL}_liger_r2", "reason"]
    failed = runs[runs["status"] != "ok"]
    assert failed[["samples_per_s", "s_per_step_mean", "loss_last"]].isna().all().all()
    assert runs.loc[f"{CELL}_baseline_r1", "steps_total"] == 2  # how far it got is kept

    summary = summary_table(runs.reset_index()).set_index("arm")
    assert summary.loc["baseline", ["n_runs", "n_ok"]].tolist() == [2, 1]
    assert summary.loc["baseline", "samples_per_s_mean"] == pytest.approx(2.0)  # the oom run's 20/s is out
    assert summary.loc["liger", ["n_runs", "n_ok"]].tolist() == [3, 0]
    assert summary.loc["liger", "verdict_speed"] == "n/a (no ok runs)"


def test_machine_state_is_taken_over_the_measured_steps(tmp_path):
    """A run whose start (cards idle: 345 MHz, 80 W) is long beside its measured steps (1980 MHz,
    650 W): the medians must describe the steps, so runs.csv takes the poller's timed state rows
    between the start of the first measured step and the end of the last (metrics' "time")."""
    idle = {"sm_clock_mhz": 345, "mem_clock_mhz": 3201, "temperature_c": 38, "power_w": 80.0}
    busy = {"sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "temperature_c": 55, "power_w": 650.0}
    devices = [
        {"index": i, "name": "H200", "total_gib": 140.0, "baseline_used_gib": 0.5, "peak_used_gib": p,
         "peak_delta_gib": p - 0.5, "state": {f: {"min": 1.0, "median": 2.0, "max": 3.0} for f in idle}}
        for i, p in enumerate((0.6, 30.0))  # card 1 is the run's
    ]  # fmt: skip
    d = write_run(
        tmp_path, "baseline", 0, [5.0, 1.0, 1.0, 1.0], warmup=1, vram={"status": "ok", "devices": devices}
    )
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    ends = [1000.0 + 20.0 + 5.0 + i for i in range(4)]  # 20 s of start, step 1 5 s, then 1 s steps
    (d / "metrics.jsonl").write_text("".join(json.dumps({**r, "time": t}) + "\n" for r, t in zip(rows, ends)))
    samples = [{"t": 1000.0 + k, "state": [idle, idle]} for k in range(25)]  # start and step 1
    samples += [{"t": 1025.5 + k, "state": [idle, busy]} for k in range(3)]  # the measured steps
    samples += [{"t": 1000.0 + k / 10, "used_gib": [0.5, 1.0]} for k in range(5)]  # VRAM rows are ignored
    (d / "vram.jsonl").write_text("".join(json.dumps(x) + "\n" for x in samples))

    row = runs_table(load_runs(tmp_path)).iloc[0]
    assert row.state_window == "measured steps"
    assert (row.power_w_min, row.power_w_median, row.sm_clock_mhz_median) == (650.0, 650.0, 1980.0)

    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # a trainer without times
    row = runs_table(load_runs(tmp_path)).iloc[0]
    assert row.state_window == "whole run" and row.power_w_median == 2.0  # vram.json's summary stands


# --- summary statistics, built from runs tables directly ---------------------------------------


def runs_df(base: list[float], liger: list[float], base_vram=None, liger_vram=None, liger_repeats=None):
    rows = []
    for arm, values, vram, repeats in (
        ("baseline", base, base_vram, None),
        ("liger", liger, liger_vram, liger_repeats),
    ):
        for i, v in enumerate(values):
            rep = repeats[i] if repeats else i
            rows.append(
                {
                    "run_id": f"{CELL}_{arm}_r{rep}", "cell_id": CELL, "profile": "p", "mode": "offline",
                    "batch_size": 2, "seq_len": 64, "gpus": 1, "arm": arm, "repeat": rep, "status": "ok",
                    "samples_per_s": v, "s_per_step_mean": 2 / v, "s_per_step_median": 2 / v,
                    "peak_vram_gib": vram[i] if vram else np.nan, "torch_peak_allocated_gib": 1.0,
                    "hostname": "h", "git_commit": "abc", "arm_in_effect": "yes",
                }
            )  # fmt: skip
    return pd.DataFrame(rows)


def deltas(summary: pd.DataFrame) -> pd.Series:
    return summary.set_index("arm").loc["liger"]


def test_summary_columns_and_repeat_ci():
    s = summary_table(runs_df([10.0, 11.0, 12.0], [10.0, 11.0, 12.0]))
    assert list(s.columns) == SUMMARY_COLUMNS
    assert s["arm"].tolist() == ["baseline", "liger"]
    base = s.iloc[0]
    lo, hi = stats.t.interval(0.95, 2, loc=11.0, scale=1.0 / math.sqrt(3))
    assert (base.samples_per_s_mean, base.samples_per_s_std) == pytest.approx((11.0, 1.0))
    assert (base.samples_per_s_ci95_low, base.samples_per_s_ci95_high) == pytest.approx((lo, hi))
    assert pd.isna(base.delta_samples_per_s_pct) and pd.isna(base.verdict_speed)
    assert base.hostname == "h" and base.git_commit == "abc"


def test_paired_ci_matches_scipy():
    base, liger = [10.0, 11.0, 12.0], [11.0, 12.2, 13.1]
    row = deltas(summary_table(runs_df(base, liger)))
    d = np.log(np.array(liger) / np.array(base))  # per-pair log-ratios
    ci = stats.ttest_1samp(d, 0).confidence_interval(0.95)
    assert row.ci_method == "paired t on log-ratios"
    # the ratio of geometric means, and the t-interval back-transformed to percent
    gm = np.exp(np.mean(np.log(liger))) / np.exp(np.mean(np.log(base)))
    assert row.delta_samples_per_s_pct == pytest.approx(100 * (gm - 1))
    expected = (100 * np.expm1(ci.low), 100 * np.expm1(ci.high))
    assert (row.delta_samples_per_s_pct_ci95_low, row.delta_samples_per_s_pct_ci95_high) == pytest.approx(
        expected
    )
    assert row.n_pairs == 3 and row.verdict_speed == "faster"
    assert row.delta_samples_per_s_pct_per_pair == " ".join(f"{100 * np.expm1(x):+.2f}" for x in d)


def test_pairs_by_repeat_and_welch_fallback_when_no_repeat_pairs():
    base, liger = [10.0, 11.0, 12.0], [13.0, 14.5]
    paired = deltas(summary_table(runs_df(base, liger, liger_repeats=[0, 2])))  # pairs r0 and r2
    assert paired.n_pairs == 2 and paired.ci_method == "paired t on log-ratios"
    assert paired.delta_samples_per_s_pct == pytest.approx(100 * (np.sqrt(13.0 / 10.0 * 14.5 / 12.0) - 1))
    row = deltas(summary_table(runs_df(base, liger, liger_repeats=[5, 6])))  # no common pair
    ci = stats.ttest_ind(np.log(liger), np.log(base), equal_var=False).confidence_interval(0.95)
    assert row.ci_method == "welch t on log throughput"
    diff = np.mean(np.log(liger)) - np.mean(np.log(base))
    assert row.delta_samples_per_s_pct == pytest.approx(100 * np.expm1(diff))
    expected = (100 * np.expm1(ci.low), 100 * np.expm1(ci.high))
    assert (row.delta_samples_per_s_pct_ci95_low, row.delta_samples_per_s_pct_ci95_high) == pytest.approx(
        expected
    )


def test_verdicts():
    same = deltas(summary_table(runs_df([10.0, 11.0, 12.0], [10.0, 11.0, 12.0], [30, 31, 30], [30, 31, 30])))
    assert same.delta_samples_per_s_pct == 0.0
    assert same.verdict_speed == "within ±1%"  # never "no significant difference"
    assert same.verdict_memory == "within ±0.30 GiB"  # 1% of the baseline's 30.3 GiB

    fast = deltas(
        summary_table(runs_df([10.0, 10.1, 9.9], [12.0, 12.2, 11.9], [35.4, 35.3, 35.4], [30.2, 30.2, 30.1]))
    )
    assert fast.verdict_speed == "faster" and fast.verdict_memory == "leaner"
    assert fast.delta_peak_vram_gib == pytest.approx(-5.2, abs=1e-9)
    assert fast.delta_peak_vram_pct == pytest.approx(100 * -5.2 / np.mean([35.4, 35.3, 35.4]))

    slow = deltas(summary_table(runs_df([10.0, 10.1, 9.9], [8.0, 8.2, 7.9])))
    assert slow.verdict_speed == "slower"
    assert slow.verdict_memory == "n/a (no VRAM data)"

    single = deltas(summary_table(runs_df([10.0], [12.0])))
    assert single.delta_samples_per_s_pct == pytest.approx(20.0)
    assert single.verdict_speed == "too few pairs (1): +20.0%"

    # Two pairs agreeing closely: a t-interval with 1 degree of freedom spans 0, but saying
    # "no significant difference" would mislead; the verdict shows the pairs instead.
    two = deltas(summary_table(runs_df([10.0, 10.0], [11.70, 11.71])))
    assert two.verdict_speed == "too few pairs (2): +17.0%, +17.1%"

    wide = deltas(summary_table(runs_df([10.0, 10.0, 10.0], [10.5, 9.6, 10.3])))
    assert wide.verdict_speed.startswith("inconclusive: CI [") and "includes 0" in wide.verdict_speed


def test_an_arm_against_another_is_paired_by_round(tmp_path):
    """contrasts: [[liger, rmsnorm]]: liger's run against rmsnorm's of the same round; one round
    where rmsnorm ran out of memory says so instead of a number."""
    for rep, (t_liger, t_rms) in enumerate([(0.8, 1.0), (0.8, 1.0), (0.8, 1.0)]):
        write_run(tmp_path, "baseline", rep, [1.2] * 4)
        write_run(tmp_path, "liger", rep, [t_liger] * 4)
        write_run(tmp_path, "rmsnorm", rep, [t_rms] * 4)
    runs = runs_table(load_runs(tmp_path))
    table = contrast_table(runs, [["liger", "rmsnorm"]])
    assert list(table.columns) == CONTRAST_COLUMNS and len(table) == 1
    row = table.iloc[0]
    assert (row.arm, row.reference, row.n_pairs) == ("liger", "rmsnorm", 3)
    assert row.delta_samples_per_s_pct == pytest.approx(25.0)  # (2 / 0.8) / (2 / 1.0)
    assert row.verdict_speed == "faster"
    oom = runs.assign(status=runs["status"].mask(runs["arm"] == "rmsnorm", "oom"))
    assert contrast_table(oom, [["liger", "rmsnorm"]]).iloc[0].verdict_speed == "liger fits, rmsnorm OOM"
    assert contrast_table(runs, []).empty


# --- loss parity --------------------------------------------------------------------------------


def test_loss_parity_max_last_and_pass_fail(tmp_path):
    base = [5.0, 4.0, 3.0, 2.0]
    write_run(tmp_path, "baseline", 0, [1.0] * 4, losses=base)
    write_run(tmp_path, "liger", 0, [1.0] * 4, losses=[5.0, 4.05, 3.0, 2.001])
    write_run(tmp_path, "baseline", 1, [1.0] * 4, losses=base)
    write_run(tmp_path, "liger", 1, [1.0] * 3, losses=[5.0, 4.0, 3.02])  # shorter: steps 1..3 compared
    write_run(tmp_path, "baseline", 2, [1.0] * 4, losses=base)  # no liger counterpart
    records = load_runs(tmp_path)
    parity = loss_parity_table(records).set_index("repeat")
    assert list(loss_parity_table(records).columns) == LOSS_PARITY_COLUMNS
    assert sorted(parity.index) == [0, 1]
    r0, r1 = parity.loc[0], parity.loc[1]
    assert r0.steps_compared == 4 and r0.max_abs_delta == pytest.approx(0.05) and r0.max_abs_delta_step == 2
    assert r0.last_step == 4 and r0.last_step_abs_delta == pytest.approx(0.001)
    assert (r0.loss_last_baseline, r0.loss_last_arm) == (2.0, 2.001) and r0.arm == "liger"
    assert r0.tolerance == 0.01 and bool(r0.passed) and "last_step" in r0.criterion
    assert r1.steps_compared == 3 and r1.last_step == 3 and r1.last_step_abs_delta == pytest.approx(0.02)
    assert not bool(r1.passed)
    # every row names its world size (a cell recorded before multi-node has no "nodes": 1)
    assert parity[["gpus", "nodes"]].values.tolist() == [[1, 1], [1, 1]]
    gaps = loss_parity_gaps(records)
    assert gaps == [f"{CELL} repeat 2: no pair to compare (runs of arms: baseline)"]


@pytest.mark.parametrize(
    ("base_status", "liger_status", "expected"),
    [
        ("oom", "ok", "liger fits, baseline OOM"),
        ("ok", "oom", "baseline fits, liger OOM"),
        ("oom", "oom", "both arms OOM"),
        ("ok", "error", "n/a (no ok runs)"),
        # the H200 faults sweep: its Liger run of the OOM cell was cut by the stage's deadline
        ("oom", "error", "baseline OOM; no ok liger run"),
    ],
)
def test_verdicts_when_one_arm_does_not_fit(base_status, liger_status, expected):
    """Which arm fits is the finding when one OOMs (measured on the H200: baseline OOM, Liger
    trained at 134 GiB, 4B at batch 24): a verdict, not "n/a"."""
    df = runs_df([10.0, 10.0], [12.0, 12.0], [130.0, 130.0], [120.0, 120.0])
    df.loc[df["arm"] == "baseline", "status"] = base_status
    df.loc[df["arm"] == "liger", "status"] = liger_status
    row = deltas(summary_table(df))
    assert row.verdict_speed == expected and row.verdict_memory == expected


@pytest.mark.parametrize(
    ("liger_status", "expected"), [("oom", "liger OOM; no baseline run"), ("ok", "n/a (no baseline run)")]
)
def test_verdicts_where_only_one_arm_ran(liger_status, expected):
    """A capacity probe that only the Liger search reached (batch 32 on the H200: the baseline's
    search stopped at 16): no baseline run is not a baseline that fits."""
    df = runs_df([10.0, 10.0], [12.0, 12.0], [130.0, 130.0], [120.0, 120.0])
    df = df[df["arm"] == "liger"].copy()
    df["status"] = liger_status
    row = summary_table(df).iloc[-1]
    assert row.verdict_speed == expected and row.verdict_memory == expected


def test_oom_reason_is_the_allocators_first_sentence():
    from bench.trainers.outcome import short_oom

    full = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9.27 GiB. GPU 0 has a total capacity "
        "of 139.81 GiB of which 5.27 GiB is free. Including non-PyTorch memory, this process has 134.53 GiB "
        "memory in use. Of the allocated memory 130.1 GiB is allocated by PyTorch, ... PYTORCH_CUDA_ALLOC_CONF"
    )
    assert short_oom(full) == "CUDA out of memory. Tried to allocate 9.27 GiB"
    assert short_oom("HIP out of memory. Tried to allocate 512.00 MiB. GPU 3 ...") == (
        "HIP out of memory. Tried to allocate 512.00 MiB"
    )
    assert short_oom("x" * 500) == "x" * 200


def test_scaling_table_arithmetic():
    """Two world sizes of one cell, both arms (numbers shaped like the H200 2-GPU sweep in the
    issue: 8.72 -> 15.96 samples/s baseline, 10.26 -> 18.68 Liger)."""
    from bench.results.columns import SCALING_COLUMNS
    from bench.results.tables import scaling_table

    rows = []
    for gpus, base, liger in ((1, [8.70, 8.74], [10.24, 10.28]), (2, [15.94, 15.98], [18.66, 18.70])):
        df = runs_df(base, liger, [30.0, 30.0], [25.0, 25.0])
        cell = f"p_offline_bs2_s64_g{gpus}" if gpus > 1 else "p_offline_bs2_s64"
        rows.append(df.assign(gpus=gpus, nodes=1, cell_id=cell, run_id=df["run_id"].str.replace(CELL, cell)))
    runs = pd.concat(rows, ignore_index=True)
    summary = summary_table(runs)
    assert set(summary["gpus"]) == {1, 2} and set(summary["nodes"]) == {1}
    scaling = scaling_table(summary).set_index(["arm", "world_size"])
    assert list(scaling_table(summary).columns) == SCALING_COLUMNS
    assert scaling.loc[("baseline", 1), "scaling_efficiency_pct"] == pytest.approx(100.0)
    assert scaling.loc[("baseline", 2), "samples_per_s_per_gpu"] == pytest.approx(15.96 / 2)
    assert scaling.loc[("baseline", 2), "scaling_efficiency_pct"] == pytest.approx(100 * (15.96 / 2) / 8.72)
    assert scaling.loc[("liger", 2), "scaling_efficiency_pct"] == pytest.approx(100 * (18.68 / 2) / 10.26)
    liger2 = scaling.loc[("liger", 2)]
    assert liger2.delta_samples_per_s_pct == pytest.approx(100 * (np.sqrt(18.66 / 15.94 * 18.70 / 15.98) - 1))
    assert liger2.peak_vram_gib == 25.0
    # a single world size is no series
    assert scaling_table(summary_table(rows[0])).empty


@pytest.mark.parametrize(
    ("run_id", "cell_id", "arm", "repeat"),
    [
        ("p_offline_bs2_s64_liger_flce_r3", "p_offline_bs2_s64", "liger_flce", 3),  # not arm flce
        ("p_offline_bs2_s64_liger_compile_r0", "p_offline_bs2_s64", "liger_compile", 0),  # nor compile
        ("p_offline_bs2_s64_adamw_foreach_r1", "p_offline_bs2_s64", "adamw_foreach", 1),
        ("p_offline_bs2_s64_compile_r2", "p_offline_bs2_s64", "compile", 2),
        ("p_offline_bs2_s64_liger_r4", "p_offline_bs2_s64", "liger", 4),
        ("p_offline_bs2_s64_newarm_r5", "p_offline_bs2_s64", "newarm", 5),  # not in bench.arms: one word
    ],
)
def test_a_run_id_is_parsed_against_the_known_arms_longest_first(tmp_path, run_id, cell_id, arm, repeat):
    from bench.config import parse_run_id
    from bench.config import run_id as build

    assert parse_run_id(run_id) == {"cell_id": cell_id, "arm": arm, "repeat": str(repeat)}
    assert build(cell_id, arm, repeat) == run_id  # built and read back in one place
    d = tmp_path / "runs" / run_id  # a cell.json without the keys: the record reads them off the id
    d.mkdir(parents=True)
    (d / "cell.json").write_text(json.dumps({"profile": "p"}))
    (rec,) = load_runs(tmp_path)
    assert (rec.run_id, rec.cell_id, rec.arm, rec.repeat) == (run_id, cell_id, arm, repeat)


def test_a_name_that_is_no_run_id_parses_to_nothing():
    from bench.results.records import parse_run_id

    assert parse_run_id("baseline_r") is None and parse_run_id("r3") is None and parse_run_id("x_r3") is None


def test_time_saved_per_step_and_per_sample_is_paired_and_in_milliseconds():
    """Reference minus arm, per pair: 0.9 s/step against 0.8 s/step saves 100 ms a step."""
    import pandas as pd

    from bench.results.deltas import savings_ms

    base = pd.DataFrame(
        {"repeat": [1, 2, 3], "s_per_step_mean": [0.90, 0.92, 0.91], "samples_per_s": [8.0, 8.0, 8.0]}
    )
    arm = pd.DataFrame(
        {"repeat": [1, 2, 3], "s_per_step_mean": [0.80, 0.80, 0.82], "samples_per_s": [10.0, 10.0, 10.0]}
    )
    per_step, per_sample = savings_ms(base, arm)
    assert per_step.n == 3 and per_step.per_pair == pytest.approx([100.0, 120.0, 90.0])
    assert per_step.pct == pytest.approx(103.333, abs=1e-3) and per_step.lo < per_step.pct < per_step.hi
    assert per_sample.pct == pytest.approx(1000 / 8 - 1000 / 10)  # 25 ms a sample
    assert per_sample.lo == pytest.approx(per_sample.hi)  # no spread between pairs


def test_a_foreign_process_on_the_cards_flags_the_run_and_keeps_it_counted(tmp_path):
    vram = {
        "status": "ok",
        "backend": "nvml",
        "memory_api": "nvml_v2",
        "devices": [
            {
                "index": 0,
                "name": "H200",
                "peak_used_gib": 30.0,
                "baseline_used_gib": 0.5,
                "peak_delta_gib": 29.5,
            }
        ],
        "processes": [
            {"card": 0, "pid": 4242, "owner": "foreign", "first_seen": "before", "max_used_gib": 12.5},
            {"card": 0, "pid": 99, "owner": "suite", "first_seen": "during", "max_used_gib": 29.0},
        ],
    }
    row = one_run(tmp_path, times=[1.0] * 4, vram=vram)
    assert row.status == "ok" and row.samples_per_s > 0
    assert row.note == (
        "another process held memory on the cards: pid 4242 on card 0 (foreign, 12.50 GiB, seen before the run); "
        "its numbers may be disturbed"
    )


def test_allocator_retries_are_said():
    from bench.results.step_checks import retries_warning as _retries

    assert _retries(pd.DataFrame({"alloc_retries": [0.0, 0.0, 3.0]})) == (
        "the allocator retried 3 allocation(s) after freeing its cache (slower steps, near OOM)"
    )
    assert _retries(pd.DataFrame({"alloc_retries": [0.0, 0.0]})) is None
    assert _retries(pd.DataFrame({"alloc_retries": [float("nan")]})) is None  # the CPU, or SpecForge
