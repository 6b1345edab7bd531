"""Checks before anything is written: packages, the machine, the GPUs a config asks for, the
multi-node launcher, and whether the Liger arms can run here. Each failure is one line
(SweepError), exit 2."""

from __future__ import annotations

import importlib.util
import shutil
import sys

from bench.config import CPU_MAX_PROCS, SweepConfig
from bench.errors import SweepError
from bench.probe import hardware

NO_GPU = "Liger's Triton kernels need a CUDA or ROCm GPU; this machine has none"
NO_LIGER = "liger-kernel is not installed: pip install '.[liger]'"
NO_LIGER_ROCM = (
    "liger-kernel is not installed: pip install --no-deps 'liger-kernel>=0.6.0' (ROCm: without its triton "
    "requirement, which would add a CUDA Triton beside pytorch-triton-rocm; docs/rocm.md)"
)
DRIVER_PACKAGES = ("yaml", "pandas", "scipy", "matplotlib", "tqdm")


def liger_skip_reason() -> str | None:
    """Why the Liger arms cannot run on this machine, or None when they can."""
    try:
        import torch

        has_gpu = torch.cuda.is_available()
        rocm = bool(getattr(torch.version, "hip", None))
    except Exception:
        has_gpu, rocm = False, False
    if not has_gpu:
        return NO_GPU
    if importlib.util.find_spec("liger_kernel") is None:
        return NO_LIGER_ROCM if rocm else NO_LIGER
    return None


def check_imports(missing: list[str]) -> None:
    """One line naming the missing packages (the driver's and the plug's trainer's), not a
    ModuleNotFoundError later."""
    missing = [m for m in DRIVER_PACKAGES if importlib.util.find_spec(m) is None] + missing
    if missing:
        raise SweepError(
            f"this Python ({sys.executable}) lacks {', '.join(missing)}: run `make install` (the venv), or "
            "point PYTHON= at an environment that has them"
        )


def detect() -> dict:
    try:
        info = hardware.detect()
    except ValueError as e:  # bench.probe.hardware.HardwareError
        raise SweepError(str(e)) from None
    return info if isinstance(info, dict) else {}


def hardware_problem(cfg: SweepConfig, info: dict) -> str | None:
    """Why this machine is not the config's hardware (a line), or None."""
    try:
        return hardware.check_hardware(list(cfg.hardware), info, config=str(cfg.path))
    except ValueError as e:  # HardwareError: unknown hardware name in the config
        raise SweepError(str(e)) from None


def check_gpus(cfg: SweepConfig, info: dict) -> None:
    gpus = int(info.get("gpu_count") or 0)
    need = cfg.max_gpus
    if cfg.runs_on_cpu or gpus == 0:
        if need > CPU_MAX_PROCS:
            raise SweepError(
                f"gpus_per_run: {need} processes on the CPU; expected at most {CPU_MAX_PROCS} (gloo) on a machine without GPUs"
            )
    elif need > gpus:
        raise SweepError(f"gpus_per_run: {need} GPUs per run, but this machine has {gpus}")


def check_launcher(cfg: SweepConfig) -> None:
    if cfg.launcher and shutil.which(cfg.launcher[0]) is None:
        raise SweepError(f"{cfg.path}: launcher: {cfg.launcher[0]!r} is not on this machine's PATH")
