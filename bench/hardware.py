"""What machine is this, and which sweep config fits it."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from bench.vram import open_backend

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

# Name fragments (upper case) per kind, tried in order.
_PATTERNS: list[tuple[str, tuple[str, ...]]] = [
    ("a100", ("A100",)),
    ("h100", ("H100",)),
    ("h200", ("H200",)),
    ("mi300x", ("MI300",)),
    ("mi355x", ("MI355", "MI350")),
]
GPU_KINDS = [kind for kind, _ in _PATTERNS]
_CONFIGS = {
    "a100": "a100.yaml",
    "h100": "h200.yaml",
    "h200": "h200.yaml",
    "mi300x": "mi355x.yaml",
    "mi355x": "mi355x.yaml",
    "cpu": "cpu.yaml",
}


class HardwareError(ValueError):
    """No sweep config fits this machine (or a config names unknown hardware)."""


def classify(name: str) -> str:
    """The kind of one GPU from its name, or "unknown"."""
    upper = name.upper()
    for kind, fragments in _PATTERNS:
        if any(f in upper for f in fragments):
            return kind
    return "unknown"


def _torch_gpus() -> tuple[str, list[str]]:
    """(vendor, names) from torch.cuda when no management library answers."""
    try:
        import torch

        if not torch.cuda.is_available():
            return "none", []
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return ("amd" if getattr(torch.version, "hip", None) else "nvidia"), names
    except Exception:
        return "none", []


def detect() -> dict:
    """``{vendor: nvidia|amd|none, gpu_names, gpu_count, kind}`` for this machine."""
    vendor, names = "none", []
    backend, _ = open_backend("auto")
    if backend is not None:
        try:
            names = [d["name"] for d in backend.devices()]
            vendor = "nvidia" if backend.name == "nvml" else "amd"
        except Exception:
            names = []
        finally:
            backend.close()
    if not names:
        vendor, names = _torch_gpus()
    kinds = {classify(n) for n in names}
    kind = "cpu" if not names else (kinds.pop() if len(kinds) == 1 else "unknown")
    return {"vendor": vendor if names else "none", "gpu_names": names, "gpu_count": len(names), "kind": kind}


def describe(info: dict) -> str:
    """ "no GPU" or e.g. "NVIDIA A100-SXM4-80GB x8"."""
    names = info.get("gpu_names") or []
    if not names:
        return "no GPU"
    return ", ".join(f"{name} x{n}" for name, n in Counter(names).items())


def config_for(kind: str, gpu: str | None = None) -> str:
    """Path of the sweep config for a hardware kind; ``HardwareError`` when none fits."""
    if kind not in _CONFIGS:
        raise HardwareError(
            f"no sweep config fits this machine's GPU ({gpu or kind}): run "
            "`make bench-a100|bench-h200|bench-mi355x` or `python -m bench sweep CONFIG`"
        )
    return str(CONFIG_DIR / _CONFIGS[kind])


def check_hardware(
    expected: str | list[str], info: dict | None = None, config: str | None = None
) -> str | None:
    """None when this machine fits a config meant for ``expected``, else a one-line message.

    ``expected``: a kind or list of kinds (a100, h100, h200, mi300x, mi355x), "cpu" or "any";
    cpu and "any" configs run anywhere. ``config`` names the config in the message.
    """
    wanted = [expected] if isinstance(expected, str) else list(expected)
    wanted = [str(w).lower() for w in wanted]
    unknown = [w for w in wanted if w not in GPU_KINDS + ["cpu", "any"]]
    if unknown or not wanted:
        raise HardwareError(
            f"{config or 'sweep config'}: unknown hardware {unknown or wanted!r}; "
            f"use one or more of {', '.join(GPU_KINDS)}, cpu, any"
        )
    if "cpu" in wanted or "any" in wanted:
        return None
    info = detect() if info is None else info
    if info.get("kind") in wanted:
        return None
    return f"{config or 'this sweep config'} is for {'/'.join(wanted)} GPUs but this machine has {describe(info)}"


def main_detect() -> int:
    """Print the sweep config for this machine (``python -m bench detect``); exit 2 if none fits."""
    info = detect()
    try:
        path = config_for(info["kind"], describe(info))
    except HardwareError as err:
        print(err, file=sys.stderr)
        sys.exit(2)
    print(path)
    return 0
