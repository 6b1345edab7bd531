"""The driver never loses a user's file and refuses bad input in one line before writing anything:
foreign output directories, bad paths, cells the trainer rejects, missing packages, torn run files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.config import Run
from bench.fileio import read_json
from bench.trainers import load_config
from bench.trainers.embedded import EMBEDDED
from tests.test_driver import fakes, snapshot, sweep_file, train_configs  # noqa: F401


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture
def cfg(tmp_path):
    tc = train_configs(tmp_path)
    return sweep_file(tmp_path, [{"config": tc["online"], "batch_size": 1, "seq_len": 32}])


def test_a_directory_holding_the_users_files_is_refused(tmp_path, cfg, fakes, capsys):  # noqa: F811
    out = tmp_path / "mine"
    out.mkdir()
    for name in ("summary.csv", "report.md", "throughput.png", "notes.txt"):
        (out / name).write_text(f"the user's {name}")
    before = snapshot(out)
    for flags in ([], ["--resume"], ["--force"]):
        assert main(["sweep", str(cfg), "--out", str(out), *flags]) == 2
        err = one_line_error(capsys)
        assert "is not empty and holds no sweep" in err and "notes.txt" in err
        assert snapshot(out) == before


def test_force_replaces_only_what_the_sweep_made(tmp_path, cfg, fakes, capsys):  # noqa: F811
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out)]) == 0
    (out / "my-plot.png").write_text("mine")
    (out / "notes.txt").write_text("mine")
    assert main(["sweep", str(cfg), "--out", str(out), "--force"]) == 0
    assert (out / "my-plot.png").read_text() == "mine" and (out / "notes.txt").read_text() == "mine"
    assert read_json(out / "sweep.json")["name"] == "t"


@pytest.mark.parametrize("kind", ["file", "empty", "under-a-file"])
def test_bad_output_paths_are_one_line(tmp_path, cfg, fakes, capsys, kind):  # noqa: F811
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    out = {"file": str(a_file), "empty": "", "under-a-file": str(a_file / "sub")}[kind]
    before = snapshot(tmp_path)
    assert main(["sweep", str(cfg), "--out", out]) == 2
    err = one_line_error(capsys)
    assert {"file": "is a file", "empty": "empty path", "under-a-file": "is a file"}[kind] in err
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_output_is_one_line(tmp_path, cfg, fakes, capsys):  # noqa: F811
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    assert main(["sweep", str(cfg), "--out", str(locked / "out")]) == 2
    assert "not writable" in one_line_error(capsys)


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_cell_the_trainer_rejects_is_refused_before_anything_is_written(tmp_path, fakes, capsys, dry_run):  # noqa: F811
    tc = train_configs(tmp_path)
    cells = [
        {"config": tc["online"], "batch_size": 1, "seq_len": 32},
        {"config": tc["online"], "batch_size": 2, "seq_len": 32, "set": {"trainnig.lr": 0.1}},
    ]
    path = sweep_file(tmp_path, cells)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), *(["--dry-run"] if dry_run else [])]) == 2
    err = one_line_error(capsys)
    assert "cells[1] (tiny_online_bs2_s32)" in err and "trainnig: unknown key" in err
    assert not out.exists()


def test_an_unknown_trainer_module_is_refused(tmp_path, fakes, capsys):  # noqa: F811
    tc = train_configs(tmp_path)
    path = sweep_file(
        tmp_path, [{"config": tc["online"], "batch_size": 1, "seq_len": 32}], trainer_module="nosuch"
    )
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "trainer_module: 'nosuch' cannot be run here" in one_line_error(capsys)
    assert not (tmp_path / "out").exists()


def test_missing_packages_are_named_before_anything_is_written(tmp_path, cfg, fakes, capsys, monkeypatch):  # noqa: F811
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pandas" else real(name, *a)
    )
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "out")]) == 2
    err = one_line_error(capsys)
    assert "lacks pandas" in err and "make install" in err
    assert not (tmp_path / "out").exists()


def _run(tmp_path: Path) -> tuple[Run, Path]:
    tc = train_configs(tmp_path)
    cfg = load_config(sweep_file(tmp_path, [{"config": tc["online"], "batch_size": 1, "seq_len": 32}]))
    rdir = tmp_path / "rdir"
    rdir.mkdir()
    return Run("r", cfg.cells[0], "baseline", 1, 0), rdir


def test_an_ok_run_with_missing_or_torn_metrics_is_not_ok(tmp_path):
    run, rdir = _run(tmp_path)  # 4 steps planned
    (rdir / "run.json").write_text(json.dumps({"status": "ok", "reason": None}))
    rows = [json.dumps({"step": i, "step_time_s": 0.1, "samples": 1}) for i in (1, 2, 3)]
    (rdir / "metrics.jsonl").write_text("\n".join(rows) + '\n{"step": 4, "step_ti')
    doc = EMBEDDED.reconcile(rdir, run, 0, False, "t0")
    assert doc.status == "error"
    assert doc.reason == "metrics.jsonl holds 3 of 4 steps and 1 unreadable line(s); the run is not counted"
    assert read_json(rdir / "run.json")["status"] == "error"


def test_a_torn_run_json_is_reported_as_such(tmp_path):
    run, rdir = _run(tmp_path)
    (rdir / "run.json").write_text('{"status": "ok", "rea')
    (rdir / "stdout.log").write_text("step 1/4\nKilled\n")
    doc = EMBEDDED.reconcile(rdir, run, -9, False, "t0")
    assert doc.status == "error" and doc.reason == "Killed (killed by SIGKILL)"
    assert "not valid JSON" in doc.driver_note


def test_a_run_json_breaking_the_contract_is_replaced_by_the_drivers(tmp_path):
    """A field of the wrong type (bench/record.py) is no record to keep: the driver's replaces it,
    its note naming the field."""
    run, rdir = _run(tmp_path)
    (rdir / "run.json").write_text(json.dumps({"status": "ok", "reason": None, "world_size": "1"}))
    (rdir / "stdout.log").write_text("step 1/4\nKilled\n")
    doc = EMBEDDED.reconcile(rdir, run, -9, False, "t0")
    assert doc.status == "error" and doc.reason == "Killed (killed by SIGKILL)" and doc.world_size == 1
    assert doc.driver_note == (
        f"the trainer's run.json broke the run contract ({rdir / 'run.json'}: field 'world_size' is a "
        "string, expected an integer); replaced by the driver's"
    )
    assert read_json(rdir / "run.json")["driver_note"] == doc.driver_note


def test_a_damaged_offline_cache_is_prepared_again(tmp_path, fakes, capsys):  # noqa: F811
    tc = train_configs(tmp_path)
    cfg = sweep_file(tmp_path, [{"config": tc["offline"], "batch_size": 1, "seq_len": 64}])
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out)]) == 0
    shard = next(p for p in (out / "cache").iterdir() if p.is_dir()) / "shard-0.bin"
    shard.write_bytes(b"\0" * 10)  # truncated
    capsys.readouterr()
    assert main(["sweep", str(cfg), "--out", str(out), "--force"]) == 0
    printed = capsys.readouterr().out
    assert "cannot be used (data.cache_dir: " in printed and "shard-0.bin is truncated" in printed
    assert "preparing it again" in printed
    assert shard.stat().st_size == 64
    assert read_json(out / "runs" / "tiny_offline_bs1_s64_baseline_r1" / "run.json")["status"] == "ok"


def test_a_python_without_the_dependencies_gets_one_line(tmp_path):
    """`make bench-cpu INSTALL= PYTHON=python3` on a bare Python: one line, exit 2, nothing written."""
    import subprocess
    import sys

    code = (
        "import sys, runpy; sys.modules['yaml'] = None; "
        f"sys.argv = ['bench', 'sweep', 'configs/cpu.yaml', '--out', {str(tmp_path / 'out')!r}]; "
        "runpy.run_module('bench', run_name='__main__')"
    )
    from tests.helpers import REPO

    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "lacks yaml" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_users_runs_folder_without_a_sweep_is_not_taken_for_one(tmp_path, cfg, fakes, capsys):  # noqa: F811
    """TensorBoard writes runs/ by default: without the sweep's sweep.json it is the user's, and
    --force must not delete it (it said "already holds a sweep" and deleted it)."""
    out = tmp_path / "mine"
    (out / "runs" / "Dec02_10-00-00").mkdir(parents=True)
    (out / "runs" / "Dec02_10-00-00" / "events.out.tfevents.1").write_bytes(b"\x00events")
    before = snapshot(out)
    for flags in ([], ["--force"]):
        assert main(["sweep", str(cfg), "--out", str(out), *flags]) == 2
        err = one_line_error(capsys)
        assert "is not empty and holds no sweep (found runs)" in err
        assert snapshot(out) == before


def test_force_refuses_a_sweep_whose_runs_folder_holds_the_users_files(tmp_path, cfg, fakes, capsys):  # noqa: F811
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out)]) == 0
    capsys.readouterr()
    (out / "runs" / "my-notes").mkdir()
    (out / "runs" / "my-notes" / "n.txt").write_text("mine")
    before = snapshot(out)
    assert main(["sweep", str(cfg), "--out", str(out), "--force"]) == 2
    assert "runs holds what this suite did not write (runs/my-notes)" in one_line_error(capsys)
    assert snapshot(out) == before


def _ab(out, *flags):  # one pair: a finished A/B is all these tests need
    return main(["ab", "-c", "configs/train/tiny-online.yaml", "--seq-len", "32", "--batch-size", "1",
                 "--steps", "2", "--pairs", "1", "--out", str(out), *flags])  # fmt: skip


def test_bench_ab_never_overwrites_an_ab_yaml_it_did_not_write(tmp_path, fakes, capsys, monkeypatch):  # noqa: F811
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    out = tmp_path / "o"
    out.mkdir()
    for content in (b"name: my own sweep\n", b"\x89PNG\r\n\x1a\n\x00\xff"):  # the user's YAML; a binary file
        (out / "ab.yaml").write_bytes(content)
        for flags in ([], ["--force"]):
            assert _ab(out, *flags) == 2
            assert "ab.yaml: not written by bench ab" in one_line_error(capsys)
            assert (out / "ab.yaml").read_bytes() == content


def test_a_refused_bench_ab_leaves_nothing_behind(tmp_path, fakes, capsys, monkeypatch):  # noqa: F811
    """Refused inside the sweep (a key the driver owns), after ab.yaml was written: the file and
    every directory the call created go again, and an earlier A/B's ab.yaml is put back."""
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    out = tmp_path / "a" / "b" / "c"
    assert _ab(out, "training.steps=5") == 2
    assert "training.steps" in one_line_error(capsys)
    assert not (tmp_path / "a").exists()
    assert _ab(out) == 0
    capsys.readouterr()
    mine = (out / "ab.yaml").read_text()
    assert _ab(out, "--force", "training.steps=5") == 2
    one_line_error(capsys)
    assert (out / "ab.yaml").read_text() == mine


def test_bench_ab_writes_nothing_while_another_sweep_holds_the_directory(
    tmp_path,
    fakes,  # noqa: F811
    capsys,
    monkeypatch,
):
    import fcntl

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    out = tmp_path / "o"
    assert _ab(out) == 0
    capsys.readouterr()
    before = snapshot(out)
    fd = os.open(out / ".sweep.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a running sweep's lock
    try:
        assert _ab(out, "--force", "--steps", "3") == 2
        assert "another sweep is running in this directory" in one_line_error(capsys)
        assert snapshot(out) == before
    finally:
        os.close(fd)
