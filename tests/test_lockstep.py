"""``pairing: lockstep``: a pair's two runs on one card at once, taking turns one optimizer step
each. The turn protocol inside real processes with a real torch optimizer (turns.py's Lockstep,
installed by instrument.py: strict alternation, a partner that dies), the config's refusals, and a
whole A/B of the real SpecForge CLI (PyPI 0.2.0, tests/upstream_env.py) in lockstep end to end."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from bench.config import SweepError
from bench.trainers import load_config
from tests.helpers import CONFIGS, REPO, built_once
from tests.upstream_env import upstream_python

TINY = CONFIGS / "train" / "tiny-offline.yaml"
INSTRUMENT = REPO / "bench" / "trainers" / "specforge_cli" / "instrument.py"
LOOP = """
import gc, sys, threading, time, torch
spun, leave = threading.Event(), threading.Event()
def spin():  # a helper thread's host work: 0.1 s of its own CPU time, then it idles until told
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.1:
        pass
    spun.set()
    leave.wait()
w = torch.nn.Parameter(torch.ones(4))
opt = torch.optim.SGD([w], lr=0.1)
for step in range(int(sys.argv[1])):
    (w * w).sum().backward()
    time.sleep(0.05)  # the step's work
    if step == 2:  # inside step 3
        helper = threading.Thread(target=spin, name="spinner")
        helper.start()
        spun.wait()
    if step == 4:
        leave.set()
        helper.join()
    if step == 3:
        gc.collect()  # a full collection inside step 4
    opt.step()
    opt.zero_grad()
    print(f"step {step + 1}", flush=True)
"""


def turn_taker(tmp: Path, role: int, steps: int, last: int) -> subprocess.Popen:
    (tmp / "loop.py").write_text(LOOP)
    argv = [sys.executable, str(INSTRUMENT), "--lockstep", str(tmp), str(role), str(last)]
    argv += [str(tmp / f"rec{role}.jsonl"), "-m", "loop", str(steps)]
    env = {**os.environ, "PYTHONPATH": str(tmp)}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def fifos(tmp: Path) -> None:
    for role in range(2):
        os.mkfifo(tmp / f"to{role}")


def records(tmp: Path, role: int) -> list[dict]:
    return [json.loads(line) for line in (tmp / f"rec{role}.jsonl").read_text().splitlines()]


def test_the_two_processes_take_strict_turns_from_step_2_and_neither_waits_past_the_last(tmp_path):
    fifos(tmp_path)
    procs = [turn_taker(tmp_path, role, 6, 6) for role in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, out
    spans = sorted(
        (r["started"], r["ended"], role, r["step"]) for role in range(2) for r in records(tmp_path, role)
    )
    later = [s for s in spans if s[3] >= 2]
    assert [(role, step) for _, _, role, step in later] == [(r, k) for k in range(2, 7) for r in (0, 1)]
    for a, b in zip(later, later[1:]):
        assert a[1] <= b[0] + 1e-3, (a, b)  # one turn ends before the next begins
    for role in range(2):
        recs = records(tmp_path, role)
        assert [r["step"] for r in recs] == list(range(1, 7))
        assert all(0.05 <= r["own_s"] < 1.0 for r in recs[1:])  # the step's own work, not the wait
        assert not any(r["alone"] for r in recs)
        assert all(r["gc2_s"] >= 0 and 0 <= r["main_cpu_s"] <= r["cpu_s"] + 0.005 for r in recs)
        assert all(r["main_cpu_s"] < 0.9 * r["own_s"] for r in recs[1:])  # a sleep is no host work
        assert all(r["allocator"] is None for r in recs)  # no CUDA here
        for r in recs:  # the CPU time per thread adds up to the process's, to the ticks' resolution
            total = sum(t["user_s"] + t["sys_s"] for t in r["threads"].values())
            assert abs(total - r["cpu_s"]) <= 0.01 * (len(r["threads"]) + 2), r
        assert "MainThread" in recs[0]["threads"]  # Python's name for the thread, where it has one
        assert recs[2]["threads"]["spinner"]["user_s"] + recs[2]["threads"]["spinner"]["sys_s"] >= 0.08
        assert not any("spinner" in r["threads"] for i, r in enumerate(recs) if i != 2)
    assert records(tmp_path, 1)[-1]["wait_s"] < 0.05  # role 1 does not wait after the last step
    for role in range(2):  # the full collection is recorded in the step it fell in, and only there
        recs = records(tmp_path, role)
        assert recs[3]["gc2_s"] > 0 and all(r["gc2_s"] == 0 for r in recs[4:])


def test_a_partner_that_dies_leaves_the_other_run_going_on_alone(tmp_path):
    fifos(tmp_path)
    survivor = turn_taker(tmp_path, 0, 6, 6)
    partner = turn_taker(tmp_path, 1, 6, 6)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the partner has finished its step 2
        if (tmp_path / "rec1.jsonl").exists() and len(records(tmp_path, 1)) >= 2:
            break
        time.sleep(0.05)
    partner.send_signal(signal.SIGKILL)
    partner.wait()
    t0 = time.monotonic()
    out, _ = survivor.communicate(timeout=60)
    assert survivor.returncode == 0, out
    assert time.monotonic() - t0 < 15  # it noticed within a few of its polls, not at a timeout
    recs = records(tmp_path, 0)
    assert [r["step"] for r in recs] == list(range(1, 7))
    assert recs[-1]["alone"] and not recs[0]["alone"]


def sweep_doc(tmp_path: Path, **top) -> Path:
    doc = {
        "name": "lock",
        "hardware": "any",
        "trainer": "specforge-cli",
        "arms": ["baseline", "aa"],
        "pairing": "lockstep",
        "steps": 4,
        "warmup_steps": 1,
        "cells": [{"config": str(TINY), "batch_size": [2], "seq_len": [128]}],
        **top,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("top", "needle"),
    [
        ({"arms": ["baseline", "aa", "nopoll"]}, "exactly two arms, got 3"),
        ({"warmup_steps": 0}, "warmup_steps of at least 1"),
        (
            {"trainer": "embedded"},
            "trainer: specforge-cli",
        ),
        ({"pairing": "together"}, "pairing: expected one of sequential, lockstep"),
        # both runs of a pair would wait on the one warm server until their timeout (83 s, both
        # runs "timeout", before this check)
        ({"trainer_python_fork": True}, "trainer_python_fork: true forks one run at a time"),
    ],
)
def test_a_lockstep_sweep_it_cannot_run_is_refused_in_one_line(tmp_path, top, needle):
    with pytest.raises(SweepError) as e:
        load_config(sweep_doc(tmp_path, **top))
    assert needle in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------ the real SpecForge CLI


def build_ab(root: Path) -> dict:
    cache = root / "inputs"
    prep = [
        sys.executable,
        "-m",
        "bench.trainers.specforge_cli.inputs",
        str(CONFIGS / "train" / "tiny-offline.yaml"),
    ]
    subprocess.run(
        [*prep, "--seq-len", "128", "--output-dir", str(cache)], cwd=REPO, check=True, capture_output=True
    )
    argv = [sys.executable, "-m", "bench", "ab", "--trainer", "specforge-cli", "-c", str(cache / "run.yaml")]
    argv += ["--python", str(upstream_python()), "--out", str(root / "out"), "--seq-len", "128"]
    argv += ["--arms", "baseline,aa", "--pairs", "2", "--steps", "5"]  # lockstep: bench ab's default here
    argv += ["--set-sweep", "prime_runs=1"]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {"output": r.stdout + r.stderr}


@pytest.fixture(scope="module")
def ab(tmp_path_factory):
    root, done = built_once(tmp_path_factory, "specforge-lockstep", build_ab)
    return root / "out", done["output"]


def metrics(rdir: Path) -> list[dict]:
    return [json.loads(line) for line in (rdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_lockstep_ab_of_the_real_cli_alternates_steps_and_times_each_by_its_own_turn(ab):
    out, _ = ab
    for repeat in (1, 2):
        rdirs = sorted((out / "runs").glob(f"*_r{repeat}"))
        assert len(rdirs) == 2
        spans = []
        for rdir in rdirs:
            assert json.loads((rdir / "run.json").read_text())["status"] == "ok"
            recs = {r["step"]: r for r in map(json.loads, (rdir / "lockstep.jsonl").read_text().splitlines())}
            rows = metrics(rdir)
            assert [r["step"] for r in rows] == list(range(1, 6))
            assert all(r["step_time_s"] == recs[r["step"]]["own_s"] for r in rows[1:])
            assert rows[0]["step_time_s"] != recs[1]["own_s"]  # step 1, no turn yet: SpecForge's window
            spans += [(r["started"], r["ended"], rdir.name) for k, r in recs.items() if k >= 2]
            cell = json.loads((rdir / "cell.json").read_text())
            assert cell["pairing"]["mode"] == "lockstep"
            vram = json.loads((rdir / "vram.json").read_text())  # the pair's poll, drawn per run's process
            assert (vram["scope"], vram["status"]) == ("process", "unavailable")  # no GPU library here
            assert vram["pid"] != os.getpid() and isinstance(vram["pid"], int)  # the run's training process
        spans.sort()
        assert all(a[1] <= b[0] + 1e-3 and a[2] != b[2] for a, b in zip(spans, spans[1:]))
        losses = [[r["loss"] for r in metrics(d)] for d in rdirs]
        assert losses[0] == losses[1]  # baseline and aa compute the same, turns or not
    assert not [p for p in (out / "pairs").rglob("*") if p.is_fifo()]  # nothing left that cannot be copied


@pytest.mark.slow
def test_bench_ab_of_the_cli_runs_lockstep_pairs_with_the_heap_frozen_by_default(ab):
    """No pairing flag given (build_ab): the README's one command is the precise mode."""
    out, _ = ab
    doc = yaml.safe_load((out / "ab.yaml").read_text())
    assert (doc["pairing"], doc["trainer_gc_freeze"], doc["warmup_steps"]) == ("lockstep", True, 3)
    runs = list(csv.DictReader((out / "runs.csv").open()))
    assert [(r["warmup_steps"], r["steps_measured"]) for r in runs] == [("3", "2")] * 4  # 5 steps - 3
    assert all((out / "runs" / r["run_id"] / "gc_freeze.json").is_file() for r in runs)


@pytest.mark.slow
def test_prime_runs_runs_one_discarded_pair_taking_turns_before_the_first_measured_pair(ab):
    out, text = ab
    primed = sorted((out / "prime").iterdir())
    assert [d.name.rsplit("_", 2)[-2:] for d in primed] == [["aa", "prime1"], ["baseline", "prime1"]]
    spans = []
    for rdir in primed:
        assert json.loads((rdir / "run.json").read_text())["status"] == "ok"
        assert json.loads((rdir / "cell.json").read_text())["pairing"]["mode"] == "lockstep"
        recs = [json.loads(line) for line in (rdir / "lockstep.jsonl").read_text().splitlines()]
        assert [r["step"] for r in recs] == list(range(1, 6))
        spans += [(r["started"], r["ended"], rdir.name) for r in recs[1:]]
    spans.sort()
    assert all(a[1] <= b[0] + 1e-3 and a[2] != b[2] for a, b in zip(spans, spans[1:]))
    first_measured = min(
        json.loads(line)["started"]
        for rdir in (out / "runs").glob("*_r1")
        for line in (rdir / "lockstep.jsonl").read_text().splitlines()
    )
    assert spans[-1][1] < first_measured  # the priming pair ran before the first measured pair
    assert text.count("as a pair, discarded: it primes the caches") == 2
    assert len(list(csv.DictReader((out / "runs.csv").open()))) == 4  # never read as a result


@pytest.mark.slow
def test_the_report_says_how_a_lockstep_pair_was_timed(ab):
    out, text = ab
    report = (out / "report.md").read_text()
    assert "taking turns on the card one optimizer step each" in report
    assert "Peak VRAM not polled: the pair shares the card" in report
    assert "runs: 4 ok" in text


@pytest.mark.slow
def test_each_run_of_the_real_cli_records_the_module_classes_it_trained(ab):
    """instrument.py's census after step 1, from inside SpecForge's process: the draft's stock
    Qwen3 modules and no Liger one in a run without Liger, so runs.csv says the arm was in effect."""
    out, _ = ab
    for rdir in sorted((out / "runs").glob("*_r*")):
        census = json.loads((rdir / "modules.json").read_text())
        types = json.loads((rdir / "run.json").read_text())["draft_module_types"]
        assert types == census["module_types"] and census["matched_tensors"] == census["trained_tensors"]
        assert {"Qwen3RMSNorm", "Qwen3MLP"} <= set(types) and not [t for t in types if t.startswith("Liger")]
    runs = list(csv.DictReader((out / "runs.csv").open()))
    assert {r["arm_in_effect"] for r in runs} == {"yes"}


@pytest.mark.slow
def test_the_step_readout_names_each_pair_and_its_delta(ab, tmp_path):
    out, _ = ab
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "step_pauses.py"), str(out), "--from-step", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("r1: baseline ") and "Δ samples/s" in lines[0]
    assert lines[-1].startswith("aa: 2 pairs: mean Δ")
    # nvidia-smi's samples (as scripts/h200_sweeps.sh writes them): one idle sample inside a step
    # (inside step 1, the only step here longer than a sample's offset: CPU steps take ~20 ms)
    rec = json.loads((sorted((out / "runs").glob("*_r1"))[0] / "lockstep.jsonl").read_text().splitlines()[0])
    stamp = datetime.fromtimestamp((rec["started"] + rec["ended"]) / 2, tz=timezone.utc)
    smi = tmp_path / "smi.csv"
    smi.write_text(f"{stamp:%Y/%m/%d %H:%M:%S.%f}, 1980, 3201, 500.0, 40, 0, 0x0000000000000000\n")
    argv = [sys.executable, str(REPO / "scripts" / "step_pauses.py"), str(out), "--from-step", "1"]
    r = subprocess.run([*argv, "--smi", str(smi)], capture_output=True, text=True, timeout=60)
    idle = r.stdout.splitlines()[-1]
    # step 1 runs in both runs at once: the sample falls in both runs' step 1, and in no other step
    assert idle.startswith("steps holding a 0% utilisation sample: 2 of ") and ", 0 of 16 other" in idle, idle
    r = subprocess.run([*argv, "--threads", "2"], capture_output=True, text=True, timeout=60)
    lines = r.stdout.splitlines()
    assert lines[0].startswith("r0: baseline ") and lines[0].endswith("(priming pair, discarded)")
    by_thread = [line for line in lines if "CPU s/step by thread: " in line]
    assert len(by_thread) == 6 and all("MainThread " in line and "(system " in line for line in by_thread)
    assert lines[-1].startswith("aa: 2 pairs: mean Δ")  # the priming pair is not in it


@pytest.mark.slow
def test_a_pair_cut_in_half_is_run_again_whole_on_resume_and_finished_pairs_are_kept(ab, tmp_path):
    """A lockstep pair runs whole or not at all: with one of its runs unfinished (the driver killed
    mid-pair), --resume runs both of its runs again, together; a finished pair stays as it was."""
    out, _ = ab
    copy = tmp_path / "out"
    shutil.copytree(out, copy, symlinks=True)
    r1 = sorted((copy / "runs").glob("*_r1"))
    r2 = sorted((copy / "runs").glob("*_r2"))
    before = {d.name: (d / "launch.json").read_text() for d in r1 + r2}
    (r2[0] / "run.json").unlink()  # one run of pair 2 never finished
    argv = [sys.executable, "-m", "bench", "sweep", str(copy / "ab.yaml"), "--out", str(copy), "--resume"]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "2 of 4 runs already finished" in r.stdout or "2 of 4 runs already finished" in r.stderr
    for d in r1:
        assert (d / "launch.json").read_text() == before[d.name]  # kept
    for d in r2:
        assert (d / "launch.json").read_text() != before[d.name]  # both run again
        assert json.loads((d / "run.json").read_text())["status"] == "ok"
    starts = {json.loads((d / "launch.json").read_text())["start_time"] for d in r2}
    assert len(starts) == 1  # together


def test_a_lockstep_metrics_row_takes_its_turn_from_step_2_and_keeps_step_1():
    from bench.trainers.specforge_cli.wrapper import own_step_time

    row = {"step": 2, "step_time_s": 2.4, "samples": 8, "tokens": 16384, "samples_per_s": 3.3}
    rec = {"own_s": 1.2, "peak_reserved_bytes": 2**31, "peak_allocated_bytes": None}
    out = own_step_time(row, rec)  # SpecForge's window held the partner's step: the turn's own time
    assert (
        out["step_time_s"] == 1.2 and out["samples_per_s"] == 8 / 1.2 and out["tokens_per_s"] == 16384 / 1.2
    )
    assert out["torch_peak_reserved_gib"] == 2.0 and out["torch_peak_allocated_gib"] is None
    first = own_step_time({**row, "step": 1}, rec)  # both runs at once, no turn yet: SpecForge's window
    assert first["step_time_s"] == 2.4 and first["samples_per_s"] == 3.3
    assert own_step_time({**row, "step": 1}, None)["step_time_s"] == 2.4
    assert own_step_time(row, None)["step_time_s"] is None  # a step without its turn has no time
