"""Sweep driver against the fake trainer (tests/fake_trainer.py): outcomes, refusals, resume."""

from __future__ import annotations

import csv
import importlib.util
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import yaml

from bench.__main__ import main
from bench.config import plan
from bench.fileio import atomic_write_json, atomic_write_text, read_json, read_jsonl
from bench.probe import hardware, vram
from bench.procs import launcher, proctable
from bench.results import report
from bench.run import console, preflight
from bench.run.sweepdir import is_finished
from bench.trainers import load_config, plug_for

REPO = Path(__file__).resolve().parents[1]
CPU_INFO = {"vendor": "none", "gpu_names": [], "gpu_count": 0, "kind": "cpu"}


# ---------------------------------------------------------------- stand-ins for the other bench modules


def fake_check_hardware(expected, info=None, config=None):
    info = info or CPU_INFO
    if {"cpu", "any", info.get("kind")} & set(expected):
        return None
    return f"this machine ({info.get('kind')}) is not one of: {', '.join(expected)}"


class FakePoller:
    def __init__(self, run_dir, interval_s=0.05, backend="auto"):
        self.run_dir = Path(run_dir)

    def start(self):
        pass

    def stop(self):
        summary = {"backend": "none", "status": "unavailable", "reason": "no GPU", "devices": []}
        atomic_write_json(self.run_dir / "vram.json", summary)
        return summary


def fake_build_report(out_dir):
    out_dir = Path(out_dir)
    rows = []
    for rdir in sorted((out_dir / "runs").iterdir()):
        doc = read_json(rdir / "run.json") or {}
        rows.append((rdir.name, doc.get("status")))
    atomic_write_text(out_dir / "runs.csv", "run_id,status\n" + "".join(f"{r},{s}\n" for r, s in rows))
    table = "| run | status |\n|---|---|\n" + "".join(f"| {r} | {s} |\n" for r, s in rows)
    atomic_write_text(out_dir / "report.md", "# Report\n\n" + table + "\nnotes\n")
    return {}


def install_missing_stubs() -> None:
    """For subprocess sweeps: stand in for bench modules that are not written yet (real ones win)."""
    stubs = {
        "bench.probe.hardware": {"detect": lambda: dict(CPU_INFO), "check_hardware": fake_check_hardware},
        "bench.probe.vram": {"VramPoller": FakePoller},
        "bench.results.report": {"build_report": fake_build_report},
    }
    for name, attrs in stubs.items():
        if importlib.util.find_spec(name) is None:
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs)
            sys.modules[name] = mod


@pytest.fixture
def fakes(monkeypatch):
    monkeypatch.chdir(REPO)  # `-m tests.fake_trainer` resolves from the repo root
    monkeypatch.setattr(hardware, "detect", lambda: dict(CPU_INFO))
    monkeypatch.setattr(hardware, "check_hardware", fake_check_hardware)
    monkeypatch.setattr(vram, "VramPoller", lambda run_dir, interval_s: FakePoller(run_dir, interval_s))
    monkeypatch.setattr(report, "build_report", fake_build_report)
    monkeypatch.setattr(preflight, "liger_skip_reason", lambda: preflight.NO_GPU)
    monkeypatch.setattr(launcher, "KILL_GRACE_S", 2.0)
    monkeypatch.setattr(vram, "preflight", lambda: None)


# ---------------------------------------------------------------- helpers


def train_configs(tmp: Path) -> dict[str, str]:
    paths = {}
    for mode in ("offline", "online"):
        path = tmp / "train" / f"tiny-{mode}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "profile": "tiny",
            "mode": mode,
            "data": {"source": "synthetic"},
            "training": {"accumulation_steps": 1, "num_anchors": 8},
            "model": {"attention_backend": "sdpa"},
        }
        path.write_text(yaml.safe_dump(doc))
        paths[mode] = str(path)
    return paths


def sweep_file(tmp: Path, cells: list[dict], name: str = "sweep.yaml", **top) -> Path:
    doc = {
        "name": "t",
        "hardware": "cpu",
        "trainer_module": "tests.fake_trainer",
        "arms": ["baseline"],
        "repeats": 1,
        "steps": 4,
        "warmup_steps": 1,
        "timeout_s": 30,
        "poll_interval_s": 0.05,
        "cells": cells,
        **top,
    }
    path = tmp / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def statuses(out: Path) -> dict[str, dict]:
    return {p.name: read_json(p / "run.json") for p in sorted((out / "runs").iterdir())}


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def launched_groups(out: Path) -> list[int]:
    recs = [read_json(p) for p in out.glob("runs/*/launch.json")] + [
        read_json(p) for p in out.glob("cache/*.launch.json")
    ]
    return [r["pgid"] for r in recs if isinstance(r, dict) and "pgid" in r]


# ---------------------------------------------------------------- commands


def test_commands_single_process_and_torchrun(tmp_path):
    tc = train_configs(tmp_path)
    cells = [{"config": tc["offline"], "batch_size": 2, "seq_len": 128, "set": {"training.num_anchors": 16}}]
    cfg = load_config(sweep_file(tmp_path, cells, arms=["baseline", "liger"], gpus_per_run=[1, 2]))
    runs = plan(cfg)
    base, liger = runs[0], runs[1]
    cmd = plug_for(cfg).train_command(cfg, base, Path("out/runs/x"), Path("out/cache/k"))
    assert cmd[:4] == [sys.executable, "-m", "tests.fake_trainer", "train"]
    sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
    assert sets == [
        "training.steps=4",
        "training.batch_size=2",
        "data.seq_len=128",
        "data.cache_dir=out/cache/k",
        "model.use_liger_kernel=false",
        "training.num_anchors=16",
    ]
    assert cmd[-2:] == ["--output-dir", "out/runs/x"] and "--use-liger-kernel" not in cmd
    assert "--use-liger-kernel" in plug_for(cfg).train_command(cfg, liger, Path("r"), None)
    g2 = next(r for r in runs if r.cell.gpus == 2)
    cmd = plug_for(cfg).train_command(cfg, g2, Path("r"), None)
    assert cmd[:7] == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--standalone",
        "-m",
    ]
    # multi-node commands: tests/test_multinode.py


def test_dry_run_prints_plan_and_writes_nothing(tmp_path, fakes, capsys):
    tc = train_configs(tmp_path)
    cells = [
        {"config": tc["offline"], "batch_size": 2, "seq_len": 64},
        {"config": tc["online"], "batch_size": 2, "seq_len": 64},
    ]
    cfg = sweep_file(tmp_path, cells, arms=["baseline", "liger"], repeats=2)
    before = snapshot(tmp_path)
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()
    ids = [r.run_id for r in plan(load_config(cfg))]
    assert all(i in printed for i in ids) and printed.index(ids[0]) < printed.index(ids[1])
    assert "prepare" in printed and "--output-dir" in printed and preflight.NO_GPU in printed


# ---------------------------------------------------------------- refusals


def test_hardware_mismatch_refused(tmp_path, fakes, monkeypatch, capsys):
    tc = train_configs(tmp_path)
    cfg = sweep_file(
        tmp_path, [{"config": tc["online"], "batch_size": 1, "seq_len": 64}], hardware=["h100", "h200"]
    )
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == "error: this machine (cpu) is not one of: h100, h200\n" and not out.exists()


def test_too_many_gpus_refused(tmp_path, fakes, monkeypatch, capsys):
    tc = train_configs(tmp_path)
    cell = {"config": tc["online"], "batch_size": 1, "seq_len": 64}
    out = tmp_path / "out"
    monkeypatch.setattr(hardware, "detect", lambda: {**CPU_INFO, "kind": "h200", "gpu_count": 1})
    assert (
        main(["sweep", str(sweep_file(tmp_path, [cell], hardware="h200", gpus_per_run=2)), "--out", str(out)])
        == 2
    )
    assert "gpus_per_run: 2 GPUs per run, but this machine has 1" in capsys.readouterr().err
    monkeypatch.setattr(hardware, "detect", lambda: dict(CPU_INFO))
    assert main(["sweep", str(sweep_file(tmp_path, [cell], gpus_per_run=3)), "--out", str(out)]) == 2
    assert "expected at most 2 (gloo)" in capsys.readouterr().err
    assert not out.exists()


def test_existing_sweep_needs_resume_or_force(tmp_path, fakes, capsys):
    tc = train_configs(tmp_path)
    cfg = sweep_file(tmp_path, [{"config": tc["online"], "batch_size": 1, "seq_len": 64}])
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out)]) == 0
    before = snapshot(out)
    capsys.readouterr()
    assert main(["sweep", str(cfg), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume" in err and "--force" in err and "OUT=" in err
    assert snapshot(out) == before
    # --resume with a changed config names the keys that differ, and changes nothing
    changed = sweep_file(
        tmp_path, [{"config": tc["online"], "batch_size": 2, "seq_len": 64}], name="changed.yaml", steps=5
    )
    assert main(["sweep", str(changed), "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "cells[0].batch_size, steps differ" in err and err.count("\n") == 1
    assert snapshot(out) == before
    # --resume of a finished sweep runs nothing and rebuilds the report
    assert main(["sweep", str(cfg), "--out", str(out), "--resume"]) == 0
    assert "1 of 1 runs already finished" in capsys.readouterr().out
    assert read_json(out / "runs" / "tiny_online_bs1_s64_baseline_r1" / "run.json")["status"] == "ok"
    assert len(read_json(out / "sweep.json")["resumes"]) == 1


def test_report_and_compare_bad_input(tmp_path, fakes, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no runs/ directory" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


# ---------------------------------------------------------------- a sweep with every outcome


@pytest.fixture(scope="module")
def failure_sweep(tmp_path_factory):
    """One sweep with every outcome (run once for the tests below): (out dir, exit status, stdout, stderr)."""
    tmp_path = tmp_path_factory.mktemp("failures")
    mp = pytest.MonkeyPatch()
    mp.chdir(REPO)
    mp.setattr(hardware, "detect", lambda: dict(CPU_INFO))
    mp.setattr(hardware, "check_hardware", fake_check_hardware)
    mp.setattr(vram, "VramPoller", lambda run_dir, interval_s: FakePoller(run_dir, interval_s))
    mp.setattr(report, "build_report", fake_build_report)
    mp.setattr(preflight, "liger_skip_reason", lambda: preflight.NO_GPU)
    mp.setattr(vram, "preflight", lambda: None)
    mp.setattr(launcher, "KILL_GRACE_S", 2.0)
    tc = train_configs(tmp_path)

    def cell(label, **fake):
        sets = {f"fake.{k}": v for k, v in fake.items()}
        return {"config": tc["online"], "batch_size": 1, "seq_len": 64, "label": label, "set": sets}

    cells = [
        cell("crash", crash_at_step=3),
        cell("oom", oom=True),
        cell("rawoom", raw_oom=True),
        {**cell("hang", hang_at_step=3, spawn_child=True), "timeout_s": 1.5},
        {"config": tc["offline"], "batch_size": 1, "seq_len": 64, "set": {"data.fail_prepare": True}},
        {"config": tc["offline"], "batch_size": 2, "seq_len": 32},
        {"config": tc["offline"], "batch_size": 4, "seq_len": 32},
        cell("ok", step_sleep=0.01),
        {**cell("hangexit", hang_at_exit=True), "timeout_s": 1.5},
    ]
    out = tmp_path / "out"
    cfg_path = sweep_file(tmp_path, cells, arms=["baseline", "liger"])
    import contextlib
    import io

    so, se = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        rc = main(["sweep", str(cfg_path), "--out", str(out)])
    mp.undo()
    return out, rc, so.getvalue(), se.getvalue()


@pytest.mark.parametrize(
    ("run", "status", "reason"),
    [
        ("tiny_online_bs1_s64_crash", "error", "RuntimeError: fake crash at step 3 on rank 0 (exit code 1)"),
        ("tiny_online_bs1_s64_oom", "oom", "CUDA out of memory"),  # the trainer's own record (exit 3)
        ("tiny_online_bs1_s64_rawoom", "oom", "CUDA out of memory"),  # found in the log
        ("tiny_online_bs1_s64_hang", "timeout", "timed out after 1.5 s at step 2/4"),
        (
            "tiny_offline_bs1_s64",
            "error",
            "cache prepare failed: error: fake prepare failure (data.fail_prepare)",
        ),
        ("tiny_offline_bs2_s32", "ok", None),
        ("tiny_online_bs1_s64_ok", "ok", None),
        ("tiny_online_bs1_s64_hangexit", "ok", None),  # finished, then hung: the result stands
    ],
)
def test_each_outcome_is_recorded_with_its_reason(failure_sweep, run, status, reason):
    out = failure_sweep[0]
    doc = read_json(out / "runs" / f"{run}_baseline_r1" / "run.json")
    assert doc["status"] == status
    if reason is not None:
        assert reason in doc["reason"]
    if run.endswith("hang"):
        assert doc["config"]  # the trainer's run.json fields are kept
    if run.endswith("hangexit"):
        assert "after recording its end status" in doc["driver_note"]


def test_failed_runs_make_the_sweep_exit_nonzero_and_it_goes_on(failure_sweep):
    out, rc, printed, err = failure_sweep
    runs = statuses(out)
    assert len(runs) == 18  # every planned run has a record: the sweep went on after each failure
    assert rc == 1 and "5 of 18 runs did not finish ok" in err
    assert f"skipped 9 run(s): {preflight.NO_GPU}" in printed
    assert "report: " in printed and "| run | status |" in printed
    for rid, doc in runs.items():
        if rid.endswith("_liger_r1"):
            assert doc == {**doc, "status": "skipped", "reason": preflight.NO_GPU, "arm": "liger"}
            assert (out / "runs" / rid / "cell.json").exists()
            assert not (out / "runs" / rid / "stdout.log").exists()
    for pgid in launched_groups(out):  # the hung run's grandchild died with its group
        assert not launcher.group_alive(pgid)


def test_offline_cells_share_one_cache_and_records_are_complete(failure_sweep):
    out = failure_sweep[0]
    caches = {
        read_json(out / "runs" / f"tiny_offline_bs{b}_s32_baseline_r1" / "cell.json")["cache_dir"]
        for b in (2, 4)
    }
    assert len(caches) == 1 and [p.name for p in (out / "cache").glob("tiny_s32_*.log")] != []
    assert len(list((out / "cache").glob("tiny_s32_*.launch.json"))) == 1  # prepared once
    cell_json = read_json(out / "runs" / "tiny_offline_bs2_s32_baseline_r1" / "cell.json")
    assert cell_json["command"][-1] == str(out / "runs" / "tiny_offline_bs2_s32_baseline_r1")
    assert cell_json["cache_dir"] and cell_json["order_index"] == 10 and cell_json["num_anchors"] == 8
    keys = {"run_id", "cell_id", "profile", "mode", "warmup_steps", "loss_tolerance", "gpus", "nodes"}
    assert keys <= set(cell_json)
    sweep = read_json(out / "sweep.json")
    assert sweep["order"] == [r.run_id for r in plan(load_config(Path(sweep["config_path"])))]
    # what was detected, and the machine's facts read with it (the report's provenance, poller or not)
    assert (
        {k: sweep["hardware"][k] for k in CPU_INFO} == CPU_INFO
        and sweep["argv"]
        and sweep["config"]["steps"] == 4
    )
    assert sweep["hardware"]["hostname"] == socket.gethostname() and sweep["hardware"]["power_limits_w"] == []


@pytest.mark.slow
def test_torchrun_runs_and_its_timeout_kills_every_rank(tmp_path, fakes):
    tc = train_configs(tmp_path)
    cell = {"config": tc["online"], "batch_size": 1, "seq_len": 32, "gpus_per_run": 2}
    cells = [cell, {**cell, "label": "hang", "set": {"fake.hang_at_step": 2}, "timeout_s": 4}]
    out = tmp_path / "out"
    assert main(["sweep", str(sweep_file(tmp_path, cells)), "--out", str(out)]) == 1  # one run timed out
    runs = statuses(out)
    ok = runs["tiny_online_bs1_s32_g2_baseline_r1"]
    assert ok["status"] == "ok" and ok["world_size"] == 2
    assert read_json(out / "runs" / "tiny_online_bs1_s32_g2_baseline_r1" / "cell.json")["gpus"] == 2
    hang = runs["tiny_online_bs1_s32_g2_hang_baseline_r1"]
    assert hang["status"] == "timeout" and hang["reason"].startswith("timed out after 4 s")
    for pgid in launched_groups(out):
        assert not launcher.group_alive(pgid)


def test_a_rank_that_dies_ends_the_tree_with_its_reason(tmp_path, fakes):
    """Rank 1 crashes while rank 0 waits on it (as in a collective): torchrun ends the tree, no rank
    is left holding memory, and the run records rank 1's exception, not torchrun's summary."""
    tc = train_configs(tmp_path)
    sets = {"fake.crash_at_step": 2, "fake.crash_rank": 1}
    cell = {"config": tc["online"], "batch_size": 1, "seq_len": 32, "gpus_per_run": 2, "set": sets}
    out = tmp_path / "out"
    assert main(["sweep", str(sweep_file(tmp_path, [{**cell, "timeout_s": 60}])), "--out", str(out)]) == 1
    doc = statuses(out)["tiny_online_bs1_s32_g2_baseline_r1"]
    assert doc["status"] == "error"
    assert doc["reason"].startswith("rank 1: RuntimeError: fake crash at step 2 on rank 1 (exit code ")
    for pgid in launched_groups(out):
        assert not launcher.group_alive(pgid)


def test_liger_skip_reasons(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert preflight.liger_skip_reason() == preflight.NO_GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert preflight.liger_skip_reason() == preflight.NO_LIGER
    monkeypatch.setattr(torch.version, "hip", "6.2.41133", raising=False)  # ROCm: no pip-installed triton
    assert preflight.liger_skip_reason() == preflight.NO_LIGER_ROCM and "--no-deps" in preflight.NO_LIGER_ROCM


def test_keyboard_interrupt_stops_the_run_and_leaves_it_unfinished(tmp_path, fakes, monkeypatch, capsys):
    tc = train_configs(tmp_path)
    cfg = sweep_file(
        tmp_path, [{"config": tc["online"], "batch_size": 1, "seq_len": 64, "set": {"fake.hang": True}}]
    )

    def interrupting_ticker(*args):
        def tick():
            raise KeyboardInterrupt

        return tick

    monkeypatch.setattr(console.Progress, "ticker", interrupting_ticker)
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out)]) == 130
    rdir = out / "runs" / "tiny_online_bs1_s64_baseline_r1"
    assert not is_finished(rdir) and "exit_code" not in read_json(rdir / "launch.json")
    assert not launcher.group_alive(read_json(rdir / "launch.json")["pgid"])
    assert "--resume redoes it" in capsys.readouterr().err


def test_force_starts_over_and_keeps_the_cache(tmp_path, fakes):
    tc = train_configs(tmp_path)
    cfg = sweep_file(tmp_path, [{"config": tc["offline"], "batch_size": 1, "seq_len": 64}])
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out)]) == 0
    rdir = out / "runs" / "tiny_offline_bs1_s64_baseline_r1"
    (rdir / "marker").write_text("old")
    (out / "summary.csv").write_text("old")
    cache = next(p for p in (out / "cache").iterdir() if p.is_dir())
    (cache / "marker").write_text("kept")
    assert main(["sweep", str(cfg), "--out", str(out), "--force"]) == 0
    assert not (rdir / "marker").exists() and read_json(rdir / "run.json")["status"] == "ok"
    assert not (out / "summary.csv").exists() and (cache / "marker").exists()
    assert main(["sweep", str(cfg), "--out", str(out), "--force", "--resume"]) == 2


# ---------------------------------------------------------------- kill -9 of the driver, then --resume


def bench_cmd(*args: str) -> list[str]:
    if all(
        importlib.util.find_spec(m)
        for m in ("bench.probe.hardware", "bench.probe.vram", "bench.results.report")
    ):
        return [sys.executable, "-m", "bench", *args]
    boot = "import runpy, tests.test_driver as t; t.install_missing_stubs(); runpy.run_module('bench', run_name='__main__', alter_sys=True)"
    return [sys.executable, "-c", boot, *args]


@pytest.mark.slow
def test_kill_dash_9_then_resume(tmp_path):
    tc = train_configs(tmp_path)
    fake = {"fake.step_sleep": 0.1, "fake.spawn_child": True}
    cells = [
        {"config": tc["offline"], "batch_size": 2, "seq_len": 32, "set": fake},
        {"config": tc["online"], "batch_size": 2, "seq_len": 32, "set": fake},
    ]
    cfg = sweep_file(tmp_path, cells, arms=["baseline", "liger"], repeats=3, steps=8)
    out = tmp_path / "out"
    planned = [r.run_id for r in plan(load_config(cfg))]
    launched = [r for r in planned if "_baseline_" in r]
    log = open(tmp_path / "first.log", "wb")
    proc = subprocess.Popen(bench_cmd("sweep", str(cfg), "--out", str(out)), cwd=REPO, stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:  # wait for two finished runs and a third in flight
            finished = [r for r in launched if is_finished(out / "runs" / r)]
            in_flight = [
                r for r in launched if (out / "runs" / r / "metrics.jsonl").exists() and r not in finished
            ]
            if len(finished) >= 2 and in_flight:
                break
            time.sleep(0.02)
        else:
            pytest.fail("the sweep did not get going: " + (tmp_path / "first.log").read_text()[-2000:])
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not all(is_finished(out / "runs" / r) for r in planned)
    res = subprocess.run(
        bench_cmd("sweep", str(cfg), "--out", str(out), "--resume"), cwd=REPO, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "left running by an earlier driver" in res.stdout  # the orphaned grandchild was stopped
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(planned)
    for rid in planned:
        rdir = out / "runs" / rid
        assert is_finished(rdir), rid
        doc = read_json(rdir / "run.json")
        assert doc["status"] == ("ok" if rid in launched else "skipped"), (rid, doc)
        if rid in launched:
            assert [m["step"] for m in read_jsonl(rdir / "metrics.jsonl")] == list(range(1, 9))
    with open(out / "runs.csv") as f:
        ids = [row["run_id"] for row in csv.DictReader(f)]
    assert sorted(ids) == sorted(planned)
    for pgid in launched_groups(out):
        assert not launcher.group_alive(pgid)
    assert len(read_json(out / "sweep.json")["resumes"]) == 1


# ---------------------------------------------------------------- priming runs (prime_runs)


def test_priming_runs_go_first_per_arm_and_never_into_the_results(tmp_path, fakes, capsys):
    tc = train_configs(tmp_path)
    cell = {"config": tc["online"], "batch_size": 1, "seq_len": 32}
    cfg = sweep_file(tmp_path, [cell], arms=["baseline", "aa"], repeats=2, prime_runs=1)
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out), "--dry-run"]) == 0
    assert "plus 1 discarded priming run(s) per cell and arm" in capsys.readouterr().out
    assert main(["sweep", str(cfg), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    stem = "tiny_online_bs1_s32"
    primes = sorted(p.name for p in (out / "prime").iterdir())
    assert primes == [f"{stem}_aa_prime1", f"{stem}_baseline_prime1"]
    assert all(read_json(out / "prime" / p / "run.json")["status"] == "ok" for p in primes)
    assert sorted(statuses(out)) == [f"{stem}_{a}_r{r}" for a in ("aa", "baseline") for r in (1, 2)]
    lines = [line for line in printed.splitlines() if line.startswith(stem)]
    for arm in ("baseline", "aa"):  # each arm's priming run comes before its first measured run
        first = next(i for i, line in enumerate(lines) if line.startswith(f"{stem}_{arm}_r"))
        prime = next(i for i, line in enumerate(lines) if line.startswith(f"{stem}_{arm}_prime1: ok"))
        assert prime < first and "discarded" in lines[prime]

    # a resume primes again only the arms that still have runs to do (the caches may be cold now)
    started = {p: read_json(out / "prime" / p / "launch.json")["start_time"] for p in primes}
    (out / "runs" / f"{stem}_aa_r2" / "run.json").unlink()
    time.sleep(1.1)  # start_time has one-second resolution
    assert main(["sweep", str(cfg), "--out", str(out), "--resume"]) == 0
    again = {p: read_json(out / "prime" / p / "launch.json")["start_time"] for p in primes}
    assert again[f"{stem}_aa_prime1"] != started[f"{stem}_aa_prime1"]
    assert again[f"{stem}_baseline_prime1"] == started[f"{stem}_baseline_prime1"]
    assert len(statuses(out)) == 4

    assert main(["sweep", str(cfg), "--out", str(out), "--force"]) == 0  # --force starts prime/ over too
    assert sorted(p.name for p in (out / "prime").iterdir()) == primes


def test_prime_runs_out_of_range_is_one_line(tmp_path, fakes, capsys):
    tc = train_configs(tmp_path)
    cfg = sweep_file(tmp_path, [{"config": tc["online"], "batch_size": 1, "seq_len": 32}], prime_runs=4)
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "prime_runs: expected 0 to 3" in err and "\n" not in err


def test_kill_tree_ends_a_grandchild_that_left_the_session(tmp_path):
    """As torchrun's ranks do: a child in a session of its own is still found (by parent links)
    and killed with its parent, which is stopped first so that it cannot start another."""
    pidfile = tmp_path / "grandchild"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
            f"open({str(pidfile)!r}, 'w').write(str(c.pid))\n"
            "time.sleep(60)",
        ]
    )
    deadline = time.monotonic() + 20
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(pidfile.read_text())
    assert child in launcher.descendants(parent.pid)
    assert launcher.kill_tree(parent.pid) == 2
    assert parent.wait(timeout=10) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while (st := proctable.facts(child)) is not None and not st.zombie:  # reaped by init, or a zombie
        assert time.monotonic() < deadline, st
        time.sleep(0.05)


def test_a_timeout_also_ends_a_rank_that_left_the_group_when_its_parent_ignores_sigterm(
    tmp_path, monkeypatch
):
    """A launcher that does not pass the SIGTERM on (a hung torchrun) and a rank in a session of its
    own: the group kill alone would leave the rank running; kill_group ends it too."""
    monkeypatch.setattr(launcher, "KILL_GRACE_S", 0.5)
    pidfile = tmp_path / "rank"
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "rank = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'], "
        "start_new_session=True)\n"
        f"open({str(pidfile)!r}, 'w').write(str(rank.pid))\n"
        "time.sleep(60)"
    )
    rc, timed_out = launcher.run_process(
        [sys.executable, "-c", code], tmp_path / "log", tmp_path / "launch.json", timeout_s=3.0
    )
    assert timed_out and rc == -signal.SIGKILL
    rank = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while (st := proctable.facts(rank)) is not None and not st.zombie:
        assert time.monotonic() < deadline, f"the rank {rank} outlived its run: {st}"
        time.sleep(0.05)
