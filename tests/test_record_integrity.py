"""Numbers nobody can corrupt (issue 19): a run's identity comes from sweep.json's plan and its
directory's name, checked against cell.json (a damaged or disagreeing cell.json makes the run an
error, never a run of another arm); a planned run whose directory is gone stays in runs.csv
("not run"); a bad value in metrics.jsonl keeps the run out of the statistics with a note; a
record field of the wrong type (bench/record.py) stops the report with one line naming it.

Hand-made sweep directories, built as the driver and the trainer write them
(docs/run-contract.md), read back through ``python -m bench report`` / build_report.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from bench.results.records import NOT_RUN_REASON
from bench.results.report import build_report
from tests.helpers import census, run_cli

CELL = "p_offline_bs2_s64"
STEPS, WARMUP = 6, 2
WARMUP_STEP_S = 5.0  # warm-up steps are slow: counting one as measured moves the throughput
BASE_S = 0.50  # baseline's steady step time, every round
ARM_S = {1: 0.40, 2: 0.45, 3: 0.41, 4: 0.39}  # the other arm's, per round


@pytest.fixture(autouse=True)
def _no_plots(no_plots):
    """Every test here reads tables only (conftest's no_plots)."""


def run_id(arm: str, repeat: int) -> str:
    return f"{CELL}_{arm}_r{repeat}"


def write_run(sweep: Path, arm: str, repeat: int, step_s: float, rows: dict[int, dict] | None = None) -> Path:
    """One finished run: cell.json (driver), run.json and metrics.jsonl (trainer). The trainer's
    run.json says arm "baseline" for every arm without Liger, as ours does. ``rows``: per step,
    values that replace the trainer's."""
    d = sweep / "runs" / run_id(arm, repeat)
    d.mkdir(parents=True)
    cell = {
        "run_id": d.name, "cell_id": CELL, "profile": "p", "mode": "offline", "batch_size": 2, "seq_len": 64,
        "accumulation_steps": 1, "num_anchors": 8, "gpus": 1, "nodes": 1, "arm": arm, "repeat": repeat,
        "order_index": 2 * (repeat - 1) + (arm != "baseline"), "steps": STEPS, "warmup_steps": WARMUP,
        "loss_tolerance": 0.01, "trainer": "embedded",
    }  # fmt: skip
    (d / "cell.json").write_text(json.dumps(cell))
    run = {"status": "ok", "reason": None, "arm": "liger" if arm == "liger" else "baseline"}
    run["draft_module_types"] = census(arm)  # what the trainer records: the arm proven in effect
    (d / "run.json").write_text(json.dumps(run))
    lines = []
    for step in range(1, STEPS + 1):
        t = WARMUP_STEP_S if step <= WARMUP else step_s
        row = {"step": step, "loss": 7.0 - 0.1 * step, "step_time_s": t, "samples": 2, "tokens": 128}
        lines.append(json.dumps({**row, **(rows or {}).get(step, {})}))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return d


def write_sweep(sweep: Path, arm: str, rounds: int, planned: int | None = None) -> Path:
    """``rounds`` finished pairs (baseline, ``arm``) and sweep.json planning ``planned`` rounds
    (default: as many), its order round-major as the driver plans it (bench/config/plan.py)."""
    for rep in range(1, rounds + 1):
        write_run(sweep, "baseline", rep, BASE_S)
        write_run(sweep, arm, rep, ARM_S[rep])
    order = [run_id(a, rep) for rep in range(1, (planned or rounds) + 1) for a in ("baseline", arm)]
    (sweep / "sweep.json").write_text(json.dumps({"name": "integrity", "order": order, "config": {}}))
    return sweep


def delta_pct(repeats: list[int]) -> float:
    """The Δ samples/s the report must give over these pairs: the ratio of geometric means."""
    lr = [math.log(BASE_S / ARM_S[rep]) for rep in repeats]
    return 100 * (math.exp(sum(lr) / len(lr)) - 1)


def row(df: pd.DataFrame, **match) -> pd.Series:
    hit = df
    for k, v in match.items():
        hit = hit[hit[k] == v]
    assert len(hit) == 1, f"{match}: {len(hit)} rows"
    return hit.iloc[0]


def main_row(out: dict, arm: str) -> list[str]:
    """The main table's cells for ``arm`` (report.md's first table, as the console prints it)."""
    for line in out["main_table"][2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[5] == arm:
            return cells
    raise AssertionError(f"no main-table row for {arm}")


# --- 1. identity from the plan and the directory name, cross-checked against cell.json ---------

DAMAGE = {
    "unreadable": ('{"run_id": ', "cell.json is not a JSON object (empty, torn or not JSON)"),
    "empty": ("", "cell.json is not a JSON object (empty, torn or not JSON)"),
    "a list": ("[1, 2]", "cell.json is an array, not an object"),
    "a string": ('"sdpa"', "cell.json is a string, not an object"),
    "missing": (None, "cell.json missing"),
    "no identity": ("{}", "cell.json lacks run_id, cell_id, arm, repeat, warmup_steps"),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_cell_json_makes_the_run_an_error_under_its_own_arm(tmp_path, damage):
    """The sdpa run's trainer wrote arm "baseline" in run.json: today's reader filed the run
    under the baseline with no warm-up, and the Δ moved. Its identity is its directory's name."""
    text, problem = DAMAGE[damage]
    sweep = write_sweep(tmp_path, "sdpa", rounds=4)
    cell_json = sweep / "runs" / run_id("sdpa", 2) / "cell.json"
    if text is None:
        cell_json.unlink()
    else:
        cell_json.write_text(text)
    out = build_report(sweep)
    bad = row(out["runs"], run_id=run_id("sdpa", 2))
    assert (bad["cell_id"], bad["arm"], bad["repeat"], bad["status"]) == (CELL, "sdpa", 2, "error")
    assert bad["reason"] == f"{problem}: its cell, arm and repeat are unconfirmed"
    assert bad["note"] == f"{STEPS} step(s) logged (run.json: ok); excluded from stats"
    assert math.isnan(bad["samples_per_s"]) and pd.isna(bad["warmup_steps"]) and bad["steps_total"] == STEPS
    assert list(out["runs"].groupby("arm").size().items()) == [("baseline", 4), ("sdpa", 4)]
    base, sdpa = row(out["summary"], arm="baseline"), row(out["summary"], arm="sdpa")
    assert (base["n_runs"], base["n_ok"], sdpa["n_runs"], sdpa["n_ok"]) == (4, 4, 4, 3)
    assert sdpa["n_pairs"] == 3 and sdpa["delta_samples_per_s_pct"] == pytest.approx(
        delta_pct([1, 3, 4]), rel=1e-12
    )
    assert sdpa["profile"] == "p" and sdpa["batch_size"] == 2 and sdpa["trainer"] == "embedded"
    assert main_row(out, "sdpa")[6] == "3/4"
    runs_csv = pd.read_csv(sweep / "runs.csv")
    assert row(runs_csv, run_id=run_id("sdpa", 2))["status"] == "error"
    report = (sweep / "report.md").read_text()
    assert f"| {run_id('sdpa', 2)} | error | {problem}: its cell, arm and repeat are unconfirmed |" in report


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("arm", "baseline", "cell.json says arm 'baseline', the directory 'sdpa'"),
        ("repeat", 3, "cell.json says repeat 3, the directory '2'"),
        ("cell_id", "p_offline_bs4_s64", "cell.json says cell_id 'p_offline_bs4_s64', the directory 'p_offline_bs2_s64'"),
        ("run_id", run_id("sdpa", 3), f"cell.json says run_id '{run_id('sdpa', 3)}', the directory '{run_id('sdpa', 2)}'"),
    ],
)  # fmt: skip
def test_a_cell_json_naming_another_run_makes_the_run_an_error(tmp_path, key, value, says):
    sweep = write_sweep(tmp_path, "sdpa", rounds=4)
    cell_json = sweep / "runs" / run_id("sdpa", 2) / "cell.json"
    cell_json.write_text(json.dumps({**json.loads(cell_json.read_text()), key: value, "warmup_steps": 0}))
    out = build_report(sweep)
    bad = row(out["runs"], run_id=run_id("sdpa", 2))
    assert (bad["arm"], bad["repeat"], bad["status"]) == ("sdpa", 2, "error")
    assert bad["reason"] == f"{says}: its cell, arm and repeat are unconfirmed"
    assert pd.isna(bad["warmup_steps"]) and pd.isna(bad["steps_measured"])  # the wrong cell.json is not read
    sdpa = row(out["summary"], arm="sdpa")
    assert (sdpa["n_ok"], sdpa["n_pairs"]) == (3, 3)
    assert sdpa["delta_samples_per_s_pct"] == pytest.approx(delta_pct([1, 3, 4]), rel=1e-12)
    assert row(out["summary"], arm="baseline")["n_ok"] == 4


def test_a_run_directory_the_plan_does_not_hold_is_an_error(tmp_path):
    sweep = write_sweep(tmp_path, "liger", rounds=3)
    write_run(sweep, "liger", 4, ARM_S[4])  # a fourth liger run: sweep.json planned three rounds
    out = build_report(sweep)
    extra = row(out["runs"], run_id=run_id("liger", 4))
    assert (extra["arm"], extra["repeat"], extra["status"]) == ("liger", 4, "error")
    assert (
        extra["reason"] == "not in sweep.json's planned run order: its cell, arm and repeat are unconfirmed"
    )
    liger = row(out["summary"], arm="liger")
    assert (liger["n_runs"], liger["n_ok"], liger["n_pairs"]) == (4, 3, 3)
    assert liger["delta_samples_per_s_pct"] == pytest.approx(delta_pct([1, 2, 3]), rel=1e-12)


def test_intact_runs_read_as_before_and_bench_report_says_which_run_is_damaged(tmp_path):
    """The command line a user runs: exit 0, the damaged run in the table's count and runs.csv."""
    sweep = write_sweep(tmp_path, "sdpa", rounds=4)
    clean = build_report(sweep)
    sdpa = row(clean["summary"], arm="sdpa")
    assert (sdpa["n_ok"], sdpa["n_pairs"], set(clean["runs"]["status"])) == (4, 4, {"ok"})
    assert sdpa["delta_samples_per_s_pct"] == pytest.approx(delta_pct([1, 2, 3, 4]), rel=1e-12)
    assert clean["runs"]["note"].isna().all() and (clean["runs"]["warmup_steps"] == WARMUP).all()
    (sweep / "runs" / run_id("sdpa", 2) / "cell.json").write_text("[]")
    done = run_cli("bench", "report", str(sweep), timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert next(line for line in lines if line.split()[:1] == ["sdpa"]).split()[1] == "3/4"
    sdpa_delta = next(line for line in lines if line.strip().startswith("sdpa vs baseline:"))
    assert f"{delta_pct([1, 3, 4]):+.1f}%" in sdpa_delta
    runs_csv = pd.read_csv(sweep / "runs.csv")
    assert row(runs_csv, run_id=run_id("sdpa", 2))["reason"] == (
        "cell.json is an array, not an object: its cell, arm and repeat are unconfirmed"
    )


@pytest.mark.parametrize(
    "name, key, value, says",
    [
        ("cell.json", "repeat", "x", "field 'repeat' is a string, expected an integer"),
        ("cell.json", "steps", 6.5, "field 'steps' is a number, expected an integer"),
        ("run.json", "status", 1, "field 'status' is a number, expected a string"),
    ],
)
def test_a_mistyped_record_field_is_one_error_line_through_bench_report(
    tmp_path, capsys, name, key, value, says
):
    """A field of the wrong type is no damage to work around: `bench report` stops with one line
    naming the file and the field (exit 2), before it writes anything."""
    from bench.__main__ import main

    sweep = write_sweep(tmp_path, "sdpa", rounds=2)
    path = sweep / "runs" / run_id("sdpa", 2) / name
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    assert main(["report", str(sweep)]) == 2
    out, err = capsys.readouterr()
    assert err == f"error: {path}: {says}\n" and out == ""
    assert not (sweep / "runs.csv").exists() and not (sweep / "report.md").exists()


# --- 2. planned runs with no directory ----------------------------------------------------------


def test_a_planned_run_whose_directory_is_gone_is_a_not_run_row(tmp_path):
    sweep = write_sweep(tmp_path, "liger", rounds=4)
    for gone in (run_id("liger", 2), run_id("baseline", 4)):
        for f in (sweep / "runs" / gone).iterdir():
            f.unlink()
        (sweep / "runs" / gone).rmdir()
    out = build_report(sweep)
    for gone, order_index in ((run_id("liger", 2), 3), (run_id("baseline", 4), 6)):
        r = row(out["runs"], run_id=gone)
        assert (r["status"], r["reason"], r["order_index"], r["steps_total"]) == (
            "not run",
            NOT_RUN_REASON,
            order_index,
            0,
        )
    assert list(out["runs"]["run_id"]) == [
        run_id(a, rep) for rep in (1, 2, 3, 4) for a in ("baseline", "liger")
    ]
    base, liger = row(out["summary"], arm="baseline"), row(out["summary"], arm="liger")
    assert (base["n_runs"], base["n_ok"], liger["n_runs"], liger["n_ok"], liger["n_pairs"]) == (4, 3, 4, 3, 2)
    assert liger["delta_samples_per_s_pct"] == pytest.approx(delta_pct([1, 3]), rel=1e-12)
    assert main_row(out, "liger")[6] == "3/4" and main_row(out, "baseline")[6] == "3/4"
    report = (sweep / "report.md").read_text()
    assert f"| {run_id('liger', 2)} | not run | {NOT_RUN_REASON} |" in report


def test_rounds_a_sweep_has_not_reached_are_not_reported(tmp_path):
    """Stopped early (a --resume not yet done), or a precision rule that extended the plan to 6
    rounds: rounds with no run directory at all are the sweep's future, not a gap; a round cut
    short lists the runs it still lacks."""
    sweep = write_sweep(tmp_path, "liger", rounds=3, planned=6)
    write_run(sweep, "baseline", 4, BASE_S)  # round 4 in flight: its liger run not started yet
    out = build_report(sweep)
    assert list(out["runs"]["run_id"]) == [
        *(run_id(a, rep) for rep in (1, 2, 3) for a in ("baseline", "liger")),
        run_id("baseline", 4),
        run_id("liger", 4),
    ]
    assert row(out["runs"], run_id=run_id("liger", 4))["status"] == "not run"
    liger = row(out["summary"], arm="liger")
    assert (liger["n_runs"], liger["n_ok"], liger["n_pairs"]) == (4, 3, 3)


def test_a_sweep_without_a_plan_reads_its_run_directories_alone(tmp_path):
    """No sweep.json (or a capacity search's empty order): nothing to check against or miss."""
    sweep = write_sweep(tmp_path, "liger", rounds=3)
    (sweep / "sweep.json").write_text(json.dumps({"name": "integrity", "order": []}))
    out = build_report(sweep)
    assert set(out["runs"]["status"]) == {"ok"} and len(out["runs"]) == 6
    (sweep / "sweep.json").unlink()
    assert set(build_report(sweep)["runs"]["status"]) == {"ok"}


# --- 3. bad values in metrics.jsonl --------------------------------------------------------------

BAD = {
    "step time text": ({"step_time_s": "0.4s"}, 'line 4 (step 4): step_time_s = "0.4s", not a finite number > 0'),
    "negative step time": ({"step_time_s": -0.4}, "line 4 (step 4): step_time_s = -0.4, not a finite number > 0"),
    "step time NaN": ({"step_time_s": float("nan")}, "line 4 (step 4): step_time_s = NaN, not a finite number > 0"),
    "step time infinite": ({"step_time_s": float("inf")}, "line 4 (step 4): step_time_s = Infinity, not a finite number > 0"),
    "negative samples": ({"samples": -2}, "line 4 (step 4): samples = -2, not a finite number >= 0"),
    "samples text": ({"samples": "two"}, 'line 4 (step 4): samples = "two", not a finite number >= 0'),
    "samples infinite": ({"samples": float("inf")}, "line 4 (step 4): samples = Infinity, not a finite number >= 0"),
    "samples true": ({"samples": True}, "line 4 (step 4): samples = true, not a finite number >= 0"),
}  # fmt: skip


@pytest.mark.parametrize("bad", BAD, ids=list(BAD))
def test_a_bad_value_in_metrics_keeps_the_run_out_of_the_statistics(tmp_path, bad):
    values, where = BAD[bad]
    sweep = write_sweep(tmp_path, "liger", rounds=3)
    d = sweep / "runs" / run_id("liger", 2)
    for f in d.iterdir():
        f.unlink()
    d.rmdir()
    write_run(sweep, "liger", 2, ARM_S[2], rows={4: values})
    out = build_report(sweep)
    r = row(out["runs"], run_id=run_id("liger", 2))
    assert r["status"] == "ok"  # as the trainer wrote
    assert r["note"] == f"metrics.jsonl {where}: excluded from throughput stats"
    assert math.isnan(r["samples_per_s"]) and math.isnan(r["s_per_step_mean"])
    liger = row(out["summary"], arm="liger")
    assert (liger["n_runs"], liger["n_ok"], liger["n_pairs"]) == (3, 2, 2)
    assert liger["delta_samples_per_s_pct"] == pytest.approx(delta_pct([1, 3]), rel=1e-12)
    assert main_row(out, "liger")[6] == "2/3"
    report = (sweep / "report.md").read_text()
    assert f"- {run_id('liger', 2)}: metrics.jsonl {where}" in report


def test_an_arm_whose_runs_all_have_bad_values_says_why_it_has_none(tmp_path):
    sweep = tmp_path
    for rep in (1, 2):
        write_run(sweep, "baseline", rep, BASE_S)
        write_run(sweep, "liger", rep, ARM_S[rep], rows={3: {"step_time_s": -1}})
    out = build_report(sweep)
    liger = row(out["summary"], arm="liger")
    assert (liger["n_ok"], liger["verdict_speed"]) == (0, "n/a (no ok runs)")
    assert main_row(out, "liger")[6] == "0/2"
    assert main_row(out, "liger")[-1] == (
        "no ok run (ok: metrics.jsonl line 3 (step 3): step_time_s = -1, not a finite number > 0: "
        "excluded from throughput stats)"
    )


def test_a_priming_run_outside_runs_reads_ok_by_its_cell_json(tmp_path):
    """A priming run (prime/<cell>_<arm>_prime1, repeat 0) has no run id for a name: cell.json
    vouches for it when its run_id is the directory's name (the console's outcome line)."""
    from bench.results.records import load_run, run_row

    (tmp_path / "prime").mkdir()
    prime = write_run(tmp_path, "baseline", 1, BASE_S).rename(tmp_path / "prime" / f"{CELL}_baseline_prime1")
    cell = json.loads((prime / "cell.json").read_text())
    (prime / "cell.json").write_text(json.dumps({**cell, "run_id": prime.name, "repeat": 0}))
    r = run_row(load_run(prime))
    assert (r["status"], r["reason"], r["note"], r["arm"], r["repeat"]) == ("ok", None, None, "baseline", 0)
    assert r["samples_per_s"] == pytest.approx(2 / BASE_S)
    (prime / "cell.json").write_text(json.dumps({**cell, "repeat": 0}))  # run_id names another run
    assert run_row(load_run(prime))["status"] == "error"
