"""Whether an arm took effect, from the run's own record of the module classes it trained and of
what the trainer made of a user arm's keys: the rule per arm, the census inside a trainer's
process, and the verdict a cell gets when a run's model lacked its arm's kernels (never a Δ), down
to a Liger run of the real SpecForge CLI whose kernels did not land."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from bench.__main__ import main
from bench.arms import ARMS, user_arm
from bench.record import CellDoc, RunDoc
from bench.results.armsection import arms_section
from bench.results.deltas import delta_columns, not_in_effect
from bench.results.records import RunRecord, arm_in_effect
from bench.results.verdicts import Speed, speed_kind
from bench.run import preflight
from bench.trainers.specforge_cli.instrument import ModuleCensus, _argv_keys, resolved_keys
from tests.test_specforge_cli_speed import user_config
from tests.upstream_env import upstream_python

STOCK = ["DFlashDraft", "Linear", "Qwen3MLP", "Qwen3RMSNorm"]
LIGER = ["DFlashDraft", "LigerRMSNorm", "LigerSwiGLUMLP", "Linear"]


def test_each_arm_asks_for_its_own_liger_modules_and_no_others():
    assert ARMS["liger"].in_effect(LIGER) == "yes"
    assert ARMS["baseline"].in_effect(STOCK) == "yes"
    assert ARMS["liger"].in_effect(STOCK) == "no: no LigerRMSNorm, LigerSwiGLUMLP in the model"
    assert ARMS["rmsnorm"].in_effect(["LigerRMSNorm", "Qwen3MLP"]) == "yes"
    assert ARMS["rmsnorm"].in_effect(LIGER) == "no: LigerSwiGLUMLP in the model, not asked for"
    assert ARMS["baseline"].in_effect(LIGER).startswith("no: LigerRMSNorm, LigerSwiGLUMLP in the model")
    assert ARMS["liger_flce"].in_effect(LIGER) == "yes"  # the fused loss is a function: no module shows it


def test_the_census_finds_the_smallest_module_holding_what_the_optimizer_trains(tmp_path):
    class Draft(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(4)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.SiLU())

    class Wrapper(torch.nn.Module):  # the training model: the draft plus a frozen head
        def __init__(self):
            super().__init__()
            self.draft, self.head = Draft(), torch.nn.Linear(4, 8)

    model = Wrapper()
    opt = torch.optim.SGD(model.draft.parameters(), lr=0.1)
    out = tmp_path / "modules.json"
    census = ModuleCensus(str(out))
    census(opt, (), {})
    doc = json.loads(out.read_text())
    assert doc["root"] == "Draft" and doc["matched_tensors"] == doc["trained_tensors"] == 4
    assert doc["module_types"] == ["Draft", "LayerNorm", "Linear", "Sequential", "SiLU"]
    out.unlink()
    census(opt, (), {})  # once, after the first step only
    assert not out.exists()


def test_a_cell_whose_liger_run_lacked_the_kernels_gets_no_delta():
    base = pd.DataFrame({"arm_in_effect": ["yes", "yes"], "samples_per_s": [1.0, 1.0], "repeat": [1, 2]})
    arm = pd.DataFrame(
        {
            "arm_in_effect": ["yes", "no: no LigerRMSNorm in the model"],
            "samples_per_s": [1.2, 1.0],
            "repeat": [1, 2],
        }
    )
    row = delta_columns(base, arm, None, 1.0, arm="liger")
    assert speed_kind(row["verdict_speed"]) is Speed.NOT_IN_EFFECT
    assert row["verdict_speed"] == "arm not in effect (1 of 2 liger runs: no LigerRMSNorm in the model)"
    assert "delta_samples_per_s_pct" not in row  # no Δ of a comparison of something else
    unknown = base.assign(arm_in_effect=[None, None])  # runs that recorded no module classes: no claim
    assert not_in_effect(unknown, unknown, "liger") is None
    assert not_in_effect(base, base.drop(columns="arm_in_effect"), "liger") is None  # a table without it


def _specforge_config_class():
    """A stand-in of SpecForge's validated run config (specforge.config.schema.Config): a class
    of that name and module, holding sections as attributes, as pydantic's models do."""
    section = type("Section", (), {})
    config = type("Config", (), {"__module__": "specforge.config.schema"})
    return section, config


def test_the_census_reads_what_specforge_made_of_each_key_from_its_config_and_its_modules():
    section, config = _specforge_config_class()
    cfg = config()
    cfg.training, cfg.model = section(), section()
    cfg.training.attention_backend, cfg.model.use_liger_kernel = "flex_attention", True

    class DFlashModel(torch.nn.Module):  # SpecForge's DFlash model keeps the backend it resolved
        def __init__(self):
            super().__init__()
            self.attention_backend = "flex_attention"

    model = DFlashModel()
    argv = [
        "train",
        "-c",
        "run.yaml",
        "training.attention_backend=sdpa",
        "model.use_liger_kernel=true",
        "x.y=1",
    ]
    got = resolved_keys(_argv_keys(argv), [cfg, model, object()], torch.nn.Module)
    assert got == {
        "training.attention_backend": {
            "config": "flex_attention",
            "model": {"DFlashModel.attention_backend": "flex_attention"},
        },
        "model.use_liger_kernel": {"config": True},
        "x.y": {},  # no config object holds it
    }


def test_a_user_arm_is_in_effect_only_when_the_trainer_resolved_each_key_to_the_value_asked():
    sdpa = user_arm("sdpa", "", {"training.attention_backend": "sdpa", "training.learning_rate": 1e-4})
    held = {"config": "sdpa", "model": {"DFlashModel.attention_backend": "sdpa"}}
    lr = {"config": 0.0001}
    assert sdpa.keys_in_effect({"training.attention_backend": held, "training.learning_rate": lr}) == "yes"
    assert (
        sdpa.keys_in_effect(
            {"training.attention_backend": held | {"config": "flex_attention"}, "training.learning_rate": lr}
        )
        == "no: training.attention_backend resolved to 'flex_attention'"
    )
    assert (
        sdpa.keys_in_effect(
            {
                "training.attention_backend": held | {"model": {"M.attention_backend": "eager"}},
                "training.learning_rate": lr,
            }
        )
        == "no: M.attention_backend is 'eager'"
    )
    assert sdpa.keys_in_effect({"training.attention_backend": held}) == (
        "no: training.learning_rate is not in the trainer's resolved config"
    )
    assert (
        user_arm("on", "", {"model.flag": True}).keys_in_effect({"model.flag": {"config": "true"}}) == "yes"
    )


def test_runs_csv_says_a_user_arm_whose_key_did_not_take_is_not_in_effect():
    cell = CellDoc.of(arm="mine", arm_set={"training.attention_backend": "sdpa"})
    took = {"training.attention_backend": {"config": "sdpa"}}
    ignored = {"training.attention_backend": {"config": "flex_attention"}}

    def verdict(resolved, types=STOCK):
        run = RunDoc.of(status="ok", draft_module_types=types, set_resolved=resolved)
        return arm_in_effect(RunRecord(Path("r"), cell, run, pd.DataFrame(), None))

    assert verdict(took) == "yes"
    assert verdict(ignored) == "no: training.attention_backend resolved to 'flex_attention'"
    assert verdict(ignored, LIGER) == (
        "no: LigerRMSNorm, LigerSwiGLUMLP in the model, not asked for; "
        "training.attention_backend resolved to 'flex_attention'"
    )
    assert verdict(None) is None  # keys set, nothing recorded of them: the module classes cannot prove it
    assert verdict(None, None) is None  # no record at all: no claim
    assert verdict(took, None) == "yes"  # its keys resolved as asked: a user arm swaps no kernel


@pytest.mark.parametrize(
    ("arm", "keys", "resolved", "types", "expected"),
    [  # a built-in arm's intent as the plug's keys (cell.json's arm_keys), judged on what the run resolved
        (
            "sdpa",
            {"model.attention_backend": "sdpa"},
            {"model.attention_backend": {"config": "sdpa"}},
            "stock",
            "yes",
        ),
        (
            "sdpa",
            {"model.attention_backend": "sdpa"},
            {"model.attention_backend": {"config": "flex_attention"}},
            "stock",
            "no: model.attention_backend resolved to 'flex_attention'",
        ),
        ("sdpa", {"model.attention_backend": "sdpa"}, None, "stock", None),  # set, never read back
        ("sdpa", None, None, "stock", "yes"),  # a record from before arm_keys: the module classes, as then
        (
            "liger_compile",
            {"model.compile_layers": True},
            {"model.compile_layers": {"config": False}},
            "liger",
            "no: model.compile_layers resolved to False",
        ),
        (
            "liger_compile",
            {"model.compile_layers": True},
            {"model.compile_layers": {"config": True}},
            None,
            None,
        ),
        ("baseline", None, None, None, None),
    ],
)
def test_a_built_in_arm_is_in_effect_only_where_its_runs_resolved_its_keys(
    arm, keys, resolved, types, expected
):
    cell = CellDoc.of(arm=arm, arm_keys=keys)
    modules = {"stock": STOCK, "liger": LIGER, None: None}[types]
    run = RunDoc.of(status="ok", draft_module_types=modules, set_resolved=resolved)
    assert arm_in_effect(RunRecord(Path("r"), cell, run, pd.DataFrame(), None)) == expected


# ------------------------------------------------------------ the real SpecForge CLI, end to end

SHIM = '''"""A liger-kernel whose modules are transformers' own: SpecForge's Liger switch is honoured, its
draft is built from these, and no Liger kernel reaches it."""
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP as LigerSwiGLUMLP
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm as LigerRMSNorm
'''


@pytest.mark.slow
def test_a_liger_run_of_the_real_cli_whose_kernels_did_not_land_gets_no_delta(tmp_path, monkeypatch, capsys):
    """The real SpecForge 0.2.0 in an environment whose liger_kernel hands it transformers' own
    modules: model.use_liger_kernel=true reaches SpecForge's config, the draft it trains holds no
    Liger module, and the verdict is "arm not in effect", never a Δ. (Liger's kernels need a GPU,
    so the driver is told this machine can run them: the kernels here are stock modules.)"""
    shim = tmp_path / "shim" / "liger_kernel"
    (shim / "transformers").mkdir(parents=True)
    (shim / "__init__.py").write_text("")
    (shim / "transformers" / "__init__.py").write_text(SHIM)
    python = tmp_path / "python"  # the user's environment: upstream SpecForge with that liger_kernel
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH={shim.parent}${{PYTHONPATH:+:$PYTHONPATH}} exec {upstream_python()} "$@"\n'
    )
    python.chmod(0o755)
    monkeypatch.setattr(preflight, "liger_skip_reason", lambda: None)
    out = tmp_path / "out"
    argv = ["ab", "--trainer", "specforge-cli", "-c", str(user_config(tmp_path)), "--python", str(python)]
    argv += [
        "--out",
        str(out),
        "--seq-len",
        "128",
        "--arms",
        "baseline,liger",
        "--pairs",
        "1",
        "--steps",
        "3",
        "--pairing",
        "sequential",
        "--set-sweep",
        "trainer_python_fork=true",  # both runs forked from one warm server of that environment
    ]
    assert main(argv) == 0
    runs = {r["arm"]: r for r in csv.DictReader((out / "runs.csv").open())}
    assert runs["liger"]["status"] == runs["baseline"]["status"] == "ok"
    assert runs["liger"]["arm_in_effect"] == "no: no LigerRMSNorm, LigerSwiGLUMLP in the model"
    assert runs["baseline"]["arm_in_effect"] == "yes"
    liger = next((out / "runs").glob("*_liger_r1"))
    run = json.loads((liger / "run.json").read_text())
    assert run["set_resolved"]["model.use_liger_kernel"] == {"config": True}  # the switch did reach SpecForge
    assert json.loads((liger / "specforge.json").read_text())["start"] == "warm-server"
    assert "Qwen3RMSNorm" in run["draft_module_types"]
    row = {r["arm"]: r for r in csv.DictReader((out / "summary.csv").open())}["liger"]
    assert row["verdict_speed"].startswith("arm not in effect (1 of 1 liger runs: no LigerRMSNorm")
    assert row["delta_samples_per_s_pct"] == ""
    assert "arm not in effect" in capsys.readouterr().out


def test_the_report_lists_each_arm_what_it_changes_and_how_many_runs_show_it_in_effect():
    cell = CellDoc.of(arm="mine", arm_set={"training.attention_backend": "sdpa"})
    took = {"training.attention_backend": {"config": "sdpa", "model": {"M.attention_backend": "sdpa"}}}
    records = [
        RunRecord(Path(f"r{i}"), cell, RunDoc.of(status="ok", set_resolved=took), pd.DataFrame(), None)
        for i in (1, 2)
    ]
    runs = pd.DataFrame(
        {
            "arm": ["mine", "baseline", "mine", "baseline", "liger"],
            "status": ["ok"] * 5,
            "arm_in_effect": ["yes", "yes", "yes", None, "no: no LigerRMSNorm in the model"],
        }
    )
    sweep = {
        "config": {
            "arms": ["baseline", "mine", "liger"],
            "user_arms": {"mine": {"doc": "SDPA", "set": cell.arm_set}},
        }
    }
    lines = arms_section(runs, sweep, records)
    assert lines[0].startswith("**Arms.**")
    assert lines[4:7] == [
        "| baseline | the stock modules | yes in 1 of 2; not recorded in 1 |",
        "| mine | the sweep's own arm: `training.attention_backend=sdpa` (SDPA) | 2 of 2 "
        "(training.attention_backend: sdpa in the config; M.attention_backend = sdpa) |",
        "| liger | Liger's RMSNorm and SwiGLU | no: no LigerRMSNorm in the model (1 of 1) |",
    ]
    # nothing recorded: the section says so per arm (before, it left the section out and the Δs
    # read as verdicts on arms nobody saw take effect)
    unrecorded = arms_section(runs.assign(arm_in_effect=None), sweep, records)
    rows = [line for line in unrecorded if line.startswith("| ") and not line.startswith(("| arm", "|---"))]
    assert unrecorded[0].startswith("**Arms.**") and len(rows) == len(set(runs["arm"]))
    assert all(line.endswith("| not recorded |") for line in rows), rows


@pytest.mark.parametrize("records", [True, False], ids=["recorded", "fake.record_effect=false"])
def test_a_trainer_that_records_nothing_of_its_arms_gets_its_delta_but_no_verdict(tmp_path, records):
    """A real sweep of the fake trainer (the run contract, no model): where its runs record the model
    classes and keys they trained, the A/A and adamw_plain rows are judged; where they record
    nothing (a trainer plug that does not say), each row keeps its measured Δ, its verdict is
    'effect not recorded' and runs.csv's arm_in_effect is blank (before: judged as in effect)."""
    from bench.run.sweep import run_sweep
    from tests.test_driver import sweep_file, train_configs

    sets = {"fake.step_time_s": 0.1, "fake.step_sleep": 0.0}
    if not records:
        sets["fake.record_effect"] = False
    cell = {"config": train_configs(tmp_path)["online"], "batch_size": 1, "seq_len": 32, "set": sets}
    path = sweep_file(tmp_path, [cell], arms=["baseline", "adamw_plain"], repeats=3)
    assert run_sweep(path, out=tmp_path / "out") == 0
    runs = pd.read_csv(tmp_path / "out" / "runs.csv")
    row = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("arm").loc["adamw_plain"]
    assert row["delta_samples_per_s_pct"] == pytest.approx(0.0, abs=1e-6)  # 0.1 s a step in both arms
    if records:
        assert set(runs["arm_in_effect"]) == {"yes"}
        assert row["verdict_speed"] == "within ±1%"
    else:
        assert runs["arm_in_effect"].isna().all()
        assert row["verdict_speed"] == (
            "effect not recorded (3 of 3 adamw_plain runs, 3 of 3 baseline runs recorded nothing of "
            "whether the arm took effect; no verdict)"
        )
