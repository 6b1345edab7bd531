"""Capacity search: the next-probe rule, the search against a fake trainer that runs out of
memory above a batch size (found exactly, in a bounded number of probes, resumable), the table."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml

from bench.__main__ import main
from bench.config import Capacity, SweepError
from bench.fileio import read_json
from bench.results import report
from bench.results.capacity_table import capacity_table
from bench.run import capacity_search as capacity
from bench.run.session import Session
from bench.trainers import load_config
from tests.test_driver import fakes, sweep_file, train_configs  # noqa: F401

REAL_BUILD_REPORT = report.build_report  # before the fakes fixture replaces it


def simulate(threshold: int, cap: Capacity) -> tuple[int | None, list[int]]:
    """Run the rule against "fits when value <= threshold"; (largest fit, values probed)."""
    history: dict[int, str] = {}
    while (v := capacity.next_value(history, cap)) is not None:
        assert v not in history  # never probes a value twice
        history[v] = "ok" if v <= threshold else "oom"
    fits = [v for v, s in history.items() if s == "ok"]
    return max(fits, default=None), list(history)


@pytest.mark.parametrize("threshold", [1, 3, 8, 23, 24, 100, 255, 256, 300])
def test_rule_finds_the_threshold_exactly_in_few_probes(threshold):
    cap = Capacity("batch_size", start=8, max=256, granularity=1, steps=3)
    best, probed = simulate(threshold, cap)
    assert best == min(threshold, 256)
    assert len(probed) <= 2 * math.ceil(math.log2(256)) + 1  # doubling then bisecting


def test_rule_on_the_sequence_axis_keeps_multiples_of_the_granularity():
    cap = Capacity("seq_len", start=2048, max=65536, granularity=1024, steps=3)
    best, probed = simulate(21000, cap)
    assert best == 20480 and all(v % 1024 == 0 for v in probed)


def test_an_error_stops_the_arm_and_nothing_fits_ends_it():
    cap = Capacity("batch_size", start=8, max=64, granularity=1, steps=3)
    assert capacity.next_value({8: "ok", 16: "error"}, cap) is None
    assert capacity.next_value({8: "oom", 4: "oom", 2: "oom", 1: "oom"}, cap) is None


@pytest.fixture
def real_report(fakes, monkeypatch):  # noqa: F811
    """The fake trainer and hardware, but the real report (capacity.csv is built there)."""
    monkeypatch.setattr(report, "build_report", REAL_BUILD_REPORT)


def capacity_sweep(tmp_path, max_batch: int = 11, **top):
    tc = train_configs(tmp_path)
    cell = {"config": tc["online"], "batch_size": 1, "seq_len": 32, "set": {"fake.max_batch": max_batch}}
    path = sweep_file(tmp_path, [cell], **top)
    doc = yaml.safe_load(path.read_text())
    doc["capacity"] = {"axis": "batch_size", "start": 2, "max": 64, "steps": 3}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_search_against_a_trainer_that_ooms_above_a_batch(plots_on, tmp_path, real_report):
    path = capacity_sweep(tmp_path)
    out = tmp_path / "out"
    assert main(["capacity", str(path), "--out", str(out)]) == 0
    runs = pd.read_csv(out / "runs.csv")
    assert sorted(runs["batch_size"]) == [2, 4, 8, 10, 11, 12, 16]  # 2, 4, 8 fit, 16 OOM, then bisection
    assert set(runs.loc[runs["batch_size"] > 11, "status"]) == {"oom"}
    assert (
        runs.loc[runs["status"] == "oom", "reason"] == "CUDA out of memory. Tried to allocate 2.00 GiB"
    ).all()
    table = pd.read_csv(out / "capacity.csv").set_index("arm").loc["baseline"]
    assert (table.largest_fit, table.first_oom, table.probes, table.stopped_by) == (11, 12, 7, "oom")
    assert "## Capacity" in (out / "report.md").read_text() and (out / "capacity.png").exists()


def test_a_killed_search_resumes_to_the_same_answer(tmp_path, fakes, monkeypatch):  # noqa: F811
    path = capacity_sweep(tmp_path)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert main(["capacity", str(path), "--out", str(whole)]) == 0
    real, calls = Session.execute, []

    def dies_on_the_fifth_probe(*args, **kw):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(Session, "execute", dies_on_the_fifth_probe)
    assert main(["capacity", str(path), "--out", str(killed)]) == 130
    assert len(list((killed / "runs").iterdir())) == 4
    monkeypatch.setattr(Session, "execute", real)
    assert main(["capacity", str(path), "--out", str(killed), "--resume"]) == 0
    names = sorted(p.name for p in (killed / "runs").iterdir())
    assert names == sorted(p.name for p in (whole / "runs").iterdir())  # nothing lost, nothing twice
    assert read_json(killed / "sweep.json")["resumes"]


def test_capacity_table_ratio_and_one_arm_oom():
    rows = [
        ("baseline", 8, "ok", 30.0), ("baseline", 16, "oom", None), ("baseline", 12, "ok", 40.0),
        ("liger", 8, "ok", 25.0), ("liger", 16, "ok", 38.0), ("liger", 32, "oom", None), ("liger", 24, "ok", 44.0),
    ]  # fmt: skip
    runs = pd.DataFrame(
        [
            {"run_id": f"p_offline_bs{v}_s64_{a}_r1", "profile": "p", "mode": "offline", "batch_size": v,
             "seq_len": 64, "gpus": 1, "arm": a, "status": s, "reason": None, "peak_vram_gib": m, "samples_per_s": 1.0}
            for a, v, s, m in rows
        ]
    )  # fmt: skip
    table = capacity_table(runs, {"config": {"capacity": {"axis": "batch_size"}}}).set_index("arm")
    assert table.loc["baseline", "largest_fit"] == 12 and table.loc["baseline", "first_oom"] == 16
    assert table.loc["liger", "largest_fit"] == 24 and table.loc["liger", "fit_ratio_vs_baseline"] == 2.0
    assert table.loc["liger", "peak_vram_gib_at_largest"] == 44.0
    assert table.loc["liger", "fit_ratio_bound"] == "exact"


@pytest.mark.parametrize(
    ("base", "liger", "ratio", "bound", "shown"),
    [
        ([(8, "ok"), (16, "oom")], [(8, "ok"), (16, "ok")], 2.0, "at least", "≥ 2.00×"),  # liger hit max 16
        ([(8, "ok"), (16, "ok")], [(8, "ok"), (16, "oom")], 0.5, "at most", "≤ 0.50×"),
        ([(8, "ok"), (16, "ok")], [(8, "ok"), (16, "ok")], None, "unknown: both fit the max", "both fit"),
        (
            [(8, "ok"), (16, "timeout")],
            [(8, "ok"), (16, "oom")],
            None,
            None,
            "timeout",
        ),  # no answer: no ratio
    ],
)
def test_a_search_that_reached_its_max_gives_a_bound_not_a_ratio(base, liger, ratio, bound, shown):
    rows = [("baseline", v, s) for v, s in base] + [("liger", v, s) for v, s in liger]
    runs = pd.DataFrame(
        [
            {"run_id": f"p_offline_bs{v}_s64_{a}_r1", "profile": "p", "mode": "offline", "batch_size": v,
             "seq_len": 64, "gpus": 1, "arm": a, "status": s, "reason": None, "peak_vram_gib": 9.0, "samples_per_s": 1.0}
            for a, v, s in rows
        ]
    )  # fmt: skip
    table = capacity_table(runs, {"config": {"capacity": {"axis": "batch_size"}}})
    row = table.set_index("arm").loc["liger"]
    assert (row.gpus, row.nodes) == (1, 1)  # every table names its world size (nodes: 1 when unrecorded)
    assert pd.isna(row.fit_ratio_bound) if bound is None else row.fit_ratio_bound == bound
    assert (pd.isna(row.fit_ratio_vs_baseline) and ratio is None) or row.fit_ratio_vs_baseline == ratio
    assert shown in "\n".join(report.capacity_section(table))


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"axis": "width", "start": 1, "max": 8}, "capacity.axis: expected one of batch_size, seq_len"),
        ({"axis": "batch_size", "start": 8, "max": 4}, "capacity.max: 4 is below start (8)"),
        ({"axis": "seq_len", "start": 1000, "max": 4096}, "expected multiples of granularity (128)"),
        ({"axis": "batch_size", "start": 1}, "capacity.max: missing"),
    ],
)
def test_bad_capacity_sections_are_one_line(tmp_path, section, expected):
    tc = train_configs(tmp_path)
    path = sweep_file(tmp_path, [{"config": tc["online"], "batch_size": 1, "seq_len": 32}])
    doc = yaml.safe_load(path.read_text())
    doc["capacity"] = section
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(SweepError) as err:
        load_config(path)
    assert expected in str(err.value)


def test_capacity_needs_its_section(tmp_path, fakes, capsys):  # noqa: F811
    tc = train_configs(tmp_path)
    path = sweep_file(tmp_path, [{"config": tc["online"], "batch_size": 1, "seq_len": 32}])
    assert main(["capacity", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "capacity: missing" in capsys.readouterr().err and not (tmp_path / "out").exists()
