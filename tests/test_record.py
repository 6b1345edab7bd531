"""The typed run records (bench/record.py): every record committed under results/ reads and writes
back unchanged, a field of the wrong type is one error naming the file and the field, new and
updated records keep the keys they were given (nulls too), metrics.jsonl's damaged lines are
counted, and the module imports nothing but the standard library."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.record import (
    METRIC_FIELDS,
    CellDoc,
    MetricRow,
    MetricsWriter,
    RecordError,
    RunDoc,
    cell_unread,
    read_cell,
    read_metrics_counted,
    read_run,
    write_run,
)
from bench.results import rawdata
from tests.helpers import REPO, committed_sweep

RESULTS = REPO / "results"


@pytest.fixture(scope="module")
def committed_records(tmp_path_factory) -> Path:
    """Every committed sweep's raw records, unpacked from its raw.tar.xz into one tmp tree."""
    root = tmp_path_factory.mktemp("committed")
    for archive in sorted(RESULTS.glob(f"*/{rawdata.RAW}")):
        committed_sweep(archive.parent.name, root / archive.parent.name, sweep_json=False)
    return root


@pytest.mark.parametrize("cls", [CellDoc, RunDoc], ids=["cell.json", "run.json"])
def test_every_committed_record_reads_back_unchanged_with_no_untyped_key(cls, committed_records):
    """The writers of every committed sweep (the driver, our trainer on the H200, the SpecForge
    CLI plug) wrote only fields the record types, and each reads and writes back as it was."""
    paths = sorted(committed_records.rglob(cls.FILE))
    assert len(paths) > 100
    for path in paths:
        obj = json.loads(path.read_text())
        doc = cls.from_json(obj, path)
        assert doc.extra == {}, (path, doc.extra)
        assert list(doc.to_json().items()) == list(obj.items()), path


def test_every_committed_metrics_row_reads_back_unchanged(committed_records):
    rows = 0
    for path in sorted(committed_records.rglob(MetricRow.FILE)):
        for line in path.read_text().splitlines():
            obj = json.loads(line)
            assert list(MetricRow.from_json(obj, path).to_json().items()) == list(obj.items()), path
            rows += 1
    assert rows > 1000


def test_the_metric_fields_are_declared_once():
    from bench.results import columns

    assert columns.METRIC_FIELDS is METRIC_FIELDS
    assert METRIC_FIELDS[:4] == ["step", "loss", "accuracy", "step_time_s"] and "extra" not in METRIC_FIELDS


@pytest.mark.parametrize(
    "cls, obj, says",
    [
        (CellDoc, {"repeat": "x"}, "field 'repeat' is a string, expected an integer"),
        (CellDoc, {"repeat": 1.5}, "field 'repeat' is a number, expected an integer"),
        (CellDoc, {"steps": True}, "field 'steps' is a boolean, expected an integer"),
        (CellDoc, {"command": ["python", 3]}, "field 'command' is an array, expected an array of strings"),
        (RunDoc, {"status": 3}, "field 'status' is a number, expected a string"),
        (RunDoc, {"startup": []}, "field 'startup' is an array, expected an object"),
        (MetricRow, {"step": "1"}, "field 'step' is a string, expected an integer"),
    ],
)
def test_a_field_of_the_wrong_type_is_one_error_naming_file_and_field(cls, obj, says):
    with pytest.raises(RecordError) as e:
        cls.from_json(obj, "runs/x/f.json")
    assert str(e.value) == f"runs/x/f.json: {says}" and "\n" not in str(e.value)


def test_nulls_and_absent_keys_read_as_none_and_write_back_as_they_were():
    doc = CellDoc.from_json({"cache_dir": None, "repeat": 2, "own": [1]}, "c")
    assert (doc.cache_dir, doc.repeat, doc.trainer, doc.extra) == (None, 2, None, {"own": [1]})
    assert doc.has("cache_dir") and not doc.has("trainer")
    assert doc.to_json() == {"cache_dir": None, "repeat": 2, "own": [1]}


def test_new_and_updated_records_hold_exactly_the_keys_given():
    doc = RunDoc.of(status="skipped", reason="no GPU", start_time=None, own=1)
    assert list(doc.to_json()) == ["status", "reason", "start_time", "own"] and doc.extra == {"own": 1}
    later = doc.updated(status="error", driver_note="n", run_reason=None)
    assert later.to_json() == {
        "status": "error", "reason": "no GPU", "start_time": None, "own": 1, "driver_note": "n", "run_reason": None,
    }  # fmt: skip
    assert doc.status == "skipped"  # updated is a copy
    with pytest.raises(RecordError, match="a new run.json: field 'world_size' is a string"):
        RunDoc.of(world_size="2")


def test_the_files_of_a_run_directory(tmp_path):
    assert read_run(tmp_path) is None and read_cell(tmp_path) is None
    assert cell_unread(tmp_path) == "cell.json missing"
    (tmp_path / "cell.json").write_text("[1]")
    assert read_cell(tmp_path) is None and cell_unread(tmp_path) == "cell.json is an array, not an object"
    (tmp_path / "cell.json").write_text('{"repeat": "x"}')
    with pytest.raises(RecordError, match="cell.json: field 'repeat'"):
        read_cell(tmp_path)
    assert read_cell(tmp_path, tolerant=True) is None
    write_run(tmp_path, RunDoc.of(status="ok", reason=None))
    assert json.loads((tmp_path / "run.json").read_text()) == {"reason": None, "status": "ok"}
    assert read_run(tmp_path) == RunDoc(status="ok")
    with MetricsWriter(tmp_path) as out:
        out.write([MetricRow.of(step=1, loss=2.0), MetricRow.of(step=2, own=None)])
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 2.0}\n{"step": 2, "own": null}\n'
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": "3"}\n[4]\n{"step": 5, "lo')  # a mistyped row, no object, a torn line
    rows, bad = read_metrics_counted(tmp_path)
    assert [r.step for r in rows] == [1, 2] and bad == 3


def test_the_record_module_imports_only_the_standard_library():
    """Importable where only the standard library is (our trainer's check, a trainer's environment)."""
    code = "import sys, bench.record; print(sorted(m for m in ('pandas', 'numpy', 'torch', 'yaml') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
