"""An arm this machine cannot run is skipped with its reason before the
sweep starts; output that cannot be written (a read-only filesystem, a full disk) is one line,
exit 1, and the sweep resumes with every planned run once; the trainer's own commands refuse a
data or cache file of the wrong shape in one line; loss parity compares only the runs in the
statistics. Against the fake trainer, with write failures injected at bench/fileio.py."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from bench import fileio
from bench.__main__ import main
from bench.config import plan
from bench.fileio import read_json
from bench.results.parity import in_statistics_records, loss_parity_gaps, loss_parity_table
from bench.results.records import load_runs
from bench.run import preflight
from bench.trainers import load_config
from specforge.__main__ import main as trainer_main
from tests.test_aggregate import CELL, write_run
from tests.test_driver import fakes, statuses, sweep_file, train_configs  # noqa: F401
from tests.test_trainer_safety import OFFLINE, ONLINE, copy_cache, refused
from tests.test_vram import Script, fake_pynvml, install

GIB = 2**30

# ---------------------------------------------------------------- 1. arms this machine cannot run


def test_a_gpu_only_arm_without_a_gpu_is_skipped_with_its_reason_before_the_first_run(
    tmp_path,
    fakes,  # noqa: F811
    monkeypatch,
    capsys,
):
    """A `hardware: any` sweep on a machine without a GPU: the compile arm's runs are recorded as
    skipped with the reason, as the Liger arm's are (still), and the sweep says so before its first run."""
    monkeypatch.setattr(preflight, "gpu_missing", lambda: True)
    tc = train_configs(tmp_path)
    cfg = sweep_file(
        tmp_path,
        [{"config": tc["online"], "batch_size": 1, "seq_len": 32}],
        hardware="any",
        arms=["baseline", "liger", "compile"],
    )
    out = tmp_path / "out"
    reason = preflight.NO_GPU_ARM.format(doc="torch.compile of each draft layer")
    assert main(["sweep", str(cfg), "--out", str(out), "--dry-run"]) == 0
    assert f"compile runs will be skipped here: {reason}" in capsys.readouterr().out

    assert main(["sweep", str(cfg), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"liger runs will be skipped here: {preflight.NO_GPU}" in captured.out  # as before
    said = captured.out.index(f"compile runs will be skipped here: {reason}")
    assert said < captured.out.index("runs: ") and "Traceback" not in captured.err
    runs = {d["arm"]: (rid, d) for rid, d in statuses(out).items()}
    compile_run, doc = runs["compile"]
    assert (doc["status"], doc["reason"]) == ("skipped", reason)
    assert not (out / "runs" / compile_run / "launch.json").exists()  # never launched
    assert (runs["liger"][1]["status"], runs["liger"][1]["reason"]) == ("skipped", preflight.NO_GPU)
    assert runs["baseline"][1]["status"] == "ok"


def test_a_cpu_config_naming_a_gpu_only_arm_is_refused_saying_what_to_do(
    tmp_path,
    fakes,  # noqa: F811
    capsys,
):
    tc = train_configs(tmp_path)
    cfg = sweep_file(
        tmp_path, [{"config": tc["online"], "batch_size": 1, "seq_len": 32}], arms=["baseline", "liger_flce"]
    )
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert "arms: liger_flce needs a GPU (Liger, and Liger's fused linear cross-entropy" in err
    assert "remove it from arms, or run it in a GPU sweep config" in err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- 2. output that cannot be written


def fail_writes(monkeypatch, code: int, when) -> list[Path]:
    """Make bench.fileio's atomic writes fail with ``code``, once: the first time ``when(path)``
    holds (a full disk, a read-only remount; afterwards the disk has room again). Returns the
    path that failed."""
    real = fileio._create_temp
    failed: list[Path] = []

    def create(path: Path):
        if not failed and when(path):
            failed.append(path)
            raise OSError(code, os.strerror(code))
        return real(path)

    monkeypatch.setattr(fileio, "_create_temp", create)
    return failed


def one_error_line(err: str) -> str:
    """The driver's last stderr line (the progress bar writes there too); no traceback."""
    assert "Traceback" not in err, err
    line = err.strip().splitlines()[-1].split("\r")[-1]
    assert line.startswith("error: "), err
    return line


def _sweep(tmp_path: Path, repeats: int = 1) -> tuple[Path, Path, list[str]]:
    """Pairs of the baseline and the A/A arm; (config, output directory, run order)."""
    tc = train_configs(tmp_path)
    cfg = sweep_file(
        tmp_path,
        [{"config": tc["online"], "batch_size": 1, "seq_len": 32}],
        arms=["baseline", "aa"],
        repeats=repeats,
    )
    return cfg, tmp_path / "out", [r.run_id for r in plan(load_config(cfg))]


def _finishes_on_resume(cfg: Path, out: Path, capsys, done_before: int, planned: int) -> None:
    assert main(["sweep", str(cfg), "--out", str(out), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert (f"{done_before} of {planned} runs already finished" in printed) == (done_before > 0)
    runs = statuses(out)
    assert sorted(runs) == sorted(read_json(out / "sweep.json")["order"])  # every planned run, once
    assert {d["status"] for d in runs.values()} == {"ok"}
    assert all(read_json(out / "runs" / rid / "launch.json")["exit_code"] == 0 for rid in runs)
    listed = [row.split(",")[0] for row in (out / "runs.csv").read_text().splitlines()[1:]]
    assert sorted(listed) == sorted(runs)  # no run lost or counted twice


@pytest.mark.parametrize(
    "code, file, index",
    [
        (errno.ENOSPC, "launch.json", 0),  # the driver's exit record of the first run, after it ran
        (errno.EROFS, "cell.json", 1),  # the first write of the second run
    ],
)
def test_a_write_failing_mid_sweep_is_one_line_and_resume_finishes_the_sweep(
    tmp_path,
    fakes,  # noqa: F811
    monkeypatch,
    capsys,
    code,
    file,
    index,
):
    cfg, out, order = _sweep(tmp_path)

    def when(path: Path) -> bool:
        if path.name != file or path.parent.name != order[index]:
            return False
        return file != "launch.json" or "pgid" in (read_json(path) or {})  # the record after the run

    failed = fail_writes(monkeypatch, code, when)
    assert main(["sweep", str(cfg), "--out", str(out)]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert failed, "the injected failure never happened"
    assert line.startswith(f"error: cannot write {failed[0]}: {os.strerror(code)} (") and "--resume" in line
    assert not (out / "runs" / order[index] / "launch.json").exists() or "exit_code" not in read_json(
        out / "runs" / order[index] / "launch.json"
    )  # the run is not finished
    _finishes_on_resume(cfg, out, capsys, index, len(order))


def test_a_run_failing_on_a_full_disk_stops_the_sweep_and_stays_unfinished(
    tmp_path,
    fakes,  # noqa: F811
    monkeypatch,
    capsys,
):
    """The trainer's own write failing (a full disk) is the machine's failure, not the arm's: the
    sweep stops there, the run unfinished, and --resume runs it once the disk has room."""
    cfg, out, order = _sweep(tmp_path, repeats=2)
    monkeypatch.setenv("FAKE_ENOSPC_RUNS", order[1])
    assert main(["sweep", str(cfg), "--out", str(out)]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: cannot write {out / 'runs' / order[1]}: No space left on device")
    assert "--resume" in line
    assert set(statuses(out)) == set(order[:2])  # the sweep stopped there
    assert "exit_code" not in read_json(out / "runs" / order[1] / "launch.json")
    monkeypatch.delenv("FAKE_ENOSPC_RUNS")
    _finishes_on_resume(cfg, out, capsys, 1, len(order))


def test_report_into_a_read_only_directory_is_one_line(tmp_path, monkeypatch, capsys):
    for arm in ("baseline", "liger"):
        write_run(tmp_path, arm, 0, [1.0] * 4)
    failed = fail_writes(monkeypatch, errno.EROFS, lambda path: path.parent == tmp_path)
    assert main(["report", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "sweep.json: missing or holds no config" in err  # runs written by hand here, no sweep's
    err = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("warning: "))
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"cannot write {failed[0]}: Read-only file system" in err
    assert f"python -m bench report {tmp_path}" in err


def test_the_pollers_failing_writes_never_stop_it(tmp_path, monkeypatch):
    install(monkeypatch, pynvml=fake_pynvml(Script([[1 * GIB] * 8 + [5 * GIB]])))
    from bench.probe import vram

    poller = vram.VramPoller(tmp_path / "run", interval_s=0.01, backend="nvml", baseline_samples=2)
    poller.start()
    shutil.rmtree(tmp_path / "run")
    (tmp_path / "run").write_text("a file where the run directory was: every write fails")
    deadline = time.monotonic() + 5
    while poller.n_samples < 150 and time.monotonic() < deadline:  # past a flush of vram.jsonl
        time.sleep(0.01)
    summary = poller.stop()  # writes vram.json: fails, and must not raise
    assert summary["status"] == "ok" and summary["devices"][0]["peak_used_gib"] == 5.0
    assert summary["errors"] >= 1 and poller.n_samples >= 150


# ---------------------------------------------------------------- 3. the trainer's files of the wrong shape


@pytest.mark.parametrize(
    "line, needle",
    [
        ("5", ":1 is a number; expected an object with input_ids or prompt+response"),
        ("null", ":1 is null; expected an object"),
        ('["input_ids"]', ":1 is an array; expected an object"),
        ('{"input_ids": 7}', ":1: expected input_ids a list of integers and loss_mask a list of 0 and 1"),
        ('{"input_ids": [1, "a"]}', ":1: expected input_ids a list of integers"),
        ('{"input_ids": [1, 2.5]}', ":1: expected input_ids a list of integers"),
        (
            '{"input_ids": [1, 2], "loss_mask": [1, 2]}',
            ":1: expected input_ids a list of integers and loss_mask a list of 0 and 1",
        ),
        ('{"prompt": 1, "response": "x"}', ":1: expected prompt and response to be strings"),
    ],
)
@pytest.mark.parametrize("command", ["train", "prepare"])
def test_data_records_of_the_wrong_shape_are_one_line(tmp_path, capsys, command, line, needle):
    data = tmp_path / "data.jsonl"
    data.write_text(line + "\n")
    out = tmp_path / "out"
    argv = [command, ONLINE if command == "train" else OFFLINE, "--output-dir", str(out)]
    refused(
        capsys,
        f"data.path: {data}{needle}",
        *argv,
        "--set",
        "data.source=jsonl",
        "--set",
        f"data.path={data}",
    )
    assert not out.exists()


def test_a_binary_data_file_is_one_line(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_bytes(b"\xff\xfe\x00\x01binary")
    refused(
        capsys,
        f"data.path: {data} is not a text file",
        *("train", ONLINE, "--output-dir", str(tmp_path / "out")),
        *("--set", "data.source=jsonl", "--set", f"data.path={data}"),
    )


@pytest.mark.parametrize("command", ["train", "check"])
def test_a_binary_cache_meta_json_is_one_line(tmp_path, tiny_cache, capsys, command):
    cache = copy_cache(tiny_cache, tmp_path / "cache")
    (cache / "meta.json").write_bytes(b"\xff\xfe\x00\x01")
    out = ["--output-dir", str(tmp_path / "out")] if command == "train" else []
    refused(capsys, "meta.json is not valid JSON", command, OFFLINE, "--set", f"data.cache_dir={cache}", *out)


def test_check_refuses_a_cache_that_train_would_refuse(tmp_path, tiny_cache, capsys):
    """check answers as train does: a cache prepared for another seq_len (or target) is refused,
    so the driver prepares it again instead of failing every run."""
    seq = json.loads((tiny_cache / "meta.json").read_text())["seq_len"]
    argv = ["--set", f"data.cache_dir={tiny_cache}", "--set", f"data.seq_len={seq * 2}"]
    line = refused(capsys, f"holds seq_len={seq}", "check", OFFLINE, *argv)
    assert (
        refused(capsys, f"holds seq_len={seq}", "train", OFFLINE, *argv, "--output-dir", str(tmp_path / "o"))
        == line
    )
    assert trainer_main(["check", OFFLINE, "--set", f"data.cache_dir={tiny_cache}"]) == 0


@pytest.mark.parametrize("kind", ["list", "binary", "directory", "empty"])
@pytest.mark.parametrize("command", ["train", "prepare", "check"])
def test_a_config_that_is_not_a_mapping_is_one_line(tmp_path, capsys, command, kind):
    path = tmp_path / "config.yaml"
    if kind == "directory":
        path.mkdir()
    else:
        path.write_bytes({"list": b"- profile\n- tiny\n", "binary": b"\xff\xfe\x00\x01", "empty": b""}[kind])
    needle = {
        "list": "expected a mapping of keys at the top level",
        "binary": "not a text file",
        "directory": "Is a directory",
        "empty": "profile: required key is missing",
    }[kind]
    out = [] if command == "check" else ["--output-dir", str(tmp_path / "out")]
    refused(capsys, needle, command, str(path), *out)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- 5. loss parity: the runs in the statistics


def test_loss_parity_compares_only_runs_in_the_statistics_and_names_the_others(tmp_path):
    """A run flagged for a bad value in its metrics is out of the statistics: no parity row for
    its pair (its losses are not a result either), and the report's gaps say why."""
    for rep in (0, 1):
        write_run(tmp_path, "baseline", rep, [1.0] * 4, losses=[5.0, 4.0, 3.0, 2.0])
    write_run(tmp_path, "liger", 0, [1.0] * 4, losses=[5.0, 4.0, 3.0, 2.0])
    bad = write_run(tmp_path, "liger", 1, [1.0] * 4, losses=[5.0, 4.0, 3.0, 9.0])
    rows = (bad / "metrics.jsonl").read_text().splitlines()
    rows[2] = rows[2].replace('"step_time_s": 1.0', '"step_time_s": -1.0')
    (bad / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    records = load_runs(tmp_path)

    parity = loss_parity_table(records)
    assert list(parity["repeat"]) == [0] and bool(parity["passed"].iloc[0])  # no FAIL from the flagged run
    gaps = loss_parity_gaps(records)
    assert gaps == [
        f"{CELL} repeat 1: liger not compared: liger is out of the statistics (metrics.jsonl line 3 (step 3): "
        "step_time_s = -1.0, not a finite number > 0: excluded from throughput stats)"
    ]
    assert [r.run_id for r in in_statistics_records(records)] == [
        r.run_id for r in records if r.run_id != bad.name
    ]
