"""Slurm as the suite's engine: ``bench submit`` against a real Slurm (tests/slurm_cluster.py: munged,
slurmctld and two slurmd on this machine) — one two-node CPU sweep, each run a job step over both
nodes, cancelled mid-run, resumed, requeued on the signal before the time limit and finished,
its hung runs ended by scancel (one test: every job start costs the driver's imports) — and,
without a cluster, the batch script, the refusals, a node's summary read from stdout, a dying
rank's reason, the flag on pairs split across allocations and the step control. The fake
trainer (tests/fake_trainer.py) keeps every run to a few seconds."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.config import Run, plan
from bench.fileio import read_json, read_jsonl
from bench.probe import nodevram
from bench.results.allocations import split_pair_notes
from bench.results.records import load_runs
from bench.slurm import alloc, steps
from bench.slurm.alloc import current
from bench.trainers import load_config, outcome
from tests.slurm_cluster import Cluster, free_ports, unavailable
from tests.test_driver import sweep_file, train_configs

REPO = Path(__file__).resolve().parents[1]
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_RESTART_COUNT", "SLURM_NODEID")
RDZV_VARS = ("BENCH_RDZV_ENDPOINT", "MASTER_ADDR", "MASTER_PORT", "BENCH_RDZV_PORT")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Not inside an allocation, no rendezvous from the machine running the tests, the repo as cwd
    (the batch script runs the sweep there: `-m tests.fake_trainer`)."""
    for var in (*SLURM_VARS, *RDZV_VARS, "FAKE_BLOCK_AFTER_RUNS", "FAKE_BLOCK_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(REPO)


@pytest.fixture(scope="module")
def cluster():
    why = unavailable()
    if why:
        pytest.skip(f"no local Slurm: {why}")
    c = Cluster().start()
    print(f"local Slurm up in {c.up_s:.2f} s ({c.root})")
    try:
        yield c
    finally:
        c.stop()


def two_node_sweep(tmp: Path, cells: list[dict], **top) -> Path:
    """A CPU sweep whose runs are Slurm job steps over 2 nodes (nodes: 2, no launcher)."""
    return sweep_file(tmp, cells, nodes=2, poll_interval_s=0.05, **top)


def cell(tc: dict, seq_len: int = 32, **sets) -> dict:
    return {"config": tc["online"], "batch_size": 1, "seq_len": seq_len, "set": sets}


def submit(cluster: Cluster, monkeypatch, config: Path, out: Path, *flags: str, **env: str) -> str:
    """``bench submit`` in this process against the local cluster; the job's id."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    port = str(free_ports(1)[0])
    assert main(["submit", str(config), "--out", str(out), "--rdzv-port", port, *flags]) == 0
    return read_jsonl(out / "slurm" / "jobs.jsonl")[-1]["job_id"]


def wait_for(ready, timeout_s: float, cluster: Cluster, job: str, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < end, f"no {what} after {timeout_s} s; job {job}: {cluster.job_state(job)}"
        time.sleep(0.05)


def step_running(cluster: Cluster, job: str, name: str) -> bool:
    """Whether the job has a step of that name (a run's: srun --job-name=<run_id>)."""
    out = cluster.call("squeue", "--steps", f"--jobs={job}", "--noheader", "--format=%j", timeout_s=5).stdout
    return name in out.split()


def job_log(out: Path, job: str) -> str:
    return (out / "slurm" / f"slurm-{job}.out").read_text()


def runs_csv(out: Path) -> list[dict]:
    with open(out / "runs.csv", newline="") as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------- against a real Slurm


@pytest.mark.slow
def test_bench_submit_runs_a_two_node_sweep_through_a_cancel_and_a_requeue(cluster, tmp_path, monkeypatch):
    """One sweep, three starts: its first job is cancelled in the second run (scancel: SIGTERM to
    the driver and to the step); `bench submit --resume --requeue` resumes it, and its driver,
    given the signal Slurm sends before the time limit in that same run, requeues its job; the
    requeued job finishes the sweep, its hung runs ended by scancel of their steps. Each run is a
    job step over both nodes: one gloo world, both nodes polled, every run once in runs.csv, the
    pair split across two allocations flagged."""
    tc = train_configs(tmp_path)
    hung = {**cell(tc, 64, **{"fake.hang": True}), "timeout_s": 3}  # ended while its agents start, or hang
    cells = [cell(tc, **{"fake.allreduce": True}), hung]
    config = two_node_sweep(tmp_path, cells, arms=["baseline", "aa"], timeout_s=60)
    order = [r.run_id for r in plan(load_config(config))]  # pair by pair: the allreduce cell's first
    assert order[0].endswith("_s32_n2_baseline_r1") and order[1].endswith("_s32_n2_aa_r1"), order
    out, gate = tmp_path / "out", tmp_path / "gate"
    runs = {run_id: out / "runs" / run_id for run_id in order}
    ok, stopped = runs[order[0]], runs[order[1]]
    gate.touch()  # the second run cannot finish: it blocks before its first step while this file exists

    first = submit(cluster, monkeypatch, config, out, FAKE_BLOCK_AFTER_RUNS="1", FAKE_BLOCK_FILE=str(gate))
    wait_for(lambda: step_running(cluster, first, stopped.name), 90, cluster, first, "job step of run 2")
    assert cluster.call("scancel", first).returncode == 0  # mid-run
    cluster.wait_job(first, 30, until=("CANCELLED",))
    assert "Slurm sent SIGTERM (the job was cancelled or preempted): the sweep stopped cleanly" in job_log(
        out, first
    )
    assert "exit_code" in read_json(ok / "launch.json") and "exit_code" not in read_json(
        stopped / "launch.json"
    )

    doc = read_json(ok / "run.json")  # the finished run: one gloo world over both nodes
    assert doc["status"] == "ok" and doc["world_size"] == 2 and doc["allreduce"] == 3.0, doc
    assert sorted(doc["group_ranks"]) == [0, 1]
    assert read_json(ok / "cell.json")["slurm"] == {
        "job_id": first, "restart_count": 0, "nodelist": "n[1-2]", "allocation": first,
    }  # fmt: skip
    step = read_json(ok / "launch.json")["slurm"]
    assert (
        step["step_id"].startswith(f"{first}.") and step["nodes"] == ["n1", "n2"] and "ended_by" not in step
    )
    assert f"--job-name={ok.name}" in read_json(ok / "launch.json")["command"]
    vram = read_json(ok / "vram.json")  # both nodes polled (no GPU here: unavailable, with the reason)
    assert [(n["node"], n["status"], n["agent_exit"]) for n in vram["nodes"]] == [
        (0, "unavailable", 0), (1, "unavailable", 0),
    ]  # fmt: skip
    printed = nodevram.node_lines(ok / "stdout.log")  # and each node's summary came through srun too
    assert sorted(printed) == ["0", "1"] and all("summary" in kinds for kinds in printed.values())
    assert {k["start"]["slurm"]["slurm_node"] for k in printed.values()} == {"n1", "n2"}

    second = submit(cluster, monkeypatch, config, out, "--resume", "--requeue")
    assert "#SBATCH --signal=B:USR1@300" in (out / "slurm" / "batch.sh").read_text()
    wait_for(lambda: step_running(cluster, second, stopped.name), 90, cluster, second, "job step of run 2")
    # what Slurm does --signal-s seconds before the time limit: SIGUSR1 to the batch shell, the driver
    assert cluster.call("scancel", "--batch", "--signal=USR1", second).returncode == 0
    cluster.wait_job(second, 30, until=("PENDING",))  # requeued by its driver
    launch = read_json(stopped / "launch.json")
    assert "exit_code" not in launch and launch["slurm"]["ended_by"][0].startswith("scancel --signal=TERM")
    assert (
        launch["slurm"]["step_id"].startswith(f"{second}.") and launch["slurm"]["step_nodelist"] == "n[1-2]"
    )
    gate.unlink()
    # Slurm holds a requeued job for AuthInfo's cred_expire + 1 s (the default 120 s; here 5 s)
    assert cluster.wait_job(second, 120) == "FAILED", job_log(out, second)  # two runs timed out: exit 1
    log = job_log(out, second)
    assert "Slurm sent SIGUSR1 (the time limit is near): the sweep stopped cleanly; requeuing job" in log
    assert f"bench: job {second} (start 1) on n[1-2]" in log and "1 of 4 runs already finished" in log
    assert "2 of 4 runs did not finish ok" in log

    for timed in order[
        2:
    ]:  # the hung cell's runs: each step ended by scancel, each wrapper's summary written
        doc, step = read_json(runs[timed] / "run.json"), read_json(runs[timed] / "launch.json")["slurm"]
        assert doc["status"] == "timeout" and doc["reason"].startswith("timed out after 3 s"), doc
        assert step["ended_by"] == [f"scancel --signal=TERM {step['step_id']}"]  # SIGTERM was enough
        nodes = read_json(runs[timed] / "vram.json")["nodes"]
        assert [n["status"] for n in nodes] == ["unavailable", "unavailable"], nodes
    rows = runs_csv(out)
    assert [r["run_id"] for r in rows] == order and [r["status"] for r in rows] == [
        "ok",
        "ok",
        "timeout",
        "timeout",
    ]
    assert [read_json(p / "cell.json")["slurm"]["allocation"] for p in runs.values()] == [first] + [
        f"{second}+r1"
    ] * 3
    spans = f"its pair spans Slurm allocations {', '.join(sorted([first, f'{second}+r1']))}"
    assert [spans in (r["note"] or "") for r in rows] == [True, True, False, False], rows


# ---------------------------------------------------------------- without a cluster


def test_submit_dry_run_prints_the_batch_script_and_writes_nothing(tmp_path, capsys):
    config = two_node_sweep(tmp_path, [cell(train_configs(tmp_path))])
    out = tmp_path / "out"
    flags = ["--partition=gpu", "--time=02:00:00", "--account=lab", "--extra-sbatch=--qos=high", "--requeue"]
    assert main(["submit", str(config), "--out", str(out), "--dry-run", "--signal-s", "120", *flags]) == 0
    text = capsys.readouterr().out
    for line in (
        "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive", "#SBATCH --partition=gpu",
        "#SBATCH --account=lab", "#SBATCH --time=02:00:00", f"#SBATCH --output={out}/slurm/slurm-%j.out",
        "#SBATCH --requeue", "#SBATCH --signal=B:USR1@120", "#SBATCH --qos=high",
        'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_ON_NODE:-1}"', "export BENCH_SLURM_REQUEUE=1",
        f"exec {sys.executable} -m bench sweep {config} --out {out} --resume",
    ):  # fmt: skip
        assert line in text.splitlines(), line
    assert "--gpus-per-node" not in text  # a CPU sweep asks for no GPU
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--nodes", "4"], "--nodes 4: the config's runs span nodes: 2"),
        (["--extra-sbatch", "qos=high"], "--extra-sbatch 'qos=high': expected one sbatch option"),
        (["--partition", "a b"], "an #SBATCH line cannot hold '--partition=a b'"),
        (["--rdzv-port", "70000"], "--rdzv-port: expected a port number"),
    ],
)
def test_submit_refuses_bad_options_in_one_line(tmp_path, capsys, flags, expected):
    config = two_node_sweep(tmp_path, [cell(train_configs(tmp_path))])
    assert main(["submit", str(config), "--out", str(tmp_path / "out"), *flags]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_submit_needs_resume_for_an_existing_sweep_and_sbatch_on_path(tmp_path, monkeypatch, capsys):
    config = two_node_sweep(tmp_path, [cell(train_configs(tmp_path))])
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "sweep.json").write_text(json.dumps({"config": load_config(config).resolved}))
    assert main(["submit", str(config), "--out", str(out)]) == 2
    assert "already holds a sweep; pass --resume" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    assert main(["submit", str(config), "--out", str(out), "--resume"]) == 2
    assert "sbatch is not on this machine's PATH" in capsys.readouterr().err
    assert not (out / "slurm").exists()


def test_slurm_steps_outside_an_allocation_are_refused_before_anything_is_written(tmp_path, capsys):
    config = two_node_sweep(tmp_path, [cell(train_configs(tmp_path))])
    cfg = load_config(config)
    assert cfg.launcher == ("srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--label")
    assert cfg.launcher_from == "slurm" and cfg.rdzv_endpoint is None
    assert main(["sweep", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "every run is a Slurm job step" in err and "bench submit" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
    shown = alloc.bind(cfg, dry_run=True)  # --dry-run shows where the rendezvous will be
    assert (shown.rdzv_endpoint, shown.rdzv_from) == ("FIRST_NODE:29400", "the allocation's first node")


def test_a_node_summary_printed_on_stdout_stands_in_for_its_missing_file(tmp_path, monkeypatch, capsys):
    """No shared filesystem: node 1's file never reached the driver's run directory, but its
    summary came through srun as labelled lines, split in parts and mixed with other output."""
    (tmp_path / "vram_node_0.json").write_text(
        json.dumps({"node": 0, "status": "ok", "devices": [{"index": 0}]})
    )
    card = {"index": 0, "name": "H200 " + "x" * 900, "peak_used_gib": 50.0}  # longer than one line
    nodevram.say(
        "1", "summary", {"node": 1, "status": "ok", "backend": "nvml", "devices": [card], "agent_exit": 0}
    )
    parts = capsys.readouterr().out.splitlines()
    assert len(parts) == 2 and all(len(p) < 1000 for p in parts)  # srun --label cuts lines at 1024 bytes
    log = [f"1: {parts[0]}", "0: step 4/4 loss 1.0", f"1: {parts[1]}", "srun: error: n2: task 1: Exited"]
    (tmp_path / "stdout.log").write_text("\n".join(log) + "\n")
    merged = nodevram.gather(tmp_path, 2, tmp_path / "stdout.log")
    assert merged["status"] == "ok" and merged["reason"] is None
    assert merged["nodes"][1] == {**merged["nodes"][1], "node": 1, "via": "stdout", "agent_exit": 0}
    assert [d["node"] for d in merged["devices"]] == [0, 1] and merged["devices"][1]["peak_used_gib"] == 50.0


def test_a_dying_rank_is_named_from_the_run_files_not_from_srun_s_status(tmp_path, monkeypatch):
    """srun's status is the highest of its tasks' (143: the ranks that --kill-on-bad-exit ended);
    the reason names the rank's exception and the node whose agent failed."""
    config = load_config(two_node_sweep(tmp_path, [cell(train_configs(tmp_path))]))
    run = Run("tiny_online_bs1_s32_n2_baseline_r1", config.cells[0], "baseline", 1, 0)
    lines = [
        "1: [rank1]: RuntimeError: fake crash at step 2 on rank 1",
        "1: torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "1: Root Cause (first observed failure):",
        "1: [0]:",
        "1:   rank      : 1 (local_rank: 0)",
        "srun: error: n2: task 1: Exited with exit code 1",
        "0: slurmstepd-n1: error: *** STEP 7.1 ON n1 CANCELLED AT 2026-01-01T00:00:00 ***",
        '0: bench.nodevram[0] summary 1/1 {"node":0,"status":"unavailable","agent_exit":-15}',
    ]
    (tmp_path / "stdout.log").write_text("\n".join(lines) + "\n")
    nodes = [{"node": 0, "agent_exit": -15}, {"node": 1, "agent_exit": 1}]
    (tmp_path / "vram.json").write_text(json.dumps({"nodes": nodes}))
    got = outcome.failure(tmp_path, run, 143, False)
    assert got == {
        "status": "error",
        "reason": "rank 1: RuntimeError: fake crash at step 2 on rank 1 (node 1's agent: exit code 1; the "
        "launcher's exit code 143)",
    }


def test_pairs_split_across_allocations_are_flagged(tmp_path):
    for run_id, arm, where in (("c_baseline_r1", "baseline", "7"), ("c_aa_r1", "aa", "9"), ("c_baseline_r2", "baseline", "9"), ("c_aa_r2", "aa", "9")):  # fmt: skip
        rdir = tmp_path / "runs" / run_id
        rdir.mkdir(parents=True)
        cell_doc = {
            "run_id": run_id,
            "cell_id": "c",
            "arm": arm,
            "repeat": int(run_id[-1]),
            "warmup_steps": 1,
            "slurm": {"allocation": where},
        }
        (rdir / "cell.json").write_text(json.dumps(cell_doc))
    notes = split_pair_notes(load_runs(tmp_path))
    assert sorted(notes) == ["c_aa_r1", "c_baseline_r1"]  # round 2 ran in one allocation
    assert notes["c_aa_r1"].startswith("its pair spans Slurm allocations 7, 9 (this run: 9)")


def test_the_step_control_names_the_step_and_ends_it_with_scancel_not_srun(tmp_path, monkeypatch):
    """With stand-ins for squeue and scancel on PATH: the step is found by its run's name among the
    job's steps, and a stop sends TERM to the step, then KILL when it does not end in the grace."""
    calls, pid = tmp_path / "calls", tmp_path / "srun.pid"
    squeue = "printf '5.batch|batch|n1\\n5.0|other|n1\\n5.3|the_run|n[1-2]\\n'"
    scancel = f'echo "$@" >> {calls}; kill -s "${{1#--signal=}}" "$(cat {pid})"'  # signals the "step": srun
    for name, body in (("squeue", squeue), ("scancel", scancel)):
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(steps.launcher, "KILL_GRACE_S", 0.3)
    ctl = steps.StepControl("5", "the_run")
    assert ctl.find() == "5.3" and ctl.nodelist == "n[1-2]"
    ignore_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
    # an srun whose step does not end on SIGTERM
    srun = subprocess.Popen(
        [sys.executable, "-c", ignore_term], start_new_session=True, stdout=subprocess.PIPE
    )
    assert srun.stdout.readline()
    pid.write_text(str(srun.pid))
    t0 = time.monotonic()
    ctl.stop(srun.pid, srun)
    assert srun.returncode == -signal.SIGKILL and time.monotonic() - t0 < 5
    assert calls.read_text().split("\n")[:2] == ["--signal=TERM 5.3", "--signal=KILL 5.3"]
    assert ctl.record({})["ended_by"] == ["scancel --signal=TERM 5.3", "scancel --signal=KILL 5.3"]
    assert (
        current({"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "2", "SLURM_JOB_NODELIST": "n[1-2]"}).key
        == "5+r2"
    )
