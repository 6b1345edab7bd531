"""Slurm as the suite's engine: ``bench submit`` against a real Slurm (tests/slurm_cluster.py: munged,
slurmctld and two slurmd on this machine) — one two-node CPU sweep, each run a job step over both
nodes, cancelled mid-run, resumed, requeued on the signal before the time limit, signalled again
past its requeue bound, and finished, its hung runs ended by scancel; another whose runs are lost
to a dead slurmd and to a time limit, never final, redone by resume, with setup lines and srun
options reaching its steps and ``bench status`` reading it (every job start costs the driver's
imports: few jobs) — and, without a cluster, the batch script, the refusals (limits that could
loop, lines that could inject), srun's and slurmstepd's lines read, a node's summary read from
stdout, a dying rank's reason, the flag on pairs split across allocations and the step control.
The fake trainer (tests/fake_trainer.py) keeps every run to a few seconds."""

from __future__ import annotations

import csv
import json
import os
import shlex
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
from bench.run.sweepdir import is_finished
from bench.slurm import alloc, lost, steps
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
    for var in (*SLURM_VARS, *RDZV_VARS, "FAKE_BLOCK_AFTER_RUNS", "FAKE_BLOCK_FILE", "FAKE_RECORD_ENV"):
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
def test_bench_submit_runs_a_two_node_sweep_through_a_cancel_and_a_bounded_requeue(
    cluster, tmp_path, monkeypatch
):
    """One sweep, four starts: its first job is cancelled in the second run (scancel: SIGTERM to
    the driver and to the step); `bench submit --resume --requeue --max-requeues 1` resumes it,
    and its driver, given the signal Slurm sends before the time limit in the third run (one run
    finished in that allocation), requeues its job; given it again in the requeued start, it is
    past its bound and does not requeue; a last `--resume` finishes the sweep, its hung runs
    ended by scancel of their steps. Each run is a job step over both nodes: one gloo world, both
    nodes polled, every run once in runs.csv, the pairs split across allocations flagged."""
    tc = train_configs(tmp_path)
    hung = {**cell(tc, 64, **{"fake.hang": True}), "timeout_s": 4}  # ended while its agents start, or hang
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

    gate.unlink()  # run 2 finishes in the next allocation, then come the hung cell's runs
    second = submit(cluster, monkeypatch, config, out, "--resume", "--requeue", "--max-requeues", "1")
    batch = (out / "slurm" / "batch.sh").read_text().splitlines()
    assert "#SBATCH --signal=B:USR1@300" in batch and "export BENCH_SLURM_MAX_REQUEUES=1" in batch
    hung1, hung2 = runs[order[2]], runs[order[3]]
    wait_for(lambda: step_running(cluster, second, hung1.name), 90, cluster, second, "job step of run 3")
    # what Slurm does --signal-s seconds before the time limit: SIGUSR1 to the batch shell, the driver
    assert cluster.call("scancel", "--batch", "--signal=USR1", second).returncode == 0
    cluster.wait_job(second, 30, until=("PENDING",))  # requeued by its driver: run 2 finished here
    launch = read_json(hung1 / "launch.json")
    assert "exit_code" not in launch and launch["slurm"]["ended_by"][0].startswith("scancel --signal=TERM")
    assert (
        launch["slurm"]["step_id"].startswith(f"{second}.") and launch["slurm"]["step_nodelist"] == "n[1-2]"
    )
    # the requeued start (Slurm holds it for AuthInfo's cred_expire + 1 s: the default 121 s, here
    # 6 s) redoes run 3; the signal again in run 4: one requeue was the bound
    wait_for(lambda: step_running(cluster, second, hung2.name), 120, cluster, second, "job step of run 4")
    assert cluster.call("scancel", "--batch", "--signal=USR1", second).returncode == 0
    assert cluster.wait_job(second, 30) == "FAILED", job_log(out, second)  # exit 138
    log = job_log(out, second)
    assert (
        f"Slurm sent SIGUSR1 (the time limit is near): the sweep stopped cleanly; requeuing job {second} "
        "(requeue 1 of at most 1)" in log
    )
    assert f"bench: job {second} (start 1) on n[1-2]" in log and "2 of 4 runs already finished" in log
    assert f"not requeued: job {second} was requeued 1 time already (--max-requeues 1)" in log
    third = submit(cluster, monkeypatch, config, out, "--resume")
    assert cluster.wait_job(third, 60) == "FAILED", job_log(out, third)  # two runs timed out: exit 1
    assert "2 of 4 runs did not finish ok" in job_log(out, third)

    for timed in order[
        2:
    ]:  # the hung cell's runs: each step ended by scancel, each wrapper's summary written
        doc, step = read_json(runs[timed] / "run.json"), read_json(runs[timed] / "launch.json")["slurm"]
        assert doc["status"] == "timeout" and doc["reason"].startswith("timed out after 4 s"), doc
        assert step["ended_by"] == [f"scancel --signal=TERM {step['step_id']}"]  # SIGTERM was enough
        nodes = read_json(runs[timed] / "vram.json")["nodes"]
        assert [n["status"] for n in nodes] == ["unavailable", "unavailable"], nodes
    rows = runs_csv(out)
    assert [r["run_id"] for r in rows] == order
    assert [r["status"] for r in rows] == ["ok", "ok", "timeout", "timeout"]
    allocations = [first, second, f"{second}+r1", third]
    assert [read_json(p / "cell.json")["slurm"]["allocation"] for p in runs.values()] == allocations
    for pair, (a, b) in ((rows[:2], allocations[:2]), (rows[2:], allocations[2:])):
        spans = f"its pair spans Slurm allocations {', '.join(sorted([a, b]))}"
        assert all(spans in (r["note"] or "") for r in pair), pair


def launched(rdir: Path) -> bool:
    return "exit_code" in (read_json(rdir / "launch.json") or {})


@pytest.mark.slow
def test_runs_lost_to_a_dead_node_and_to_the_time_limit_are_redone_by_resume(
    cluster, tmp_path, monkeypatch, capsys
):
    tc = train_configs(tmp_path)
    config = two_node_sweep(tmp_path, [cell(tc)], arms=["baseline", "aa"], repeats=2, timeout_s=60)
    order = [r.run_id for r in plan(load_config(config))]
    out, gate, reached = tmp_path / "out", tmp_path / "gate", tmp_path / "gate.reached"
    runs = [out / "runs" / run_id for run_id in order]

    # job 1: n2's slurmd dies while run 1 runs; run 1 ends ok (its slurmstepd lives on), run 2
    # cannot start on n2: lost, the sweep stops, nothing final is wrong
    gate.touch()
    first = submit(cluster, monkeypatch, config, out, FAKE_BLOCK_AFTER_RUNS="0", FAKE_BLOCK_FILE=str(gate))
    wait_for(reached.exists, 90, cluster, first, "run 1 under way")
    cluster.kill_slurmd("n2")
    gate.unlink()
    wait_for(lambda: launched(runs[1]), 60, cluster, first, "run 2's end")
    assert read_json(runs[0] / "run.json")["status"] == "ok"
    doc = read_json(runs[1] / "run.json")
    assert (doc["status"], doc["lost_cause"], doc["run_status"]) == ("lost", "node", "error"), doc
    assert doc["reason"].startswith("Slurm: node n2 failed (task launch: Communication connection failure")
    assert not is_finished(runs[1])
    cluster.start_slurmd("n2")  # the job ends once n2 answers again
    assert cluster.wait_job(first, 30) == "FAILED"  # exit 75: the sweep is unfinished
    log = job_log(out, first)
    assert f"the sweep stopped: {order[1]}: Slurm: node n2 failed" in log
    assert f"resume with: sbatch {out}/slurm/batch.sh" in log and not (out / "runs.csv").exists()

    # job 2, with setup lines and an srun option: the time limit passes while run 2 runs; run 2
    # ends ok, run 3 is refused its step: lost, the sweep stops
    setup = tmp_path / "setup.sh"
    setup.write_text("# the site's setup\nexport BENCH_SETUP_MARK='from setup'\n")
    gate.touch()
    reached.unlink()
    flags = [
        "--resume",
        "--time",
        "10",
        "--setup",
        str(setup),
        "--srun-option=--export=ALL,BENCH_SRUN_MARK=from-srun",
    ]
    second = submit(
        cluster, monkeypatch, config, out, *flags, FAKE_BLOCK_AFTER_RUNS="1",
        FAKE_RECORD_ENV="BENCH_SETUP_MARK,BENCH_SRUN_MARK",
    )  # fmt: skip
    wait_for(reached.exists, 90, cluster, second, "run 2 under way")
    assert main(["status", str(out), "--lines", "3"]) == 0
    status = capsys.readouterr().out
    assert f"job:     {second} RUNNING, for " in status and f"(earlier: {first})" in status, status
    assert "runs:    1 of 4 planned finished (1 ok)" in status
    assert f"in flight: {order[1]} (started " in status and "; running)" in status
    assert f"{runs[1]}/stdout.log (last 3 lines):" in status
    cluster.expire(second)
    gate.unlink()
    assert cluster.wait_job(second, 30) == "FAILED", job_log(out, second)
    doc = read_json(runs[2] / "run.json")
    assert (doc["status"], doc["lost_cause"]) == ("lost", "time"), doc
    assert doc["reason"].startswith("Slurm: the job's time limit has passed (EndTime ")
    assert "srun could not create the step: Job/step already completing or completed" in doc["reason"]
    assert read_json(runs[1] / "run.json")["env"] == {
        "BENCH_SETUP_MARK": "from setup",
        "BENCH_SRUN_MARK": "from-srun",
    }
    assert "--export=ALL,BENCH_SRUN_MARK=from-srun" in read_json(runs[1] / "launch.json")["command"]
    batch = (out / "slurm" / "batch.sh").read_text().splitlines()
    assert batch.index("export BENCH_SETUP_MARK='from setup'") < batch.index("set -u")
    assert "export BENCH_SRUN_OPTIONS=--export=ALL,BENCH_SRUN_MARK=from-srun" in batch
    job = read_jsonl(out / "slurm" / "jobs.jsonl")[-1]
    assert job["setup"] == ["# the site's setup", "export BENCH_SETUP_MARK='from setup'"]
    assert job["srun_options"] == ["--export=ALL,BENCH_SRUN_MARK=from-srun"]

    # job 3: the resume redoes the lost run and finishes: every run once, ok
    third = submit(cluster, monkeypatch, config, out, "--resume")
    assert cluster.wait_job(third, 60) == "COMPLETED", job_log(out, third)
    rows = runs_csv(out)
    assert [r["run_id"] for r in rows] == order and {r["status"] for r in rows} == {"ok"}, rows
    allocations = [read_json(r / "cell.json")["slurm"]["allocation"] for r in runs]
    assert allocations == [first, second, third, third]


# ---------------------------------------------------------------- without a cluster


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--time", "-5"], "--time -5: expected a Slurm time limit"),
        (["--time", "0"], "--time 0: expected a limit above zero"),
        (["--time", "1", "--requeue"], "--time 1 with --signal-s 300: the requeue signal would come 0 s into"),
        (["--time", "5", "--requeue", "--signal-s", "270"], "would come 30 s into each allocation"),
        (["--requeue", "--signal-s", "0"], "--signal-s: expected seconds from 1 to 65535, got 0"),
        (["--max-requeues", "2"], "--max-requeues bounds the requeues of --requeue: pass --requeue too"),
        (["--requeue", "--max-requeues", "-1"], "--max-requeues: expected 0 to 100, got -1"),
        (["--setup-line", 'echo "unclosed'], "setup lines: bash cannot parse them"),
        (["--setup-line", "#SBATCH --qos=high"], "an #SBATCH line after the first command is ignored"),
        (["--setup-line", "exec bash"], "exec would replace the batch shell"),
        (["--setup-line", "echo a\necho b"], "holds a control character (a newline?)"),
        (["--srun-option=--nodes=3"], "--srun-option --nodes=3: the driver sets --nodes on every step itself"),
        (["--srun-option=-J", ], "--srun-option -J: the driver sets -J on every step itself"),
        (["--srun-option", "mpi=pmix"], "--srun-option 'mpi=pmix': expected one srun option as one word"),
        (["--extra-sbatch=--qos=high\n#SBATCH --x"], "expected one sbatch option"),
    ],
)  # fmt: skip
def test_submit_refuses_limits_that_loop_and_lines_that_inject(tmp_path, capsys, flags, expected):
    config = two_node_sweep(tmp_path, [cell(train_configs(tmp_path))])
    assert main(["submit", str(config), "--out", str(tmp_path / "out"), "--dry-run", *flags]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1 and err.startswith("error: "), err
    assert not (tmp_path / "out").exists()


def test_submit_writes_setup_srun_options_requeue_bound_and_retry_into_the_batch_script(tmp_path, capsys):
    config = two_node_sweep(tmp_path, [cell(train_configs(tmp_path))])
    out = tmp_path / "out"
    setup = tmp_path / "setup.sh"
    setup.write_text(
        'module load cuda/12.4 2>/dev/null || true\nsource "$HOME/venv x/bin/activate" || true\n'
    )
    flags = ["--time", "30", "--requeue", "--max-requeues", "2", "--setup", str(setup), "--retry-failed",
             "--setup-line", "export NCCL_DEBUG=WARN", "--srun-option=--container-image=nvcr.io#nvidia/pytorch:25.01",
             "--srun-option=--container-mounts=/a b:/a"]  # fmt: skip
    assert main(["submit", str(config), "--out", str(out), "--dry-run", *flags]) == 0
    text = capsys.readouterr().out.splitlines()
    setup_at = text.index("module load cuda/12.4 2>/dev/null || true")
    assert text[setup_at + 1] == 'source "$HOME/venv x/bin/activate" || true'
    assert text[setup_at + 2] == "export NCCL_DEBUG=WARN" and setup_at < text.index("set -u")
    opts = ["--container-image=nvcr.io#nvidia/pytorch:25.01", "--container-mounts=/a b:/a"]
    exported = next(ln for ln in text if ln.startswith("export BENCH_SRUN_OPTIONS="))
    assert shlex.split(shlex.split(exported.removeprefix("export BENCH_SRUN_OPTIONS="))[0]) == opts
    for line in ("#SBATCH --time=30", "#SBATCH --requeue", "#SBATCH --signal=B:USR1@300", "export BENCH_SLURM_MAX_REQUEUES=2",
                 'retry=(); [ "${SLURM_RESTART_COUNT:-0}" = 0 ] && retry=(--retry-failed)',
                 f'exec {sys.executable} -m bench sweep {config} --out {out} --resume "${{retry[@]}}"'):  # fmt: skip
        assert line in text, line
    assert not out.exists()


def test_srun_and_slurmstepd_lines_tell_slurm_s_end_of_a_step_from_the_run_s():
    """Lines as Slurm 22.05 printed them here (no scontrol needed for these)."""
    stepd = "0: slurmstepd-n1: error: *** STEP 4.1 ON n1 CANCELLED AT 2026-12-01T19:50:52"
    timed = lost.classify([f"{stepd} DUE TO TIME LIMIT ***"], "4", 143, False)
    assert timed == lost.Lost(
        "time", "Slurm: the job reached its time limit; the step was cancelled (srun's exit code 143)"
    )
    node = lost.classify([f"{stepd} DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"], "4", 143, False)
    assert node.cause == "node"
    aborted = "srun: Job step aborted: Waiting up to 12 seconds for job step to finish."
    cancelled = lost.classify([aborted, f"{stepd} ***", "srun: error: n2: task 1: Killed"], "4", 137, False)
    assert cancelled.cause == "cancelled" and "scancel, not by the driver" in cancelled.reason
    # a rank that fails under --kill-on-bad-exit: srun ends the step itself (same CANCELLED line)
    bad_exit = ["srun: error: n2: task 1: Exited with exit code 1", "srun: launch/slurm: _step_signal: "
                "Terminating StepId=4.1", f"{stepd} ***"]  # fmt: skip
    assert lost.classify(bad_exit, "4", 1, False) is None
    assert lost.classify([f"{stepd} ***"], "4", 143, True) is None  # the driver ended it: its timeout
    assert (
        lost.classify(
            ["RuntimeError: fake crash", "srun: error: n2: task 1: Exited with exit code 1"], "4", 1, False
        )
        is None
    )


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
    assert ctl.summary({})["ended_by"] == ["scancel --signal=TERM 5.3", "scancel --signal=KILL 5.3"]
    assert (
        current({"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "2", "SLURM_JOB_NODELIST": "n[1-2]"}).key
        == "5+r2"
    )


def test_status_of_a_sweep_without_slurm_reads_its_files_and_its_lock(tmp_path, capsys):
    """`bench status` of a plain `bench sweep`: runs finished of planned, a lost run, the driver
    holding the lock (seen in /proc/locks, never taken), the run in flight and its last lines."""
    from bench.fileio import atomic_write_json
    from bench.run.sweepdir import take_lock

    out = tmp_path / "out"
    atomic_write_json(out / "sweep.json", {"name": "t", "order": ["a", "b", "c", "d"]})
    atomic_write_json(out / "runs" / "a" / "run.json", {"status": "ok"})
    atomic_write_json(out / "runs" / "b" / "run.json", {"status": "lost", "reason": "Slurm: node n2 failed"})
    inflight = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        launch = {
            "hostname": os.uname().nodename,
            "pgid": inflight.pid,
            "start_time": "2026-01-01T00:00:00+00:00",
        }
        atomic_write_json(out / "runs" / "c" / "launch.json", launch)
        (out / "runs" / "c" / "stdout.log").write_text("".join(f"step {i}/9 loss 1.0\n" for i in range(1, 8)))
        lock = take_lock(out)
        try:
            assert main(["status", str(out), "--lines", "2"]) == 0
        finally:
            os.close(lock)
    finally:
        inflight.kill()
        inflight.wait()
    text = capsys.readouterr().out.splitlines()
    assert text[:2] == [f"sweep t: {out}", "runs:    1 of 4 planned finished (1 ok)"]
    assert "lost:    b: Slurm: node n2 failed (not final: --resume redoes it)" in text
    assert f"driver:  running here (pid {os.getpid()} holds .sweep.lock)" in text
    assert any(
        ln.startswith("in flight: c (started 2026-01-01T00:00:00+00:00, ") and ln.endswith("; running)")
        for ln in text
    )
    assert text[-2:] == ["    step 6/9 loss 1.0", "    step 7/9 loss 1.0"]
    assert not any(ln.startswith("job:") for ln in text)  # no Slurm job: none named
    assert main(["status", str(tmp_path)]) == 2
    assert "no sweep.json; expected the output directory of a sweep" in capsys.readouterr().err
    pending = tmp_path / "pending"  # submitted, its driver not started: the job, and no sweep yet
    (pending / "slurm").mkdir(parents=True)
    (pending / "slurm" / "jobs.jsonl").write_text(json.dumps({"job_id": "12"}) + "\n")
    assert main(["status", str(pending)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith("job:     12") and text[1].startswith("sweep:   not started yet in ")


def test_status_refuses_a_damaged_order_and_reads_a_start_without_time_zone(tmp_path, capsys):
    """A sweep.json whose order is a string (it counted its characters as runs) is one line and
    exit 2; a launch.json start time without a zone is read as UTC and says so (it was a
    TypeError traceback)."""
    from bench.fileio import atomic_write_json

    out = tmp_path / "out"
    for order in ("abcd", ["a", "../../etc"]):  # a string; an id that is a path out of runs/
        atomic_write_json(out / "sweep.json", {"name": "t", "order": order})
        assert main(["status", str(out)]) == 2
        err = capsys.readouterr().err
        assert "'order' is not a list of run ids" in err and err.count("\n") == 1
    atomic_write_json(out / "sweep.json", {"name": "t", "order": ["a"]})
    atomic_write_json(
        out / "runs" / "a" / "launch.json", {"hostname": "elsewhere", "start_time": "2026-01-01T00:00:00"}
    )
    assert main(["status", str(out)]) == 0
    text = capsys.readouterr().out
    assert "in flight: a (started 2026-01-01T00:00:00 (no time zone: read as UTC), " in text
