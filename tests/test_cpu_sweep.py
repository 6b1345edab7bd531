"""`make bench` on a machine without a GPU: the real CPU sweep, end to end."""

import json
import re
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from bench.results.columns import LOSS_PARITY_COLUMNS, RUNS_COLUMNS, SUMMARY_COLUMNS, VRAM_PER_CARD_COLUMNS
from bench.results.report import MAIN_TABLE_HEADER
from tests.conftest import PLOTS_ON
from tests.helpers import REPO, built_once, run_cli

pytestmark = pytest.mark.slow


REPEATS = 3  # the shipped config's 5, cut to 3 for the test's time (12 runs instead of 20)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root, done = built_once(tmp_path_factory, "cpu-sweep", build)
    return root / "cpu", SimpleNamespace(**done)


@pytest.fixture(scope="module")
def config(sweep) -> str:
    return str(sweep[0].parent / "cpu.yaml")


def build(root) -> dict:
    """configs/cpu.yaml as `make bench` runs it on a machine without a GPU, with 3 repeats."""
    doc = yaml.safe_load((REPO / "configs" / "cpu.yaml").read_text())
    (root / "cpu.yaml").write_text(yaml.safe_dump({**doc, "repeats": REPEATS}, sort_keys=False))
    r = run_cli(
        "bench", "sweep", str(root / "cpu.yaml"), "--out", str(root / "cpu"), timeout=600, env=PLOTS_ON
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return {"stdout": r.stdout, "stderr": r.stderr}


def test_cpu_sweep_writes_every_result(sweep):
    out, r = sweep
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs.columns) == RUNS_COLUMNS
    assert len(runs) == 4 * REPEATS and runs["run_id"].is_unique  # 1 cell x 4 arms x 3 repeats
    assert (runs[runs.arm.isin(["baseline", "aa", "adamw_plain"])].status == "ok").all()
    liger = runs[runs.arm == "liger"]
    assert (liger.status == "skipped").all() and liger.reason.str.contains("need a CUDA or ROCm GPU").all()
    ok = runs[runs.status == "ok"]
    assert (ok.steps_total == 60).all() and (ok.steps_measured == 55).all() and (ok.samples_per_s > 0).all()
    assert (ok.vram_status == "unavailable").all()  # no NVML / AMD SMI on a CPU machine
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns) == SUMMARY_COLUMNS and len(summary) == 4
    # the first command shows an A/B: each arm that runs here ends with a Δ and its 95% CI
    for arm in ("aa", "adamw_plain"):
        line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith(f"{arm} vs baseline:"))
        assert re.search(r"[+-]\d+\.\d% \[[+-]\d+\.\d, [+-]\d+\.\d\] throughput \(3 pairs; \w", line), (
            line
        )  # + its verdict
    # primed (configs/cpu.yaml's prime_runs: 1): the first running Δ compares two warm runs, never
    # a cold first run (which once read hundreds of percent)
    assert sorted(p.name.rsplit("_", 1)[-1] for p in (out / "prime").iterdir()) == ["prime1"] * 3
    first = next(ln for ln in r.stdout.splitlines() if "running Δ samples/s, aa vs baseline" in ln)
    assert abs(float(re.search(r": ([+-]\d+\.\d)%", first).group(1))) < 100, first
    ran = runs[runs.arm == "adamw_plain"].iloc[0]
    assert json.loads((out / "runs" / ran.run_id / "run.json").read_text())["optimizer"] == "AdamW, for-loop"
    assert list(pd.read_csv(out / "loss_parity.csv").columns) == LOSS_PARITY_COLUMNS
    assert list(pd.read_csv(out / "vram_per_card.csv").columns) == VRAM_PER_CARD_COLUMNS
    for png in ("throughput.png", "vram_per_card.png", "loss_curves.png", "step_time_dist.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "| " + " | ".join(MAIN_TABLE_HEADER) + " |" in report
    assert "Liger's Triton kernels need a CUDA or ROCm GPU" in report
    assert "skipped" in r.stdout + r.stderr
    assert "fork server ready" in r.stdout  # the baseline runs forked from the warm server
    launches = [json.loads(p.read_text()) for p in (out / "runs").glob("*baseline*/launch.json")]
    assert len(launches) == REPEATS and all(rec["start"] == "fork-server" for rec in launches)


def test_finished_sweep_is_kept(sweep, config):
    out, _ = sweep
    before = (out / "runs.csv").read_text()
    again = run_cli("bench", "sweep", config, "--out", str(out))
    assert (
        again.returncode == 2 and "--resume" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    )
    resumed = run_cli("bench", "sweep", config, "--out", str(out), "--resume")
    assert resumed.returncode == 0 and "12 of 12 runs already finished" in resumed.stdout
    assert "fork server ready" not in resumed.stdout  # nothing left to run: no server started
    assert (out / "runs.csv").read_text() == before
