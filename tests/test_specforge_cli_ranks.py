"""The SpecForge CLI plug across two ranks of one node, on the CPU against the real PyPI
specforge 0.2.0 (tests/upstream_env.py). SpecForge 0.2.0 starts the ranks itself:
``deployment.trainer.nproc_per_node: 2`` makes its launch plan (specforge/launch_plan.py,
``_trainer_command``) run ``python -m torch.distributed.run --standalone --nproc_per_node 2
--module specforge.cli ...``; each rank calls ``dist.init_process_group`` with gloo on the CPU
(specforge/distributed.py, ``_DISTRIBUTED_BACKENDS``), DDP with ``training.fsdp_sharding=NO_SHARD``.

What the real runs showed, and these tests keep:

- every rank prints its own unlabelled ``step N: {...}`` line to torchrun's one stdout, and
  ``print`` writes the text and its newline apart, so two ranks' lines arrive joined
  (``step 1: {...}step 1: {...}`` then an empty line). Before parse_step_lines split them, a
  2-rank run read no step line at all ("no step line recognised ...");
- a step is timed by its slowest rank; SpecForge's ``perf/global_samples_per_second`` already
  counts every rank's samples;
- a rank killed mid-run: torchrun SIGTERMs the others and exits 1 with a ChildFailedError whose
  "Root Cause" block names the rank; the reason says which rank, how, and after which step.

The logs in tests/data/ are SpecForge 0.2.0's real stdout on this CPU (2 ranks, 4 steps; and 2
ranks, 40 steps, rank 1 SIGKILLed after step 3). Note: torchrun starts each rank in a session of
its own (torch/distributed/elastic/multiprocessing/subprocess_handler, ``start_new_session``), so
a group kill reaches torchrun only; torchrun passes SIGTERM on to the ranks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.config import plan
from bench.trainers import load_config
from bench.trainers.specforge_cli.log import StepCollector, parse_step_line, parse_step_lines
from bench.trainers.specforge_cli.plug import SpecForgeCliPlug
from tests.helpers import CONFIGS, REPO
from tests.upstream_env import upstream_python

DATA = REPO / "tests" / "data"
TWO = DATA / "specforge-0.2.0-cpu-2rank-stdout.log"
KILLED = DATA / "specforge-0.2.0-cpu-2rank-killed-stdout.log"
TINY = str(CONFIGS / "train" / "tiny-offline.yaml")


def records(path: Path) -> list[tuple[int, dict]]:
    return [rec for ln in path.read_text().splitlines() for rec in parse_step_lines(ln)]


def test_both_ranks_lines_are_read_even_when_they_arrive_joined():
    lines = TWO.read_text().splitlines()
    assert any(ln.count("step 1: {") == 2 for ln in lines)  # the real log has them joined
    assert [s for s, _ in records(TWO)] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert len([p for p in map(parse_step_line, lines) if p]) < 8  # one-record-per-line missed some
    assert all(v["perf/optimizer_step_time_s"] > 0 for _, v in records(TWO))


def test_each_step_is_one_row_timed_by_its_slowest_rank():
    c = StepCollector(world=2, seq_len=128)
    rows = [r for i, (s, v) in enumerate(records(TWO)) for r in c.add(s, v, float(i), 1e9 + i)]
    rows += c.flush(9.0, 1e9 + 9)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and {r["ranks_logged"] for r in rows} == {2}
    by_step: dict[int, list[float]] = {}
    for s, v in records(TWO):
        by_step.setdefault(s, []).append(v["perf/optimizer_step_time_s"])
    for r in rows:
        assert r["step_time_s"] == max(by_step[r["step"]]) and r["samples"] == 8  # 2 ranks x batch 2 x acc 2


def sweep_doc(tmp_path: Path, **top) -> Path:
    doc = {"name": "ranks", "hardware": "cpu", "out": str(tmp_path / "out"), "trainer": "specforge-cli"}
    doc |= {"trainer_python": sys.executable, "arms": ["baseline"], "repeats": 1, "gpus_per_run": [2]}
    doc |= {"steps": 4, "warmup_steps": 1, "timeout_s": 240, "fork_server": False, **top}
    doc["cells"] = [{"config": TINY, "batch_size": 2, "seq_len": 128}]
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_rank_that_dies_mid_run_is_named_with_the_step(tmp_path):
    cfg = load_config(sweep_doc(tmp_path, steps=40))
    run = plan(cfg)[0]
    rdir = tmp_path / "run"
    rdir.mkdir()
    (rdir / "stdout.log").write_text(KILLED.read_text())
    c = StepCollector(2, 128)
    rows = [r for i, (s, v) in enumerate(records(KILLED)) for r in c.add(s, v, 5.0 + i, 1e9 + i)]
    rows += c.flush(9.0, 1e9 + 9)
    (rdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    exit_doc = {"exit_code": 1, "last_step": rows[-1]["step"], "stop": {"stopped": False}}
    (rdir / "specforge.json").write_text(json.dumps(exit_doc))
    doc = SpecForgeCliPlug(python="/py").reconcile(rdir, run, 1, False, "2026-12-01T00:00:00+00:00")
    assert doc.status == "error"
    assert doc.reason == (
        "rank 1 of 2 was killed by SIGKILL after step 3 of 40; torchrun stopped the other ranks (exit code 1)"
    )


@pytest.mark.slow
def test_two_ranks_of_the_real_specforge_run_end_to_end_on_the_cpu(tmp_path):
    path = sweep_doc(tmp_path, trainer_python=str(upstream_python()))
    r = subprocess.run(
        [sys.executable, "-m", "bench", "sweep", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (rdir,) = (tmp_path / "out" / "runs").iterdir()
    run = json.loads((rdir / "run.json").read_text())
    assert run["status"] == "ok" and run["world_size"] == 2 and run["exit"]["stop"]["stopped"]
    cmd = json.loads((rdir / "cell.json").read_text())["command"]
    assert "deployment.trainer.nproc_per_node=2" in cmd and "training.fsdp_sharding=NO_SHARD" in cmd
    rows = [json.loads(ln) for ln in (rdir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == [1, 2, 3, 4] and {x["ranks_logged"] for x in rows} == {2}
    times: dict[int, list[float]] = {}
    for ln in (rdir / "stdout.log").read_text().splitlines():
        for s, v in parse_step_lines(ln):
            times.setdefault(s, []).append(v["perf/optimizer_step_time_s"])
    assert {s: len(t) for s, t in times.items()} == {1: 2, 2: 2, 3: 2, 4: 2}
    assert all(x["step_time_s"] == max(times[x["step"]]) for x in rows)  # the slowest rank's
