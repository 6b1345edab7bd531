"""Arms of the user's own (issue 38): a sweep's ``user_arms`` and ``bench ab --arm``, for every
trainer. A user arm is the trainer's own dotted keys, set on its runs' command lines; the keys a
plug owns are refused before anything runs, in one line naming the key and why; a key the trainer
does not know is refused with the trainer's own reason (its pre-flight check); cell.json and the
workload digest hold the arm's keys; and one A/B of the real SpecForge CLI (PyPI 0.2.0) with a
user arm, end to end."""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.config import SweepError, plan
from bench.record import CellDoc
from bench.results.identity import workload_digest
from bench.trainers import load_config, plugs_for
from tests.helpers import CONFIGS, built_once, run_cli
from tests.test_specforge_cli_speed import build_ab
from tests.upstream_env import upstream_python

TINY = CONFIGS / "train" / "tiny-offline.yaml"
EAGER = {"doc": "SDPA instead of the config's attention", "set": {"model.attention_backend": "sdpa"}}


def sweep(tmp_path: Path, **keys) -> Path:
    doc = {
        "name": "mine",
        "hardware": "cpu",
        "user_arms": {"eager": EAGER},
        "arms": ["baseline", "eager"],
        "steps": 3,
        "warmup_steps": 1,
        "repeats": 1,
        "cells": [{"config": str(TINY), "batch_size": [1], "seq_len": [64]}],
    } | keys
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def commands(cfg, tmp_path: Path) -> dict[str, list[str]]:
    """Each arm's command line for the first cell, as the plug builds it."""
    plugs = plugs_for(cfg)
    return {
        run.arm: plugs[run.cell.trainer].train_command(cfg, run, tmp_path / run.run_id, tmp_path / "cache")
        for run in plan(cfg)
    }


def test_a_user_arm_from_the_sweep_yaml_sets_its_keys_on_each_trainers_command_line(tmp_path):
    cfg = load_config(sweep(tmp_path))
    assert cfg.arms == ("baseline", "eager") and cfg.resolved["user_arms"] == {"eager": EAGER}
    argv = commands(cfg, tmp_path)
    assert "model.attention_backend=sdpa" in argv["eager"]  # our trainer: --set KEY=VALUE
    assert "model.attention_backend=sdpa" not in argv["baseline"]
    assert "--use-liger-kernel" not in argv["eager"]  # the baseline with the user's keys
    # the real SpecForge CLI: its own keys, on its command line
    cli = {"doc": "eager attention", "set": {"training.attention_backend": "eager"}}
    path = sweep(tmp_path, trainer="specforge-cli", trainer_python=sys.executable, user_arms={"eager": cli})
    argv = commands(load_config(path), tmp_path)
    assert "training.attention_backend=eager" in argv["eager"]
    assert "training.attention_backend=eager" not in argv["baseline"]
    assert "model.use_liger_kernel=false" in argv["eager"]
    # any run-contract trainer: --set KEY=VALUE, as the cell's own keys
    mine = {"doc": "my trainer's option", "set": {"training.my_option": 2}}
    path = sweep(tmp_path, trainer="contract", trainer_module="tests.fake_trainer", user_arms={"eager": mine})
    argv = commands(load_config(path), tmp_path)
    assert argv["eager"][argv["eager"].index("training.my_option=2") - 1] == "--set"
    assert "training.my_option=2" not in argv["baseline"]


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ({"user_arms": {"liger": EAGER}}, "user_arms.liger: 'liger' is a built-in arm (Liger's RMSNorm"),
        (
            {"user_arms": {"my_arm": EAGER}, "arms": ["baseline"]},
            "user_arms.my_arm: 'my_arm' should be letters",
        ),
        ({"user_arms": {"eager": {"doc": "x", "set": {}}}}, "user_arms.eager: changes nothing; expected set"),
        ({"user_arms": {"eager": {"set": {"a": 1}}}}, "user_arms.eager.doc: missing; expected a string"),
        ({"arms": ["baseline", "eagr"]}, "arms: unknown arm 'eagr'; expected arms from baseline, liger"),
        ({"arms": ["eager", "baseline"]}, None),  # the baseline first, whatever the order given
        # keys the plug owns, each named with why
        (
            {"user_arms": {"eager": {"doc": "x", "set": {"training.batch_size": 4}}}},
            "user_arms.eager.set.training.batch_size: set by the driver; use the cell's batch_size (cells[0])",
        ),
        (
            {"user_arms": {"eager": {"doc": "x", "set": {"model.liger_swiglu": False}}}},
            "user_arms.eager.set.model.liger_swiglu: set by the driver; use arms (rmsnorm, swiglu, liger)",
        ),
        (
            {
                "trainer": "specforge-cli",
                "user_arms": {"eager": {"doc": "x", "set": {"data.hidden_states_path": "/x"}}},
            },
            "user_arms.eager.set.data.hidden_states_path: set by the driver for trainer specforge-cli; the plug "
            "prepares the features",
        ),
    ],
)
def test_the_sweeps_own_arms_are_checked_in_one_line_before_anything_runs(keys, says, tmp_path):
    if says is None:
        assert load_config(sweep(tmp_path, **keys)).arms == ("baseline", "eager")
        return
    with pytest.raises(SweepError) as e:
        load_config(sweep(tmp_path, **keys))
    assert str(e.value).startswith(f"{tmp_path / 'sweep.yaml'}: {says}") and "\n" not in str(e.value), e.value


def ab(tmp_path: Path, *args: str, python: str = "/no/such/python") -> subprocess.CompletedProcess:
    argv = ["bench", "ab", "--trainer", "specforge-cli", "-c", str(TINY), "--python", python]
    argv += ["--out", str(tmp_path / "o"), "--seq-len", "128", "--pairs", "1", "--dry-run", *args]
    return run_cli(*argv, timeout=180)


def test_bench_ab_refuses_a_key_the_specforge_plug_sets_in_one_line(tmp_path):
    r = ab(tmp_path, "--arm", "eager:training.attention_backend=sdpa,training.max_steps=50")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(
        "error: --arm eager:training.max_steps=: set by the driver for --trainer specforge-cli; use --steps"
    ), r.stderr
    assert not (tmp_path / "o").exists()


def test_bench_ab_arm_is_a_complete_ab_and_an_unknown_key_gets_specforges_own_reason(tmp_path):
    python = str(upstream_python())
    r = ab(
        tmp_path,
        "--arm",
        "eager:training.attention_backend=eager,training.learning_rate=0.0002",
        python=python,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    runs = [ln for ln in r.stdout.splitlines() if ln.startswith("[")]
    assert [ln.split()[-1].rsplit("_", 2)[-2] for ln in runs] == ["baseline", "eager"]  # baseline vs eager
    lines = r.stdout.splitlines()
    eager = lines[lines.index(runs[1]) + 1]
    assert "training.attention_backend=eager training.learning_rate=0.0002" in eager
    assert "training.attention_backend=eager" not in lines[lines.index(runs[0]) + 1]
    r = ab(tmp_path, "--arm", "eager:training.attention_bakend=eager", python=python)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "(tiny_offline_bs2_s128_specforge-cli, user arm eager): SpecForge refuses the config: " in r.stderr
    assert "'training.attention_bakend' does not exist" in r.stderr


def test_an_unknown_key_gets_our_trainers_own_reason(tmp_path):
    arms = {"eager": {"doc": "x", "set": {"model.attention_bakend": "sdpa"}}}
    r = run_cli("bench", "sweep", str(sweep(tmp_path, user_arms=arms)), "--dry-run", timeout=180)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "(tiny_offline_bs1_s64, user arm eager): model.attention_bakend: unknown key" in r.stderr


def test_the_workload_digest_tells_two_user_arms_of_one_name_apart():
    cell = dict(
        arm="eager", train_config="run.yaml", config_sha256="ab" * 32, set={"training.num_anchors": 64}
    )
    sdpa = CellDoc.of(**cell, arm_set={"training.attention_backend": "sdpa"})
    eager = CellDoc.of(**cell, arm_set={"training.attention_backend": "eager"})
    assert workload_digest(sdpa) != workload_digest(eager)
    # a built-in arm's runs (no arm_set) digest as before there were user arms
    before = json.dumps({"training_config": cell["config_sha256"], "set": cell["set"]}, sort_keys=True)
    assert workload_digest(CellDoc.of(**cell)) == hashlib.sha256(before.encode()).hexdigest()[:12]


# ------------------------------------------------------------ the real SpecForge CLI, end to end


@pytest.mark.slow
def test_a_user_arm_ab_of_the_real_cli_runs_both_arms_and_records_the_arms_keys(tmp_path_factory):
    # the one-command A/B of tests/test_specforge_cli_speed.py: baseline vs eager, built once for both
    root, _ = built_once(tmp_path_factory, "specforge-ab", build_ab)
    out = root / "out"
    with (out / "runs.csv").open() as f:
        runs = list(csv.DictReader(f))
    assert sorted((r["arm"], r["status"]) for r in runs) == [("baseline", "ok")] * 2 + [("eager", "ok")] * 2
    with (out / "summary.csv").open() as f:
        summary = {r["arm"]: r for r in csv.DictReader(f)}
    assert set(summary) == {"baseline", "eager"} and summary["eager"]["n_ok"] == "2"
    digests = {r["arm"]: r["workload_digest"] for r in runs}
    assert digests["baseline"] != digests["eager"]  # the arm's keys are part of its workload
    for rdir in (out / "runs").iterdir():
        cell = json.loads((rdir / "cell.json").read_text())
        eager = cell["arm"] == "eager"
        assert cell.get("arm_set") == ({"training.attention_backend": "eager"} if eager else None)
        assert ("training.attention_backend=eager" in cell["command"]) == eager
        # what SpecForge made of the arm's key, read inside its process: its validated config and
        # the DFlash model's own attribute (the visible effect); the Liger switch likewise
        resolved = json.loads((rdir / "run.json").read_text())["set_resolved"]
        backend = resolved.get("training.attention_backend")
        assert backend == (
            {"config": "eager", "model": {"OnlineDFlashModel.attention_backend": "eager"}} if eager else None
        )
        assert resolved["model.use_liger_kernel"] == {"config": False}
    assert {r["arm_in_effect"] for r in runs} == {"yes"}
    config = json.loads((out / "sweep.json").read_text())["config"]
    assert config["user_arms"]["eager"]["set"] == {"training.attention_backend": "eager"}


@pytest.mark.slow
def test_a_user_arm_sweep_of_our_trainer_runs_end_to_end_and_proves_its_key(tmp_path):
    """A sweep YAML's own arm, run: our trainer on the CPU, baseline vs SDPA attention, one pair;
    each run's set_resolved holds what its validated config made of the keys, so runs.csv says the
    arm was in effect and the summary compares the two."""
    out = tmp_path / "out"
    r = run_cli("bench", "sweep", str(sweep(tmp_path)), "--out", str(out), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with (out / "runs.csv").open() as f:
        runs = {row["arm"]: row for row in csv.DictReader(f)}
    assert {a: (row["status"], row["arm_in_effect"]) for a, row in runs.items()} == {
        "baseline": ("ok", "yes"),
        "eager": ("ok", "yes"),
    }
    rdir = out / "runs" / runs["eager"]["run_id"]
    assert json.loads((rdir / "run.json").read_text())["set_resolved"]["model.attention_backend"] == {
        "config": "sdpa"
    }
    with (out / "summary.csv").open() as f:
        eager = next(row for row in csv.DictReader(f) if row["arm"] == "eager")
    assert eager["n_pairs"] == "1" and eager["delta_samples_per_s_pct"] != ""
