"""Issue 27, "Compare you can trust": damaged, foreign and mismatched inputs, on sweeps built here
as the driver and trainer write them (tests/test_record_integrity.py's helpers) and read back
through `python -m bench compare` / `bench report`. One test (or parametrized set) per class."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from bench.__main__ import main
from bench.results.report import build_report
from tests.test_record_integrity import ARM_S, STEPS, row, run_id, write_run, write_sweep


@pytest.fixture(autouse=True)
def _no_plots(no_plots):
    """Tables only (conftest's no_plots), except where a test draws."""


def built(path: Path, rounds: int = 4, arm_s: dict | None = None, **cell) -> Path:
    """A finished sweep of ``rounds`` pairs (baseline, liger), reported: runs.csv, summary.csv, manifest.json."""
    write_sweep(path, "liger", rounds=rounds)
    if cell or arm_s:
        for d in (path / "runs").iterdir():
            c = json.loads((d / "cell.json").read_text())
            (d / "cell.json").write_text(json.dumps({**c, **cell}))
            if arm_s and c["arm"] == "liger":
                rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
                for r in rows[2:]:
                    r["step_time_s"] = arm_s[c["repeat"]]
                (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_report(path)
    return path


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["compare", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


# --- 1. workload identity ------------------------------------------------------------------------


def test_two_workloads_that_differ_in_accumulation_and_anchors_are_never_compared(tmp_path, capsys):
    a = built(tmp_path / "a")
    b = built(tmp_path / "b", accumulation_steps=4, num_anchors=16, batch_size=2)
    for d in (tmp_path / "b" / "runs").iterdir():  # samples per step follow the cell: 2 x 4
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        (d / "metrics.jsonl").write_text("".join(json.dumps({**r, "samples": 8}) + "\n" for r in rows))
    build_report(b)
    summary = pd.read_csv(b / "summary.csv")
    assert set(summary["accumulation_steps"]) == {4} and summary["workload_digest"].notna().all()
    rc, out, err = cli(capsys, str(a / "summary.csv"), str(b / "summary.csv"), "--fail-if-slower", "5")
    assert rc == 2 and err.startswith("error: gate: --fail-if-slower 5: cannot decide any row")
    assert "(no workload is in both A and B)" in out
    assert "Not compared: different workloads:" in out
    assert "accumulation_steps 1 in A, 4 in B; num_anchors 8 in A, 16 in B" in out
    assert "+0.0%" not in out


def test_a_changed_training_config_or_set_is_another_workload(tmp_path, capsys):
    a = built(tmp_path / "a")
    b = built(tmp_path / "b", set={"training.lr": 0.1})
    da, db = (pd.read_csv(p / "summary.csv")["workload_digest"].iloc[0] for p in (a, b))
    assert da != db
    rc, out, _ = cli(capsys, str(a / "runs.csv"), str(b / "runs.csv"))
    assert rc == 0 and f"workload_digest {da} in A, {db} in B" in out


# --- 2. one source of truth; files cut short or edited ------------------------------------------


def test_an_edited_summary_is_refused_naming_both_files(tmp_path, capsys):
    a = built(tmp_path / "a")
    b = built(tmp_path / "b")
    (b / "manifest.json").unlink()  # even without the manifest: recomputed from its runs
    df = pd.read_csv(b / "summary.csv")
    liger = df["arm"] == "liger"
    df.loc[liger, "delta_samples_per_s_pct"] = (
        df.loc[liger, "delta_samples_per_s_pct_ci95_low"] + 0.5
    )  # inside its CI
    df.to_csv(b / "summary.csv", index=False)
    rc, out, err = cli(capsys, str(a / "summary.csv"), str(b / "summary.csv"), "--fail-if-slower", "5")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"error: {b / 'summary.csv'}: line 3: delta_samples_per_s_pct ")
    assert (
        f", where {b / 'runs.csv'} gives " in err
        and "this summary is not the one built from those runs" in err
    )


def test_a_summary_beside_another_sweeps_runs_with_the_same_counts_is_refused(tmp_path, capsys):
    a = built(tmp_path / "a")
    other = built(tmp_path / "other", arm_s={1: 0.30, 2: 0.31, 3: 0.29, 4: 0.30})
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(a / "summary.csv", mixed / "summary.csv")  # as `git show` of two commits gives them
    shutil.copy(other / "runs.csv", mixed / "runs.csv")
    rc, _, err = cli(capsys, str(a / "summary.csv"), str(mixed / "summary.csv"), "--fail-if-slower", "5")
    assert rc == 2 and str(mixed / "summary.csv") in err and str(mixed / "runs.csv") in err
    assert "this summary is not the one built from those runs" in err


def test_a_summary_alone_gives_labelled_point_estimates_and_no_gate_verdict(tmp_path, capsys):
    a = built(tmp_path / "a")
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(a / "summary.csv", alone / "summary.csv")
    rc, out, err = cli(capsys, str(a / "summary.csv"), str(alone / "summary.csv"), "--fail-if-slower", "5")
    assert "+0.0% point estimate" in out and "B: point estimates (a summary.csv without its runs.csv)" in out
    assert rc == 2 and "cannot decide any row" in err
    assert "not decided" in out and "point estimate only" in out


@pytest.mark.parametrize(
    "which, cut, says",
    [
        ("summary.csv", lambda t: t[: t.index("\n", t.index("\n") + 1) + 60], "manifest"),
        ("runs.csv", lambda t: t.rstrip("\n")[:-2], "manifest"),
        ("summary.csv", lambda t: t[: t.index("\n", t.index("\n") + 1) + 60] + "\n", "fields"),
        ("runs.csv", lambda t: t.rstrip("\n")[:-2], "not ended"),
    ],
    ids=[
        "summary cut in a row",
        "runs cut in its last number",
        "no manifest: a short row",
        "no manifest: cut",
    ],
)
def test_a_file_cut_short_is_detected_never_read_as_whole(tmp_path, capsys, which, cut, says):
    a = built(tmp_path / "a")
    b = built(tmp_path / "b")
    if says != "manifest":
        (b / "manifest.json").unlink()
    path = b / which
    path.write_text(cut(path.read_text()))
    rc, out, err = cli(capsys, str(a / "summary.csv"), str(b / "summary.csv"), "--fail-if-slower", "5")
    assert rc == 2 and out == "" and err.startswith(f"error: {path}: ") and err.count("\n") == 1, err
    assert {"manifest": "manifest.json", "fields": "of the header's", "not ended": "not ended"}[says] in err


def test_a_ci_that_does_not_hold_its_estimate_is_refused(tmp_path, capsys):
    a = built(tmp_path / "a")
    alone = tmp_path / "alone"
    alone.mkdir()
    df = pd.read_csv(a / "summary.csv")
    df.loc[df["arm"] == "liger", "delta_samples_per_s_pct_ci95_low"] = 50.0
    df.to_csv(alone / "summary.csv", index=False)
    rc, out, err = cli(capsys, str(a / "summary.csv"), str(alone / "summary.csv"))
    assert rc == 2 and "lies outside its own 95% CI" in err


def test_compare_prints_a_delta_inside_its_own_ci(tmp_path, capsys):
    a = built(tmp_path / "a")
    b = built(tmp_path / "b", arm_s={1: 0.38, 2: 0.44, 3: 0.40, 4: 0.37})
    rc, out, _ = cli(capsys, str(a / "summary.csv"), str(b / "summary.csv"), "--format", "json")
    doc = json.loads(out)
    for r in doc["rows"]:
        for p, lo, hi in (
            ("samples_per_s_delta_pct", "_ci95_low", "_ci95_high"),
            ("gain_change_points", "_ci95_low", "_ci95_high"),
        ):
            if r[p + lo] is not None:
                assert r[p + lo] <= r[p] <= r[p + hi]
    assert doc["a"]["source"] == doc["b"]["source"] == "per-run data"


# --- 3. per-step data against the run's own facts; foreign run directories ----------------------

STEP_CASES = {
    "step time 0": ({4: {"step_time_s": 0}}, "line 4 (step 4): step_time_s = 0, not a finite number > 0"),
    "step time 1e-9": (
        {4: {"step_time_s": 1e-9}},
        "line 4 (step 4): step_time_s = 1e-09, not within 1/50 to 1000",
    ),
    "step time 1e308": (
        {4: {"step_time_s": 1e308}},
        "line 4 (step 4): step_time_s = 1e+308, not within 1/50 to 1000",
    ),
    "samples 400": (
        {4: {"samples": 400}},
        "line 4 (step 4): samples = 400, where the cell fixes 2 a step (batch 2",
    ),
    "duplicate step": ({4: {"step": 3}}, "line 4: step 3 again (first at line 3)"),
    "a gap": ({4: {"step": 5}}, "line 4: step 5 where step 4 belongs (steps missing)"),
}


@pytest.mark.parametrize("case", STEP_CASES, ids=list(STEP_CASES))
def test_a_step_the_runs_own_facts_contradict_keeps_the_run_out_with_a_note(tmp_path, case):
    rows, says = STEP_CASES[case]
    sweep = write_sweep(tmp_path, "liger", rounds=3)
    shutil.rmtree(sweep / "runs" / run_id("liger", 2))
    write_run(sweep, "liger", 2, ARM_S[2], rows=rows)
    out = build_report(sweep)
    r = row(out["runs"], run_id=run_id("liger", 2))
    assert r["note"].startswith(f"metrics.jsonl {says}") and r["note"].endswith(
        "excluded from throughput stats"
    )
    assert math.isnan(r["samples_per_s"])
    assert row(out["summary"], arm="liger")["n_ok"] == 2


def test_a_step_beyond_the_plan_is_named(tmp_path):
    sweep = write_sweep(tmp_path, "liger", rounds=3)
    d = sweep / "runs" / run_id("liger", 2)
    with open(d / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": STEPS + 1, "loss": 6.0, "step_time_s": 0.45, "samples": 2}) + "\n")
    r = row(build_report(sweep)["runs"], run_id=run_id("liger", 2))
    assert r["note"].startswith(f"metrics.jsonl line {STEPS + 1}: step {STEPS + 1} beyond the {STEPS} steps")


@pytest.mark.parametrize("plan", [True, False], ids=["sweep.json plans its cells", "an older sweep.json"])
@pytest.mark.parametrize(
    "edit", [{"batch_size": 4}, {"set": {"training.accumulation_steps": 8}, "accumulation_steps": 8}]
)
def test_a_run_directory_from_another_workload_is_excluded_with_the_difference_named(tmp_path, plan, edit):
    sweep = write_sweep(tmp_path, "liger", rounds=4)
    doc = json.loads((sweep / "sweep.json").read_text())
    cell = json.loads((sweep / "runs" / run_id("liger", 1) / "cell.json").read_text())
    if plan:
        keys = (
            "trainer",
            "profile",
            "mode",
            "batch_size",
            "seq_len",
            "accumulation_steps",
            "num_anchors",
            "gpus",
            "nodes",
            "steps",
            "warmup_steps",
        )
        doc["cells"] = {cell["cell_id"]: {**{k: cell.get(k) for k in keys}, "set": {}, "train_config": None}}
        for d in (sweep / "runs").iterdir():
            c = json.loads((d / "cell.json").read_text())
            (d / "cell.json").write_text(json.dumps({**c, "set": {}, "train_config": None}))
    (sweep / "sweep.json").write_text(json.dumps(doc))
    copied = sweep / "runs" / run_id("liger", 2) / "cell.json"
    copied.write_text(json.dumps({**json.loads(copied.read_text()), **edit}))
    out = build_report(sweep)
    bad = row(out["runs"], run_id=run_id("liger", 2))
    key = next(iter(edit)) if "set" not in edit else "accumulation_steps"
    assert (
        bad["status"] == "error"
        and key in bad["reason"]
        and "a run of another workload, not counted" in bad["reason"]
    )
    assert row(out["summary"], arm="liger")["n_ok"] == 3


# --- 4. gates, VRAM, versions, formats, the figure ------------------------------------------------


def test_the_gain_gate_fails_a_lost_gain_and_passes_a_kept_one(tmp_path, capsys):
    a = built(tmp_path / "a", arm_s={1: 0.40, 2: 0.401, 3: 0.399, 4: 0.40})
    kept = built(tmp_path / "kept", arm_s={1: 0.401, 2: 0.40, 3: 0.40, 4: 0.399})
    lost = built(tmp_path / "lost", arm_s={1: 0.47, 2: 0.48, 3: 0.475, 4: 0.47})
    rc, out, _ = cli(capsys, str(a / "summary.csv"), str(kept / "summary.csv"), "--fail-if-gain-drops", "2")
    assert rc == 0 and "gate: passed (1 row within -2 points)" in out
    rc, out, _ = cli(capsys, str(a / "summary.csv"), str(lost / "summary.csv"), "--fail-if-gain-drops", "2")
    assert rc == 3
    final = out.splitlines()[-1]
    assert final.startswith("gate: FAILED: p offline bs2 seq64 acc1 anchors8 gpus1 arm liger gain +")
    assert "gain lower by" in final and "points [" in final


def test_versions_that_differ_are_flagged_and_vram_is_idle_subtracted(tmp_path, capsys):
    a = built(tmp_path / "a")
    b = tmp_path / "b"
    write_sweep(b, "liger", rounds=4)
    for d in (b / "runs").iterdir():
        doc = json.loads((d / "run.json").read_text())
        doc["provenance"] = {"torch": "2.12.0+cu130", "triton": "3.7.0", "cuda": "13.1"}
        (d / "run.json").write_text(json.dumps(doc))
        vram = {
            "status": "ok",
            "devices": [{"index": 0, "name": "H200", "baseline_used_gib": 5.0, "peak_used_gib": 30.0}],
        }
        (d / "vram.json").write_text(json.dumps(vram))
    for d in (a / "runs").iterdir():
        vram = {
            "status": "ok",
            "devices": [{"index": 0, "name": "H200", "baseline_used_gib": 0.5, "peak_used_gib": 25.5}],
        }
        (d / "vram.json").write_text(json.dumps(vram))
    build_report(a)
    build_report(b)
    rc, out, _ = cli(capsys, str(a / "summary.csv"), str(b / "summary.csv"), "--format", "md")
    assert rc == 0 and out.startswith("### `bench compare`: B vs A")
    assert (
        "| torch | — | 2.12.0+cu130 | ⚠ differs |" in out
        and "| CUDA/ROCm | — | CUDA 13.1 | ⚠ differs |" in out
    )
    rc, out, _ = cli(capsys, str(a / "runs.csv"), str(b / "runs.csv"), "--format", "json")
    doc = json.loads(out)
    assert {"torch", "Triton", "CUDA/ROCm"} <= set(doc["versions_differ"])
    liger = next(r for r in doc["rows"] if r["arm"] == "liger")
    assert liger["vram_over_idle_b_minus_a_gib"] == pytest.approx(0.0)  # 25 GiB over idle on both
    assert liger["peak_vram_b_minus_a_gib"] == pytest.approx(4.5)  # gross: the idle memory


def test_compare_png_draws_the_gate_and_survives_a_point_outside_its_bar(tmp_path, plots_on):
    from bench.results.forest import FOREST_COLUMNS, plot_forest

    rows = pd.DataFrame(
        [{"label": "x", "kind": "arm", "parity_failed": False, "n_pairs": 3, "delta_pct": 5.0, "ci_low": 6.0,
          "ci_high": 7.0, "delta_text": "+5.0%", "verdict": "faster", "vram_gib": 1.0, "vram_low": 2.0,
          "vram_high": 3.0, "vram_text": "+1 GiB"}], columns=FOREST_COLUMNS,
    )  # fmt: skip
    path = plot_forest(rows, tmp_path / "f.png", "t", threshold_pct=2.0)
    assert path.read_bytes().startswith(b"\x89PNG")
    a = built(tmp_path / "a")
    assert (
        main(
            [
                "compare",
                str(a / "summary.csv"),
                str(a / "summary.csv"),
                "--fail-if-slower",
                "3",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 0
    )
    for name in ("compare.csv", "compare.md", "compare.json", "compare.png"):
        assert (tmp_path / "o" / name).stat().st_size > 0


# --- 5. an honest Summary -------------------------------------------------------------------------


def test_the_summary_says_a_missed_target_one_torch_energy_coverage_and_integer_counts():
    from bench.results.prsummary import delta_line, energy_coverage, machine_line

    runs = pd.DataFrame({
        "cell_id": ["c"] * 4, "status": ["ok", "ok", "ok", "not run"], "samples_per_s": [1.0, 1.0, 1.0, None],
        "energy_source": ["power integral", "power integral", "n/a (gap)", None], "energy_j_per_sample": [1.0, 1.0, None, None],
        "power_interval_s": [1.0, 1.0, None, None], "gpu_name": ["NVIDIA H200"] * 4, "gpu_count": [1.0, 1.0, 1.0, None],
        "torch_version": ["2.11.0+cu130", "2.11.0", "2.11.0+cu130", None],
    })  # fmt: skip
    assert machine_line(runs) == "NVIDIA H200 × 1 · torch 2.11.0+cu130"
    assert energy_coverage(runs, "c") == " (power integral at ~1 s, 2 of 3 runs; 1 n/a)"
    r = pd.DataFrame([{
        "arm": "liger", "n_pairs": 6.0, "delta_samples_per_s_pct": 16.6, "delta_samples_per_s_pct_ci95_low": 14.8,
        "delta_samples_per_s_pct_ci95_high": 18.4, "verdict_speed": "faster", "precision_target_pct": 1.0,
        "delta_samples_per_s_halfwidth_pct": 1.81, "hit_pair_cap": True, "pairs_wanted": 20.0, "loss_parity": "pass (6/6)",
        "delta_peak_vram_gib": float("nan"), "delta_energy_per_sample_pct": -14.9,
        "delta_energy_per_sample_pct_ci95_low": -16.2, "delta_energy_per_sample_pct_ci95_high": -13.6,
    }]).iloc[0]  # fmt: skip
    line = delta_line(r, energy_coverage(runs, "c"))
    assert (
        "(6 pairs; faster; MISSED the ±1-point precision target: ±1.81 (pair cap hit, 20 pairs wanted))"
        in line
    )
    assert "energy/sample (power integral at ~1 s, 2 of 3 runs; 1 n/a)" in line


# --- 6. the smaller cases -------------------------------------------------------------------------


def test_a_probe_printing_bytes_that_are_not_utf8_is_one_line(tmp_path):
    import stat

    from bench.errors import SweepError
    from bench.trainers.isolation import _probe

    fake = tmp_path / "python"
    fake.write_bytes(b"#!/bin/sh\nprintf '\\377\\376 not utf-8\\n'; printf '\\351t\\351\\n' >&2; exit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(SweepError) as e:
        _probe(str(fake), {"PATH": "/usr/bin:/bin"})
    assert "could not run the specforge probe" in str(e.value) and "\n" not in str(e.value)


def test_a_gpu_kind_named_on_a_machine_without_one_is_refused_for_a_cpu_config_too():
    from bench.probe.hardware import check_hardware

    info = {"kind": "h200", "kind_source": "BENCH_HARDWARE", "gpu_count": 0}
    assert "BENCH_HARDWARE=h200 names a GPU kind, but this machine has no GPU" in check_hardware("cpu", info)
    assert check_hardware("cpu", {"kind": "cpu", "kind_source": "detected", "gpu_count": 0}) is None
