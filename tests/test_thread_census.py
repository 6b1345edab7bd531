"""scripts/thread_census.py against a real process shaped like a SpecForge run: it finds the
process by its command line, samples only once the run has logged its warm-up turns, counts the
threads other than the main one by name and says where they sleep; it stops once the run is gone."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO

POOL = """
import sys, threading, time
gate = threading.Event()
workers = [threading.Thread(target=gate.wait) for _ in range(3)]  # idle pool workers: asleep in a futex
for w in workers:
    w.start()
time.sleep(float(sys.argv[1]))
gate.set()
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_the_census_counts_a_runs_idle_threads_and_where_they_sleep(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "lockstep.jsonl").write_text("{}\n{}\n")  # two turns logged: not yet sampled from step 4
    argv = [sys.executable, "-c", POOL, "2", "specforge.cli", f"output_dir={run / 'specforge-out'}"]
    proc = subprocess.Popen(argv)
    out = tmp_path / "census.json"
    census = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "scripts" / "thread_census.py"),
            str(out),
            "--seconds",
            "30",
            "--every",
            "0.05",
            "--linger",
            "1",
            "--pid",  # this test's process only: other tests may run SpecForge beside it
            str(proc.pid),
        ]
    )
    time.sleep(1.0)
    (run / "lockstep.jsonl").write_text("{}\n{}\n{}\n")  # the warm-up is over: sampling starts
    proc.wait(timeout=30)
    t0 = time.monotonic()
    assert census.wait(timeout=40) == 0
    assert time.monotonic() - t0 < 10  # it stopped once the run was gone, not at its deadline
    doc = json.loads(out.read_text())
    assert 0 < doc["samples"] < 2 / 0.05  # not before the warm-up turns
    (name, pool), *_ = doc["by_name"].items()
    assert pool["threads"] == 3  # the main thread is not counted
    assert pool["syscall"].get("futex", 0) >= 0.9 * sum(pool["state"].values())
