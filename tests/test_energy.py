"""Energy per sample: known power and energy traces in hand-made run directories, read through the
real records, runs and summary tables (bench/results/energy.py, records.run_row, tables.summary_table)
and the report's energy section; the backends' energy reads against fake pynvml / amdsmi modules
that follow the real APIs (nvmlDeviceGetTotalEnergyConsumption in mJ, nvmlDeviceGetFieldValues'
nvmlFieldValue_t, amdsmi_get_energy_count's dict); and the real poller writing the rows that a
run's energy is read from."""

from __future__ import annotations

import json
import math
import time
import types
from pathlib import Path

import numpy as np
import pytest

from bench.fileio import read_jsonl
from bench.probe import vram
from bench.results import stats
from bench.results.records import load_runs
from bench.results.sections import energy_section
from bench.results.tables import runs_table, summary_table
from tests.helpers import census
from tests.test_vram import (
    AMDSMI_STATUS_NOT_SUPPORTED,
    BASELINE,
    GIB,
    NVML_ERROR_NOT_SUPPORTED,
    AmdSmiLibraryException,
    NVMLError,
    ProcessorHandle,
    Script,
    fake_amdsmi,
    fake_pynvml,
    install,
)

CELL = "p_offline_bs2_s64"
T = 1_700_000_000.0  # wall clock at the start of step 1
SAMPLES = 4  # per step


def gpu_vram(peaks: list[float], node: list[int] | None = None) -> dict:
    """A vram.json of polled cards whose memory rose to ``peaks`` GiB (from 0.5 GiB idle)."""
    cards = [
        {"index": i if node is None else 0, "name": "NVIDIA H200", "total_gib": 140.0, "baseline_used_gib": 0.5,
         "peak_used_gib": p, "peak_delta_gib": p - 0.5, **({} if node is None else {"node": node[i]})}
        for i, p in enumerate(peaks)
    ]  # fmt: skip
    return {"backend": "nvml", "status": "ok", "reason": None, "interval_s": 0.05, "devices": cards}


def write_run(sweep: Path, arm: str, repeat: int, rows: list[dict], vram_doc: dict | None, **kw) -> tuple:
    """A run of 1 warm-up and ``steps - 1`` measured steps of ``step_s`` from T, SAMPLES samples each;
    ``rows`` its vram.jsonl (kw ``files``: {name: rows} instead). Returns its measured window."""
    steps, step_s, gpus = kw.get("steps", 11), kw.get("step_s", 1.0), kw.get("gpus", 1)
    run_id = f"{CELL}_{arm}_r{repeat}"
    d = sweep / "runs" / run_id
    d.mkdir(parents=True)
    cell = {"run_id": run_id, "cell_id": CELL, "profile": "p", "mode": "offline",
            "batch_size": SAMPLES // gpus, "seq_len": 64, "accumulation_steps": 1, "num_anchors": 8, "gpus": gpus, "arm": arm, "repeat": repeat,
            "order_index": 2 * repeat + (arm != "baseline"), "steps": steps, "warmup_steps": 1}  # fmt: skip
    (d / "cell.json").write_text(json.dumps(cell))
    (d / "run.json").write_text(json.dumps({"status": "ok", "arm": arm, "draft_module_types": census(arm)}))
    metrics = [
        {"step": i, "loss": 7.0, "step_time_s": step_s, "samples": SAMPLES, "time": T + i * step_s}
        for i in range(1, steps + 1)
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    if vram_doc is not None:
        (d / "vram.json").write_text(json.dumps(vram_doc))
    for name, lines in (kw.get("files") or {"vram.jsonl": rows}).items():
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in lines))
    return T + step_s, T + steps * step_s


def power_rows(times, watts) -> list[dict]:
    """Energy rows of cards without a counter: ``watts(t)`` a list, one value per card."""
    return [
        {"t": round(t, 3), "energy_j": [None] * len(watts(t)), "power_w": watts(round(t, 3))} for t in times
    ]


def every(step: float, start: float = T - 0.47, end: float = T + 12.2) -> np.ndarray:
    return np.arange(start, end, step)


def run_rows(sweep: Path):
    runs = runs_table(load_runs(sweep))
    return runs, summary_table(runs)


# -- runs.csv: joules and J/sample from known traces ----------------------------------------


def test_constant_300_w_on_two_cards_over_the_measured_window(tmp_path):
    window = write_run(tmp_path, "baseline", 0, power_rows(every(0.1), lambda t: [300.0, 300.0]),
                       gpu_vram([40.0, 40.0]), gpus=2)  # fmt: skip
    assert window == (T + 1, T + 11)  # readings at T - 0.47 + k/10: both ends fall between two
    run = run_rows(tmp_path)[0].iloc[0]
    assert run.energy_j == pytest.approx(2 * 300 * 10)
    assert run.energy_j_per_sample == pytest.approx(6000 / (10 * SAMPLES))  # 150 J
    assert run.energy_source == "power integral" and run.energy_cards == 2
    assert run.power_interval_s == pytest.approx(0.1, abs=1e-3)


def test_a_ramp_is_integrated_with_its_ends_interpolated(tmp_path):
    # 100 W at T rising 20 W/s, read every 0.25 s off the window's grid: the trapezoid is exact for a
    # line, so only the interpolation at the two ends could be wrong.
    write_run(
        tmp_path, "baseline", 0, power_rows(every(0.25), lambda t: [100.0 + 20.0 * (t - T)]), gpu_vram([40.0])
    )
    run = run_rows(tmp_path)[0].iloc[0]
    assert run.energy_j == pytest.approx(
        100 * 10 + 10 * (11**2 - 1**2), rel=1e-9
    )  # ∫ from T+1 to T+11: 2200 J
    assert run.energy_j_per_sample == pytest.approx(2200 / 40)
    assert run.power_interval_s == pytest.approx(0.25, abs=1e-3)


def test_the_energy_counter_is_preferred_to_any_power_reading(tmp_path):
    counter = [{"t": round(t, 3), "energy_j": [round(5e5 + 400.0 * (t - T), 3)], "power_w": [None]}
               for t in every(0.1)]  # fmt: skip
    state = [{"t": t, "state": [{"power_w": 123.0}]} for t in every(1.0)]  # what the 1-s state rows say
    write_run(tmp_path, "baseline", 0, sorted(counter + state, key=lambda r: r["t"]), gpu_vram([40.0]))
    run = run_rows(tmp_path)[0].iloc[0]
    assert run.energy_source == "energy counter"
    assert run.energy_j == pytest.approx(400 * 10, abs=0.01)  # the counter's 400 W, not the state rows' 123


def test_a_counter_that_goes_backwards_falls_back_to_the_state_power(tmp_path):
    counter = [{"t": round(t, 3), "energy_j": [1e6 + 400 * (t - T) - (3e3 if t > T + 5 else 0)], "power_w": [None]}
               for t in every(0.1)]  # fmt: skip
    state = [{"t": round(t, 3), "state": [{"power_w": 250.0}]} for t in every(0.5)]
    write_run(tmp_path, "baseline", 0, sorted(counter + state, key=lambda r: r["t"]), gpu_vram([40.0]))
    run = run_rows(tmp_path)[0].iloc[0]
    assert run.energy_source == "power integral" and run.energy_j == pytest.approx(2500)
    assert run.power_interval_s == pytest.approx(0.5)


def test_only_the_cards_of_the_run_count(tmp_path):
    # a 1-GPU cell on a 2-card machine: card 1 idles at 70 W beside it and is left out
    write_run(tmp_path, "baseline", 0, power_rows(every(0.1), lambda t: [300.0, 70.0]), gpu_vram([40.0, 0.6]))
    run = run_rows(tmp_path)[0].iloc[0]
    assert run.energy_j == pytest.approx(3000) and run.energy_cards == 1


def test_every_node_of_a_multi_node_run(tmp_path):
    files = {
        "vram_node_0.jsonl": power_rows(every(0.1), lambda t: [300.0, 60.0]),
        "vram_node_1.jsonl": power_rows(every(0.1), lambda t: [200.0, 60.0]),
    }
    doc = gpu_vram([40.0, 0.6, 40.0, 0.6], node=[0, 0, 1, 1])
    for i, card in enumerate(doc["devices"]):
        card["index"] = i % 2
    write_run(tmp_path, "baseline", 0, [], doc, files=files)
    run = run_rows(tmp_path)[0].iloc[0]
    assert run.energy_j == pytest.approx((300 + 200) * 10) and run.energy_cards == 2


# -- honest n/a ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "times, steps, reason",
    [
        (every(1.0, T + 0.5), 4, "3 readings inside the 3.00-s measured window, at least 5 needed"),
        (every(0.1, T - 0.47, T + 10.8), 11, "its last reading is 0.2"),
        (every(0.1, T + 1.01), 11, "its first reading is 0.01 s after the measured window's start"),
        (
            np.concatenate([every(0.1, T, T + 4), every(0.1, T + 7)]),
            11,
            "s gap between readings, more than 20%",
        ),
    ],
    ids=["too-few", "ends-early", "starts-late", "gap"],
)
def test_too_sparse_or_short_readings_give_nan_with_the_reason(tmp_path, times, steps, reason):
    write_run(tmp_path, "baseline", 0, power_rows(times, lambda t: [300.0]), gpu_vram([40.0]), steps=steps)
    run = run_rows(tmp_path)[0].iloc[0]
    assert math.isnan(run.energy_j) and math.isnan(run.energy_j_per_sample)
    assert run.energy_source.startswith("n/a (card 0: power integral: ") and reason in run.energy_source


def test_cpu_runs_and_unpolled_arms_have_no_energy_and_the_report_says_na(tmp_path):
    cpu = {"backend": "none", "status": "unavailable", "devices": [],
           "reason": "no NVML or AMD SMI on this machine (nvml: ImportError: No module named 'pynvml')"}  # fmt: skip
    write_run(tmp_path, "baseline", 0, [], cpu)
    write_run(
        tmp_path,
        "nopoll",
        0,
        [],
        {"backend": "none", "status": "disabled", "reason": "arm nopoll runs without the poller"},
    )
    runs, summary = run_rows(tmp_path)
    assert runs["energy_j"].isna().all() and runs["energy_j_per_sample"].isna().all()
    assert list(runs["energy_source"]) == [
        "n/a (no GPU readings: no NVML or AMD SMI on this machine (nvml: ImportError: No module named 'pynvml'))",
        "n/a (poller off: arm nopoll runs without the poller)",
    ]
    assert summary["energy_j_per_sample_mean"].isna().all()
    assert summary.set_index("arm").loc["nopoll", "energy_n_pairs"] == 0
    assert summary["delta_energy_per_sample_pct"].isna().all()
    lines = energy_section(summary, runs)
    assert lines[0] == f"Energy per sample: {runs['energy_source'].iloc[0]}."
    assert not any("0.00" in line for line in lines)


def test_partitioned_cards_are_na(tmp_path):
    doc = {**gpu_vram([40.0]), "partitioned": True}
    write_run(tmp_path, "baseline", 0, power_rows(every(0.1), lambda t: [300.0]), doc)
    assert run_rows(tmp_path)[0].iloc[0].energy_source.startswith("n/a (cards split into compute partitions")


# -- summary.csv and the report: Δ energy per sample, paired --------------------------------


def test_delta_energy_per_sample_is_paired_like_delta_samples_per_s(tmp_path):
    liger_w = [300.0, 310.0, 290.0]  # liger's steps are 0.8 s: 60, 62 and 58 J/sample against 75
    for rep, watts in enumerate(liger_w):
        write_run(tmp_path, "baseline", rep, power_rows(every(0.1), lambda t: [300.0]), gpu_vram([40.0]))
        write_run(
            tmp_path,
            "liger",
            rep,
            power_rows(every(0.1), lambda t, w=watts: [w]),
            gpu_vram([35.0]),
            step_s=0.8,
        )
    runs, summary = run_rows(tmp_path)
    per_sample = runs.set_index(["arm", "repeat"])["energy_j_per_sample"]
    assert per_sample["baseline"].tolist() == pytest.approx([75.0] * 3)
    assert per_sample["liger"].tolist() == pytest.approx([60.0, 62.0, 58.0])
    expected = stats.paired_log_delta([math.log(w * 0.8 / 300) for w in liger_w])
    row = summary.set_index("arm").loc["liger"]
    assert row.energy_n_pairs == 3 and row.energy_j_per_sample_mean == pytest.approx(60.0)
    assert row.delta_energy_per_sample_pct == pytest.approx(expected.pct)  # about -20%
    assert (
        row.delta_energy_per_sample_pct_ci95_low,
        row.delta_energy_per_sample_pct_ci95_high,
    ) == pytest.approx((expected.lo, expected.hi))
    assert summary.set_index("arm").loc["baseline", "energy_j_per_sample_mean"] == pytest.approx(75.0)
    lines = energy_section(summary, runs)
    liger_line = next(line for line in lines if "| liger |" in line)
    ci = f"{expected.pct:+.1f}% [{expected.lo:+.1f}, {expected.hi:+.1f}] (3 pairs)"
    assert "| 60.00 |" in liger_line and ci in liger_line and "| power integral |" in liger_line
    assert "Readings every 0.10 s (median)" in lines[-2]


def test_a_pair_without_energy_drops_out_of_the_delta(tmp_path):
    for rep in range(3):
        write_run(tmp_path, "baseline", rep, power_rows(every(0.1), lambda t: [300.0]), gpu_vram([40.0]))
        rows = power_rows(every(0.1) if rep else every(1.0, T + 0.5, T + 4), lambda t: [240.0])
        write_run(tmp_path, "liger", rep, rows, gpu_vram([35.0]))
    runs, summary = run_rows(tmp_path)
    row = summary.set_index("arm").loc["liger"]
    assert row.energy_n_pairs == 2 and row.delta_energy_per_sample_pct == pytest.approx(-20.0)
    assert row.energy_source.startswith("power integral; 1 of 3 runs n/a (card 0: power integral: ")


# -- the backends' energy reads --------------------------------------------------------------


def nvml_with_energy(counter_mj=None, instant=None):
    """fake_pynvml plus the energy calls: ``counter_mj()`` the counter (or an exception to raise),
    ``instant`` the instant power field's nvmlFieldValue_t (its value in mW)."""
    mod = fake_pynvml(Script([[GIB]]))
    mod.calls = {"energy": 0, "fields": 0}

    def nvmlDeviceGetTotalEnergyConsumption(h):
        mod.calls["energy"] += 1
        value = counter_mj()
        if isinstance(value, BaseException):
            raise value
        return value

    def nvmlDeviceGetFieldValues(h, field_ids):
        mod.calls["fields"] += 1
        assert list(field_ids) == [mod.NVML_FI_DEV_POWER_INSTANT]
        return [instant]

    mod.NVML_FI_DEV_POWER_INSTANT = 186
    mod.nvmlDeviceGetTotalEnergyConsumption = nvmlDeviceGetTotalEnergyConsumption
    mod.nvmlDeviceGetFieldValues = nvmlDeviceGetFieldValues
    return mod


def field(ret: int, mw: int):
    """A c_nvmlFieldValue_t as pynvml returns it: NVML_VALUE_TYPE_UNSIGNED_INT (1) in value.uiVal."""
    return types.SimpleNamespace(fieldId=186, scopeId=0, timestamp=0, latencyUsec=0, valueType=1, nvmlReturn=ret,
                                 value=types.SimpleNamespace(uiVal=mw))  # fmt: skip


def test_nvml_energy_counter_in_joules(monkeypatch):
    install(monkeypatch, pynvml=nvml_with_energy(counter_mj=lambda: 123_456_789))
    backend, _ = vram.open_backend("nvml")
    assert backend.energy() == [{"energy_j": pytest.approx(123_456.789), "power_w": None}]


def test_nvml_without_a_counter_gives_the_instant_power_and_stops_asking(monkeypatch):
    mod = nvml_with_energy(counter_mj=lambda: NVMLError(NVML_ERROR_NOT_SUPPORTED), instant=field(0, 412_500))
    install(monkeypatch, pynvml=mod)
    backend, _ = vram.open_backend("nvml")
    for _ in range(3):
        assert backend.energy() == [{"energy_j": None, "power_w": 412.5}]
    assert mod.calls == {"energy": 1, "fields": 3}  # an unsupported call is tried once


def test_nvml_falls_back_to_the_averaged_power_usage(monkeypatch):
    mod = nvml_with_energy(counter_mj=lambda: NVMLError(NVML_ERROR_NOT_SUPPORTED), instant=field(3, 0))
    install(monkeypatch, pynvml=mod)
    backend, _ = vram.open_backend("nvml")
    assert backend.energy() == [{"energy_j": None, "power_w": 350.125}]  # nvmlDeviceGetPowerUsage's mW


def amd_with_energy(reply):
    """fake_amdsmi plus amdsmi_get_energy_count: ``reply`` its dict, or a status code to raise."""
    mod = fake_amdsmi(Script([[GIB]]))

    def amdsmi_get_energy_count(h):
        if not isinstance(h, ProcessorHandle):
            raise TypeError(h)
        if isinstance(reply, int):
            raise AmdSmiLibraryException(reply)
        return reply

    mod.amdsmi_get_energy_count = amdsmi_get_energy_count
    return mod


@pytest.mark.parametrize(
    "reply",
    [  # ROCm 6.4 and later (energy_accumulator; "power" kept, deprecated), and before (power only)
        {"power": 2_000_000, "energy_accumulator": 2_000_000, "counter_resolution": 15.259, "timestamp": 17},
        {"power": 2_000_000, "counter_resolution": 15.259, "timestamp": 17},
    ],
    ids=["6.4+", "6.3"],
)
def test_amdsmi_energy_count_times_its_resolution(monkeypatch, reply):
    install(monkeypatch, amdsmi=amd_with_energy(reply))
    backend, _ = vram.open_backend("amdsmi")
    assert backend.energy() == [{"energy_j": pytest.approx(2_000_000 * 15.259e-6), "power_w": None}]


def test_amdsmi_without_energy_count_gives_the_socket_power(monkeypatch):
    install(monkeypatch, amdsmi=amd_with_energy(AMDSMI_STATUS_NOT_SUPPORTED))
    backend, _ = vram.open_backend("amdsmi")
    assert backend.energy() == [{"energy_j": None, "power_w": 748.0}]  # current_socket_power


# -- the poller: energy rows often, one after the run, read back into the run's energy --------


def test_the_poller_reads_the_counter_often_and_once_more_at_stop(tmp_path, monkeypatch):
    start = time.time()
    install(
        monkeypatch, pynvml=nvml_with_energy(counter_mj=lambda: int(5e8 + 300_000 * (time.time() - start)))
    )
    rdir = tmp_path / "runs" / f"{CELL}_baseline_r0"
    poller = vram.VramPoller(rdir, interval_s=0.01, baseline_samples=BASELINE, power_interval_s=0.02).start()
    # a 2.6-s measured window: a 0.4-s stall of the poller thread (seen on a loaded 2-core CI
    # machine) stays under the 20% gap that makes the energy n/a
    time.sleep(3.0)
    stopping = time.time()
    summary = poller.stop()
    rows = [r for r in read_jsonl(rdir / "vram.jsonl") if "energy_j" in r]
    assert summary["power_interval_s"] == 0.02 and summary["n_power_samples"] == len(rows) >= 10
    assert all(r["power_w"] == [None] for r in rows)  # a card with a counter gives no power reads
    assert rows[-1]["t"] >= round(stopping, 3)  # the read at stop: past the run's last step
    # the run's measured window, 0.2 s in from both ends, read back through the records
    begin, end = round(start + 0.2, 3), round(stopping - 0.2, 3)
    steps = 8
    metrics = [{"step": i, "step_time_s": (end - begin) / (steps - 1), "samples": SAMPLES,
                "time": begin + (i - 1) * (end - begin) / (steps - 1)} for i in range(1, steps + 1)]  # fmt: skip
    (rdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    cell = {
        "run_id": rdir.name,
        "cell_id": CELL,
        "arm": "baseline",
        "repeat": 0,
        "warmup_steps": 1,
        "gpus": 1,
    }
    (rdir / "cell.json").write_text(json.dumps(cell))
    (rdir / "run.json").write_text(json.dumps({"status": "ok"}))
    run = run_rows(tmp_path)[0].iloc[0]
    assert run.energy_source == "energy counter" and run.energy_cards == 1
    assert run.energy_j == pytest.approx(300 * (end - begin), abs=1.0)  # 1 ms stamps at 300 W: 0.3 J an end
    assert run.energy_j_per_sample == pytest.approx(run.energy_j / ((steps - 1) * SAMPLES))
    assert 0.015 <= run.power_interval_s <= 0.05
