"""Sweep config validation, grid expansion and run order (no processes launched)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml

from bench.__main__ import main
from bench.config import SweepError, diff_resolved, format_set_value, plan
from bench.config.schema import CapacityKeys, CellKeys, PrecisionKeys, SweepKeys
from bench.trainers import load_config, plug_for

REPO = Path(__file__).resolve().parents[1]


def write_train(tmp: Path, name: str, profile: str = "tiny", mode: str = "offline", **extra) -> Path:
    path = tmp / "train" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"profile": profile, "mode": mode, **extra}))
    return path


def write_sweep(tmp: Path, doc: dict, name: str = "sweep.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(autouse=True)
def _no_rendezvous_env(monkeypatch):
    """A machine's MASTER_ADDR / BENCH_RDZV_ENDPOINT would fill a missing rdzv_endpoint."""
    for var in ("BENCH_RDZV_ENDPOINT", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def base(tmp_path) -> dict:
    off = write_train(
        tmp_path,
        "off",
        training={"accumulation_steps": 4, "num_anchors": 64},
        model={"attention_backend": "sdpa"},
        data={"source": "synthetic"},
    )
    on = write_train(tmp_path, "on", mode="online")
    return {
        "name": "t",
        "hardware": "cpu",
        "trainer_module": "tests.fake_trainer",
        "arms": ["baseline", "liger"],
        "repeats": 3,
        "steps": 10,
        "warmup_steps": 2,
        "cells": [
            {
                "config": str(off),
                "batch_size": [1, 2],
                "seq_len": [128, 256],
                "set": {"training.num_anchors": 8},
            },
            {"config": str(on), "batch_size": 2, "seq_len": 128, "gpus_per_run": 2},
        ],
    }


def test_grid_expansion_and_cell_fields(tmp_path, base):
    cfg = load_config(write_sweep(tmp_path, base))
    ids = [c.cell_id for c in cfg.cells]
    assert ids == [
        "tiny_offline_bs1_s128",
        "tiny_offline_bs1_s256",
        "tiny_offline_bs2_s128",
        "tiny_offline_bs2_s256",
        "tiny_online_bs2_s128_g2",
    ]
    first = cfg.cells[0]
    assert (first.accumulation_steps, first.num_anchors, first.attention_backend) == (4, 8, "sdpa")
    assert (first.steps, first.warmup_steps, first.gpus) == (10, 2, 1)
    assert cfg.out == "results/t" and cfg.timeout_s == 600 and cfg.order == "interleaved"
    runs = plan(cfg)
    assert len(runs) == 5 * 2 * 3
    assert len({r.run_id for r in runs}) == len(runs)
    assert runs[0].run_id == "tiny_offline_bs1_s128_baseline_r1"
    assert [r.order_index for r in runs] == list(range(len(runs)))
    # offline caches are shared by arms and batch sizes, not by sequence lengths
    keys = {c.cache_key() for c in cfg.cells if c.mode == "offline"}
    assert len(keys) == 2


def _pairs(runs):
    return [runs[i : i + 2] for i in range(0, len(runs), 2)]


def test_interleaved_order_alternates_arms(tmp_path, base):
    runs = plan(load_config(write_sweep(tmp_path, base)))
    arms = [r.arm for r in runs]
    assert arms == ["baseline", "liger"] * (len(runs) // 2)
    for a, b in _pairs(runs):  # each (cell, repeat) pair runs back to back
        assert (a.cell, a.repeat) == (b.cell, b.repeat)
    # never all A then all B; repeats come in rounds over every cell
    half = len(arms) // 2
    assert set(arms[:half]) == {"baseline", "liger"}
    assert [r.repeat for r in runs[:10]] == [1] * 10


def test_shuffled_order_is_reproducible(tmp_path, base):
    base |= {"order": "shuffled", "order_seed": 7, "repeats": 5}
    a = [r.run_id for r in plan(load_config(write_sweep(tmp_path, base)))]
    b = [r.run_id for r in plan(load_config(write_sweep(tmp_path, base)))]
    assert a == b
    other = [r.run_id for r in plan(load_config(write_sweep(tmp_path, base | {"order_seed": 8})))]
    assert other != a and sorted(other) == sorted(a)
    runs = plan(load_config(write_sweep(tmp_path, base)))
    for x, y in _pairs(runs):
        assert (x.cell, x.repeat) == (y.cell, y.repeat) and {x.arm, y.arm} == {"baseline", "liger"}
    firsts = {x.arm for x, _ in _pairs(runs)}
    assert firsts == {"baseline", "liger"}  # the arm order really is randomised


def test_single_baseline_arm_and_per_cell_overrides(tmp_path, base):
    base["arms"] = ["baseline"]
    base["cells"][1] |= {"steps": 30, "warmup_steps": 20, "timeout_s": 5}
    cfg = load_config(write_sweep(tmp_path, base))
    assert cfg.arms == ("baseline",)
    last = cfg.cells[-1]
    assert (last.steps, last.warmup_steps, last.timeout_s) == (30, 20, 5.0)
    assert {r.arm for r in plan(cfg)} == {"baseline"}


def test_arms_are_run_baseline_first(tmp_path, base):
    base["arms"] = ["liger", "baseline"]
    cfg = load_config(write_sweep(tmp_path, base))
    assert plan(cfg)[0].arm == "baseline"


def _bad(base: dict, tmp: Path) -> list[tuple[str, dict, str]]:
    cell = base["cells"][0]
    return [
        ("unknown top key", base | {"stepz": 3}, "stepz: unknown key; did you mean 'steps'"),
        ("unknown cell key", base | {"cells": [cell | {"batch": 2}]}, "cells[0].batch: unknown key"),
        ("wrong type", base | {"repeats": "3"}, "repeats: expected an integer"),
        ("bool for int", base | {"steps": True}, "steps: expected an integer"),
        (
            "float for int",
            base | {"cells": [cell | {"batch_size": 1.5}]},
            "cells[0].batch_size: expected a positive",
        ),
        ("warmup >= steps", base | {"warmup_steps": 10}, "warmup_steps: 10 leaves no steady-state steps"),
        ("cell warmup >= steps", base | {"cells": [cell | {"steps": 2}]}, "cells[0].warmup_steps"),
        ("repeats < 1", base | {"repeats": 0}, "repeats: expected a value >= 1"),
        ("zero timeout", base | {"timeout_s": 0}, "timeout_s: expected a value > 0"),
        ("poll too slow", base | {"poll_interval_s": 2.0}, "poll_interval_s: expected at most 1.0"),
        ("bad order", base | {"order": "random"}, "order: expected one of interleaved, shuffled"),
        (
            "missing train config",
            base | {"cells": [cell | {"config": "nope.yaml"}]},
            "cells[0].config: no such",
        ),
        ("bad arm", base | {"arms": ["baseline", "fast"]}, "arms: unknown arm 'fast'"),
        ("no baseline", base | {"arms": ["liger"]}, "arms: the baseline arm is missing"),
        ("missing key", {k: v for k, v in base.items() if k != "steps"}, "steps: missing"),
        ("empty cells", base | {"cells": []}, "cells: expected a non-empty list"),
        (
            "nodes without rdzv",
            base | {"nodes": 2, "launcher": ["srun"]},
            "rdzv_endpoint: required when nodes > 1",
        ),
        (
            "driver key in set",
            base | {"cells": [cell | {"set": {"training.steps": 5}}]},
            "set.training.steps",
        ),
        ("non-scalar set", base | {"cells": [cell | {"set": {"a.b": [1]}}]}, "set.a.b: expected a scalar"),
        ("bad module", base | {"trainer_module": "x; rm -rf /"}, "trainer_module: expected a Python module"),
        ("duplicate cells", base | {"cells": [cell, cell]}, "give one of them a distinct label"),
        ("top-level list", [1, 2], "expected a mapping of sweep settings"),
        (
            "train config w/o mode",
            base | {"cells": [cell | {"config": str(write_train(tmp, "nomode", mode="batch"))}]},
            "needs a top-level 'mode'",
        ),
        ("gpu arm on cpu", base | {"arms": ["baseline", "compile"]}, "arms: compile needs a GPU"),
        (
            "sdpa arm, sdpa cell",
            base | {"hardware": "h200", "arms": ["baseline", "sdpa"]},
            "arms: sdpa on cells[0], whose attention is sdpa already",
        ),
        (
            "profiling in a sweep",
            base | {"cells": [cell | {"set": {"training.profile_steps": "[3, 4]"}}]},
            "profiled steps are not for timing",
        ),
        (
            "arm key in set",
            base | {"cells": [cell | {"set": {"training.fused_adamw": False}}]},
            "use arms (adamw_foreach, adamw_plain)",
        ),
        (
            "contrast shape",
            base | {"contrasts": ["liger"]},
            "contrasts: expected a list of [arm, reference] pairs",
        ),
        (
            "contrast of an arm not run",
            base | {"arms": ["baseline", "liger", "rmsnorm"], "contrasts": [["liger", "swiglu"]]},
            "contrasts[0]: 'swiglu' is not one of this sweep's arms",
        ),
        (
            "contrast with itself",
            base | {"arms": ["baseline", "liger", "rmsnorm"], "contrasts": [["liger", "liger"]]},
            "contrasts[0]: compares 'liger' with itself",
        ),
        (
            "contrast with the baseline",
            base | {"arms": ["baseline", "liger", "rmsnorm"], "contrasts": [["liger", "baseline"]]},
            "contrasts[0]: every arm is already compared with the baseline",
        ),
        (
            "contrast twice",
            base
            | {
                "arms": ["baseline", "liger", "rmsnorm"],
                "contrasts": [["liger", "rmsnorm"], ["rmsnorm", "liger"]],
            },
            "contrasts[1]: rmsnorm and liger are compared twice",
        ),
    ]


def test_each_bad_config_names_the_key(tmp_path, base):
    for what, doc, expected in _bad(base, tmp_path):
        path = write_sweep(tmp_path, doc, name="bad.yaml")
        with pytest.raises(SweepError) as err:
            load_config(path)
        msg = str(err.value)
        assert expected in msg, f"{what}: {msg}"
        assert "\n" not in msg and msg.startswith(str(path)), what


def test_malformed_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SweepError, match=r"not valid YAML.*line"):
        load_config(bad)
    with pytest.raises(SweepError, match="no such sweep config file"):
        load_config(tmp_path / "absent.yaml")


@pytest.mark.parametrize("which", [0, 5, 11, 13])
def test_cli_bad_config_exits_2_with_one_line(tmp_path, base, capsys, which):
    _, doc, expected = _bad(base, tmp_path)[which]
    path = write_sweep(tmp_path, doc, name="bad.yaml")
    out = tmp_path / "out"
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["sweep", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and expected in err and err.count("\n") == 1
    assert "Traceback" not in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == before


def test_diff_resolved_names_keys(tmp_path, base):
    a = load_config(write_sweep(tmp_path, base)).resolved
    changed = base | {"steps": 12, "cells": [base["cells"][0] | {"batch_size": [4]}, base["cells"][1]]}
    b = load_config(write_sweep(tmp_path, changed)).resolved
    assert diff_resolved(a, b) == ["cells[0].batch_size", "steps"]
    # a key added to the schema after a sweep started: its default is no difference, another value is
    older = {k: v for k, v in a.items() if k != "fork_server"}
    assert diff_resolved(older, a) == []
    assert diff_resolved(older, a | {"fork_server": False}) == ["fork_server"]
    assert diff_resolved(a, a | {"out": "elsewhere"}) == []
    # contrasts change no run: a resumed sweep may ask for others (sweep.json takes the new ones)
    assert diff_resolved(a, a | {"contrasts": [["liger", "rmsnorm"]]}) == []


def test_format_set_value_round_trips_through_yaml():
    values = [True, False, None, 3, 0.5, 1e-05, 2.5e-07, 1e20, float("inf"), "sdpa"]
    assert [format_set_value(v) for v in values[:5]] == ["true", "false", "null", "3", "0.5"]
    assert [yaml.safe_load(format_set_value(v)) for v in values] == values


TRAIN_CONFIGS = ("tiny-offline", "tiny-online", "qwen3.5-4b-offline", "qwen3-8b-online")


SHIPPED = sorted(p.stem for p in (REPO / "configs").glob("*.yaml"))  # every sweep config we ship


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """The shipped sweep configs, read against stand-in training configs (profile + mode)."""
    (tmp_path / "configs").mkdir()
    for name in TRAIN_CONFIGS:
        mode = "online" if name.endswith("online") else "offline"
        write_train(tmp_path / "configs", name, profile=name.rsplit("-", 1)[0], mode=mode)
    for name in SHIPPED:
        shutil.copy(REPO / "configs" / f"{name}.yaml", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    return lambda name: load_config(Path("configs") / f"{name}.yaml")


def test_shipped_configs(shipped):
    cpu = shipped("cpu")
    assert cpu.hardware == ("cpu",) and cpu.out == "results/cpu"
    assert [c.cell_id for c in cpu.cells] == ["tiny_offline_bs2_s128"]
    assert cpu.arms == ("baseline", "liger", "aa", "adamw_plain")  # an A/A pair and a CPU contrast
    assert len(plan(cpu)) == 20 and (cpu.steps, cpu.warmup_steps) == (60, 5)
    h200 = shipped("h200")
    assert set(h200.hardware) == {"h100", "h200"}
    # 12 measured steps per run, pairs added until ±1 point (docs/method.md has the arithmetic)
    assert all((c.steps, c.warmup_steps) == (13, 1) for c in h200.cells)
    assert [
        (c.precision.ci_halfwidth_pct, c.precision.min_pairs, c.precision.max_pairs) for c in h200.cells
    ] == [
        (1.0, 5, 12),
        (1.0, 3, 8),
    ]
    assert h200.fork_server and plug_for(h200).preload(h200)[:2] == [
        "specforge.train",
        "liger_kernel.transformers",
    ]
    assert h200.order == "shuffled"
    assert all(c.num_anchors == 512 for c in h200.cells)
    # The 4B cell is the seeds' method (8 samples per step); the online 8B cell uses 2 micro-batches.
    assert [c.accumulation_steps for c in h200.cells] == [4, 2]
    a100 = shipped("a100")
    # Same cells as the H200 sweep, so the two summaries compare row for row.
    assert [c.cell_id for c in a100.cells] == [c.cell_id for c in h200.cells]
    assert [c.accumulation_steps for c in a100.cells] == [c.accumulation_steps for c in h200.cells]
    mi = shipped("mi355x")
    assert set(mi.hardware) == {"mi300x", "mi355x"} and (mi.steps, mi.warmup_steps, mi.repeats) == (
        200,
        20,
        3,
    )
    for cfg in (h200, a100, mi):
        assert cfg.trainer_module == "specforge" and cfg.arms == ("baseline", "liger")


def test_shipped_configs_against_real_training_configs(monkeypatch):
    monkeypatch.chdir(REPO)
    for name in SHIPPED:
        assert plan(load_config(f"configs/{name}.yaml"))


def test_option_arms_set_their_keys_and_only_liger_arms_patch(tmp_path, base):
    """Each arm is a named set of trainer options; its run's command carries exactly those."""
    from bench.trainers import plug_for

    base["hardware"] = "h200"
    base["cells"] = [base["cells"][1]]  # online, flex attention (the train config's default)
    base["arms"] = ["baseline", "compile", "liger_compile", "liger_flce", "sdpa", "adamw_foreach"]
    runs = {r.arm: r for r in plan(load_config(write_sweep(tmp_path, base)))}
    expect = {
        "baseline": [],
        "compile": ["model.compile_layers=true"],
        "liger_compile": ["model.compile_layers=true"],
        "liger_flce": ["model.liger_fused_linear_ce=true"],
        "sdpa": ["model.attention_backend=sdpa"],
        "adamw_foreach": ["training.fused_adamw=false"],
    }
    for arm, sets in expect.items():
        cfg = load_config(write_sweep(tmp_path, base))
        argv = plug_for(cfg).train_command(cfg, runs[arm], tmp_path / arm, None)
        arm_sets = [
            a
            for a in argv
            if a.split("=")[0]
            in (
                "model.compile_layers",
                "model.attention_backend",
                "training.fused_adamw",
                "model.liger_fused_linear_ce",
            )
        ]
        assert arm_sets == sets, arm
        assert ("--use-liger-kernel" in argv) == (arm in ("liger_compile", "liger_flce")), arm


def test_default_arms_are_baseline_and_liger(tmp_path, base):
    del base["arms"]
    assert load_config(write_sweep(tmp_path, base)).arms == ("baseline", "liger")


# What the sweep config parser resolved for every shipped config before bench/config was rebuilt on
# the typed engine (taken from that code, run in the repository root): the resolved config is
# stored in sweep.json and compared by --resume, so the rebuild must not change a byte of it.
RESOLVED = json.loads((REPO / "tests" / "data" / "resolved_configs.json").read_text())


def _json(value) -> str:
    return json.dumps(value, sort_keys=True)  # tells 600 from 600.0, as sweep.json does


@pytest.mark.parametrize("config", sorted(RESOLVED))
def test_resolved_config_is_unchanged(config, monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = load_config(f"configs/{config}")
    assert _json(cfg.resolved) == _json(RESOLVED[config])
    assert list(cfg.resolved) == list(RESOLVED[config])  # the keys in declaration order, too


def _committed_sweep_json(config: str) -> Path | None:
    """results/<name>/sweep.json of the shipped config's committed sweep (its name read from the
    YAML), or None where none was committed (a100, mi355x, the CPU configs, ...)."""
    name = yaml.safe_load((REPO / "configs" / f"{config}.yaml").read_text())["name"]
    path = REPO / "results" / name / "sweep.json"
    return path if path.is_file() and json.loads(path.read_text())["config"]["name"] == name else None


# Only the shipped configs that have a committed sweep: the others have nothing to match (a case for
# them could only skip, on every machine).
COMMITTED = [c for c in SHIPPED if _committed_sweep_json(c) is not None]


def test_most_shipped_configs_have_a_committed_sweep_to_match():
    assert len(COMMITTED) >= 25 and "h200" in COMMITTED and "cpu" not in COMMITTED


@pytest.mark.parametrize("config", COMMITTED)
def test_resolved_config_matches_the_committed_sweep(config, monkeypatch):
    """A committed sweep's sweep.json holds the config it ran: each of its keys resolves to the same
    value today, and a key added to the schema since (prime_runs, contrasts, ...) holds its default,
    so --resume finds no difference."""
    monkeypatch.chdir(REPO)
    cfg = load_config(f"configs/{config}.yaml")
    sweep_json = REPO / "results" / cfg.name / "sweep.json"
    assert sweep_json == _committed_sweep_json(config)  # the YAML's name is the loaded config's
    stored = json.loads(sweep_json.read_text())["config"]
    assert {k: _json(cfg.resolved[k]) for k in stored if k != "cells"} == {
        k: _json(v) for k, v in stored.items() if k != "cells"
    }
    now = [{k: c[k] for k in old} for c, old in zip(cfg.resolved["cells"], stored["cells"])]
    assert _json(now) == _json(stored["cells"])
    assert diff_resolved(stored, cfg.resolved) == []


@pytest.mark.parametrize("section", [SweepKeys, CellKeys, PrecisionKeys, CapacityKeys])
def test_every_key_has_a_one_line_doc(section):
    for f in dataclasses.fields(section):
        doc = f.metadata["doc"]
        assert doc.strip() and "\n" not in doc, f"{section.__name__}.{f.name}"


def test_the_keys_arms_set_are_refused_in_a_cell_with_the_arms_that_set_them():
    """Derived from the arms' intent by our trainer's plug, as the hand-written table had them (sdpa's
    key stays a cell's)."""
    from bench.trainers.embedded.keys import DRIVER_KEYS

    derived = {k: v for k, v in DRIVER_KEYS.items() if v.startswith("use arms (")}
    assert derived == {
        "model.liger_rms_norm": "use arms (rmsnorm, swiglu, liger)",
        "model.liger_swiglu": "use arms (rmsnorm, swiglu, liger)",
        "model.compile_layers": "use arms (compile, liger_compile)",
        "model.liger_fused_linear_ce": "use arms (liger_flce)",
        "training.fused_adamw": "use arms (adamw_foreach, adamw_plain)",
        "training.foreach_adamw": "use arms (adamw_plain)",
        "model.init_perturb_ulp": "use arms (aa_eps)",
        "training.lr_scale": "use arms (lr_off)",
    }
