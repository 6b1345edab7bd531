"""Nothing silent in `bench compare` and its gates: an arm not in effect never passes a gate, a
sweep's own arm (user_arms) is held to the baseline of its cell, a sweep with a planned run that
never ran compares and says so, and an intact summary.json reads as intact. On sweeps built here as
the driver and the trainer write them (tests/test_record_integrity.py's helpers), through
``python -m bench compare``."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from bench.__main__ import main
from bench.results.report import build_report
from tests.test_record_integrity import ARM_S, BASE_S, delta_pct, run_id, write_sweep

NAME = "p offline bs2 seq64 acc1 anchors8 gpus1 arm"  # the cell write_run writes
STOCK = ["DFlashDraft", "Linear", "Qwen3MLP", "Qwen3RMSNorm"]  # the model classes a run records
LIGER = ["DFlashDraft", "LigerRMSNorm", "LigerSwiGLUMLP", "Linear"]
SDPA = {"training.attention_backend": "sdpa"}


@pytest.fixture(autouse=True)
def _no_plots(no_plots):
    """Tables only (conftest's no_plots)."""


def sweep(
    path: Path,
    arm: str = "liger",
    arm_s: dict[int, float] | None = None,
    types: dict[str, list[str]] | None = None,
    arm_set: dict | None = None,
    gone: tuple[str, ...] = (),
    skipped: bool = False,
    resolved: bool = True,
) -> Path:
    """A reported sweep of 4 pairs (baseline, ``arm``): the arm's steady step time per round
    (``arm_s``, default ARM_S; the baseline's is BASE_S), the model classes each arm's runs
    recorded (``types``), a sweep's own arm's keys (``arm_set``, declared in sweep.json), run
    directories removed (``gone``: planned, never ran) and the arm's runs skipped; ``resolved``
    False: the runs of a sweep's own arm record nothing of what its keys resolved to."""
    write_sweep(path, arm, rounds=4)
    for d in (path / "runs").iterdir():
        given = json.loads((d / "cell.json").read_text())
        mine = given["arm"] == arm
        if mine and arm_set:
            (d / "cell.json").write_text(json.dumps({**given, "arm_set": arm_set}))
        if mine and arm_s:
            steps = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
            for s in steps[2:]:
                s["step_time_s"] = arm_s[given["repeat"]]
            (d / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
        said = json.loads((d / "run.json").read_text())
        if types:
            said["draft_module_types"] = types[given["arm"]]
        if mine and arm_set and resolved:  # what the trainer resolved the arm's keys to: as asked
            said["set_resolved"] = {k: {"config": v} for k, v in arm_set.items()}
        if mine and skipped:
            said.update(status="skipped", reason="Liger's Triton kernels need a GPU")
            (d / "metrics.jsonl").unlink()
        (d / "run.json").write_text(json.dumps(said))
    if arm_set:
        plan = json.loads((path / "sweep.json").read_text())
        plan["config"] = {"arms": ["baseline", arm], "user_arms": {arm: {"doc": "SDPA", "set": arm_set}}}
        (path / "sweep.json").write_text(json.dumps(plan))
    for name in gone:
        shutil.rmtree(path / "runs" / name)
    build_report(path)
    return path


def compare(capsys, a: Path, b: Path, *flags: str) -> tuple[int, str, str]:
    rc = main(["compare", str(a), str(b), *flags])
    out, err = capsys.readouterr()
    return rc, out, err


def gate_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(("  pass", "  not decided", "  FAILED"))]


# --- 1. an arm not in effect never passes a gate ---------------------------------------------------

OFF_LIGER = "4 of 4 liger runs: no LigerRMSNorm, LigerSwiGLUMLP in the model"


@pytest.mark.parametrize("side", ["A", "B"])
def test_an_arm_not_in_effect_on_either_side_never_passes_either_gate(tmp_path, capsys, side):
    """Same speeds on both sides: before, both gates passed the liger row of a side whose own
    report says "arm not in effect" (its runs trained the stock modules)."""
    landed = sweep(tmp_path / "landed", types={"baseline": STOCK, "liger": LIGER})
    stock = sweep(tmp_path / "stock", types={"baseline": STOCK, "liger": STOCK})
    assert pd.read_csv(stock / "summary.csv").set_index("arm").loc["liger", "verdict_speed"] == (
        f"arm not in effect ({OFF_LIGER})"
    )
    a, b = (stock, landed) if side == "A" else (landed, stock)
    flags = ("--fail-if-slower", "5", "--fail-if-gain-drops", "5", "--out", str(tmp_path / "o"))
    rc, out, err = compare(capsys, a / "summary.csv", b / "summary.csv", *flags)
    why = f"arm not in effect in {side} ({OFF_LIGER})"
    assert gate_lines(out) == [
        f"  pass         {NAME} baseline: +0.0% [+0.0, +0.0]: CI above -5%",
        f"  not decided  {NAME} liger: {why}",
        f"  not decided  {NAME} liger: {why}",
    ]
    assert rc == 2 and err.startswith("error: gate: --fail-if-gain-drops 5: cannot decide any row")
    assert f"{NAME} liger: {why}: no verdict, no gain, never a gate's pass" in out.replace("\n    ", " ")
    table = out[out.index("(samples/s)") : out.index("Gate (")]
    assert max(len(line) for line in table.splitlines()) <= 100
    row = pd.read_csv(tmp_path / "o" / "compare.csv").set_index("arm").loc["liger"]
    assert row["verdict"] == f"arm not in effect in {side}: {OFF_LIGER}"
    assert math.isnan(row["gain_change_points"]) and row["gate"] == row["gain_gate"] == "not decided"


def test_a_baseline_not_in_effect_holds_back_its_own_row_and_its_arms_gain(tmp_path, capsys):
    a = sweep(tmp_path / "a", types={"baseline": STOCK, "liger": LIGER})
    b = sweep(tmp_path / "b", types={"baseline": LIGER, "liger": LIGER})  # B's baseline trained Liger's
    rc, out, _ = compare(capsys, a / "runs.csv", b / "runs.csv", "--fail-if-slower", "5")
    base, liger = gate_lines(out)
    assert base.startswith(f"  not decided  {NAME} baseline: arm not in effect in B (4 of 4 baseline runs: ")
    assert liger.startswith(f"  not decided  {NAME} liger: arm not in effect in B (4 of 4 baseline runs: ")
    assert rc == 2  # nothing left to pass


def test_a_summary_alone_whose_arm_was_not_in_effect_says_so(tmp_path, capsys):
    landed = sweep(tmp_path / "landed", types={"baseline": STOCK, "liger": LIGER})
    stock = sweep(tmp_path / "stock", types={"baseline": STOCK, "liger": STOCK})
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(stock / "summary.csv", alone / "summary.csv")
    _, out, _ = compare(capsys, landed / "summary.csv", alone / "summary.csv", "--fail-if-slower", "5")
    assert f"  not decided  {NAME} liger: arm not in effect in B ({OFF_LIGER})" in gate_lines(out)


# --- 1b. an arm whose runs recorded nothing of it: a Δ, no verdict, never a gate's pass -------------

UNRECORDED = "4 of 4 liger runs recorded nothing of whether the arm took effect; no verdict"


def test_a_liger_arm_whose_runs_recorded_no_module_classes_gets_its_delta_but_no_verdict(tmp_path, capsys):
    """Before, a Liger arm whose runs recorded nothing of the model they trained read 'faster' (a
    verdict on kernels nobody saw land) and both gates passed it."""
    unrecorded = sweep(tmp_path / "unrecorded", types={"baseline": STOCK, "liger": None})
    landed = sweep(tmp_path / "landed", types={"baseline": STOCK, "liger": LIGER})
    row = pd.read_csv(unrecorded / "summary.csv").set_index("arm").loc["liger"]
    # the Δ is a measurement and stays: baseline 0.50 s a step, the arm 0.40-0.45 s (delta_pct's hand rule)
    assert row["delta_samples_per_s_pct"] == pytest.approx(delta_pct([1, 2, 3, 4]), abs=0.01)
    assert row["verdict_speed"] == f"effect not recorded ({UNRECORDED})"
    assert "effect not recorded, no verdict" in (unrecorded / "report.md").read_text()
    assert (
        "| liger | " in (unrecorded / "report.md").read_text().split("**Arms.**")[1]
    )  # the Arms table says so
    for a, b, side in ((unrecorded, landed, "A"), (landed, unrecorded, "B")):
        flags = ("--fail-if-slower", "5", "--fail-if-gain-drops", "5")
        rc, out, _ = compare(capsys, a / "summary.csv", b / "summary.csv", *flags)
        lines = gate_lines(out)
        assert lines[1:] == [f"  not decided  {NAME} liger: effect not recorded in {side} ({UNRECORDED})"] * 2
        assert rc == 2  # the gain gate has nothing else to decide


def test_a_user_arm_whose_runs_recorded_nothing_of_its_keys_is_never_a_gates_pass(tmp_path, capsys):
    a = sweep(tmp_path / "a", arm="eager", arm_set=SDPA, resolved=False)
    b = sweep(tmp_path / "b", arm="eager", arm_set=SDPA, resolved=False)
    verdict = pd.read_csv(a / "summary.csv").set_index("arm").loc["eager", "verdict_speed"]
    assert verdict.startswith("effect not recorded (4 of 4 eager runs recorded nothing")
    rc, out, _ = compare(capsys, a / "summary.csv", b / "summary.csv", "--fail-if-gain-drops", "5")
    assert gate_lines(out) == [f"  not decided  {NAME} eager: effect not recorded in A and B (A: " + verdict[21:-1]
                               + "; B: " + verdict[21:-1] + ")"]  # fmt: skip
    assert rc == 2


# --- 2. a sweep's own arm is held to the baseline of its cell -------------------------------------

SLOWER = {1: 0.48, 2: 0.49, 3: 0.47, 4: 0.48}  # B's eager: most of A's gain gone


def _gain(arm_s: dict[int, float]) -> tuple[float, float]:
    """An arm's gain over BASE_S in % (ratio of geometric means over its 4 pairs) and its
    delta-method variance: docs/reference.md's "the gain's change"."""
    lr = np.log([BASE_S / arm_s[r] for r in (1, 2, 3, 4)])
    m = float(np.mean(lr))
    return 100 * math.expm1(m), (100 * math.exp(m)) ** 2 * float(np.var(lr, ddof=1)) / 4


def test_a_user_arms_gain_is_judged_against_the_baseline_of_its_cell(tmp_path, capsys):
    a = sweep(tmp_path / "a", arm="eager", arm_set=SDPA)
    b = sweep(tmp_path / "b", arm="eager", arm_set=SDPA, arm_s=SLOWER)
    (ga, va), (gb, vb) = _gain(ARM_S), _gain(SLOWER)
    change, se = gb - ga, math.sqrt(va + vb)
    half = sps.t.ppf(0.975, (va + vb) ** 2 / (va**2 / 3 + vb**2 / 3)) * se
    rc, out, _ = compare(capsys, a / "summary.csv", b / "summary.csv", "--fail-if-gain-drops", "5")
    how = "paired with its cell's baseline by cell plus the arm's declared keys: training.attention_backend=sdpa"
    assert gate_lines(out) == [
        f"  FAILED       {NAME} eager: gain {ga:+.1f}% in A, {gb:+.1f}% in B ({how}): gain lower by "
        f"{-change:.1f} points [{change - half:+.1f}, {change + half:+.1f}]"
    ]
    assert rc == 3
    assert f"{NAME} eager: a sweep's own arm (user_arms): its gain is {how}" in out.replace("\n    ", " ")
    # two sweeps' own arms of one name that set other keys are other workloads: never paired
    other = sweep(tmp_path / "other", arm="eager", arm_set={"training.attention_backend": "eager"})
    rc, out, err = compare(capsys, a / "summary.csv", other / "summary.csv", "--fail-if-gain-drops", "5")
    assert gate_lines(out)[0].startswith(f"  not decided  {NAME} eager: not compared: different workloads")
    assert rc == 2 and "cannot decide any row" in err


# --- 3. a run that never ran; summary.json -------------------------------------------------------


def test_a_sweep_with_a_run_that_never_ran_compares_and_says_which(tmp_path, capsys):
    a = sweep(tmp_path / "a")
    b = sweep(tmp_path / "b", gone=(run_id("liger", 2),))
    rc, out, err = compare(capsys, a / "summary.csv", b / "summary.csv", "--fail-if-slower", "50")
    assert (rc, err) == (0, "")
    assert f"  B: 1 planned run never ran (not run): {run_id('liger', 2)}" in out.splitlines()
    assert gate_lines(out)[1].startswith(f"  pass         {NAME} liger: ")


def test_an_arm_none_of_whose_runs_ran_fails_the_gate_as_missing(tmp_path, capsys):
    a = sweep(tmp_path / "a")
    b = sweep(tmp_path / "b", gone=tuple(run_id("liger", r) for r in (1, 2, 3, 4)))
    rc, out, _ = compare(capsys, a / "summary.csv", b / "summary.csv", "--fail-if-slower", "5")
    mean_a = np.mean([2 / ARM_S[r] for r in (1, 2, 3, 4)])  # 2 samples a step
    assert gate_lines(out)[1] == f"  FAILED       {NAME} liger: B has no ok run (A: {mean_a:.2f} samples/s)"
    assert rc == 3 and "B: 4 planned runs never ran (not run): " in out


CASES = {
    "a user arm": dict(arm="eager", arm_set=SDPA),
    "a skipped arm": dict(skipped=True),
    "a run that never ran": dict(gone=(run_id("liger", 3),)),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_an_intact_summary_json_reads_as_intact(tmp_path, capsys, case):
    """summary.json was called "cut short or edited"; it reads as the summary.csv beside it does."""
    a = sweep(tmp_path / "a", **CASES[case])
    b = sweep(tmp_path / "b", **CASES[case])
    got = {}
    for name in ("summary.csv", "summary.json"):
        rc, out, err = compare(capsys, a / name, b / name, "--out", str(tmp_path / name))
        assert (rc, err) == (0, "") and "per-run data" in out
        got[name] = (tmp_path / name / "compare.csv").read_text()
    assert got["summary.json"] == got["summary.csv"]
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(b / "summary.json", alone / "summary.json")  # no runs.csv beside: point estimates
    rc, out, err = compare(capsys, a / "summary.json", alone / "summary.json")
    assert (rc, err) == (0, "") and "B: point estimates" in out


def test_a_summary_json_cut_short_is_named_so(tmp_path, capsys):
    a = sweep(tmp_path / "a")
    text = (a / "summary.json").read_text()
    cut = tmp_path / "summary.json"
    cut.write_text(text[: len(text) // 2])
    rc, out, err = compare(capsys, a / "summary.json", cut)
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"error: {cut}: not a whole JSON document (") and "cut short or edited" in err
