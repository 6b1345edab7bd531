"""Shared test helpers."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"


def run_cli(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m <args>`` from the repo root and capture its output."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=full_env
    )


def built_once(tmp_path_factory, name: str, build) -> tuple[Path, dict]:
    """A module fixture's expensive work done once per test session, whichever xdist workers run
    the module's tests: each worker would otherwise run the fixture of its own (worksteal splits a
    module's tests across workers). ``build(DIR)`` fills DIR and returns a JSON-able dict; the
    first worker builds under an exclusive lock in the directory the workers share, the others
    wait and get the same DIR and dict. Tests must only read DIR."""
    import fcntl
    import json
    import shutil

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    target, result = shared / f"once-{name}", shared / f"once-{name}.json"
    with open(shared / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not result.exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            result.write_text(json.dumps(build(target)))
        return target, json.loads(result.read_text())


def committed_sweep(name: str, dst: Path, sweep_json: bool = True) -> Path:
    """A copy of the committed sweep results/<name> in ``dst`` with its raw records unpacked from
    its raw.tar.xz (bench/results/rawdata.py): what `bench report` rebuilds it from."""
    from bench.results import rawdata

    return rawdata.unpacked_copy(REPO / "results" / name, dst, sweep_json)


def census(arm: str) -> list[str]:
    """The module classes a run of the built-in ``arm`` records of the draft it trained (run.json's
    draft_module_types, as our trainer and the SpecForge CLI's wrapper write them): Liger's RMSNorm
    and SwiGLU modules for the kernels the arm asks for, Qwen3's own for the rest. A synthetic run
    with it reads "in effect"; without it, "not recorded" (no verdict)."""
    from bench.arms import ARMS, KERNEL_MODULES

    spec = ARMS.get(arm)
    own = {"rmsnorm": "Qwen3RMSNorm", "swiglu": "Qwen3MLP"}
    liger = spec is not None and spec.liger
    held = [KERNEL_MODULES[k] if liger and k in spec.kernels else own[k] for k in KERNEL_MODULES]
    return sorted(["Draft", *held])
