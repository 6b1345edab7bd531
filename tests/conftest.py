import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CONFIGS, REPO, run_cli

# Reports built by the tests (in-process and by every sweep a test starts) write their CSVs and
# report.md but draw no PNGs: matplotlib's rendering is ~2 s of CPU per report. The tests of the
# figures turn drawing back on (plots_on; env PLOTS_ON for a subprocess).
os.environ["BENCH_NO_PLOTS"] = "1"
PLOTS_ON = {"BENCH_NO_PLOTS": "0"}
# One intra-op thread per torch process (this worker's and every run a test starts): two pytest
# workers on two cores each starting a training run that spins as many OpenMP threads as there
# are cores oversubscribe the machine (two CPU parity sweeps side by side: 71 s with the default,
# 20 s with one thread each, on the 2-core machine). A value set outside is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Python's bytecode as installed: where the environment says PYTHONDONTWRITEBYTECODE (these CPU
# machines do), every sweep a test starts would give its runs a fresh bytecode cache of its own
# (bench/run/execute.py: bytecode_dir, right for an H200 whose torch ships no .pyc) and the first
# run of each sweep would compile torch and transformers from source again, ignoring the .pyc files
# pip wrote: a real SpecForge run's start on the 2-core machine went from 5.0 s to 14.7 s. The tests
# of that sharing set the variable themselves (tests/test_specforge_cli_probe.py).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_collection_modifyitems(items):
    """The `slow` tests (end-to-end runs of 10-110 s) first, so that two workers share them and the
    quick ones fill the gaps at the end, instead of one long test starting last. (Ordering the
    heaviest modules first as well: a clean-clone CI run took 614 s of pytest, the one before 486 s.)"""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def plots_on(monkeypatch):
    """build_report in this test draws its PNGs."""
    monkeypatch.setenv("BENCH_NO_PLOTS", "0")


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> Path:
    """An offline cache for the tiny profile, prepared once per test session."""
    out = tmp_path_factory.mktemp("cache") / "tiny"
    r = run_cli("specforge", "prepare", str(CONFIGS / "train/tiny-offline.yaml"), "--output-dir", str(out))
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture
def no_plots(monkeypatch):
    """build_report without drawing: every PNG the report draws becomes a no-op returning its path
    (tests of the tables run faster; tests of the figures draw them)."""
    from bench.results import plots, report, runplots

    def skip(*args, **kw):
        return Path(args[1] if len(args) > 1 else kw["path"])

    for module, name in ((plots, "plot_throughput"), (plots, "plot_vram_per_card"), (runplots, "plot_loss_curves"),
                         (runplots, "plot_step_time_dist"), (report, "plot_forest")):  # fmt: skip
        monkeypatch.setattr(module, name, skip)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """Our distribution's wheel, built from a copy of the sources (the build writes build/ and
    *.egg-info beside them); the copy keeps specforge/ at the top, so leaving it out there is the
    build's doing. The copy follows bench/shipped's links, as a build of the checkout does."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for pkg in ("bench", "specforge", "configs"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "-w", str(tmp), str(src)], check=True, capture_output=True, timeout=300)
    (whl,) = tmp.glob("*.whl")
    return whl
