"""Multi-node runs on one CPU machine: two torchrun agents meeting at a c10d rendezvous on
127.0.0.1 (started by tests/local_nodes.py, a stand-in for srun), each node's VRAM file and the
driver's gathering of them, and the config keys that set a multi-node sweep up."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.config import SweepError, diff_resolved, plan
from bench.fileio import read_json, read_jsonl
from bench.probe import nodevram
from bench.results import plots
from bench.results.columns import VRAM_PER_CARD_COLUMNS
from bench.results.records import load_runs, run_row
from bench.results.tables import vram_per_card_table
from bench.trainers import load_config, plug_for
from tests.test_driver import (
    fakes,  # noqa: F401  (a fixture, used by name)
    sweep_file,
    train_configs,
)
from tests.test_vram import GIB, Script, fake_pynvml, install

REPO = Path(__file__).resolve().parents[1]
LOCAL_NODES = [sys.executable, "-m", "tests.local_nodes", "2"]
RDZV_VARS = ("BENCH_RDZV_ENDPOINT", "MASTER_ADDR", "MASTER_PORT")
NODE_VARS = ("BENCH_NODE_RANK", "SLURM_NODEID", "NODE_RANK")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No rendezvous or node index leaking in from the machine running the tests."""
    for var in (*RDZV_VARS, *NODE_VARS):
        monkeypatch.delenv(var, raising=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cell(tc: dict, **sets) -> dict:
    return {"config": tc["online"], "batch_size": 1, "seq_len": 32, "set": sets}


# ---------------------------------------------------------------- two agents, one machine


@pytest.mark.usefixtures("fakes")
@pytest.mark.slow
def test_two_agents_meet_at_the_rendezvous_and_the_run_is_recorded_ok(tmp_path, monkeypatch):
    endpoint = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("BENCH_RDZV_ENDPOINT", endpoint)  # the config names none
    tc = train_configs(tmp_path)
    cfg = sweep_file(
        tmp_path, [cell(tc, **{"fake.allreduce": True})], nodes=2, launcher=LOCAL_NODES, timeout_s=90
    )
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out)]) == 0
    rdir = out / "runs" / "tiny_online_bs1_s32_n2_baseline_r1"
    doc = read_json(rdir / "run.json")
    assert doc["status"] == "ok" and doc["world_size"] == 2, doc
    assert doc["allreduce"] == 3.0  # ranks 0 and 1 summed over gloo: one world across both agents
    assert sorted(doc["group_ranks"]) == [0, 1]  # one rank on each agent ("node")
    assert read_json(rdir / "launch.json")["exit_code"] == 0  # both agents (and their pollers) exited 0
    assert endpoint in read_json(rdir / "cell.json")["command"]
    vram = read_json(rdir / "vram.json")  # gathered from both nodes' files
    assert [n["node"] for n in vram["nodes"]] == [0, 1]  # from SLURM_NODEID, as srun sets it
    assert all(n["status"] in ("ok", "unavailable") for n in vram["nodes"])  # finished, not "running"


# ---------------------------------------------------------------- per-node files and their gathering


def poll_node(monkeypatch, rdir: Path, node: int, busy_gib: float) -> None:
    """One node's wrapper, in this process, on two fake NVIDIA cards: card 0 goes from 1 GiB idle to
    busy_gib while the agent (a short sleep) runs, card 1 stays at 2 GiB."""
    idle = [1 * GIB] * 6  # devices() reads memory once, the idle baseline five times
    install(monkeypatch, pynvml=fake_pynvml(Script([idle + [busy_gib * GIB], [2 * GIB]])))
    monkeypatch.setenv("SLURM_NODEID", str(node))
    agent = [sys.executable, "-c", "import time; time.sleep(0.3)"]
    assert nodevram.main(["--run-dir", str(rdir), "--interval-s", "0.005", "--", *agent]) == 0


def test_each_node_polls_its_cards_and_the_driver_gathers_every_node(tmp_path, monkeypatch):
    rdir = tmp_path / "runs" / "tiny_online_bs1_s32_n2_baseline_r1"
    rdir.mkdir(parents=True)
    poll_node(monkeypatch, rdir, 0, 30)
    poll_node(monkeypatch, rdir, 1, 50)
    assert read_json(rdir / "vram_node_1.json")["hostname"] == socket.gethostname()
    memory = [r["used_gib"] for r in read_jsonl(rdir / "vram_node_1.jsonl") if "used_gib" in r]
    assert memory[-1] == [50.0, 2.0]
    merged = nodevram.gather(rdir, 2)
    assert merged["status"] == "ok" and merged["reason"] is None and merged["backend"] == "nvml"
    assert read_json(rdir / "vram.json") == merged

    cards = vram_per_card_table(load_runs(tmp_path))
    assert list(cards.columns) == VRAM_PER_CARD_COLUMNS
    rows = cards[["node", "card_index", "baseline_used_gib", "peak_used_gib"]].values.tolist()
    assert rows == [[0, 0, 1.0, 30.0], [0, 1, 2.0, 2.0], [1, 0, 1.0, 50.0], [1, 1, 2.0, 2.0]]
    assert run_row(load_runs(tmp_path)[0])["peak_vram_gib"] == 50.0  # the busiest card of any node
    assert plots._cards(cards)[1] == ["0:0", "0:1", "1:0", "1:1"]  # the plot keeps nodes' cards apart


def test_single_node_cards_are_node_0(tmp_path):
    rdir = tmp_path / "runs" / "c_baseline_r1"
    rdir.mkdir(parents=True)
    device = {"index": 0, "name": "H200", "baseline_used_gib": 0.5, "peak_used_gib": 9.0}
    (rdir / "vram.json").write_text(json.dumps({"status": "ok", "devices": [device]}))
    cards = vram_per_card_table(load_runs(tmp_path))
    assert cards[["node", "card_index", "peak_used_gib"]].values.tolist() == [[0, 0, 9.0]]
    assert plots._cards(cards)[1] == ["0"]


def test_a_missing_node_and_a_killed_poller_are_named(tmp_path):
    assert nodevram.claim(tmp_path, "0") == "0"  # its poller was killed: the file still says "running"
    merged = nodevram.gather(tmp_path, 2)
    assert merged["status"] == "unavailable" and merged["devices"] == []
    assert "node 0: its poller never finished" in merged["reason"]
    assert "1 of 2 nodes sent no summary (no vram_node_<node>.json, and none printed" in merged["reason"]


def test_local_nodes_gives_each_copy_its_node_id_and_its_own_gpus(tmp_path):
    # one write() per copy: the copies share one pipe, and print()'s separate pieces interleave
    # when stdout is unbuffered (seen in CI: "01 2,3")
    probe = (
        "import os, sys; sys.stdout.write("
        "f\"{os.environ['SLURM_NODEID']} {os.environ.get('CUDA_VISIBLE_DEVICES')}\\n\")"
    )
    cmd = [
        sys.executable,
        "-m",
        "tests.local_nodes",
        "2",
        "--gpus-per-node",
        "2",
        sys.executable,
        "-c",
        probe,
    ]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert sorted(out.split("\n")[:2]) == ["0 0,1", "1 2,3"]
    plain = subprocess.run(
        [*LOCAL_NODES, sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True
    )
    assert plain.returncode == 0 and "None" in plain.stdout  # without the option, nothing is hidden


def test_node_index_from_the_environment_else_the_host_name(tmp_path, monkeypatch):
    env = {"NODE_RANK": "3", "SLURM_NODEID": "1", "BENCH_NODE_RANK": "2"}
    assert nodevram.node_label(env) == "2"
    assert nodevram.node_label({k: v for k, v in env.items() if k != "BENCH_NODE_RANK"}) == "1"
    assert nodevram.node_label({"NODE_RANK": "3"}) == "3"
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu node/7")
    assert nodevram.node_label({"SLURM_NODEID": "", "NODE_RANK": "n/a"}) == "gpu-node-7"  # a file name
    # two agents on one host without a node index each get a file of their own
    claimed = [nodevram.claim(tmp_path, "gpu-node-7") for _ in range(2)]
    assert claimed == ["gpu-node-7", "gpu-node-7-2"]
    assert [read_json(tmp_path / f"vram_node_{c}.json")["node"] for c in claimed] == claimed


def wrapper(rdir: Path, *agent: str, **env: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "bench.probe.nodevram", "--run-dir", str(rdir), "--interval-s", "0.01", "--"]
    return subprocess.Popen(
        [*cmd, sys.executable, "-c", *agent],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_wrapper_ends_as_its_agent_did(tmp_path):
    proc = wrapper(tmp_path, "import sys; sys.exit(3)", BENCH_NODE_RANK="1")
    assert proc.wait(timeout=30) == 3
    doc = read_json(tmp_path / "vram_node_1.json")
    assert doc["node"] == 1 and doc["status"] in ("ok", "unavailable")
    # no shared filesystem: the agent still runs, polled into a temporary directory, and the node's
    # summary reaches the driver only as lines on stdout (which srun passes on)
    proc = wrapper(tmp_path / "absent", "print('ran')", BENCH_NODE_RANK="1")
    out, err = proc.communicate(timeout=30)
    assert (
        proc.returncode == 0 and "ran" in out.splitlines() and "reaches the driver as lines on stdout" in err
    )
    assert not (tmp_path / "absent").exists()
    log = tmp_path / "stdout.log"
    log.write_text("".join(f"1: {line}\n" for line in out.splitlines()))  # as srun --label writes it
    printed = nodevram.node_lines(log)["1"]
    assert printed["summary"]["agent_exit"] == 0 and printed["summary"]["status"] in ("ok", "unavailable")
    assert printed["start"]["node"] == 1


def test_sigterm_reaches_the_agent_and_the_node_file_is_finished(tmp_path):
    agent = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
    proc = wrapper(tmp_path, agent, BENCH_NODE_RANK="0")
    assert proc.stdout.readline().startswith("bench.nodevram[0] start 1/1 ")  # the wrapper's own line
    pid = int(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)  # the wrapper alone, as srun signals its tasks
    assert proc.wait(timeout=30) == -signal.SIGTERM  # it dies of the agent's signal
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not Path(f"/proc/{pid}").exists()
    assert read_json(tmp_path / "vram_node_0.json")["status"] != "running"


# ---------------------------------------------------------------- commands and config keys


def test_multinode_command_wraps_each_agent_in_its_poller(tmp_path):
    tc = train_configs(tmp_path)
    launcher = ["srun", "-p", "train", "--nodes=2"]  # a partition named like the subcommand
    top = {"nodes": 2, "launcher": launcher, "rdzv_endpoint": "node0:29400", "arms": ["baseline", "nopoll"]}
    cfg = load_config(sweep_file(tmp_path, [cell(tc)], **top))
    polled, unpolled = plan(cfg)
    cmd = plug_for(cfg).train_command(cfg, polled, Path("r"), None)
    agent = cmd.index("torch.distributed.run") - 2
    assert cmd[:5] == [*launcher, f"--job-name={polled.run_id}"]  # srun: the step is named after its run
    poller = [sys.executable, "-m", "bench.probe.nodevram", "--run-dir", "r", "--interval-s", "0.05", "--"]
    assert cmd[5:agent] == poller
    assert cmd[agent + 3 : agent + 15] == [
        "--nproc-per-node", "1", "--nnodes", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "node0:29400", "--rdzv-id", polled.run_id, "-m", "tests.fake_trainer",
    ]  # fmt: skip
    assert cmd[agent + 15] == "train"
    assert "bench.probe.nodevram" not in plug_for(cfg).train_command(
        cfg, unpolled, Path("r"), None
    )  # nopoll: no poller
    check = plug_for(cfg).check_command(cfg, cfg.cells[0], tmp_path, None)
    assert check[:5] == [sys.executable, "-m", "tests.fake_trainer", "check", tc["online"]]


@pytest.mark.usefixtures("fakes")
def test_dry_run_names_the_launcher_and_where_the_endpoint_came_from(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MASTER_ADDR", "node0")
    monkeypatch.setenv("MASTER_PORT", "29500")
    path = sweep_file(tmp_path, [cell(train_configs(tmp_path))], nodes=2, launcher=LOCAL_NODES)
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    assert "rendezvous at node0:29500 (from MASTER_ADDR/MASTER_PORT)" in capsys.readouterr().out


@pytest.mark.usefixtures("fakes")
def test_a_launcher_missing_here_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BENCH_RDZV_ENDPOINT", "node0:29400")
    path = sweep_file(tmp_path, [cell(train_configs(tmp_path))], nodes=2, launcher=["no-such-srun", "-N2"])
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "launcher: 'no-such-srun' is not on this machine's PATH" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("top", "expected"),
    [
        ({"nodes": 2, "launcher": "srun --nodes=2"}, "launcher: expected a list of strings"),
        ({"nodes": 2, "launcher": ["srun", "--nodes", 2]}, "launcher: expected a list of strings"),
        ({"nodes": 2, "launcher": []}, "launcher: expected a list of strings"),
        ({"launcher": ["srun"]}, "launcher: only for nodes > 1"),
        ({"nodes": 2, "launcher": ["srun"]}, "rdzv_endpoint: required when nodes > 1"),
        ({"nodes": 2, "launcher": ["srun"], "rdzv_endpoint": "node0"}, "rdzv_endpoint: expected host:port"),
    ],
)
def test_bad_multinode_keys_are_one_line(tmp_path, top, expected):
    path = sweep_file(tmp_path, [cell(train_configs(tmp_path))], **top)
    with pytest.raises(SweepError) as err:
        load_config(path)
    assert expected in str(err.value) and "\n" not in str(err.value)
    if "rdzv_endpoint: required" in expected:
        assert "BENCH_RDZV_ENDPOINT" in str(err.value) and "MASTER_ADDR" in str(err.value)


def test_endpoint_from_the_environment_when_the_config_names_none(tmp_path, monkeypatch):
    path = sweep_file(tmp_path, [cell(train_configs(tmp_path))], nodes=2, launcher=["srun"])

    def endpoint(**env: str) -> tuple:
        for var in RDZV_VARS:
            monkeypatch.delenv(var, raising=False)
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        cfg = load_config(path)
        return cfg.rdzv_endpoint, cfg.rdzv_from

    assert endpoint(MASTER_ADDR="node0") == ("node0:29400", "MASTER_ADDR/MASTER_PORT")  # torchrun's c10d port
    assert endpoint(MASTER_ADDR="node0", MASTER_PORT="1234") == ("node0:1234", "MASTER_ADDR/MASTER_PORT")
    both = {"BENCH_RDZV_ENDPOINT": "node7:29401", "MASTER_ADDR": "node0"}
    assert endpoint(**both) == ("node7:29401", "BENCH_RDZV_ENDPOINT")
    with pytest.raises(SweepError, match=r"BENCH_RDZV_ENDPOINT: expected host:port, got 'node7'$"):
        endpoint(BENCH_RDZV_ENDPOINT="node7")
    given = sweep_file(tmp_path, [cell(train_configs(tmp_path))], "given.yaml", nodes=2, launcher=["srun"])
    given.write_text(given.read_text() + "rdzv_endpoint: node1:29400\n")
    monkeypatch.setenv("BENCH_RDZV_ENDPOINT", "node7:29401")
    assert load_config(given).rdzv_endpoint == "node1:29400"  # the config's wins
    # the resolved config (sweep.json, --resume's check) does not hold an endpoint from the environment:
    # a sweep resumes in a new allocation whose first node differs
    endpoint(BENCH_RDZV_ENDPOINT="node7:29401")
    first = load_config(path).resolved
    endpoint(BENCH_RDZV_ENDPOINT="node9:29401")
    assert diff_resolved(first, load_config(path).resolved) == []
