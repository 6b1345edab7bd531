"""Adaptive sweeps against the fake trainer: Stein's rule decides the pairs, --resume after a
kill reaches the same decision, A/A and poller-off arms, the shared compile cache."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.config import SweepError, plan, plan_rounds
from bench.fileio import read_json, read_jsonl
from bench.results import stats
from bench.run import console, execute, sweepdir
from bench.run.sweep import run_sweep
from bench.trainers import load_config, plug_for
from tests.test_aggregate import write_run
from tests.test_driver import REPO, fakes, statuses, sweep_file, train_configs  # noqa: F401

PRECISION = {"ci_halfwidth_pct": 1.0, "min_pairs": 3, "max_pairs": 5}
# per-run throughput drawn from a known distribution: 0.1 s/step times exp(N(0, 0.5%))
NOISY = {"fake.step_time_s": 0.1, "fake.run_sd": 0.005, "fake.step_sleep": 0.0}


def adaptive_sweep(tmp: Path, **top) -> Path:
    tc = train_configs(tmp)
    cells = [{"config": tc["online"], "batch_size": 1, "seq_len": 32, "set": NOISY}]
    top = {"arms": ["baseline", "baseline"], "order": "shuffled", "precision": PRECISION, **top}
    top.pop("repeats", None)
    path = sweep_file(tmp, cells, **top)
    doc = yaml.safe_load(path.read_text())
    doc.pop("repeats")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def samples_per_s(rdir: Path, warmup: int) -> float:
    rows = [r for r in read_jsonl(rdir / "metrics.jsonl") if r["step"] > warmup]
    return sum(r["samples"] for r in rows) / sum(r["step_time_s"] for r in rows)


def test_adaptive_sweep_stops_where_steins_rule_says(tmp_path, fakes):  # noqa: F811
    cfg_path = adaptive_sweep(tmp_path)
    cfg = load_config(cfg_path)
    assert cfg.arms == ("baseline", "aa")  # [baseline, baseline] is an A/A comparison
    assert len(plan(cfg)) == 6  # the pilot: 3 pairs x 2 arms
    out = tmp_path / "out"
    assert run_sweep(cfg_path, out=out) == 0
    runs = statuses(out)
    cell = cfg.cells[0].cell_id
    # the rule, recomputed here from the raw metrics of the pilot
    pilot = [
        math.log(
            samples_per_s(out / "runs" / f"{cell}_aa_r{i}", 1)
            / samples_per_s(out / "runs" / f"{cell}_baseline_r{i}", 1)
        )
        for i in (1, 2, 3)
    ]
    expected = stats.stein_pairs(pilot, 1.0, 3, PRECISION["max_pairs"])
    assert expected.pairs > 3  # the pilot alone does not reach ±1 point here
    assert sorted(runs) == sorted(
        f"{cell}_{a}_r{i}" for i in range(1, expected.pairs + 1) for a in ("baseline", "aa")
    )
    assert all(doc["status"] == "ok" for doc in runs.values())
    sweep = read_json(out / "sweep.json")
    assert sweep["precision"][cell]["decision"]["pairs"] == expected.pairs
    assert len(sweep["order"]) == 2 * expected.pairs and sweep["precision_targets"][cell] == PRECISION


def test_running_delta_past_the_pilot_is_the_reports_stein_interval(tmp_path):
    """The console's running Δ after a pair states the interval the report will: past the pilot of
    a precision-target cell, Stein's (the pilot's sd and df), not the plain t on every pair so far,
    which here reads as the ±0.5 target met (±0.45) while the report says ±1.52, cap hit."""
    target = {"ci_halfwidth_pct": 0.5, "min_pairs": 3, "max_pairs": 8}
    cfg = load_config(adaptive_sweep(tmp_path, arms=["baseline", "liger"], precision=target))
    cell = cfg.cells[0].cell_id
    pct = [12.0, 14.0, 13.0, 13.0, 13.1, 12.9, 13.0, 13.05]  # per pair, liger vs baseline: a noisy pilot
    runs, out = plan_rounds(cfg, {cell: len(pct)}), tmp_path / "out"

    def pair(k: int) -> None:  # 2 samples per step, steps 2-3 measured: liger's take 1/(1 + pct) s
        for arm in ("baseline", "liger"):
            step = 1 / (1 + pct[k - 1] / 100) if arm == "liger" else 1.0
            write_run(out, arm, k, [1.0, step, step], cell_id=cell, warmup=1)

    for k in (1, 2):
        pair(k)
    (mid,) = console.running_deltas(out, plan(cfg), runs[3])  # the pilot's 2nd pair
    naive2 = stats.paired_log_delta([math.log1p(p / 100) for p in pct[:2]])
    assert f"(±{naive2.halfwidth:.2f} points, pilot 2/3; target ±0.5) after 2 pair(s)" in mid, mid
    for k in range(3, len(pct) + 1):
        pair(k)
    (line,) = console.running_deltas(out, runs, runs[-1])
    logs = [math.log1p(p / 100) for p in pct]
    decision = stats.stein_pairs(logs[:3], 0.5, 3, 8)
    stein, naive = (
        stats.paired_log_delta(logs, decision.pilot_sd, decision.pilot_df),
        stats.paired_log_delta(logs),
    )
    assert naive.halfwidth < 0.5 < stein.halfwidth and decision.capped
    assert line == (
        f"running Δ samples/s, liger vs baseline, {cell}: {stein.pct:+.1f}% [{stein.lo:+.1f}, {stein.hi:+.1f}] "
        f"(±{stein.halfwidth:.2f} points, Stein: pilot sd over 3 pairs; target ±0.5, 8 pairs planned, "
        f"cap hit: {decision.wanted} wanted) after 8 pair(s)"
    )


@pytest.mark.slow
def test_resume_of_a_killed_adaptive_sweep_reaches_the_same_decision(tmp_path):
    cfg_path = adaptive_sweep(tmp_path)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    cmd = [sys.executable, "-m", "bench", "sweep", str(cfg_path)]
    r = subprocess.run([*cmd, "--out", str(whole)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # the 9th run (past the pilot) blocks before its first step: the kill lands mid-sweep, always
    env = {**os.environ, "FAKE_BLOCK_AFTER_RUNS": "8"}
    proc = subprocess.Popen(
        [*cmd, "--out", str(killed)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(killed.glob("runs/*/run.json"))) < 9:  # the blocked one
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(list(killed.glob("runs/*"))) < len(list(whole.glob("runs/*")))
    r = subprocess.run(
        [*cmd, "--out", str(killed), "--resume"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in killed.glob("runs/*")) == sorted(p.name for p in whole.glob("runs/*"))
    a, b = read_json(whole / "sweep.json"), read_json(killed / "sweep.json")
    assert a["precision"] == b["precision"] and a["order"] == b["order"]
    assert len(b["resumes"]) == 1
    # the A/A comparison of the finished sweep: its CI contains 0
    summary = (killed / "summary.csv").read_text()
    import pandas as pd

    aa = pd.read_csv(killed / "summary.csv").set_index("arm").loc["aa"]
    assert aa.delta_samples_per_s_pct_ci95_low <= 0 <= aa.delta_samples_per_s_pct_ci95_high, summary
    # it passes only at a half-width within the target; this pilot's spread asked for more pairs than the cap
    if aa.delta_samples_per_s_halfwidth_pct <= PRECISION["ci_halfwidth_pct"]:
        assert aa.verdict_speed.startswith("A/A check passed: CI contains 0")
    else:
        assert aa.verdict_speed.startswith("A/A check not passed: this machine is too noisy to resolve ±1"), (
            aa.verdict_speed
        )
    assert (
        aa.ci_method == "Stein two-stage (pilot of 3 pairs)"
        and aa.n_pairs == a["precision"][aa.cell_id]["decision"]["pairs"]
    )
    report = (killed / "report.md").read_text()
    assert "## Precision" in report and "Stein's two-stage rule" in report


def test_poller_off_arm_and_shared_compile_cache(tmp_path, fakes, monkeypatch):  # noqa: F811
    tc = train_configs(tmp_path)
    cfg_path = sweep_file(
        tmp_path,
        [{"config": tc["online"], "batch_size": 1, "seq_len": 32}],
        arms=["baseline", "nopoll"],
        repeats=1,
    )
    cfg = load_config(cfg_path)
    assert cfg.polls("baseline") and not cfg.polls("nopoll")
    out = tmp_path / "out"
    assert run_sweep(cfg_path, out=out) == 0
    cell = cfg.cells[0].cell_id
    nopoll = read_json(out / "runs" / f"{cell}_nopoll_r1" / "vram.json")
    assert nopoll["status"] == "disabled" and "without the poller" in nopoll["reason"]
    first = read_json(out / "runs" / f"{cell}_baseline_r1" / "cell.json")["compile_cache"]
    assert first["dir"].startswith(str(out / "cache" / "compile" / "torch-"))
    env = execute.compile_env(Path(first["dir"]))
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(first["dir"]) and env["TRITON_CACHE_DIR"].startswith(
        first["dir"]
    )
    # --force starts over but keeps cache/ (the compile cache and offline caches)
    Path(first["dir"], "inductor").mkdir(parents=True)
    Path(first["dir"], "inductor", "x").write_text("kernel")
    assert run_sweep(cfg_path, out=out, force=True) == 0
    assert Path(first["dir"], "inductor", "x").exists()
    assert read_json(out / "runs" / f"{cell}_baseline_r1" / "cell.json")["compile_cache"]["warm"] is True


def test_compile_cache_is_keyed_by_versions_and_gpu(monkeypatch, tmp_path):
    versions = {"torch": "2.11.0+cu130", "triton": "3.6.0"}

    def version(name):
        if name not in versions:
            raise sweepdir.importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(sweepdir.importlib.metadata, "version", version)
    h200 = sweepdir.compile_cache_dir(tmp_path, {"kind": "h200"})
    assert h200.name == "torch-2.11.0-cu130_triton-3.6.0_h200"
    assert sweepdir.compile_cache_dir(tmp_path, {"kind": "a100"}) != h200
    versions["torch"] = "2.12.0+cu130"
    assert sweepdir.compile_cache_dir(tmp_path, {"kind": "h200"}) != h200
    versions.pop("triton")
    versions["pytorch-triton-rocm"] = "3.5.0"  # ROCm torch ships Triton under another name
    assert "triton-3.5.0_mi355x" in sweepdir.compile_cache_dir(tmp_path, {"kind": "mi355x"}).name


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"precision": {"ci_halfwidth_pct": 1.0, "min_pairs": 2}},
            "precision.min_pairs: expected a value >= 3",
        ),
        (
            {"precision": {"ci_halfwidth_pct": 1.0, "min_pairs": 6, "max_pairs": 4}},
            "precision.max_pairs: 4 is below",
        ),
        ({"precision": {"min_pairs": 4}}, "precision.ci_halfwidth_pct: missing"),
        ({"precision": {"ci_halfwidth_pct": 0}}, "precision.ci_halfwidth_pct: expected a value > 0"),
        ({"precision": {"ci_halfwidth_pct": 1.0, "pairs": 4}}, "precision.pairs: unknown key"),
        ({"precision": {"ci_halfwidth_pct": 1.0}, "repeats": 3}, "repeats: not used with precision"),
        ({"timeout_s": float("nan")}, "timeout_s: expected a number (finite)"),
        ({"equivalence_pct": float("inf")}, "equivalence_pct: expected a number (finite)"),
        ({"arms": ["baseline", "turbo"]}, "arms: unknown arm 'turbo'"),
    ],
)
def test_bad_precision_and_arm_settings_are_one_line_errors(tmp_path, change, expected):
    tc = train_configs(tmp_path)
    path = sweep_file(tmp_path, [{"config": tc["online"], "batch_size": 1, "seq_len": 32}])
    doc = yaml.safe_load(path.read_text())
    doc.pop("repeats")
    doc.update(change)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(SweepError) as err:
        load_config(path)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_cell_precision_overrides_the_sweeps(tmp_path):
    tc = train_configs(tmp_path)
    cells = [
        {"config": tc["online"], "batch_size": 1, "seq_len": 32},
        {
            "config": tc["online"],
            "batch_size": 2,
            "seq_len": 32,
            "precision": {"min_pairs": 4, "max_pairs": 6},
        },
    ]
    path = sweep_file(tmp_path, cells)
    doc = yaml.safe_load(path.read_text())
    doc.pop("repeats")
    doc["precision"] = {"ci_halfwidth_pct": 0.5}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    cfg = load_config(path)
    assert [
        (c.precision.min_pairs, c.precision.max_pairs, c.precision.ci_halfwidth_pct) for c in cfg.cells
    ] == [
        (5, 12, 0.5),
        (4, 6, 0.5),
    ]
    assert len(plan(cfg)) == 5 + 4  # one arm (baseline) per pair here


def test_single_kernel_arms_set_their_keys(tmp_path):
    tc = train_configs(tmp_path)
    path = sweep_file(
        tmp_path,
        [{"config": tc["online"], "batch_size": 1, "seq_len": 32}],
        arms=["baseline", "rmsnorm", "swiglu", "liger"],
    )
    cfg = load_config(path)
    argv = {r.arm: plug_for(cfg).train_command(cfg, r, tmp_path / r.run_id, None) for r in plan(cfg)}
    assert "--use-liger-kernel" in argv["rmsnorm"] and "model.liger_swiglu=false" in argv["rmsnorm"]
    assert "--use-liger-kernel" in argv["swiglu"] and "model.liger_rms_norm=false" in argv["swiglu"]
    assert "--use-liger-kernel" in argv["liger"] and not any(
        "liger_rms_norm" in a or "liger_swiglu" in a for a in argv["liger"]
    )
    assert "--use-liger-kernel" not in argv["baseline"]
    bad = sweep_file(
        tmp_path,
        [{"config": tc["online"], "batch_size": 1, "seq_len": 32, "set": {"model.liger_swiglu": False}}],
        name="bad.yaml",
    )
    with pytest.raises(SweepError, match=r"set\.model\.liger_swiglu: set by the driver; use arms"):
        load_config(bad)


def test_a_running_delta_whose_ci_says_nothing_yet_says_so_and_names_the_noted_run(tmp_path):
    """Two pairs, the second's Liger run disturbed (one step 100x the others): the running Δ's CI
    runs to +2665814985.3 on the CPU's first screen before; now its width alone, in words, and the
    run runs.csv flags ("unstable") named on the same line."""
    tc = train_configs(tmp_path)
    cells = [{"config": tc["online"], "batch_size": 1, "seq_len": 32}]
    cfg = load_config(sweep_file(tmp_path, cells, arms=["baseline", "liger"], repeats=2))
    cell, out = cfg.cells[0].cell_id, tmp_path / "out"
    runs = plan(cfg)
    for k, liger_steps in ((1, [1.0, 0.9, 0.9, 0.9]), (2, [1.0, 1.0, 1.0, 100.0])):
        write_run(out, "baseline", k, [1.0, 1.0, 1.0, 1.0], cell_id=cell, warmup=1)
        write_run(out, "liger", k, liger_steps, cell_id=cell, warmup=1)
    (line,) = console.running_deltas(out, runs, runs[-1])
    # per pair, samples/s liger over baseline: 3 steps in 2.7 s against 3 s, then in 102 s against 3 s
    logs = [math.log(3 / 2.7), math.log(3 / 102)]
    sd = abs(logs[0] - logs[1]) / math.sqrt(2)
    half_log = 12.706 * sd / math.sqrt(2)  # t(0.975, 1 df) from the table
    point = 100 * math.expm1(sum(logs) / 2)
    assert line.startswith(f"running Δ samples/s, liger vs baseline, {cell}: {point:+.1f}% (CI ±")
    assert (
        "points: too wide to read yet) after 2 pair(s); 1 run noted in runs.csv (unstable: step 4 took"
        in line
    )
    assert "[" not in line and half_log > 3  # the interval's ends (e^±44) are not printed
