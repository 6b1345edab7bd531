"""Whether an arm took effect, from the run's own record of the module classes it trained: the
rule per arm, the census inside a trainer's process, and the verdict a cell gets when a run's
model lacked its arm's kernels (never a Δ)."""

from __future__ import annotations

import json

import pandas as pd
import torch

from bench.arms import ARMS
from bench.results.deltas import delta_columns, not_in_effect
from bench.results.verdicts import Speed, speed_kind
from bench.trainers.specforge_cli.instrument import ModuleCensus

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
