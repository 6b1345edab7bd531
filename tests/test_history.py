"""`bench history`: sweeps made here (run records as the driver and the trainer write them, reported
by `bench report`'s code) over three commits, with a planted step change in the gain at the third
and a sweep of the same workload on another GPU; the step is flagged where it is, naming the
version that changed, and the other GPU's sweep is kept apart with its reason. Expected Δs are
computed here from the planted step times (the ratio of geometric means), not by the code."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.results.report import build_report
from tests.test_record_integrity import BASE_S, write_sweep

STEPPED_S = {1: 0.26, 2: 0.25, 3: 0.255}  # the arm's step times after the change: about +96%
EARLY_S = {1: 0.40, 2: 0.45, 3: 0.41}  # write_sweep's ARM_S for 3 rounds: about +18%


@pytest.fixture(autouse=True)
def _no_plots(no_plots):
    """Tables only, unless a test turns plots on."""


def made(path: Path, created: str, commit: str, torch: str, gpu: str = "NVIDIA H200", arm_s=None) -> Path:
    """A reported sweep of 3 pairs (baseline, liger) whose runs say they ran ``torch`` on ``gpu`` at
    ``commit``; the Liger arm's steady step times ``arm_s`` (default write_sweep's)."""
    write_sweep(path, "liger", rounds=3)
    for d in (path / "runs").iterdir():
        run = json.loads((d / "run.json").read_text())
        run["provenance"] = {"gpu_names": [gpu], "torch": torch, "git_commit": commit}
        (d / "run.json").write_text(json.dumps(run))
        if arm_s and d.name.split("_")[-2] == "liger":
            rep = int(d.name.rsplit("_r", 1)[1])
            steps = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
            for s in steps[2:]:  # after the 2 warm-up steps
                s["step_time_s"] = arm_s[rep]
            (d / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    build_report(path)
    summary = json.loads((path / "summary.json").read_text())
    summary["sweep"]["created"] = created
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def gain(arm_s: dict[int, float]) -> float:
    logs = [math.log(BASE_S / s) for s in arm_s.values()]
    return 100 * (math.exp(sum(logs) / len(logs)) - 1)


@pytest.fixture
def history(tmp_path):
    """Four sweeps, given out of order: two before the change, one after, one on another GPU."""
    made(tmp_path / "c", "2026-12-03T10:00:00+00:00", "cccccccccccc", "2.11.0", arm_s=STEPPED_S)
    made(tmp_path / "a", "2026-12-01T10:00:00+00:00", "aaaaaaaaaaaa", "2.9.0")
    made(tmp_path / "b", "2026-12-02T10:00:00+00:00", "bbbbbbbbbbbb", "2.9.0")
    made(tmp_path / "x", "2026-12-02T12:00:00+00:00", "bbbbbbbbbbbb", "2.9.0", gpu="AMD Instinct MI355X")
    return tmp_path


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["history", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_planted_step_in_the_gain_is_flagged_where_it_is_and_names_what_changed(history, capsys):
    rc, out, _ = run(capsys, *(str(history / n) for n in "cabx"), "--arm", "liger", "--format", "json")
    assert rc == 0
    doc = json.loads(out)
    (h200,) = [s for s in doc["series"] if s["gpu_name"] == "NVIDIA H200"]
    pts = h200["points"]
    assert [Path(p["sweep"]).name for p in pts] == ["a", "b", "c"]  # by date, not as given
    assert {p["date_source"] for p in pts} == {"run"}  # these commits are not this checkout's
    assert [p["delta_pct"] for p in pts] == pytest.approx([gain(EARLY_S)] * 2 + [gain(STEPPED_S)], abs=0.01)
    assert [p["change"] for p in pts] == [None, None, "torch 2.9.0 -> 2.11.0"]
    assert pts[2]["ci_low"] > pts[1]["ci_high"]  # why it is a step: the CIs do not overlap


def test_the_same_workload_on_another_gpu_is_kept_apart_and_says_why(history, capsys):
    rc, out, _ = run(capsys, str(history), "--arm", "liger")  # the folder of sweeps
    assert rc == 0
    apart = [line for line in out.splitlines() if "AMD Instinct MI355X" in line]
    assert len(apart) == 1 and apart[0].endswith(
        "another GPU (AMD Instinct MI355X) than this workload's other sweeps (NVIDIA H200)"
    ), out
    assert "step changes: 1" in out and "torch 2.9.0 -> 2.11.0" in out


def test_out_writes_the_markdown_the_json_and_a_trend_plot_per_series(history, capsys, plots_on):
    out_dir = history / "history"
    rc, _, err = run(capsys, str(history), "--out", str(out_dir))
    assert rc == 0 and f"in {out_dir}" in err
    md = (out_dir / "history.md").read_text()
    assert "STEP: torch 2.9.0 -> 2.11.0" in md and "## Kept apart" in md
    assert json.loads((out_dir / "history.json").read_text())["schema_version"] == 1
    # the liger series of the H200 has Δs: one plot; the baseline's have none (no Δ), the MI355X's one point
    assert len(list(out_dir.glob("history_liger_*.png"))) == 1
    assert not list(out_dir.glob("history_baseline_*.png"))


def test_a_commit_this_checkout_knows_orders_by_its_date(tmp_path, capsys):
    import subprocess

    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    made(tmp_path / "s", "2020-01-01T00:00:00+00:00", head, "2.9.0")
    rc, out, _ = run(capsys, str(tmp_path / "s"), "--format", "json")
    assert rc == 0
    (point,) = json.loads(out)["series"][0]["points"]
    assert point["date_source"] == "commit" and not point["date"].startswith("2020")


@pytest.mark.parametrize(
    "given, says",
    [
        ("nowhere", "nowhere: not a sweep directory (no such directory)"),
        (".", ".: not a sweep directory (no summary.csv in it or in its subfolders)"),
    ],
)
def test_what_is_not_a_sweep_is_one_line_and_exit_2(given, says, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, given)
    assert (
        rc == 2
        and out == ""
        and err.strip().splitlines() == [f"error: {says}; give sweep output directories"]
    )


def test_a_folder_that_is_not_a_sweep_beside_sweeps_is_skipped_and_named(history, capsys):
    """A glob such as results/h200* also matches the kernel attributions' folders (no summary.csv)."""
    (history / "kernels").mkdir()
    rc, out, err = run(capsys, str(history / "a"), str(history / "kernels"))
    assert rc == 0 and "kept apart" in out
    why = "not a sweep directory (no summary.csv in it or in its subfolders)"
    assert err.splitlines() == [f"skipped {history / 'kernels'}: {why}"]


def _head() -> str:
    import subprocess

    return subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def test_sweeps_of_one_commit_are_ordered_by_their_own_date_not_their_name(tmp_path, capsys):
    """Two sweeps at one commit share its date: the one created first comes first ("a" was made later)."""
    head = _head()
    made(tmp_path / "a", "2026-12-02T17:28:00+00:00", head, "2.9.0")
    made(tmp_path / "b", "2026-12-02T17:17:00+00:00", head, "2.9.0")
    rc, out, _ = run(capsys, str(tmp_path), "--arm", "liger", "--format", "json")
    assert rc == 0
    (series,) = json.loads(out)["series"]
    assert [Path(p["sweep"]).name for p in series["points"]] == ["b", "a"]
    assert {p["date_source"] for p in series["points"]} == {"commit"}


@pytest.mark.parametrize("torn", ['{"sweep": ', "[1, 2]", '{"sweep": "x"}'])
def test_a_torn_summary_json_is_no_traceback(tmp_path, capsys, torn):
    """summary.json only dates the sweep; torn or not an object, the sweep has no date of its own."""
    made(tmp_path / "s", "2026-12-01T10:00:00+00:00", "aaaaaaaaaaaa", "2.9.0")
    (tmp_path / "s" / "summary.json").write_text(torn)
    rc, out, _ = run(capsys, str(tmp_path / "s"), "--arm", "liger", "--format", "json")
    assert rc == 0
    (point,) = json.loads(out)["series"][0]["points"]
    assert (point["date"], point["date_source"]) == ("", "run")


def test_a_summary_without_a_key_column_is_skipped_beside_others_and_refused_alone(history, capsys):
    """An older summary.csv (no workload_digest) cannot be keyed: skipped with its reason beside other
    sweeps; alone, nothing is left to read: one line, exit 2."""
    import pandas as pd

    old = history / "a" / "summary.csv"
    pd.read_csv(old).drop(columns=["workload_digest"]).to_csv(old, index=False)
    why = f"{old}: lacks workload_digest; not a summary bench report wrote"
    rc, out, err = run(capsys, str(history / "a"), str(history / "b"), "--format", "json")
    assert rc == 0 and err.splitlines() == [f"skipped {why}"]
    assert {Path(p["sweep"]).name for s in json.loads(out)["series"] for p in s["points"]} == {"b"}
    rc, out, err = run(capsys, str(history / "a"))
    assert rc == 2 and out == "" and err.splitlines() == [f"error: {why}; no sweep left to read"]
