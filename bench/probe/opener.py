"""Picking and opening this machine's management library: ``open_backend``."""

from __future__ import annotations

from bench.probe.amd import AmdSmiBackend
from bench.probe.backends import Backend, _one_line
from bench.probe.nvml import NvmlBackend

_BACKENDS = {"nvml": NvmlBackend, "amdsmi": AmdSmiBackend}


def open_backend(prefer: str = "auto") -> tuple[Backend | None, str | None]:
    """(backend, None) on success, else (None, one-line reason). Never raises.

    ``prefer``: "auto" (NVML, then AMD SMI), "nvml", "amdsmi" or "none".
    """
    if prefer == "none":
        return None, "VRAM polling disabled (backend: none)"
    if prefer == "auto":
        names = ["nvml", "amdsmi"]
    elif prefer in _BACKENDS:
        names = [prefer]
    else:
        return None, f"unknown VRAM backend {prefer!r} (expected auto, nvml, amdsmi or none)"
    failures = []
    for name in names:
        try:
            backend = _BACKENDS[name]()
        except Exception as err:  # import (ImportError, KeyError, AttributeError, OSError) or init failure
            failures.append(f"{name}: {_one_line(err)}")
            continue
        if prefer == "auto" and not backend.count:
            backend.close()
            failures.append(f"{name}: no devices")
            continue
        return backend, None
    if prefer == "auto":
        return None, f"no NVML or AMD SMI on this machine ({'; '.join(failures)})"
    return None, failures[0]
