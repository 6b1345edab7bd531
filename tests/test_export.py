"""`bench export SWEEP --to tensorboard|mlflow|wandb` (bench/results/export.py): a reported sweep's
runs and verdicts written with each tracker's own library and read back with that tracker's own
reader: TensorBoard's EventAccumulator, MLflow's MlflowClient, W&B's ``wandb leet inspect --json``
(wandb's reader of its offline ``.wandb`` transaction log; its Python DataStore is gone since the
Go core took over `wandb sync`). The expected values are read from the sweep's own files here (the
run directories, run.json as written, metrics.jsonl, summary.csv), never through the exporter.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.results.rawdata import pack
from bench.results.report import build_report
from tests.test_record_integrity import CELL, write_sweep

STEP = 4  # a steady step (after the 2 warm-up steps)
RUN = f"{CELL}_liger_r2"
VERSIONS = {"torch": "2.13.0", "liger_kernel": "0.6.5", "transformers": "5.1.0", "git_commit": "0123abcd"}
GPU = "NVIDIA H100 80GB HBM3"
# run.json's provenance key -> the tag it becomes (runs.csv's column)
TAG_OF = {"torch": "torch_version", "liger_kernel": "liger_version", "transformers": "transformers_version"}
TRACKERS = {"tensorboard": "tensorboardX", "mlflow": "mlflow", "wandb": "wandb"}


@pytest.fixture(autouse=True)
def _no_plots(no_plots):
    """Tables only (conftest's no_plots)."""


@pytest.fixture
def sweep(tmp_path) -> Path:
    """3 reported pairs (baseline, liger) whose runs recorded their versions."""
    path = write_sweep(tmp_path / "integrity", "liger", rounds=3)
    for d in (path / "runs").iterdir():
        run = json.loads((d / "run.json").read_text())
        run["provenance"] = {**VERSIONS, "gpu_names": [GPU]}
        (d / "run.json").write_text(json.dumps(run))
    build_report(path)
    return path


def run_dirs(path: Path) -> list[str]:
    return sorted(d.name for d in (path / "runs").iterdir() if d.is_dir())


def step_of(path: Path, run_id: str, step: int) -> dict:
    lines = (path / "runs" / run_id / "metrics.jsonl").read_text().splitlines()
    return next(row for row in map(json.loads, lines) if row["step"] == step)


def summary_row(path: Path, arm: str = "liger") -> dict[str, str]:
    with open(path / "summary.csv", newline="") as f:
        return next(r for r in csv.DictReader(f) if r["arm"] == arm)


def export(capsys, path: Path, tracker: str, *more: str) -> list[str]:
    assert main(["export", str(path), "--to", tracker, *more]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith(f"exported {len(run_dirs(path))} runs and the summary to "), out
    assert out[1].endswith(f" ({tracker})")
    return out


def expected_tags(path: Path, run_id: str) -> dict[str, str]:
    cell = json.loads((path / "runs" / run_id / "cell.json").read_text())
    tags = {"arm": cell["arm"], "cell_id": cell["cell_id"], "repeat": str(cell["repeat"]), "status": "ok"}
    tags |= {TAG_OF[k]: v for k, v in VERSIONS.items() if k in TAG_OF}
    return tags | {"git_commit": VERSIONS["git_commit"], "gpu_name": GPU, "trainer": cell["trainer"]}


def test_tensorboard_event_files_read_back(sweep, capsys):
    pytest.importorskip("tensorboardX")
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    export(capsys, sweep, "tensorboard")
    out = sweep / "tracker" / "tensorboard"
    assert sorted(d.name for d in out.iterdir()) == sorted([*run_dirs(sweep), "summary"])

    def read(name: str):
        acc = ea.EventAccumulator(str(out / name), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
        return acc.Reload()

    def text(acc, tag: str) -> str:
        return acc.Tensors(f"{tag}/text_summary")[0].tensor_proto.string_val[0].decode()

    run = read(RUN)
    want = step_of(sweep, RUN, STEP)
    steps = {tag: {e.step: e.value for e in run.Scalars(tag)} for tag in run.Tags()["scalars"]}
    assert steps["step/loss"][STEP] == pytest.approx(want["loss"], rel=1e-6)
    assert steps["step/step_time_s"][STEP] == pytest.approx(want["step_time_s"], rel=1e-6)
    assert steps["step/samples_per_s"][STEP] == pytest.approx(want["samples"] / want["step_time_s"], rel=1e-6)
    table = text(run, "run")
    for key, value in expected_tags(sweep, RUN).items():
        assert f"| {key} | {value} |" in table, key

    summary = read("summary")
    row = summary_row(sweep)
    for col in (
        "delta_samples_per_s_pct",
        "delta_samples_per_s_pct_ci95_low",
        "delta_samples_per_s_pct_ci95_high",
    ):
        got = summary.Scalars(f"{CELL}/liger/{col}")[0].value
        assert got == pytest.approx(float(row[col]), rel=1e-5), col
    verdicts = text(summary, "verdicts")
    assert f"| {CELL}/liger verdict_speed | {row['verdict_speed']} |" in verdicts
    assert f"| {CELL}/liger loss_parity | {row['loss_parity']} |" in verdicts


def test_mlflow_store_reads_back_and_the_users_tracking_uri_is_honoured(sweep, capsys, monkeypatch, tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = export(capsys, sweep, "mlflow")
    uri = (sweep / "tracker" / "mlruns").resolve().as_uri()
    assert f"experiment 'integrity' at {uri} (mlflow)" in out[1]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 opens a file store only so
    client = MlflowClient(tracking_uri=uri)
    found = client.search_runs([client.get_experiment_by_name("integrity").experiment_id], max_results=1000)
    runs = {r.info.run_name: r for r in found if r.data.tags.get("bench.kind") == "run"}
    assert sorted(runs) == run_dirs(sweep)
    mine = runs[RUN]
    assert expected_tags(sweep, RUN).items() <= mine.data.tags.items()
    assert mine.data.params["batch_size"] == "2" and mine.info.status == "FINISHED"
    history = {m.step: m.value for m in client.get_metric_history(mine.info.run_id, "step/loss")}
    assert history[STEP] == pytest.approx(step_of(sweep, RUN, STEP)["loss"])
    (summary,) = [r for r in found if r.data.tags.get("bench.kind") == "summary"]
    row = summary_row(sweep)
    for col in (
        "delta_samples_per_s_pct",
        "delta_samples_per_s_pct_ci95_low",
        "delta_samples_per_s_pct_ci95_high",
    ):
        assert summary.data.metrics[f"{CELL}/liger/{col}"] == pytest.approx(float(row[col]), rel=1e-5), col
    assert summary.data.tags[f"{CELL}/liger/verdict_speed"] == row["verdict_speed"]
    assert summary.data.tags[f"{CELL}/liger/loss_parity"] == row["loss_parity"]

    # the user's MLFLOW_TRACKING_URI (no --out): the runs go there, nothing under the sweep
    theirs = (tmp_path / "their-store").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", theirs)
    (sweep / "tracker" / "mlruns").rename(sweep / "tracker" / "first")
    assert f"at {theirs} (mlflow)" in export(capsys, sweep, "mlflow")[1]
    assert not (sweep / "tracker" / "mlruns").exists()
    client = MlflowClient(tracking_uri=theirs)
    found = client.search_runs([client.get_experiment_by_name("integrity").experiment_id], max_results=1000)
    assert len(found) == len(run_dirs(sweep)) + 1


def leet(paths: list[Path]) -> list[dict]:
    """Offline runs read by wandb's own reader (its processes side by side): each one's run record,
    history by step, summary and exit code."""
    cmd = [sys.executable, "-m", "wandb", "leet", "inspect", "--json"]
    procs = [
        subprocess.Popen(
            [*cmd, str(p)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        for p in paths
    ]
    return [_records(p.communicate(timeout=60), p.returncode) for p in procs]


def _records(streams: tuple[bytes, bytes], rc: int) -> dict:
    assert rc == 0, streams[1].decode()
    out = {"history": {}, "summary": {}}
    for rec in map(json.loads, streams[0].decode().splitlines()):
        if rec["type"] == "run":
            out["run"] = rec["run"]
        elif rec["type"] == "history":
            out["history"][rec["history"]["step"]["num"]] = rec["history"]["item"]
        elif rec["type"] == "summary":
            out["summary"].update(rec["summary"]["update"])
        elif rec["type"] == "exit":
            out["exit_code"] = rec["exit"].get("exit_code", 0)
    return out


def test_wandb_offline_runs_read_back(sweep, capsys, monkeypatch):
    pytest.importorskip("wandb")
    for var in ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    export(capsys, sweep, "wandb")
    files = sorted((sweep / "tracker" / "wandb" / "wandb").glob("offline-run-*/*.wandb"))
    assert len(files) == len(run_dirs(sweep)) + 1  # and the summary's
    runs = {r["run"]["display_name"]: r for r in leet(files)}
    assert sorted(runs) == sorted([*run_dirs(sweep), "summary"])
    mine = runs[RUN]
    assert mine["run"]["project"] == mine["run"]["run_group"] == "integrity"
    assert {"arm:liger", f"cell:{CELL}", "status:ok", "repeat:2"} <= set(mine["run"]["tags"])
    assert expected_tags(sweep, RUN).items() <= mine["run"]["config"]["update"].items()
    assert mine["history"][STEP]["step/loss"] == pytest.approx(step_of(sweep, RUN, STEP)["loss"])
    assert mine["exit_code"] == 0
    row, summary = summary_row(sweep), runs["summary"]["summary"]
    assert summary[f"{CELL}/liger/delta_samples_per_s_pct"] == pytest.approx(
        float(row["delta_samples_per_s_pct"]), rel=1e-5
    )
    assert summary[f"{CELL}/liger/verdict_speed"] == row["verdict_speed"]


@pytest.mark.parametrize("tracker", TRACKERS)
def test_a_missing_tracker_library_is_one_line(sweep, capsys, monkeypatch, tracker):
    for name in [m for m in sys.modules if m == TRACKERS[tracker] or m.startswith(TRACKERS[tracker] + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, TRACKERS[tracker], None)  # as if not installed
    assert main(["export", str(sweep), "--to", tracker]) == 2
    dist = {"tensorboard": "tensorboardX", "mlflow": "mlflow-skinny", "wandb": "wandb"}[tracker]
    assert capsys.readouterr().err.splitlines() == [
        f"error: bench export --to {tracker} needs {dist}: pip install 'dflash-liger-bench[trackers]'"
    ]
    assert not (sweep / "tracker").exists()


@pytest.mark.parametrize("what", ["missing", "no runs", "not reported", "unknown tracker"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, what):
    path = tmp_path / "d"
    if what != "missing":
        path.mkdir()
    if what in ("not reported", "unknown tracker"):
        write_sweep(path, "liger", rounds=1)
    if what == "unknown tracker":
        build_report(path)
    tracker = "swanlab" if what == "unknown tracker" else "tensorboard"
    assert main(["export", str(path), "--to", tracker]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert (
        ("unknown tracker 'swanlab'" in err[0])
        if what == "unknown tracker"
        else err[0].startswith(f"error: {path}")
    )
    assert not (path / "tracker").exists()


def test_a_packed_sweep_exports_from_its_archive_and_a_second_export_is_refused(sweep, capsys):
    pytest.importorskip("tensorboardX")
    names = run_dirs(sweep)
    pack(sweep)
    assert main(["export", str(sweep), "--to", "tensorboard"]) == 0
    assert f"exported {len(names)} runs and the summary to " in capsys.readouterr().out
    assert sorted(d.name for d in (sweep / "tracker" / "tensorboard").iterdir()) == sorted(
        [*names, "summary"]
    )
    assert not (sweep / "runs").exists()  # the sweep stays packed
    assert main(["export", str(sweep), "--to", "tensorboard"]) == 2
    assert "already holds files" in capsys.readouterr().err
