"""Every column in lockstep pairs: each run's own peak VRAM from the pair's per-process poll
(bench/probe/pairvram.py, the poller's ``per_process``) against a fake pynvml with the real
process-list call (``nvmlDeviceGetComputeRunningProcesses``' structs with ``pid`` and
``usedGpuMemory``); each run's energy summed over its own turns (bench/results/energy.py) against a
hand calculation; the driver, host and power limit named also with the poller off; and each Δ
line saying its verdict's words."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pandas as pd
import pytest

from bench.probe import hardware, pairvram
from bench.probe.backends import GIB
from bench.probe.poller import VramPoller
from bench.results import method, prsummary
from bench.results.records import load_runs
from bench.results.tables import runs_table
from tests.test_energy import SAMPLES, T, gpu_vram, write_run
from tests.test_probe_processes import fake_pynvml


def scripted_processes(nv: types.ModuleType, per_pid: dict[int, list[float]]) -> None:
    """Card 0's compute processes: each pid's memory in GiB at successive calls, the last one held."""
    calls = {"n": 0}

    def running(h):
        if h != 0:
            return []
        i = calls["n"]
        calls["n"] += 1
        return [
            types.SimpleNamespace(pid=pid, usedGpuMemory=int(gib[min(i, len(gib) - 1)] * GIB))
            for pid, gib in per_pid.items()
        ]

    nv.nvmlDeviceGetComputeRunningProcesses = running


def poll_pair(tmp_path: Path, monkeypatch, per_pid: dict[int, list[float]]) -> Path:
    """A pair directory polled as a lockstep pair's is (per process), its runs' pids written."""
    nv = fake_pynvml()
    nv.nvmlDeviceGetTotalEnergyConsumption = lambda h: 5_000_000  # mJ since the driver loaded
    scripted_processes(nv, per_pid)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nv)
    monkeypatch.setitem(__import__("sys").modules, "amdsmi", None)
    pair = tmp_path / "pair"
    poller = VramPoller(pair, interval_s=0.01, baseline_samples=2, per_process=True, power_interval_s=0.05)
    poller.start()
    while poller.n_samples < 12:
        __import__("time").sleep(0.01)
    summary = poller.stop()
    assert summary["status"] == "ok"
    return pair


def test_each_run_of_a_pair_gets_its_own_processes_peak_not_the_cards(tmp_path, monkeypatch):
    # the card (fake_pynvml) holds 4 GiB used; run 0's process peaks at 11 GiB, run 1's at 9
    pair = poll_pair(tmp_path, monkeypatch, {101: [5, 11, 7, 7], 202: [2, 3, 9, 1]})
    peaks = json.loads((pair / "vram.json").read_text())["process_peaks"]
    assert {(p["pid"], p["peak_used_gib"]) for p in peaks} == {(101, 11.0), (202, 9.0)}
    (pair / "pid0").write_text("101")
    (pair / "pid1").write_text("202")
    runs = [tmp_path / "a", tmp_path / "b"]
    for d in runs:
        d.mkdir()
    pairvram.split(pair, runs)
    a, b = (json.loads((d / "vram.json").read_text()) for d in runs)
    assert (a["scope"], a["pid"], b["pid"]) == ("process", 101, 202)
    card_a, card_b = a["devices"][0], b["devices"][0]
    assert card_a["baseline_used_gib"] == 4.0  # the card before the pair: what the fake reports as used
    assert (card_a["peak_delta_gib"], card_a["peak_used_gib"]) == (11.0, 15.0)  # 4 idle + 11 own
    assert (card_b["peak_delta_gib"], card_b["peak_used_gib"]) == (9.0, 13.0)
    assert a["devices"][1]["peak_delta_gib"] == 0.0  # card 1: the process held nothing there
    # the runs' rows keep the card's energy and state, never the pair's used memory
    rows = [json.loads(line) for line in (runs[0] / "vram.jsonl").read_text().splitlines()]
    assert rows and all("used_gib" not in r and r["energy_j"] == [5000.0, 5000.0] for r in rows)
    # runs.csv's peak VRAM of run 0 is its own peak: what the table reads from the file
    from bench.results.records import vram_devices

    assert vram_devices(a)["peak_used_gib"].max() == 15.0


@pytest.mark.parametrize(
    "pid, needle", [(None, "wrote no pid"), (999, "never listed the run's process (pid 999)")]
)
def test_a_run_whose_process_was_never_seen_is_unavailable_with_the_reason(
    tmp_path, monkeypatch, pid, needle
):
    pair = poll_pair(tmp_path, monkeypatch, {101: [5]})
    if pid is not None:
        (pair / "pid0").write_text(str(pid))
    run = tmp_path / "run"
    run.mkdir()
    pairvram.split(pair, [run])
    doc = json.loads((run / "vram.json").read_text())
    assert doc["status"] == "unavailable" and needle in doc["reason"]
    assert "process_peaks" not in doc  # never the pair's card peak in its place


# -- energy over a run's own turns ------------------------------------------------------------


def counter_rows(own: list[tuple[float, float]], own_w: float, other_w: float) -> list[dict]:
    """The card's energy counter read every 0.1 s from T to T + 12: ``own_w`` inside the run's own
    turns, ``other_w`` (its partner's turns and the waits) elsewhere."""
    rows, joules = [], 0.0
    for k in range(121):
        t = T + k / 10
        if k:
            mid = t - 0.05
            joules += 0.1 * (own_w if any(a <= mid <= b for a, b in own) else other_w)
        rows.append({"t": round(t, 3), "energy_j": [joules], "power_w": [None]})
    return rows


def lockstep_run(sweep: Path, turns: list[tuple[float, float]], rows: list[dict]) -> None:
    """A lockstep run of 5 steps (1 warm-up): its own turn of each step in lockstep.jsonl."""
    write_run(sweep, "baseline", 1, rows, gpu_vram([40.0]), steps=5)
    d = next((sweep / "runs").iterdir())
    cell = json.loads((d / "cell.json").read_text())
    (d / "cell.json").write_text(
        json.dumps({**cell, "pairing": {"mode": "lockstep", "pair_dir": "x", "role": 0}})
    )
    recs = [{"step": 1, "started": T, "ended": T + 1.0}]
    recs += [{"step": s, "started": a, "ended": b, "own_s": b - a} for s, (a, b) in zip(range(2, 6), turns)]
    (d / "lockstep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


TURNS = [(T + 2, T + 3), (T + 4, T + 5), (T + 6, T + 7), (T + 8, T + 9)]  # the partner's in between


def test_a_lockstep_runs_energy_is_its_own_turns_not_its_partners(tmp_path):
    lockstep_run(tmp_path, TURNS, counter_rows(TURNS, own_w=200.0, other_w=600.0))
    row = runs_table(load_runs(tmp_path)).iloc[0]
    # by hand: 4 own turns of 1 s at 200 W = 800 J over 4 measured steps of SAMPLES samples; the
    # window from the first measured turn's start to the last one's end would also hold the partner's
    # three turns at 600 W (800 + 3 * 600 = 2600 J)
    assert row["energy_j"] == pytest.approx(800.0, rel=1e-9)
    assert row["energy_j_per_sample"] == pytest.approx(800.0 / (4 * SAMPLES), rel=1e-9)
    assert row["energy_source"] == "energy counter over own turns"


def test_a_turn_the_readings_cannot_attribute_leaves_the_run_without_energy_and_says_which(tmp_path):
    rows = [r for r in counter_rows(TURNS, 200.0, 600.0) if not T + 3.7 < r["t"] < T + 5.3]
    lockstep_run(tmp_path, TURNS, rows)
    row = runs_table(load_runs(tmp_path)).iloc[0]
    assert pd.isna(row["energy_j"])
    assert row["energy_source"].startswith("n/a (") and "own turn 2 of 4" in row["energy_source"]


def test_a_measured_step_without_its_turn_has_no_energy(tmp_path):
    lockstep_run(tmp_path, TURNS[:3], counter_rows(TURNS, 200.0, 600.0))  # step 5's turn missing
    row = runs_table(load_runs(tmp_path)).iloc[0]
    assert pd.isna(row["energy_j"]) and "measured step 5 has no turn" in row["energy_source"]


# -- provenance in every mode, and the verdict's words -----------------------------------------


def test_machine_facts_read_the_driver_and_the_power_limit_never_set_them(monkeypatch):
    nv = fake_pynvml()
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000  # mW, as NVML returns it
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nv)
    facts = hardware.machine_facts()
    assert facts["driver_version"] == "580.159.04" and facts["power_limits_w"] == [700.0, 700.0]
    assert not [n for n in dir(nv) if n.startswith("nvmlDeviceSet")]  # nothing that sets was there to call


def test_the_report_names_the_driver_and_power_limit_when_no_run_recorded_them():
    runs = pd.DataFrame(
        {"status": ["ok"], "gpu_name": ["NVIDIA H200"], "gpu_count": [1], "driver_version": [None],
         "hostname": [None], "torch_version": ["2.11.0"], "triton_version": [None],
         "transformers_version": [None], "liger_version": [None], "git_commit": [None]}
    )  # fmt: skip
    sweep = {"hardware": {"gpu_count": 1, "driver_version": "580.159.04", "power_limits_w": [700.0],
                          "hostname": "vm"}}  # fmt: skip
    assert prsummary.machine_line(runs, sweep).startswith(
        "NVIDIA H200 × 1, driver 580.159.04, power limit 700 W"
    )
    lines = method.provenance_section(sweep, runs)
    assert "- **Host:** vm" in lines
    assert any("driver 580.159.04; power limit 700 W (read, never set)" in line for line in lines)


def summary_row(**kw) -> types.SimpleNamespace:
    base = dict(
        arm="lr101", n_pairs=3, delta_samples_per_s_pct=-0.1, delta_samples_per_s_pct_ci95_low=-0.3,
        delta_samples_per_s_pct_ci95_high=0.2, verdict_speed="within ±1%", delta_peak_vram_gib=0.0,
        delta_peak_vram_gib_ci95_low=0.0, delta_peak_vram_gib_ci95_high=0.0, delta_peak_vram_pct=0.0,
        verdict_memory="within ±0.32 GiB", loss_parity="pass (3/3)",
    )  # fmt: skip
    return types.SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize(
    "speed, memory, words",
    [
        ("within ±1%", "within ±0.32 GiB", ("(3 pairs; within ±1%)", "peak VRAM (within ±0.32 GiB)")),
        ("faster", "leaner", ("(3 pairs; faster)", "peak VRAM (leaner)")),
        ("inconclusive: CI [-0.3, +0.2]", "heavier", ("(3 pairs; inconclusive)", "peak VRAM (heavier)")),
    ],
)
def test_every_delta_line_says_its_verdicts_words(speed, memory, words):
    line = prsummary.delta_line(summary_row(verdict_speed=speed, verdict_memory=memory))
    assert line.startswith("lr101 vs baseline: -0.1% [-0.3, +0.2] throughput")
    for w in words:
        assert w in line
