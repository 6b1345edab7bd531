"""Warm starts: runs forked from the fork server behave as the same command started afresh."""

import json
import multiprocessing
import signal
import subprocess
import sys
import time

import pytest

from bench.__main__ import main
from bench.fileio import read_json
from bench.procs import forkstart, launcher, proctable
from tests.helpers import REPO
from tests.test_driver import fakes, sweep_file, train_configs  # noqa: F401 (fakes is a fixture)

PROBE = [sys.executable, "-m", "tests.fork_probe"]


@pytest.fixture(scope="module", autouse=True)
def server():
    assert forkstart.start_server(["tests.fork_probe"]) >= 0.0
    assert forkstart.ready()


def _run(tmp_path, argv, timeout_s=60.0, fork=True, env=None):
    log, launch = tmp_path / "stdout.log", tmp_path / "launch.json"
    rc, timed_out = launcher.run_process(argv, log, launch, timeout_s, None, env, fork=fork)
    return rc, timed_out, log.read_text(), read_json(launch)


@pytest.mark.parametrize("fork", [True, False])
def test_a_forked_run_sees_what_the_command_line_gives(tmp_path, monkeypatch, fork):
    monkeypatch.chdir(REPO)
    out = tmp_path / "probe.json"
    rc, timed_out, log, launch = _run(tmp_path, [*PROBE, str(out), "7"], fork=fork, env={"FORK_PROBE": "x"})
    assert (rc, timed_out) == (7, False)
    assert launch["start"] == ("fork-server" if fork else "exec")
    info = json.loads(out.read_text())
    assert info["argv"] == [str(out), "7"] and info["probe_env"] == "x"
    assert info["leads_session"] and info["stdin_is_devnull"]
    # the platform's default, as in a fresh interpreter: not the fork server's (a DataLoader
    # would otherwise start its workers through a fork server of its own)
    assert info["start_method"] == multiprocessing.get_context().get_start_method()
    assert launch["pgid"] == launch["pid"] == info["pid"]
    assert "probe says hello" in log and "probe on stderr" in log


def test_a_server_of_other_imports_is_replaced_not_reused(tmp_path):
    """A second sweep in one process (the tests run many) whose trainer imports other modules gets
    a server that imported those: the first one's forks imported the second trainer themselves,
    every run (3.3 s each of the CPU parity sweep's runs here)."""
    out, env = tmp_path / "probe.json", {"FORK_PROBE_MODULES": "wave,colorsys"}
    try:
        assert forkstart.start_server(["tests.fork_probe", "wave"]) > 0  # not the module's server
        assert forkstart.start_server(["tests.fork_probe", "wave"]) == 0.0  # running already
        rc, _, _, launch = _run(tmp_path, [*PROBE, str(out)], env=env)
        assert rc == 0 and launch["start"] == "fork-server"
        assert json.loads(out.read_text())["preloaded"] == ["wave"]
    finally:
        assert forkstart.start_server(["tests.fork_probe"]) > 0  # the module's own again
    out.unlink()
    assert _run(tmp_path, [*PROBE, str(out)], env=env)[0] == 0
    assert json.loads(out.read_text())["preloaded"] == []


def test_other_commands_are_not_forked(tmp_path):
    assert forkstart.module_argv([sys.executable, "-m", "tests.fork_probe", "a"]) == (
        "tests.fork_probe",
        ["a"],
    )
    assert forkstart.module_argv(["python9", "-m", "x"]) is None  # another interpreter
    assert forkstart.module_argv([sys.executable, "-c", "pass"]) is None
    rc, _, _, launch = _run(tmp_path, [sys.executable, "-c", "raise SystemExit(3)"])
    assert rc == 3 and launch["start"] == "exec"


def test_timeout_kills_the_forked_run_and_its_children(tmp_path):
    out = tmp_path / "probe.json"
    t0 = time.monotonic()
    rc, timed_out, _, launch = _run(tmp_path, [*PROBE, str(out), "0", "child"], timeout_s=2.0)
    assert timed_out and rc == -signal.SIGTERM and time.monotonic() - t0 < 30
    info = json.loads(out.read_text())
    assert not launcher.group_alive(launch["pgid"])
    st = proctable.facts(info["grandchild"])
    assert st is None or st.zombie  # gone, or dead and not yet reaped by init


def test_a_killed_driver_takes_its_forked_runs_with_it(tmp_path):
    """kill -9 of the driver: the server exits, and the run (its child) gets SIGTERM."""
    out = tmp_path / "probe.json"
    script = (
        "import sys; from pathlib import Path; from bench.procs import forkstart, launcher; "
        "forkstart.start_server([]); "
        f"launcher.run_process([sys.executable, '-m', 'tests.fork_probe', {str(out)!r}, '0', 'sleep'], "
        f"Path({str(tmp_path / 'log')!r}), Path({str(tmp_path / 'launch.json')!r}), 600, fork=True)"
    )
    driver = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.exists(), "the forked run did not start"
        pid = json.loads(out.read_text())["pid"]
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 20
        while launcher.group_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not launcher.group_alive(pid)
    finally:
        if driver.poll() is None:
            driver.kill()


@pytest.mark.usefixtures("fakes")
@pytest.mark.parametrize("fork_server", [True, False])
def test_sweep_forks_single_process_runs_only_when_asked(tmp_path, fork_server):
    tc = train_configs(tmp_path)
    cells = [{"config": tc["online"], "batch_size": 1, "seq_len": 64}]
    cfg = sweep_file(tmp_path, cells, fork_server=fork_server, gpus_per_run=[1, 2])
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out)]) == 0
    starts = {p.parent.name: read_json(p)["start"] for p in out.glob("runs/*/launch.json")}
    one = [s for rid, s in starts.items() if "_g2" not in rid]
    two = [s for rid, s in starts.items() if "_g2" in rid]
    assert one == ["fork-server" if fork_server else "exec"] and two == ["exec"]  # torchrun: never forked
    for rid in starts:
        assert read_json(out / "runs" / rid / "run.json")["status"] == "ok"


def test_a_server_whose_forks_see_no_gpu_is_not_used(monkeypatch):
    """On a machine with GPUs, a server that left its forks without any (e.g. an import that
    initialised the CUDA driver) is refused; the driver then starts runs afresh."""
    monkeypatch.setattr(forkstart, "_preloaded", None)
    with pytest.raises(forkstart.ForkServerUnusable, match="found no GPU; the machine has 2"):
        forkstart.start_server(["tests.fork_probe"], gpus=2)  # torch on this CPU machine: 0 devices
    assert not forkstart.ready()
