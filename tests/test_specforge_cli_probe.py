"""The SpecForge CLI's diagnostics and start levers on the CPU, against the real PyPI specforge
0.2.0 (tests/upstream_env.py): the probe inside a SpecForge process (fresh, and forked from the
warm server that preloads what `specforge train` imports) without changing what it computes; the
lines before step 1 with their times and the report's start breakdown; Python's bytecode shared
by a sweep's runs where the environment writes none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.results.startlines import phases
from bench.run import execute
from tests.helpers import CONFIGS, REPO, built_once
from tests.upstream_env import upstream_python

TINY = CONFIGS / "train" / "tiny-offline.yaml"
WARMSERVER = REPO / "bench" / "trainers" / "specforge_cli" / "warmserver.py"


def inputs(root: Path) -> Path:
    cache = root / "inputs"
    prep = [sys.executable, "-m", "bench.trainers.specforge_cli.inputs", str(TINY), "--seq-len", "128"]
    subprocess.run([*prep, "--output-dir", str(cache)], cwd=REPO, check=True, capture_output=True)
    return cache / "run.yaml"


def wrapped(root: Path, rdir: Path, steps: int, env: dict, warm: Path | None = None, *extra: str) -> int:
    rdir.mkdir(parents=True)
    wrap = [sys.executable, "-m", "bench.trainers.specforge_cli.wrapper", "--run-dir", str(rdir)]
    wrap += ["--seq-len", "128", "--stop-after", str(steps)] + (["--warm", str(warm)] if warm else [])
    wrap += [*extra, "--"]
    spec = [str(upstream_python()), "-m", "specforge.cli", "train", "-c", str(root / "inputs" / "run.yaml")]
    spec += [
        f"training.max_steps={steps}",
        "training.fsdp_sharding=NO_SHARD",
        "training.attention_backend=sdpa",
    ]
    spec += [f"output_dir={rdir / 'out'}"]
    with (rdir / "stdout.log").open("w") as log:
        return subprocess.run(
            [*wrap, *spec],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            timeout=300,
        ).returncode


def build_runs(root: Path) -> dict:
    inputs(root)
    probe = {"BENCH_SPECFORGE_PROBE": "2:2"}
    codes = [
        wrapped(root, root / "plain", 5, {}),
        wrapped(root, root / "forked", 5, probe, root / "warm.sock"),
        wrapped(root, root / "probed", 5, probe, None, "--gc-freeze"),  # fresh, both hooks in one process
        wrapped(root, root / "nudged", 5, {}, None, "--perturb-ulp", "param"),
        wrapped(root, root / "nudged16", 5, {}, root / "warm.sock", "--perturb-ulp", "bfloat16"),  # forked
    ]
    return {"codes": codes}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root, done = built_once(tmp_path_factory, "specforge-probe", build_runs)
    return root, done["codes"]


def losses(rdir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (rdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_probe_records_a_fresh_run_without_changing_what_it_computes(runs):
    root, codes = runs
    assert codes == [0, 0, 0, 0, 0], (root / "probed" / "stdout.log").read_text()[-2000:]
    assert losses(root / "probed") == losses(root / "plain")  # the same numbers, step by step
    doc = json.loads((root / "probed" / "probe.json").read_text())
    assert len(doc["step_t"]) >= 4 and doc["step_t"] == sorted(doc["step_t"])
    assert doc["profile"]["wall_s"] > 0 and doc["profile"]["kernels"] == 0  # the CPU: no GPU kernel
    main = [t for t in doc["host"]["threads"] if t["tid"] == doc["pid"]]
    assert main and main[0]["cpu_share"] is not None and doc["host"]["affinity"]
    assert doc["compile"]["inductor"]["fx_graph_cache"] in (True, False)
    assert all({"step", "s"} <= set(g) for g in doc["gc"])
    how = json.loads((root / "probed" / "specforge.json").read_text())
    assert how["probe"] == {"first": 2, "count": 2, "output": "probe.json"}
    assert not (root / "plain" / "probe.json").exists()


@pytest.mark.slow
def test_a_run_forked_from_the_warm_server_is_probed_too_and_its_imports_were_preloaded(runs):
    root, _ = runs
    how = json.loads((root / "forked" / "specforge.json").read_text())
    assert how["start"] == "warm-server" and how["probe"]["first"] == 2
    assert json.loads((root / "forked" / "probe.json").read_text())["step_t"]
    assert losses(root / "forked") == losses(root / "plain")
    # its output in the directory of the run that started it (a log beside the socket, in the
    # temporary directory, outlived every sweep)
    assert how["started_here"] and how["log"] == "warm-server.log"
    server_log = (root / "forked" / "warm-server.log").read_text()
    assert "warm-server ready" in server_log and "not preloaded" not in server_log
    assert not Path(str(root / "warm.sock") + ".log").exists()
    assert not json.loads((root / "nudged16" / "specforge.json").read_text())["started_here"]
    assert not (root / "nudged16" / "warm-server.log").exists()


@pytest.mark.slow
def test_gc_freeze_lands_after_the_first_step_and_changes_no_number(runs):
    root, _ = runs
    frozen = json.loads((root / "probed" / "gc_freeze.json").read_text())
    assert frozen["after_step"] == 1 and frozen["frozen_objects"] > 10_000  # torch's heap and more
    assert (
        json.loads((root / "probed" / "specforge.json").read_text())["gc_freeze"]["output"]
        == "gc_freeze.json"
    )
    assert losses(root / "probed") == losses(root / "plain")
    assert json.loads((root / "probed" / "probe.json").read_text())["step_t"]  # both hooks in one process
    assert not (root / "plain" / "gc_freeze.json").exists()


def test_the_sweep_key_puts_gc_freeze_on_the_wrapper_command(tmp_path):
    from bench.config import plan
    from bench.trainers import load_config
    from bench.trainers.specforge_cli.plug import SpecForgeCliPlug

    doc = {"name": "k", "hardware": "cpu", "trainer": "specforge-cli", "arms": ["baseline", "aa"]}
    doc |= {"steps": 3, "warmup_steps": 1, "repeats": 1, "out": str(tmp_path / "o"), "trainer_python": "/py"}
    doc["cells"] = [{"config": str(TINY), "batch_size": 2, "seq_len": 128}]
    for value in (False, True):
        (tmp_path / "s.yaml").write_text(yaml.safe_dump({**doc, "trainer_gc_freeze": value}))
        cfg = load_config(tmp_path / "s.yaml")
        argv = SpecForgeCliPlug(python="/py").train_command(cfg, plan(cfg)[0], tmp_path / "r", None)
        assert ("--gc-freeze" in argv[: argv.index("--")]) is value


@pytest.mark.slow
def test_the_aa_eps_arm_moves_every_weight_by_one_ulp_inside_specforge(runs):
    """The sensitivity floor's arm on the real CLI: SpecForge has no key for it, so instrument.py
    nudges the weights the optimizer holds before step 1's update; the run then trains a hair
    apart from the baseline: step 1 equal, later steps different but close."""
    root, _ = runs
    moved = json.loads((root / "nudged" / "perturb.json").read_text())
    assert moved["before_step"] == 1 and moved["tensors"] > 0 and moved["elements"] > 1000
    assert moved["direction"] == "random" and 0.45 < moved["up"] / moved["elements"] < 0.55  # no bias
    how = json.loads((root / "nudged" / "specforge.json").read_text())
    assert how["perturb_ulp"] == {"before_step": 1, "ulp_of": "param", "output": "perturb.json"}
    plain, nudged = losses(root / "plain"), losses(root / "nudged")
    assert nudged[0] == plain[0] and nudged != plain
    assert max(abs(a - b) for a, b in zip(plain, nudged)) < 0.05
    # one bfloat16 ulp (what a GPU run's forward computes in) moves the float32 weights further
    wide = losses(root / "nudged16")
    assert json.loads((root / "nudged16" / "perturb.json").read_text())["ulp_of"] == "bfloat16"
    assert json.loads((root / "nudged16" / "specforge.json").read_text())["start"] == "warm-server"
    apart = lambda run: max(abs(a - b) for a, b in zip(plain, run))  # noqa: E731
    assert wide[0] == plain[0] and apart(wide) > apart(nudged)


@pytest.mark.slow
def test_the_lines_before_step_1_are_kept_with_their_times(runs):
    root, _ = runs
    lines = json.loads((root / "plain" / "specforge.json").read_text())["startup_lines"]
    times = [t for t, _ in lines]
    assert times == sorted(times) and lines[-1][1].startswith("step 1")
    split = phases(lines)  # SpecForge 0.2.0 prints "Loading [...] from model.safetensors"
    assert split is not None and all(x >= 0 for x in split)
    assert sum(split) == pytest.approx(times[-1])


def test_start_phases_need_both_lines_in_order():
    ok = [[1.0, "warning"], [5.0, "Loading ['emb'] from /x/model.safetensors..."], [7.5, "step 1: {}"]]
    assert phases(ok) == (1.0, 4.0, 2.5)
    assert phases(ok[:1] + ok[2:]) is None  # no weights line
    assert phases([[1.0, "a"], [2.0, "step 1: {}"], [3.0, "Loading ['e'] from m.safetensors"]]) is None
    assert phases("not a list") is None and phases([["x", "y"]]) is None


def test_an_optional_warm_preload_that_cannot_be_imported_is_left_to_the_run(tmp_path):
    sock = tmp_path / "s.sock"
    server = subprocess.Popen(
        [sys.executable, str(WARMSERVER), str(sock), str(os.getpid()), "json", "no_such_module_here?"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first, second = server.stdout.readline(), server.stdout.readline()
        assert "no_such_module_here not preloaded" in first and second.startswith("warm-server ready")
    finally:
        server.kill()
        server.wait()
    bad = subprocess.run(
        [sys.executable, str(WARMSERVER), str(tmp_path / "t.sock"), str(os.getpid()), "no_such_module_here"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "ModuleNotFoundError" in bad.stderr  # a required one still fails


def test_bytecode_is_shared_only_where_the_environment_writes_none(tmp_path):
    cdir = tmp_path / "compile"
    env = execute.compile_env(cdir, {"PYTHONDONTWRITEBYTECODE": "1"})
    assert env["PYTHONPYCACHEPREFIX"] == str(cdir / "pycache") and env["PYTHONDONTWRITEBYTECODE"] == ""
    assert "PYTHONPYCACHEPREFIX" not in execute.compile_env(cdir, {})  # bytecode is written as usual
    own = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/theirs"}
    assert "PYTHONPYCACHEPREFIX" not in execute.compile_env(cdir, own)  # the user's own prefix stays
    assert execute.compile_env(None, {"PYTHONDONTWRITEBYTECODE": "1"}) == {}  # compile_cache: false


def build_sweep(root: Path) -> dict:
    doc = {
        "name": "sf-pyc",
        "hardware": "any",
        "trainer": "specforge-cli",
        "trainer_python": str(upstream_python()),
    }
    doc |= {"arms": ["baseline", "aa"], "repeats": 1, "steps": 3, "warmup_steps": 1, "out": str(root / "out")}
    doc["cells"] = [{"config": str(TINY), "batch_size": [2], "seq_len": [128]}]
    (root / "sweep.yaml").write_text(yaml.safe_dump(doc))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "bench", "sweep", str(root / "sweep.yaml")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {}


@pytest.mark.slow
def test_a_sweep_shares_python_bytecode_where_the_environment_writes_none(tmp_path_factory):
    root, _ = built_once(tmp_path_factory, "specforge-pycache", build_sweep)
    out = root / "out"
    cells = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/cell.json"))]
    by_order = sorted(cells, key=lambda c: c["order_index"])
    records = [c["compile_cache"]["bytecode"] for c in by_order]
    assert [r["warm"] for r in records] == [False, True]  # the first run wrote it, the second read it
    pyc = Path(records[0]["dir"])
    assert pyc.parent == Path(by_order[0]["compile_cache"]["dir"]) and any(pyc.rglob("*.pyc"))
    report = (out / "report.md").read_text()
    assert "## Where a SpecForge run's start goes (medians)" in report


def test_the_gc_heap_probe_imports_what_the_warm_server_preloads():
    """scripts/gc_heap_probe.py runs in the user's interpreter (nothing of this checkout importable),
    so it spells the preload list out: the same modules as the warm server's."""
    import importlib.util

    from bench.trainers.specforge_cli.wrapper import WARM_PRELOAD

    spec = importlib.util.spec_from_file_location("gc_heap_probe", REPO / "scripts" / "gc_heap_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    assert list(probe.PRELOAD) == [m.rstrip("?") for m in WARM_PRELOAD]
