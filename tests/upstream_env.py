"""Upstream SpecForge (PyPI ``specforge``) for the tests: ``make specforge-env``, built once into
``.venv-specforge/`` (about 10-25 s from scratch, reusing this interpreter's torch) and kept
between sessions. Workers of pytest-xdist take a file lock, so one builds and the rest wait."""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

VENV = REPO / ".venv-specforge"
LOCK = REPO / ".venv-specforge.lock"
BUILD_TIMEOUT_S = 600
# What a parent make (`make test`) or the caller's shell could pass down to this make.
SCRUB = {
    "MAKEFLAGS",
    "MFLAGS",
    "MAKELEVEL",
    "MAKEOVERRIDES",
    "GNUMAKEFLAGS",
    "SPECFORGE_VENV",
    "SPECFORGE_VERSION",
}


@functools.cache
def upstream_python() -> Path:
    """The upstream environment's interpreter, building the environment first when needed (with
    this interpreter's site-packages behind its own, as `make specforge-env` does for .venv)."""
    if sys.version_info < (3, 11):
        pytest.skip("upstream SpecForge needs Python >= 3.11")
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    cmd = ["make", "--no-print-directory", "specforge-env", "INSTALL=", f"PYTHON={sys.executable}"]
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        r = subprocess.run(
            [*cmd, f"SPECFORGE_VENV={VENV}"],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}"
    return VENV / "bin" / "python"
