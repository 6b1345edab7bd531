"""Training parity through the real SpecForge CLI (PyPI 0.2.0) on the CPU: its offline features are
our trainer's cache of the same learnable config, so SpecForge's loss really falls over 200 steps;
the A/A floor is measured; a third run of the same numerics is equivalent, and one whose learning
rate is 1% off is reported as not equivalent. One test (its two sweeps are one fixture's work: a
module fixture would run once per xdist worker that takes one of its tests)."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
import torch
import yaml

from bench.results.parity_gate import PARITY_EXIT
from bench.run.sweep import run_sweep
from bench.trainers.specforge_cli.plug import SpecForgeCliPlug
from tests.helpers import CONFIGS
from tests.upstream_env import upstream_python

pytestmark = pytest.mark.slow
CELL = "tiny_offline_bs2_s128_specforge-cli"


def sweeps(root):
    """configs/cpu-specforge-parity.yaml as shipped, then a copy whose nopoll run is redone with
    SpecForge's learning rate 1% higher (the baseline and A/A runs kept: only that run is redone)."""
    doc = yaml.safe_load((CONFIGS / "cpu-specforge-parity.yaml").read_text())
    doc["trainer_python"] = str(upstream_python())
    doc["cells"][0]["config"] = str(CONFIGS / "train" / "tiny-parity.yaml")
    config = root / "sweep.yaml"
    config.write_text(yaml.safe_dump(doc))
    good, bad = root / "good", root / "bad"
    assert run_sweep(config, out=good) == 0
    shutil.copytree(good, bad, ignore=shutil.ignore_patterns("cache"))
    (bad / "cache").symlink_to(good / "cache")
    shutil.rmtree(bad / "runs" / f"{CELL}_nopoll_r1")
    lr = yaml.safe_load((CONFIGS / "train" / "tiny-parity.yaml").read_text())["training"]["lr"]
    plain = SpecForgeCliPlug.overrides
    mp = pytest.MonkeyPatch()
    mp.setattr(
        SpecForgeCliPlug,
        "overrides",
        lambda self, cfg, run, rdir: [
            *plain(self, cfg, run, rdir),
            *([f"training.learning_rate={lr * 1.01}"] if run.arm == "nopoll" else []),
        ],
    )
    assert run_sweep(config, out=bad, resume=True) == PARITY_EXIT  # the wrong run fails parity: exit 4
    mp.undo()
    return good, bad


def test_specforge_learns_our_features_the_floor_is_measured_and_a_wrong_run_fails(tmp_path):
    good, bad = sweeps(tmp_path)
    check_same_numerics_is_equivalent(good)
    check_the_features_are_our_caches(good)
    check_one_percent_off_is_not_equivalent(bad)


def check_same_numerics_is_equivalent(good):
    table = pd.read_csv(good / "training_parity.csv")
    assert set(table.trainer) == {"specforge-cli"} and set(table.arm) == {"nopoll"}
    assert (table.steps_compared == 200).all() and (table.verdict == "equivalent").all()
    assert (table.loss_drop_pct >= 30).all()  # SpecForge's draft learns the chain too
    runs = {arm: good / "runs" / f"{CELL}_{arm}_r1" / "metrics.jsonl" for arm in ("baseline", "aa", "aa_eps")}
    loss = {arm: [json.loads(x)["loss"] for x in p.read_text().splitlines()] for arm, p in runs.items()}
    assert loss["aa"] == loss["baseline"] and loss["aa_eps"] != loss["baseline"]  # the CPU's A/A: exact
    moved = table.set_index("metric").max_abs_delta_floor  # the floor is aa_eps's: one ulp, carried on
    assert moved["loss"] > 0 and moved["grad_norm"] > 0  # (an accuracy may not move at all)
    report = (good / "report.md").read_text()
    assert "## Training parity (against the A/A floor)" in report and f"### {CELL}" in report


def check_the_features_are_our_caches(good):
    (cache,) = (good / "cache").glob("*specforge-cli")
    sample = torch.load(cache / "features" / "000000.ckpt")
    ids = sample["input_ids"][sample["loss_mask"].bool()]
    assert len(set(ids.tolist())) <= 64  # the chain's 64 states, not random tokens of the vocabulary
    assert sample["hidden_states"].shape == (1, 128, 2 * 64)  # two captured layers of the tiny target
    # the target's hidden states, not noise: position 0 sees only its own token, so two samples
    # that start with the same token carry the same features there (the seeded chain has such pairs)
    samples = [torch.load(p) for p in sorted((cache / "features").glob("*.ckpt"))]
    by_first: dict[int, list[torch.Tensor]] = {}
    for smp in samples:
        by_first.setdefault(int(smp["input_ids"][0]), []).append(smp["hidden_states"][0, 0])
    pairs = [h for h in by_first.values() if len(h) > 1]
    assert pairs and all(torch.equal(h[0], other) for h in pairs for other in h[1:])
    meta = yaml.safe_load((cache / "meta.json").read_text())
    assert meta["samples"].startswith("markov, the target's hidden states") and not (cache / "ours").exists()


def check_one_percent_off_is_not_equivalent(bad):
    loss = pd.read_csv(bad / "training_parity.csv").query("metric == 'loss'").iloc[0]
    assert loss.verdict.startswith("not equivalent: steps ")
    assert loss.worst_rms_arm > loss.worst_allowed and loss.max_abs_delta_floor > 0  # beyond aa_eps's floor
    cmd = (bad / "runs" / f"{CELL}_nopoll_r1" / "cell.json").read_text()
    assert "training.learning_rate=" in cmd
