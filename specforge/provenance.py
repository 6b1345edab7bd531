"""Where a run ran: host, devices, driver and library versions, git commit."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    """``git describe`` of the checkout, or $BENCH_GIT_COMMIT where the code was copied without .git."""
    if os.environ.get("BENCH_GIT_COMMIT"):
        return os.environ["BENCH_GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else v
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML here (CPU or AMD machine): not an error
        return None


def _package(module: str, dist: str) -> dict | None:
    """Where a package is imported from and its installed version (the run's own record of its code)."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None:
        return None
    places = list(spec.submodule_search_locations or [])
    where = places[0] if places else spec.origin
    return {"file": os.path.realpath(where) if where else None, "version": _version(dist)}


def code() -> dict:
    """The code this run imported (the packages whose versions decide the work), its interpreter,
    and the environment variables a benchmark arm declared (named by $BENCH_ARM_VARS)."""
    names = [n for n in os.environ.get("BENCH_ARM_VARS", "").split(",") if n]
    mods = {"liger-kernel": ("liger_kernel", "liger-kernel"), "torch": ("torch", "torch")}
    mods |= {"triton": ("triton", "triton"), "transformers": ("transformers", "transformers")}
    packages = {name: _package(*m) for name, m in mods.items()}
    packages["specforge"] = {
        "file": str(Path(__file__).resolve().parent),
        "version": None,
        "commit": _git_commit(),
    }
    return {
        "packages": packages,
        "python": {"executable": os.path.realpath(sys.executable), "version": sys.version.split()[0]},
        "vars": {n: os.environ.get(n) for n in names},
    }


def collect() -> dict:
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "gpu_names": gpus,
        "gpu_count": len(gpus),
        "driver_version": _driver_version() if gpus and not torch.version.hip else None,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "rocm_version": torch.version.hip,
        "torch": torch.__version__,
        "triton": _version("triton") or _version("pytorch-triton-rocm"),
        "transformers": _version("transformers"),
        "liger_kernel": _version("liger-kernel"),
        "git_commit": _git_commit(),
        "code": code(),
    }
