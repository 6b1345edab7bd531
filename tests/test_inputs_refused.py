"""Inputs a tester found accepted, or answered with a traceback's words: names ending in a newline,
a key given twice in one ``--arm``, lockstep's warm-up read from the sweep instead of the cell, a
SpecForge-only sweep key on a sweep of another trainer, a measured step without its time, absurd
values in a run's records, a directory where ``bench report`` writes a file, a comma in an
``--arm`` value, and a ratio printed with hundreds of digits. Each bad input is one ``error:``
line on stderr and exit 2 before anything is written; each damaged record a note on its run."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import yaml

from bench import fmt
from bench.__main__ import main
from bench.config import SweepError
from bench.config.schema import SweepKeys
from bench.results.report import build_report
from bench.trainers import load_config, registered
from bench.trainers.base import trainer_gaps
from tests.helpers import CONFIGS
from tests.test_record_integrity import ARM_S, row, run_id, write_run, write_sweep

TINY = CONFIGS / "train" / "tiny-offline.yaml"


@pytest.fixture(autouse=True)
def _no_plots(no_plots):
    """Tables only (conftest's no_plots)."""


def sweep(tmp_path: Path, cell: dict | None = None, **top) -> Path:
    doc = {
        "name": "refused",
        "hardware": "any",
        "arms": ["baseline", "aa"],
        "steps": 4,
        "warmup_steps": 1,
        "repeats": 1,
        "out": str(tmp_path / "out"),
        "cells": [{"config": str(TINY), "batch_size": [1], "seq_len": [64], **(cell or {})}],
    } | top
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def refused(capsys, argv: list[str]) -> str:
    """``python -m bench ARGV`` refused: exit 2, one ``error:`` line on stderr; that line."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err.strip()


# --- 1. names: no control character, no whitespace around them --------------------------------


@pytest.mark.parametrize(
    ("where", "needle"),
    [
        ({"name": "mine\n"}, "name: 'mine\\n' holds a control character"),
        ({"cell": {"label": "fast\n"}}, "cells[0].label: 'fast\\n' holds a control character"),
        ({"cell": {"label": " fast"}}, "cells[0].label: ' fast' has whitespace before or after it"),
        (
            {"user_arms": {"eager\n": {"doc": "d", "set": {"model.attention_backend": "sdpa"}}}},
            "user_arms.'eager\\n': 'eager\\n' holds a control character",
        ),
        (
            {"user_arms": {"eager": {"doc": "SDPA\rsdpa", "set": {"model.attention_backend": "sdpa"}}}},
            "user_arms.eager.doc: expected one line",
        ),
        ({"name\n": "mine"}, "'name\\n': unknown key"),
    ],
    ids=["sweep name", "cell label", "label with a space", "user arm", "user arm doc", "a key"],
)
def test_a_name_with_a_control_character_or_whitespace_is_refused(tmp_path, capsys, where, needle):
    cell = where.pop("cell", None)
    path = sweep(tmp_path, cell, **where)
    err = refused(capsys, ["sweep", str(path), "--dry-run"])
    assert needle in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["eager\n", " eager", "eager\t"])
def test_an_arm_name_typed_with_a_control_character_or_whitespace_is_refused(tmp_path, capsys, name):
    out = tmp_path / "ab"
    argv = ["ab", "-c", str(TINY), "--arm", f"{name}:model.attention_backend=sdpa", "--out", str(out)]
    err = refused(capsys, [*argv, "--dry-run"])
    assert err.startswith("error: --arm ") and repr(name) in err
    assert not out.exists()


# --- 2. a key given twice in one --arm -----------------------------------------------------------


def test_a_key_given_twice_in_one_arm_is_refused_naming_it(tmp_path, capsys):
    arm = "eager:training.lr=0.1,model.attention_backend=sdpa,training.lr=0.2"
    err = refused(capsys, ["ab", "-c", str(TINY), "--arm", arm, "--dry-run"])
    assert err.startswith("error: --arm eager: training.lr is given twice")
    assert "'training.lr=0.1' and 'training.lr=0.2'" in err


# --- 3. lockstep's warm-up: the one each cell runs ---------------------------------------------


def lockstep(tmp_path: Path, warmup: int, cell_warmup: int) -> Path:
    return sweep(
        tmp_path,
        {"warmup_steps": cell_warmup},
        trainer="specforge-cli",
        pairing="lockstep",
        warmup_steps=warmup,
    )


def test_lockstep_reads_the_warm_up_a_cell_sets_for_itself(tmp_path):
    with pytest.raises(SweepError) as e:
        load_config(lockstep(tmp_path, warmup=1, cell_warmup=0))
    assert "lockstep" in str(e.value) and "cells[0].warmup_steps of at least 1" in str(e.value)
    assert "\n" not in str(e.value)
    # the sweep's own 0 is no refusal where every cell warms up
    cfg = load_config(lockstep(tmp_path, warmup=0, cell_warmup=2))
    assert [c.warmup_steps for c in cfg.cells] == [2]


# --- 4. a sweep key only another trainer honours ------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("trainer_gc_freeze", True, "true"),
        ("trainer_python_fork", True, "true"),
        ("stop_after_last_step", False, "false"),
        ("trainer_python", "/usr/bin/python3", "'/usr/bin/python3'"),
    ],
)
def test_a_key_no_cell_s_trainer_honours_is_refused_naming_the_trainers_that_do(
    tmp_path, capsys, key, value, shown
):
    err = refused(capsys, ["sweep", str(sweep(tmp_path, **{key: value})), "--dry-run"])
    assert f"{key}: {shown} changes nothing here: only trainer specforge-cli honours it" in err
    assert "cells run embedded" in err
    # the same key where a cell runs the SpecForge CLI is that cell's
    cfg = load_config(sweep(tmp_path, {"trainer": "specforge-cli"}, **{key: value}))
    assert getattr(cfg, key) == value


def test_every_reader_lists_the_trainer_specific_sweep_keys_it_honours(tmp_path):
    keys = {f for f in SweepKeys.__dataclass_fields__}
    for name, t in registered().items():
        assert set(t.reader.sweep_keys) <= keys, name

    class Drifted:  # a reader from before sweep_keys
        name, module, takes_turns = "drifted", None, False

        def read_cell(self, *a): ...
        def refuse_set(self, *a): ...
        def refuse_arm_key(self, *a): ...
        def refuse_arms(self, *a): ...

    assert trainer_gaps("drifted", Drifted()) == (
        "trainer drifted: its cell reader lacks sweep_keys (bench/config/cellfacts.py's CellReader)"
    )


# --- 5. a measured step without its time is noted as a NaN is ------------------------------------


def test_a_measured_step_without_its_time_keeps_the_run_out_with_a_note_like_a_nan(tmp_path):
    s = write_sweep(tmp_path, "liger", rounds=4)
    for rep, value in ((2, None), (3, math.nan)):
        shutil.rmtree(s / "runs" / run_id("liger", rep))
        write_run(s, "liger", rep, ARM_S[rep], rows={4: {"step_time_s": value}})
    p = s / "runs" / run_id("liger", 4) / "metrics.jsonl"  # the key absent altogether
    rows = [json.loads(x) for x in p.read_text().splitlines()]
    del rows[4]["step_time_s"]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = s / "runs" / run_id("baseline", 4) / "metrics.jsonl"  # a warm-up step's: nothing measured
    rows = [json.loads(x) for x in p.read_text().splitlines()]
    rows[0]["step_time_s"] = None
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = build_report(s)["runs"]
    notes = {rep: row(runs, run_id=run_id("liger", rep))["note"] for rep in (2, 3, 4)}
    assert notes[2] == (
        "metrics.jsonl line 4 (step 4): step_time_s missing (null or absent), not a finite number > 0: "
        "excluded from throughput stats"
    )
    assert notes[3] == (
        "metrics.jsonl line 4 (step 4): step_time_s = NaN, not a finite number > 0: excluded from "
        "throughput stats"
    )
    assert notes[4].startswith("metrics.jsonl line 5 (step 5): step_time_s missing")
    assert all(math.isnan(row(runs, run_id=run_id("liger", rep))["samples_per_s"]) for rep in (2, 3, 4))
    assert not math.isnan(row(runs, run_id=run_id("baseline", 4))["samples_per_s"])


# --- 6. bench report on absurd records, on a directory where it writes a file --------------------


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("step_time_s", 1e300, "step_time_s = 1e+300, not within 1e-06 to 1e+06"),
        ("step_time_s", 1e-300, "step_time_s = 1e-300, not within 1e-06 to 1e+06"),
        ("tokens", 1e300, "tokens = 1e+300, not within 0 to 1e+15"),
    ],
)
def test_absurd_values_in_a_run_keep_it_out_with_a_note_naming_the_file(tmp_path, capsys, field, value, says):
    s = write_sweep(tmp_path, "liger", rounds=4)
    shutil.rmtree(s / "runs" / run_id("liger", 2))
    write_run(s, "liger", 2, ARM_S[2], rows={step: {field: value} for step in range(1, 7)})
    rc = main(["report", str(s)])
    out, err = capsys.readouterr()
    assert rc == 0 and "error" not in err, err
    note = row(build_report(s)["runs"], run_id=run_id("liger", 2))["note"]
    assert note == f"metrics.jsonl line 1 (step 1): {says} (no step is): excluded from throughput stats"


@pytest.mark.parametrize("name", ["summary.json", "runs.csv"])
def test_a_directory_where_bench_report_writes_a_file_is_refused_naming_it(tmp_path, capsys, name):
    s = write_sweep(tmp_path, "liger", rounds=3)
    (s / name).mkdir()
    err = refused(capsys, ["report", str(s)])
    assert err.startswith(f"error: {s / name}: a directory, where bench report writes its {name}")
    assert not (s / "report.md").exists()


@pytest.mark.parametrize("arm", ["eager:data.path=a,b", "eager:data.path=[a,b]"])
def test_a_comma_in_an_arm_value_is_answered_with_what_can_be_done(capsys, arm):
    err = refused(capsys, ["ab", "-c", str(TINY), "--arm", arm, "--dry-run"])
    assert "quote it" not in err
    assert "so no value can hold one (quotes do not help)" in err and "user_arms" in err


def test_an_absurd_ratio_is_printed_in_a_few_characters(tmp_path):
    assert fmt.f(5e267, "+.1f") == "+5.0e+267" and fmt.f(3e12, ".0%") == "3e+14%"
    assert fmt.f(16.25, "+.1f") == "+16.2" and fmt.f(1234567.0, ".1f") == "1234567.0"
    s = write_sweep(tmp_path, "liger", rounds=3)
    for rep in (1, 2, 3):  # within what a step can be, and a ratio of 1e10
        for arm, t in (("baseline", 1e5), ("liger", 1e-5)):
            shutil.rmtree(s / "runs" / run_id(arm, rep))
            write_run(s, arm, rep, t)
    built = build_report(s)
    text = "\n".join(built["console_summary"]) + (s / "report.md").read_text()
    assert "+1.0e+12%" in text
    assert max(len(m) for m in re.findall(r"\d+", text)) < 12
