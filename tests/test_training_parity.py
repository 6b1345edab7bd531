"""Training parity on the CPU: 200 steps of the tiny profile on learnable data, each arm held to
the A/A floor window by window; an arm with deliberately wrong numerics is reported as not
equivalent, a correct one as equivalent."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest

import bench.config.typed as typed
from bench.config.schema import ParityKeys
from bench.results.parity_gate import PARITY_EXIT
from bench.results.training_parity import TRAINING_PARITY_COLUMNS, divergence, judge, windows
from bench.run.sweep import run_sweep
from bench.trainers.embedded import EmbeddedPlug
from bench.trainers.embedded import keys as our_keys
from tests.helpers import REPO, built_once

pytestmark = pytest.mark.slow
CONFIG = REPO / "configs" / "cpu-parity.yaml"


def test_windows_join_a_short_tail():
    assert windows(list(range(1, 25)), 10) == [list(range(1, 11)), list(range(11, 25))]  # 4 < 5: joined
    assert windows(list(range(1, 26)), 10)[-1] == list(range(21, 26))  # 5 steps: a window of its own
    assert windows(list(range(1, 31)), 10)[-1] == list(range(21, 31))


def test_divergence_takes_the_largest_over_rounds():
    base = {
        1: pd.DataFrame({"loss": [1.0, 2.0]}, index=[1, 2]),
        2: pd.DataFrame({"loss": [1.0, 2.0]}, index=[1, 2]),
    }
    arm = {
        1: pd.DataFrame({"loss": [1.5, 2.0]}, index=[1, 2]),
        2: pd.DataFrame({"loss": [1.0, 2.25]}, index=[1, 2]),
    }
    d = divergence({"baseline": base, "x": arm}, "x", "loss")
    assert d.to_dict() == {1: 0.5, 2: 0.25}


def _chaotic(scale: float, steps: int = 100) -> pd.DataFrame:
    """A metric that moves away from the baseline's like a rounding step that training amplifies:
    |Δ| grows from 1e-6 to ``scale`` over the run."""
    t = np.arange(1, steps + 1)
    delta = 1e-6 * (scale / 1e-6) ** (t / steps) * np.where(t % 2, 1, -1)
    base = 5.0 - 0.02 * t
    return pd.DataFrame(
        {"loss": base + delta, "accuracy": 0.01 * t / steps, "grad_norm": 1.0 + 0 * t}, index=t
    )


def test_a_reassociation_only_arm_is_held_to_the_sensitivity_floor_and_a_wrong_arm_still_fails():
    """On a deterministic machine the A/A pair agrees exactly (floor 0), so the old rule held an arm
    that only sums in another order to the fixed 1e-3: 'not equivalent'. The aa_eps run (one ulp on
    every weight) shows how far this training carries such a difference; an arm within it is
    equivalent, and an arm 10x beyond it still fails."""
    steps = 100
    t = np.arange(1, steps + 1)
    base = pd.DataFrame(
        {"loss": 5.0 - 0.02 * t, "accuracy": 0.01 * t / steps, "grad_norm": 1.0 + 0 * t}, index=t
    )
    p = {**typed.defaults(ParityKeys), "window": 10}
    runs = {
        "baseline": {1: base},
        "aa": {1: base.copy()},
        "reassoc": {1: _chaotic(0.05)},
        "wrong": {1: _chaotic(0.5)},
    }
    old = judge(runs, "reassoc", "loss", p, steps)
    assert old["verdict"].startswith("not equivalent") and old["max_abs_delta_floor"] == 0
    runs["aa_eps"] = {1: _chaotic(0.04)}
    assert judge(runs, "reassoc", "loss", p, steps)["verdict"] == "equivalent"
    wrong = judge(runs, "wrong", "loss", p, steps)
    assert wrong["verdict"].startswith("not equivalent") and wrong["worst_rms_floor"] > 0


def test_the_last_resort_term_applies_only_where_no_aa_eps_run_measured_the_floor():
    """The gradient-norm term (one bfloat16 rounding step of the norm) stands for a sensitivity
    nobody measured. Measured on one H200 (results/h200-parity-unbiased/): the 1% learning-rate
    error moved the gradient norm 7x its aa_eps floor and still sat inside that term alone. With an
    aa_eps run the term is dropped: such an arm is caught, an arm within the floor still passes;
    without one (a deterministic A/A floor of 0) the term still keeps a reassociation-only arm in."""
    steps = 100
    t = np.arange(1, steps + 1)
    base = pd.DataFrame({"loss": 5.0 - 0.02 * t, "accuracy": 0.5 + 0 * t, "grad_norm": 0.11 + 0 * t}, index=t)

    def norm_off(scale: float) -> pd.DataFrame:
        out = base.copy()
        out["grad_norm"] = 0.11 + scale * np.where(t % 2, 1, -1)
        return out

    p = {**typed.defaults(ParityKeys), "window": 10, "grad_norm_rtol": 2.0**-8}  # 0.11 x 2^-8 = 4.3e-4
    runs = {
        "baseline": {1: base},
        "aa": {1: base.copy()},
        "wrong": {1: norm_off(3.8e-4)},
        "ok": {1: norm_off(4e-5)},
    }
    alone = judge(runs, "wrong", "grad_norm", p, steps)
    assert alone["verdict"] == "equivalent" and alone["tolerance"] == 2.0**-8  # floor 0: the term holds it
    runs["aa_eps"] = {1: norm_off(5.2e-5)}
    caught = judge(runs, "wrong", "grad_norm", p, steps)
    assert caught["verdict"].startswith("not equivalent") and caught["tolerance"] == 0.0
    assert caught["worst_allowed"] == pytest.approx(2 * 5.2e-5)
    assert judge(runs, "ok", "grad_norm", p, steps)["verdict"] == "equivalent"


@pytest.fixture(scope="module")
def parity_sweeps(tmp_path_factory):
    """The CPU parity sweep as shipped, and once more with adamw_plain made wrong: its run trains in
    bfloat16 instead of float32 (a deliberately wrong numerics arm; the baseline and A/A runs are
    the first sweep's, copied: only that run is redone, by --resume)."""
    root, _ = built_once(tmp_path_factory, "cpu-parity", build)
    good, bad = root / "good", root / "bad"
    return pd.read_csv(good / "training_parity.csv"), pd.read_csv(bad / "training_parity.csv"), good


def build(root) -> dict:
    mp = pytest.MonkeyPatch()
    mp.setenv("BENCH_NO_PLOTS", "1")
    good, bad = root / "good", root / "bad"
    assert run_sweep(CONFIG, out=good) == 0
    shutil.copytree(good, bad, symlinks=True)
    shutil.rmtree(bad / "runs" / "tiny_offline_bs2_s128_adamw_plain_r1")
    wrong_sets = lambda self, arm: {  # noqa: E731
        **our_keys.arm_sets(arm),
        **({"model.dtype": "bfloat16"} if arm.name == "adamw_plain" else {}),
    }
    mp.setattr(EmbeddedPlug, "arm_sets", wrong_sets)
    assert run_sweep(CONFIG, out=bad, resume=True) == PARITY_EXIT  # the wrong arm fails: exit 4
    mp.undo()
    return {}


def test_a_correct_arm_is_equivalent_and_the_loss_really_falls(parity_sweeps):
    table, _, out = parity_sweeps
    assert list(table.columns) == TRAINING_PARITY_COLUMNS
    assert set(table.arm) == {"adamw_plain", "lr_off"}  # the arm under test, the negative control
    good = table[table.arm == "adamw_plain"]
    assert set(good.metric) == {"loss", "accuracy", "grad_norm"}
    assert (good.steps_compared == 200).all() and (good.verdict == "equivalent").all()
    assert (good.loss_drop_pct >= 30).all()  # the draft learns the chain: at least 30% below step 1
    report = (out / "report.md").read_text()
    assert "## Training parity (against the A/A floor)" in report and "| 200 |" in report


def test_the_cpu_sweep_measures_a_sensitivity_floor_where_its_aa_floor_is_zero(parity_sweeps):
    """aa_eps (one ulp on every weight of our trainer's draft) trains apart from the baseline,
    while the A/A run agrees exactly: the floor the rule holds arms to is no longer 0."""
    _, _, out = parity_sweeps

    def loss(arm: str) -> pd.Series:
        rows = (out / "runs" / f"tiny_offline_bs2_s128_{arm}_r1" / "metrics.jsonl").read_text().splitlines()
        return pd.Series([json.loads(r)["loss"] for r in rows])

    base = loss("baseline")
    assert (loss("aa") == base).all()
    nudged = (loss("aa_eps") - base).abs()
    assert 0 < nudged.iloc[:10].max() < 1e-4  # a rounding step apart at first ...
    assert nudged.max() > 100 * nudged.iloc[:10].max()  # ... which 200 steps of training carry far


def test_the_sensitivity_floor_arm_is_shown_as_a_floor_not_failed_by_the_fixed_tolerance(parity_sweeps):
    """aa_eps moves the baseline by design: its |Δ loss| is the floor, not a verdict. The fixed
    0.01 tolerance would call it FAIL where a cell is sensitive (results/h200-parity: 0.0197)."""
    _, _, out = parity_sweeps
    summary = pd.read_csv(out / "summary.csv", keep_default_na=False)
    row = summary[summary.arm == "aa_eps"].iloc[0]
    assert row.loss_parity.startswith("floor, not judged (|Δ loss| at the last step up to ")
    assert summary[summary.arm == "aa"].iloc[0].loss_parity.startswith("pass")


def test_the_negative_control_is_caught_without_failing_the_sweep(parity_sweeps):
    """lr_off (the learning rate 1% higher) is wrong on purpose: the rule must call it not
    equivalent (its power on this cell), and the sweep still exits 0 (the fixture asserts it)."""
    table, _, out = parity_sweeps
    control = table[table.arm == "lr_off"].set_index("metric")
    assert control.loc["loss", "verdict"].startswith("not equivalent: steps ")
    assert control.loc["loss", "worst_rms_arm"] > control.loc["loss", "worst_allowed"]
    report = (out / "report.md").read_text()
    assert (
        "Negative control `lr_off` (the baseline with a learning rate 1% higher): caught, not equivalent on loss"
        in report
    )
    assert "Parity FAILED" not in report  # a negative control is never the sweep's parity failure
    summary = pd.read_csv(out / "summary.csv", keep_default_na=False)
    assert summary[summary.arm == "lr_off"].iloc[0].loss_parity.startswith("negative control (|Δ loss|")
    cmd = json.loads((out / "runs" / "tiny_offline_bs2_s128_lr_off_r1" / "cell.json").read_text())["command"]
    assert "training.lr_scale=1.01" in " ".join(cmd)


def test_an_arm_with_wrong_numerics_is_not_equivalent(parity_sweeps):
    _, bad, _ = parity_sweeps
    bad = bad[bad.arm == "adamw_plain"]
    loss = bad[bad.metric == "loss"].iloc[0]
    assert loss.verdict.startswith("not equivalent: steps ")
    assert loss.worst_rms_arm > loss.worst_allowed  # beyond even the sensitivity floor (aa_eps)
    assert loss.max_abs_delta_floor > 0  # a CPU's A/A agrees exactly: the floor is aa_eps's


def test_bench_report_exits_4_when_an_arm_fails_training_parity_and_the_summary_says_so_first(
    parity_sweeps, tmp_path_factory
):
    import subprocess
    import sys

    root, _ = built_once(tmp_path_factory, "cpu-parity", build)
    env = {"BENCH_NO_PLOTS": "1"}
    for name, code in (("good", 0), ("bad", PARITY_EXIT)):
        r = subprocess.run(
            [sys.executable, "-m", "bench", "report", str(root / name)],
            cwd=REPO,
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=300,
        )
        assert r.returncode == code, r.stderr[-2000:]
    assert r.stderr.startswith("error: Parity FAILED: adamw_plain (tiny_offline_bs2_s128): loss parity FAIL")
    assert "training parity not equivalent on loss, accuracy, grad_norm" in r.stderr
    summary = (root / "bad" / "report.md").read_text().split("## Summary", 1)[1].lstrip().splitlines()[0]
    assert summary.startswith("**Parity FAILED: adamw_plain")
    assert "Parity FAILED" not in (root / "good" / "report.md").read_text()


def test_the_console_says_each_metrics_verdict_and_the_worst_window(parity_sweeps):
    from bench.results.parity_report import parity_console

    good, bad, _ = parity_sweeps
    said = " ".join(" ".join(parity_console(good)).split())  # the wrapped lines as one
    assert "training parity, adamw_plain vs baseline" in said and "(200 steps, loss fell" in said
    assert "loss equivalent; accuracy equivalent; grad_norm equivalent" in said
    worst = bad[bad.metric == "loss"].iloc[0].worst_window
    assert f"loss not equivalent (steps {worst})" in " ".join(" ".join(parity_console(bad)).split())
    assert all(len(line) <= 100 for line in parity_console(bad))


def _learning(steps: int = 60) -> pd.DataFrame:
    t = np.arange(1, steps + 1)
    return pd.DataFrame(
        {"loss": 5.0 - 0.05 * t, "accuracy": 0.01 * t / steps, "grad_norm": 1.0 + 0 * t}, index=t
    )


@pytest.mark.parametrize("who", ["arm", "baseline"])
def test_a_nan_half_way_fails_the_comparison_at_its_step_instead_of_shortening_it(who):
    base, arm = _learning(), _learning()
    broken = arm if who == "arm" else base
    broken.loc[31:, "loss"] = np.nan  # the training broke at step 31
    runs = {"baseline": {1: base}, "aa": {1: _learning()}, "x": {1: arm}}
    p = {**typed.defaults(ParityKeys), "window": 10}
    row = judge(runs, "x", "loss", p, 60)
    whose = "the arm's" if who == "arm" else "the baseline's"
    assert row["verdict"] == f"not equivalent: step 31: {whose} loss is nan"
    assert judge(runs, "x", "grad_norm", p, 60)["verdict"] == "equivalent"  # that metric is finite


def test_an_allowance_of_zero_passes_two_identical_runs():
    runs = {"baseline": {1: _learning()}, "aa": {1: _learning()}, "x": {1: _learning()}}
    p = {**typed.defaults(ParityKeys), "window": 10, "loss_atol": 0.0}
    assert judge(runs, "x", "loss", p, 60)["verdict"] == "equivalent"  # RMS 0 <= 0 allowed
    runs["x"][1].loc[40, "loss"] += 1e-9
    assert judge(runs, "x", "loss", p, 60)["verdict"].startswith("not equivalent: steps 31-40")


def test_an_unknown_compute_dtype_is_one_line(tmp_path, capsys):
    """It was accepted and would have failed at report time with a KeyError."""
    from bench.__main__ import main
    from tests.helpers import REPO

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "name: a\nhardware: cpu\nrepeats: 1\nsteps: 100\nwarmup_steps: 1\narms: [baseline, aa]\n"
        "parity: {compute_dtype: int8, at_steps: [50]}\n"
        f"cells: [{{config: {REPO / 'configs/train/tiny-offline.yaml'}, batch_size: [1], seq_len: [32]}}]\n"
    )
    assert main(["sweep", str(cfg), "--dry-run", "--out", str(tmp_path / "o")]) == 2
    assert (
        "parity.compute_dtype: expected one of bfloat16, float16, float32, got 'int8'"
        in capsys.readouterr().err
    )


def test_the_gradient_norms_last_resort_term_is_one_rounding_step_of_the_compute_dtype():
    """The issue's case: at the seed's shapes, with a floor of exactly 0, a Liger gradient norm
    0.25% off the baseline's failed the fixed 1e-3; one bfloat16 step (2^-8) allows it, and a
    norm 1% off still fails."""
    from bench.results.training_parity import settings

    gpu = settings({"config": {"hardware": ["h200"], "parity": {}}})
    cpu = settings({"config": {"hardware": "cpu", "parity": {}}})
    mine = settings({"config": {"hardware": ["h200"], "parity": {"grad_norm_rtol": 1e-3}}})
    assert gpu["grad_norm_rtol"] == 2.0**-8 and gpu["compute_dtype"] == "bfloat16"
    assert cpu["grad_norm_rtol"] == 1e-3 and cpu["compute_dtype"] == "float32"
    assert mine["grad_norm_rtol"] == 1e-3
    steps = 40
    t = np.arange(1, steps + 1)
    base = pd.DataFrame({"loss": 5.0 - 0.02 * t, "accuracy": 0.0 * t, "grad_norm": 0.137 + 0 * t}, index=t)

    def arm(rel: float) -> pd.DataFrame:
        return base.assign(grad_norm=base["grad_norm"] * (1 + rel))

    runs = {"baseline": {1: base}, "aa": {1: base.copy()}, "liger": {1: arm(0.0025)}, "wrong": {1: arm(0.01)}}
    assert judge(runs, "liger", "grad_norm", {**gpu, "window": 10}, steps)["verdict"] == "equivalent"
    assert judge(runs, "liger", "grad_norm", {**mine, "window": 10}, steps)["verdict"].startswith(
        "not equivalent"
    )
    assert judge(runs, "wrong", "grad_norm", {**gpu, "window": 10}, steps)["verdict"].startswith(
        "not equivalent"
    )


def test_the_sensitivity_nudge_moves_each_weight_one_ulp_up_or_down_without_a_direction():
    """aa_eps must model a rounding step, which has no direction. Moved all towards +inf, every
    bfloat16 RMSNorm weight of 1.0 became 1.0078 (a 0.8% scale on every norm: on the H200 the
    nudged run's loss sat 0.02 below the baseline's for 200 steps, and a 1% learning-rate error
    passed). Now each element moves one ulp up or down at random, from the init seed: half up,
    the same draw in every aa_eps run, none left where it was."""
    import torch

    from specforge.config import load_config
    from specforge.draft import DFlashDraft
    from tests.helpers import CONFIGS

    _, profile = load_config(CONFIGS / "train" / "tiny-offline.yaml")
    t = profile.target

    def draft(nudge: bool) -> DFlashDraft:
        d = DFlashDraft(profile.draft, len(t.capture_layer_ids), t.hidden_size, 256)
        d.to(torch.bfloat16).init_weights(42, nudge_ulp=nudge)
        return d

    base, nudged, again = draft(False), draft(True), draft(True)
    ups = total = 0
    for (name, p), (_, q), (_, r) in zip(
        base.named_parameters(), nudged.named_parameters(), again.named_parameters()
    ):
        assert torch.equal(q, r), name  # seeded: every aa_eps run moves the same way
        moved_up, moved_down = (
            q == torch.nextafter(p, torch.full_like(p, float("inf"))),
            q == torch.nextafter(p, torch.full_like(p, float("-inf"))),
        )
        assert bool((moved_up | moved_down).all()), name  # exactly one ulp, every element
        ups, total = ups + int(moved_up.sum()), total + p.numel()
    assert 0.45 < ups / total < 0.55
    norms = torch.cat([q.float() for n, q in nudged.named_parameters() if n.endswith("norm.weight")])
    # about a quarter of the all-up scale on the norms (+7.8e-3): at 1.0, bfloat16's step up is
    # 2^-7 and its step down 2^-8, so even a direction drawn at random leaves +2^-9 on average
    assert abs(norms.mean().item() - 1.0) < 3e-3, norms.mean()
