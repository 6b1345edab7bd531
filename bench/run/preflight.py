"""Checks before anything is written: packages, the machine, the GPUs a config asks for, the
multi-node launcher, and which arms cannot run here (recorded as skipped with the reason). Each
failure is one line (SweepError), exit 2."""

from __future__ import annotations

import importlib.util
import shutil
import sys

from bench.config import CPU_MAX_PROCS, SweepConfig
from bench.distribution import TRAIN_EXTRA
from bench.errors import SweepError
from bench.probe import hardware

NO_GPU = "Liger's Triton kernels need a CUDA or ROCm GPU; this machine has none"
NO_LIGER = "liger-kernel is not installed: pip install '.[liger]'"
NO_LIGER_ROCM = (
    "liger-kernel is not installed: pip install --no-deps 'liger-kernel>=0.6.0' (ROCm: without its triton "
    "requirement, which would add a CUDA Triton beside pytorch-triton-rocm; docs/rocm.md)"
)
DRIVER_PACKAGES = ("yaml", "pandas", "scipy", "matplotlib", "tqdm")
RUN_PACKAGES = ("psutil",)  # what the driver needs to run a sweep (process trees: bench/procs/proctable.py)


# A GPU-only arm that is not a Liger arm (compile: TorchInductor's Triton kernels) on a machine
# without a GPU; its runs are recorded as skipped, like the Liger arms'.
NO_GPU_ARM = "{doc} needs a CUDA or ROCm GPU (Triton kernels); this machine has none"


def _torch_gpu() -> tuple[bool, bool]:
    """(whether torch sees a CUDA or ROCm GPU here, whether torch is a ROCm build); no GPU,
    without importing torch when hardware.torch_may_see_a_gpu() says no."""
    if not hardware.torch_may_see_a_gpu():
        return False, False
    try:
        import torch

        return torch.cuda.is_available(), bool(getattr(torch.version, "hip", None))
    except Exception:
        return False, False


def gpu_missing() -> bool:
    """Whether this machine has no GPU torch can train on (the trainer would fall back to the CPU)."""
    return not _torch_gpu()[0]


def liger_skip_reason() -> str | None:
    """Why the Liger arms cannot run on this machine, or None when they can."""
    has_gpu, rocm = _torch_gpu()
    if not has_gpu:
        return NO_GPU
    if importlib.util.find_spec("liger_kernel") is None:
        return NO_LIGER_ROCM if rocm else NO_LIGER
    return None


def arm_skip_reasons(cfg: SweepConfig) -> dict[str, str]:
    """arm -> why its runs cannot run on this machine and are recorded as skipped: the Liger arms
    (a declared arm or the baseline kept as a Liger arm included: user_arms' base, baseline_arm)
    without a GPU or liger-kernel (liger_skip_reason), the other GPU-only arms (compile) without a
    GPU. A ``hardware: cpu`` config naming a GPU-only arm was refused when it was loaded."""
    arms = {a: cfg.arm(a) for a in cfg.arms}
    liger = liger_skip_reason() if any(arm.liger for arm in arms.values()) else None
    no_gpu = gpu_missing() if any(arm.gpu_only and not arm.liger for arm in arms.values()) else False
    reasons = {}
    for a, arm in arms.items():
        if arm.liger and liger:
            reasons[a] = liger
        elif arm.gpu_only and not arm.liger and no_gpu:
            reasons[a] = NO_GPU_ARM.format(doc=arm.doc)
    return reasons


def skip_lines(reasons: dict[str, str]) -> list[str]:
    """``liger, liger_flce runs will be skipped here: <reason>``, one line per reason."""
    by_reason: dict[str, list[str]] = {}
    for arm, why in reasons.items():
        by_reason.setdefault(why, []).append(arm)
    return [f"{', '.join(arms)} runs will be skipped here: {why}" for why, arms in by_reason.items()]


def missing_run_packages() -> list[str]:
    """The train extra's packages the driver itself needs to run (not to plan) a sweep, missing here."""
    return [m for m in RUN_PACKAGES if importlib.util.find_spec(m) is None]


def check_imports(missing: list[str]) -> None:
    """One line naming the missing packages (the driver's and the plug's trainer's), not a
    ModuleNotFoundError later."""
    driver = [m for m in DRIVER_PACKAGES if importlib.util.find_spec(m) is None]
    missing = driver + missing
    if missing:
        # the light install (`pip install .`) has the driver's packages, not the trainer's
        fix = "run `make install` (the venv)" if driver else f"{TRAIN_EXTRA} (training needs that extra)"
        raise SweepError(
            f"this Python ({sys.executable}) lacks {', '.join(missing)}: {fix}, or "
            "run an interpreter that has them (with make: PYTHON=/path/to/python)"
        )


def detect() -> dict:
    """This machine (hardware.detect) with its host name, GPU driver and power limits
    (hardware.machine_facts): sweep.json's ``hardware``, and what the plugs record as provenance."""
    try:
        info = hardware.detect()
    except ValueError as e:  # bench.probe.hardware.HardwareError
        raise SweepError(str(e)) from None
    return {**info, **hardware.machine_facts()} if isinstance(info, dict) else {}


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
