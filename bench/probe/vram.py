"""VRAM polling's public surface: NVML on NVIDIA, AMD SMI on AMD, nothing on CPU.

Here: ``preflight()`` (at sweep start, one line saying what to install when this machine has
GPUs whose library cannot be opened), ``poll_once()`` and ``gpu_vendors_present()``; and,
re-exported, what the other modules of bench/probe/ hold: the ``Backend`` Protocol and its
helpers (backends.py), ``NvmlBackend`` (nvml.py), ``AmdSmiBackend`` (amd.py),
``open_backend`` (opener.py) and ``VramPoller`` (poller.py, which writes vram.jsonl and
vram.json). The management libraries are imported lazily, so this module imports anywhere.

AMD cards in a compute-partition mode (CPX, DPX, ...) give one handle per partition; they
are reported per handle, with ``partition`` set in the device dicts and ``partitioned`` in
the summary.
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

from bench.probe.amd import MIB, AmdSmiBackend
from bench.probe.backends import GIB, STATE_FIELDS, Backend, LibraryImportError, _one_line
from bench.probe.nvml import NvmlBackend
from bench.probe.opener import open_backend
from bench.probe.poller import FLUSH_EVERY_S, VramPoller
from bench.probe.processes import ProcessLog

__all__ = [
    "FLUSH_EVERY_S",
    "GIB",
    "MIB",
    "STATE_FIELDS",
    "AmdSmiBackend",
    "Backend",
    "LibraryImportError",
    "NvmlBackend",
    "VramPoller",
    "gpu_vendors_present",
    "open_backend",
    "foreign_processes",
    "poll_once",
    "preflight",
]


# -- preflight -----------------------------------------------------------------------------


def _rocm_path() -> Path:
    return Path(os.environ.get("ROCM_PATH") or os.environ.get("ROCM_HOME") or "/opt/rocm")


def gpu_vendors_present(root: str | Path = "/") -> set[str]:
    """GPU vendors whose kernel driver is loaded here ("nvidia", "amd"), from /proc, /sys and /dev."""
    r = Path(root)
    probes = {
        "nvidia": ("proc/driver/nvidia/version", "dev/nvidiactl", "dev/nvidia0"),
        "amd": ("dev/kfd", "sys/module/amdgpu"),
    }
    return {vendor for vendor, paths in probes.items() if any((r / p).exists() for p in paths)}


def _amd_fix() -> str:
    """What to install for AMD SMI: ROCm's own amdsmi, else PyPI's of the host's ROCm version."""
    rocm = _rocm_path()
    shares = [rocm / "share" / "amd_smi", *sorted(rocm.glob("core-*/share/amd_smi"))]
    share = next((d for d in shares if d.is_dir()), shares[0])
    try:
        installed = metadata.version("amdsmi")
    except Exception:
        installed = None
    prefix = f"pip uninstall amdsmi ({installed} is installed), then " if installed else ""
    if (share / "pyproject.toml").is_file() or (share / "setup.py").is_file():
        return (
            f"{prefix}install ROCm's own amdsmi, which matches its libamd_smi.so: "
            f"cp -r {share} /tmp/amd_smi && pip install /tmp/amd_smi (or: make install GPU_STACK=rocm)"
        )
    if (share / "amdsmi" / "__init__.py").is_file():
        return f"{prefix}put ROCm's own amdsmi on the path: export PYTHONPATH={share}"
    try:
        version = (rocm / ".info" / "version").read_text().split("-")[0].strip()
        pin = "==" + ".".join(version.split(".")[:2]) + ".*"
    except Exception:
        pin = ""
    return f"{prefix}install amd-smi-lib (ROCm) and the amdsmi matching it: pip install 'amdsmi{pin}'"


def preflight(prefer: str = "auto") -> str | None:
    """One line saying what to install when this machine has GPUs whose management library
    cannot be opened (VRAM would be "unavailable" in every run), else None. Never raises."""
    try:
        if prefer == "none":
            return None
        wanted = {"nvml": {"nvidia"}, "amdsmi": {"amd"}, "auto": {"nvidia", "amd"}}.get(prefer)
        if wanted is None:
            return f"unknown VRAM backend {prefer!r} (expected auto, nvml, amdsmi or none)"
        problems = []
        for vendor in sorted(gpu_vendors_present() & wanted):
            name = "nvml" if vendor == "nvidia" else "amdsmi"
            backend, reason = open_backend(name)
            if backend is not None:
                count = backend.count
                backend.close()
                if count:
                    continue
                reason = f"{name}: no devices"
            if vendor == "nvidia":
                fix = "pip install 'nvidia-ml-py>=12.535' and check that the NVIDIA driver is loaded"
                problems.append(f"NVIDIA GPUs present but NVML cannot be opened ({reason}); {fix}")
                continue
            if "NO_PERM" in str(reason) or "ermission" in str(reason):
                fix = "give this user the GPUs (sudo usermod -aG render,video $USER; in docker: --device=/dev/kfd --device=/dev/dri)"
            elif reason.endswith("no devices"):
                fix = "check that /dev/kfd and /dev/dri are readable here (in docker: --device=/dev/kfd --device=/dev/dri)"
            else:
                fix = _amd_fix()
            problems.append(
                f"AMD GPUs present but AMD SMI cannot be opened ({reason}); {fix}; see docs/rocm.md"
            )
        if not problems:
            return None
        return "VRAM polling will be unavailable: " + "; ".join(problems)
    except Exception as err:  # a preflight must never stop a sweep
        return f"VRAM preflight failed: {_one_line(err)}"


def poll_once(backend: str = "auto") -> list[dict]:
    """Current per-card ``{index, name, used_gib, total_gib}``; [] when nothing can be polled."""
    b, _ = open_backend(backend)
    if b is None:
        return []
    try:
        used = b.used_bytes()
        return [
            {
                "index": d["index"],
                "name": d["name"],
                "used_gib": u / GIB,
                "total_gib": None if d["total_bytes"] is None else d["total_bytes"] / GIB,
            }
            for d, u in zip(b.devices(), used)
        ]
    except Exception:
        return []
    finally:
        b.close()


def foreign_processes(backend: str = "auto") -> list[dict]:
    """The processes other than the suite's holding memory on any card now (vram.json's
    ``processes`` rows, owner foreign or unknown); [] when none, or nothing can be polled."""
    b, _ = open_backend(backend)
    if b is None:
        return []
    try:
        log = ProcessLog()
        log.add(b.processes(), "before")
        return [p for p in log.summary() if p["owner"] != "suite"]
    except Exception:
        return []
    finally:
        b.close()
