"""The SpecForge CLI plug: its log parsing on SpecForge's real output, its run wrapper on a run cut
mid-step, the sweep config's rules for specforge-cli cells, and a sweep through the real
upstream SpecForge (PyPI 0.2.0, in its own environment: tests/upstream_env.py) beside ours."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bench.config import SweepError, plan
from bench.record import RunDoc
from bench.trainers import load_config, plug_for
from bench.trainers.specforge_cli.log import StepCollector, parse_step_line
from bench.trainers.specforge_cli.plug import SpecForgeCliPlug, find_python, refusal
from tests.helpers import CONFIGS, REPO
from tests.upstream_env import upstream_python

LOG = REPO / "tests" / "data" / "specforge-0.2.0-cpu-stdout.log"  # a real run's stdout (tiny, CPU)


def step_lines() -> list[str]:
    return [ln for ln in LOG.read_text().splitlines() if ln.startswith("step ")]


# ---------------------------------------------------------------- parsing SpecForge's stdout


def test_every_step_line_of_a_real_run_parses_and_nothing_else_does():
    lines = LOG.read_text().splitlines()
    parsed = [p for p in map(parse_step_line, lines) if p is not None]
    assert [s for s, _ in parsed] == [1, 2, 3, 4, 5, 6]
    step, values = parsed[0]
    assert values["loss"] == pytest.approx(9.933107376098633)
    assert values["perf/optimizer_step_time_s"] > 0 and values["perf/global_samples_per_second"] > 0
    assert {"acc", "grad_norm", "lr", "perf/data_wait_time_s", "perf/train_compute_time_s"} <= set(values)


def test_a_line_cut_mid_write_is_not_a_step():
    line = step_lines()[2]
    assert parse_step_line(line) is not None
    for cut in (len(line) // 3, len(line) - 1, line.index("{") + 1):
        assert parse_step_line(line[:cut]) is None


def test_lists_are_kept_as_positions_and_non_finite_values_kept():
    step, values = parse_step_line("step 7: {'acc': [0.5, 0.25], 'loss': nan, 'lr': inf}")
    assert step == 7 and values["acc"] == [0.5, 0.25]
    assert values["loss"] != values["loss"] and values["lr"] == float("inf")


def test_per_position_accuracies_become_one_list_in_position_order():
    from bench.trainers.specforge_cli.log import metrics_row, positions

    eagle = parse_step_line("step 2: {'acc_1': 0.4, 'acc_0': 0.7, 'acc': 0.55, 'loss': 3.0}")[1]
    assert positions(eagle) == [0.7, 0.4]
    dspark = {"accuracy_position_0": 0.9, "accuracy_position_1": 0.6}
    assert positions(dspark) == [0.9, 0.6]
    assert positions(parse_step_line(step_lines()[0])[1]) is None  # SpecForge 0.2.0's DFlash: acc only
    row = metrics_row(2, [eagle], 128, 1.0, 1e9)
    assert row["accuracy"] == 0.55 and row["accuracy_by_position"] == [0.7, 0.4]


def test_ranks_of_one_step_make_one_row_timed_by_the_slowest():
    c = StepCollector(world=2, seq_len=100)
    a = {"loss": 2.0, "perf/optimizer_step_time_s": 0.5, "perf/global_samples_per_second": 16.0}
    b = {"loss": 4.0, "perf/optimizer_step_time_s": 0.8, "perf/global_samples_per_second": 10.0}
    assert c.add(1, a, 1.0, 10.0) == []  # rank 1 not yet
    (row,) = c.add(1, b, 1.1, 10.1)
    assert row["step"] == 1 and row["ranks_logged"] == 2 and row["loss"] == 3.0
    assert row["step_time_s"] == 0.8 and row["samples"] == 8 and row["samples_per_s"] == 10.0
    assert row["tokens"] == 800 and row["torch_peak_allocated_gib"] is None
    # a rank that prints nothing: the next step's line closes the previous one
    assert [r["step"] for r in c.add(2, a, 2.0, 11.0)] == []
    assert [r["step"] for r in c.add(3, a, 3.0, 12.0)] == [2]
    assert [r["step"] for r in c.flush(4.0, 13.0)] == [3]


def test_a_run_cut_by_its_timeout_mid_step_keeps_every_finished_step(tmp_path):
    """The wrapper around a process that prints a real run's log up to the middle of step 4's
    line and hangs, ended by SIGTERM to its process group as the driver's timeout does."""
    lines = LOG.read_text().splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if ln.startswith("step 4:"))
    text = "".join(lines[:at]) + lines[at][:60]
    child = f"import sys, time; sys.stdout.write({text!r}); sys.stdout.flush(); time.sleep(60)"
    wrapper = [sys.executable, "-m", "bench.trainers.specforge_cli.wrapper", "--run-dir", str(tmp_path)]
    argv = [*wrapper, "--world", "1", "--seq-len", "128", "--", sys.executable, "-c", child]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    metrics = tmp_path / "metrics.jsonl"
    while time.monotonic() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["elapsed_s"] > 0 and r["time"] > 1e9 and r["step_time_s"] > 0 for r in rows)
    assert proc.returncode == 128 + signal.SIGTERM  # SpecForge's status, passed on
    exit_doc = json.loads((tmp_path / "specforge.json").read_text())
    assert exit_doc["signals_received"] == [signal.SIGTERM] and exit_doc["exit_code"] == -signal.SIGTERM
    assert b"step 3:" in out  # its output passed through to stdout.log


def test_refusal_is_specforge_s_reason_in_one_line():
    pydantic = """Traceback (most recent call last):
  File "x.py", line 1, in <module>
pydantic_core._pydantic_core.ValidationError: 1 validation error for Config
training.batch_size
  Input should be a valid integer, unable to parse string as an integer [type=int_parsing, input_value='x', input_type=str]
    For further information visit https://errors.pydantic.dev/2.14/v/int_parsing
"""
    assert refusal(pydantic) == (
        "training.batch_size: Input should be a valid integer, unable to parse string as an integer"
    )
    plain = "Traceback...\n    raise ValueError(f\"override path\")\nValueError: override path 'training.bogus' does not exist\n"
    assert refusal(plain) == "override path 'training.bogus' does not exist"


# ---------------------------------------------------------------- the sweep config


def sweep(tmp_path: Path, cells: list[dict], **top) -> Path:
    doc = {"name": "cli", "hardware": "cpu", "out": str(tmp_path / "out"), "trainer": "specforge-cli"}
    doc |= {"trainer_python": str(sys.executable), "arms": ["baseline", "liger"], "repeats": 1}
    doc |= {"steps": 4, "warmup_steps": 1, "timeout_s": 240, "cells": cells, **top}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


TINY = str(CONFIGS / "train" / "tiny-offline.yaml")
TINY_ONLINE = str(CONFIGS / "train" / "tiny-online.yaml")  # ours, beside it: no cache to prepare


def user_config(tmp_path: Path, **data) -> str:
    doc = {
        "model": {"target_model_path": "/t", "draft_model_config": "/d.json"},
        "data": data,
        "training": {"strategy": "dflash", "accumulation_steps": 4, "num_anchors": 256},
        "run_id": "my-qwen",
    }
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def test_a_cli_cell_is_named_for_its_trainer_and_has_its_own_cache(tmp_path):
    cfg = load_config(
        sweep(
            tmp_path,
            [
                {"config": TINY, "batch_size": 2, "seq_len": 128},
                {"config": TINY, "batch_size": 2, "seq_len": 128, "trainer": "embedded"},
            ],
        )
    )
    cli, ours = cfg.cells
    assert cli.cell_id == "tiny_offline_bs2_s128_specforge-cli" and ours.cell_id == "tiny_offline_bs2_s128"
    assert cli.trainer == "specforge-cli" and cli.prepared and cli.cache_key() != ours.cache_key()
    # another interpreter: never forked from our server (its plug preloads nothing into it)
    assert plug_for(cfg, cli).preload(cfg) == [] and plug_for(cfg, ours).preload(cfg)


def test_a_user_config_is_passed_through_and_read_in_specforge_s_keys(tmp_path):
    cfg = load_config(
        sweep(
            tmp_path,
            [{"config": user_config(tmp_path, hidden_states_path="/f"), "batch_size": 1, "seq_len": 512}],
        )
    )
    (cell,) = cfg.cells
    assert (
        cell.cell_id == "my-qwen_offline_bs1_s512_specforge-cli"
        and cell.inputs == "user"
        and not cell.prepared
    )
    assert (cell.accumulation_steps, cell.num_anchors, cell.attention_backend) == (4, 256, "flex_attention")
    # the user's file untouched: only the driver's keys are set on the command line
    argv = SpecForgeCliPlug(python="/py").train_command(cfg, plan(cfg)[0], tmp_path / "r", None)
    assert argv[argv.index("--") + 1 :][:6] == [
        "/py",
        "-m",
        "specforge.cli",
        "train",
        "-c",
        str(Path(cell.train_config).resolve()),
    ]
    assert (
        "model.use_liger_kernel=false" in argv and "training.max_steps=4" in argv and "--features" not in argv
    )


def test_the_negative_control_runs_specforge_at_its_own_learning_rate_one_percent_higher(tmp_path):
    """lr_off on the SpecForge CLI: the learning rate its run config gives (the one the suite writes
    from our config for prepared inputs, the user's own, or the cell's set:) times 1.01."""
    arms = {"arms": ["baseline", "lr_off"]}
    prepared = load_config(sweep(tmp_path, [{"config": TINY, "batch_size": 2, "seq_len": 128}], **arms))
    lr = yaml.safe_load(Path(TINY).read_text())["training"]["lr"]
    plug = SpecForgeCliPlug(python="/py")
    base, off = plan(prepared)
    assert not any(a.startswith("training.learning_rate=") for a in plug.overrides(prepared, base, tmp_path))
    assert f"training.learning_rate={lr * 1.01!r}" in plug.overrides(prepared, off, tmp_path)
    mine = user_config(tmp_path, hidden_states_path="/f")
    doc = yaml.safe_load(Path(mine).read_text())
    doc["training"]["learning_rate"] = 2e-4
    Path(mine).write_text(yaml.safe_dump(doc))
    user = load_config(sweep(tmp_path, [{"config": mine, "batch_size": 1, "seq_len": 512}], **arms))
    assert f"training.learning_rate={2e-4 * 1.01!r}" in plug.overrides(user, plan(user)[1], tmp_path)
    cell_set = {"config": mine, "batch_size": 1, "seq_len": 512, "set": {"training.learning_rate": 5e-4}}
    given = load_config(sweep(tmp_path, [cell_set], **arms))
    assert f"training.learning_rate={5e-4 * 1.01!r}" in plug.overrides(given, plan(given)[1], tmp_path)


@pytest.mark.parametrize(
    "cell, top, expected",
    [
        ({"config": str(CONFIGS / "train" / "tiny-online.yaml")}, {}, "online runs need an SGLang server"),
        (
            {"set": {"model.use_liger_kernel": True}},
            {},
            "set.model.use_liger_kernel: set by the driver for trainer specforge-cli; use arms",
        ),
        ({"set": {"data.hidden_states_path": "/x"}}, {}, "the plug prepares the features"),
        (
            {},
            {"arms": ["baseline", "rmsnorm"]},
            "arms: rmsnorm cannot run on cells[0] (trainer specforge-cli)",
        ),
        (
            {"trainer": "sglang"},
            {},
            "cells[0].trainer: expected one of embedded, specforge-cli, contract, got 'sglang'",
        ),
    ],
)
def test_bad_cli_cells_are_refused_in_one_line(tmp_path, cell, top, expected):
    entry = {"config": TINY, "batch_size": 2, "seq_len": 128, **cell}
    with pytest.raises(SweepError) as e:
        load_config(sweep(tmp_path, [entry], **top))
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_a_user_config_without_offline_features_is_refused(tmp_path):
    with pytest.raises(SweepError, match="online runs need an SGLang server"):
        load_config(
            sweep(
                tmp_path,
                [
                    {
                        "config": user_config(tmp_path, train_data_path="/x.jsonl"),
                        "batch_size": 1,
                        "seq_len": 64,
                    }
                ],
            )
        )


def test_the_interpreter_comes_from_the_config_then_the_environment_then_path(tmp_path):
    cfg = load_config(sweep(tmp_path, [{"config": TINY, "batch_size": 2, "seq_len": 128}]))
    assert find_python(cfg) == sys.executable
    cfg2 = load_config(
        sweep(tmp_path, [{"config": TINY, "batch_size": 2, "seq_len": 128}], trainer_python=None)
    )
    assert find_python(cfg2, {"SPECFORGE_PYTHON": "/env/python", "PATH": ""}) == "/env/python"
    script = tmp_path / "bin" / "specforge"
    script.parent.mkdir()
    script.write_text("#!/opt/sf/bin/python3\nimport sys\n")
    script.chmod(0o755)
    assert find_python(cfg2, {"PATH": str(script.parent)}) == "/opt/sf/bin/python3"
    with pytest.raises(SweepError, match="trainer_python: name your SpecForge environment's python"):
        find_python(cfg2, {"PATH": str(tmp_path / "none")})


# ---------------------------------------------------------------- the real SpecForge, beside ours


@pytest.mark.slow
def test_both_trainers_run_one_sweep_on_the_cpu_through_the_real_specforge(tmp_path):
    python = upstream_python()
    cells = [
        {"config": TINY, "batch_size": 2, "seq_len": 128},
        {"config": TINY_ONLINE, "batch_size": 2, "seq_len": 128, "trainer": "embedded"},
    ]
    path = sweep(tmp_path, cells, trainer_python=str(python), steps=5, fork_server=False)
    r = subprocess.run(
        [sys.executable, "-m", "bench", "sweep", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "out"
    runs = pd.read_csv(out / "runs.csv").set_index("run_id")
    cli = runs.loc["tiny_offline_bs2_s128_specforge-cli_baseline_r1"]
    assert cli["status"] == "ok" and cli["steps_measured"] == 4 and cli["samples_per_s"] > 0
    assert (
        cli["trainer"] == "specforge-cli" and runs.loc["tiny_online_bs2_s128_baseline_r1", "status"] == "ok"
    )
    skipped = runs.loc["tiny_offline_bs2_s128_specforge-cli_liger_r1"]
    assert skipped["status"] == "skipped" and "GPU" in skipped["reason"]
    rdir = out / "runs" / "tiny_offline_bs2_s128_specforge-cli_baseline_r1"
    run = json.loads((rdir / "run.json").read_text())
    assert run["trainer"]["specforge"] == "0.2.0" and run["startup_s"] > 0
    assert run["exit"]["stop"]["stopped"] and run["exit_s"] < 60  # stopped after its last step
    assert not (rdir / "specforge-out").exists() and not (rdir / "features").exists()
    assert str(REPO / "specforge") not in (rdir / "stdout.log").read_text()  # upstream's, not ours
    cmd = json.loads((rdir / "cell.json").read_text())["command"]
    assert "model.use_liger_kernel=false" in cmd and "training.fsdp_sharding=NO_SHARD" in cmd
    assert Path(json.loads((rdir / "cell.json").read_text())["compile_cache"]["dir"]).name.startswith(
        "specforge-0.2.0_"
    )


@pytest.mark.slow
def test_specforge_itself_refuses_a_bad_key_before_anything_is_written(tmp_path):
    path = sweep(
        tmp_path,
        [{"config": TINY, "batch_size": 2, "seq_len": 128, "set": {"training.bogus": 1}}],
        trainer_python=str(upstream_python()),
    )
    r = subprocess.run(
        [sys.executable, "-m", "bench", "sweep", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .endswith("SpecForge refuses the config: override path 'training.bogus' does not exist")
    )
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- reading a run back


def reconciled(tmp_path: Path, log: str, rows: int, rc: int, timed_out: bool) -> RunDoc:
    cfg = load_config(sweep(tmp_path, [{"config": TINY, "batch_size": 2, "seq_len": 128}]))
    run = plan(cfg)[0]
    rdir = tmp_path / "run"
    (rdir / "specforge-out" / "x-step4").mkdir(parents=True)  # a checkpoint the wrapper never removed
    (rdir / "stdout.log").write_text(log)
    lines = [ln for ln in step_lines()[:rows]]
    c = StepCollector(1, 128)
    with (rdir / "metrics.jsonl").open("w") as f:
        for i, ln in enumerate(lines):
            for row in c.add(*parse_step_line(ln), elapsed_s=10.0 + i, t=1e9 + i):
                f.write(json.dumps(row) + "\n")
    doc = SpecForgeCliPlug(python="/py").reconcile(rdir, run, rc, timed_out, "2026-12-01T00:00:00+00:00")
    assert json.loads((rdir / "run.json").read_text()) == doc.to_json()
    assert not (rdir / "specforge-out").exists()
    return doc


def test_a_finished_run_is_ok_with_its_startup(tmp_path):
    doc = reconciled(tmp_path, "\n".join(step_lines()[:4]) + "\n", rows=4, rc=0, timed_out=False)
    assert doc.status == "ok" and doc.reason is None and doc.arm == "baseline"
    assert 9.0 < doc.startup_s < 10.0  # the first step's arrival minus its own time


def test_a_run_that_exits_0_with_steps_missing_is_not_ok(tmp_path):
    doc = reconciled(tmp_path, "", rows=2, rc=0, timed_out=False)
    assert doc.status == "error" and "metrics.jsonl holds 2 of 4 steps" in doc.reason


def test_an_out_of_memory_specforge_run_is_oom(tmp_path):
    log = (
        'step 1: ...\nTraceback (most recent call last):\n  File "trainer.py", line 9, in fit\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 139.81 GiB of which 1.2 GiB is free.\n"
    )
    doc = reconciled(tmp_path, log, rows=1, rc=1, timed_out=False)
    assert doc.status == "oom" and doc.reason == "CUDA out of memory. Tried to allocate 2.00 GiB"


def test_a_run_killed_at_its_timeout_says_at_which_step(tmp_path):
    doc = reconciled(tmp_path, "\n".join(step_lines()[:2]), rows=2, rc=-15, timed_out=True)
    assert doc.status == "timeout" and doc.reason == "timed out after 240 s at step 2/4"


@pytest.mark.slow
def test_capacity_probes_of_a_cli_cell_are_specforge_runs(tmp_path, capsys):
    from bench.run.sweep import run_sweep

    path = sweep(
        tmp_path,
        [{"config": TINY, "batch_size": 2, "seq_len": 128}],
        capacity={"axis": "batch_size", "start": 2, "max": 8},
        trainer_python=str(upstream_python()),
    )
    assert run_sweep(str(path), capacity=True, dry_run=True) == 0
    out = capsys.readouterr().out
    assert "-m specforge.cli train" in out and "training.batch_size=2" in out and "--samples 16" in out


def test_the_kernel_attribution_refuses_a_specforge_cli_cell(tmp_path, capsys):
    from bench.__main__ import main

    path = sweep(tmp_path, [{"config": TINY, "batch_size": 2, "seq_len": 128}])
    assert main(["kernels", str(path), "--out", str(tmp_path / "k")]) == 2
    assert (
        "cells[0]: kernels times our trainer's draft modules; trainer specforge-cli"
        in capsys.readouterr().err
    )
