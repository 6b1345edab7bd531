"""What machine is this, and which sweep config fits it.

The kind of each GPU comes from its name (NVML / AMD SMI ``market_name``), else, on AMD,
from the ASIC's ``target_graphics_version`` (gfx942 -> MI300 series, gfx950 -> MI350
series), else from torch's device name and ``gcnArchName``. ``BENCH_HARDWARE=<kind>``
overrides all of it; ``detect()`` records the override beside what was detected.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

from bench.distribution import CONFIGS
from bench.probe.opener import open_backend

CONFIG_DIR = CONFIGS  # the checkout's configs/, or an installed copy's shipped ones
ENV_OVERRIDE = "BENCH_HARDWARE"

# Name fragments (upper case) per kind, tried in order.
_PATTERNS: list[tuple[str, tuple[str, ...]]] = [
    ("a100", ("A100",)),
    ("h100", ("H100",)),
    ("h200", ("H200",)),
    ("mi300x", ("MI300",)),
    ("mi355x", ("MI355", "MI350")),
]
GPU_KINDS = [kind for kind, _ in _PATTERNS]
# AMD ISA (target_graphics_version / gcnArchName) per kind: gfx942 is the MI300 series
# (MI300X, MI300A, MI325X), gfx950 the MI350 series (MI350X, MI355X).
_ARCHS = {"gfx942": "mi300x", "gfx950": "mi355x"}
_CONFIGS = {
    "a100": "a100.yaml",
    "h100": "h200.yaml",
    "h200": "h200.yaml",
    "mi300x": "mi355x.yaml",
    "mi355x": "mi355x.yaml",
    "cpu": "cpu.yaml",
}


class HardwareError(ValueError):
    """No sweep config fits this machine (or a config or BENCH_HARDWARE names unknown hardware)."""


def classify(name: str | None) -> str:
    """The kind of one GPU from its name, or "unknown" (also for hex ids and "N/A")."""
    upper = str(name or "").upper()
    for kind, fragments in _PATTERNS:
        if any(f in upper for f in fragments):
            return kind
    return "unknown"


def classify_arch(arch: str | None) -> str:
    """The kind of an AMD GPU from its ISA ("gfx942", "gfx942:sramecc+:xnack-"), or "unknown".

    amdsmi builds ``target_graphics_version`` as "gfx" + the library's integer, printed in
    decimal by some wrapper versions and in hex by others (7.0.x); a wrapper that does not
    match its library turns gfx942 into "gfx2370" or "gfx3ae", which are read back here too.
    """
    base = str(arch or "").strip().lower().split(":")[0]
    if base in _ARCHS:
        return _ARCHS[base]
    digits = base.removeprefix("gfx")
    candidates = []
    if digits.isdigit():
        candidates.append(f"gfx{int(digits):x}")
    try:
        candidates.append(f"gfx{int(digits, 16)}")
    except ValueError:
        pass
    return next((_ARCHS[c] for c in candidates if c in _ARCHS), "unknown")


def _kind_of(name: str | None, arch: str | None) -> str:
    kind = classify(name)
    return kind if kind != "unknown" else classify_arch(arch)


def _display_name(name: object, arch: str | None) -> str:
    """The device name, with the ISA added when the name says nothing ("0x74a5 (gfx942)")."""
    text = str(name) if name is not None else "N/A"
    if arch and classify(text) == "unknown" and classify_arch(arch) != "unknown":
        return f"{text} ({arch})"
    return text


# Device nodes a GPU driver creates (NVIDIA, AMD's KFD, WSL's GPU paravirtualisation): without
# any of them torch sees no GPU either, and importing it (2-3 s) to learn that is skipped.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def torch_may_see_a_gpu() -> bool:
    """False when asking torch is pointless: it is not imported yet and the machine has no GPU
    device node (GPU_DEVICE_NODES), so importing it (2-3 s) would only say "no GPU"."""
    return "torch" in sys.modules or any(os.path.exists(node) for node in GPU_DEVICE_NODES)


def _torch_gpus() -> tuple[str, list[str], list[str | None]]:
    """(vendor, names, archs) from torch.cuda (archs: gcnArchName on ROCm, else None); none
    when torch_may_see_a_gpu() says no."""
    if not torch_may_see_a_gpu():
        return "none", [], []
    try:
        import torch

        if not torch.cuda.is_available():
            return "none", [], []
        n = torch.cuda.device_count()
        names = [torch.cuda.get_device_name(i) for i in range(n)]
        archs: list[str | None] = []
        for i in range(n):
            try:
                archs.append(getattr(torch.cuda.get_device_properties(i), "gcnArchName", None))
            except Exception:
                archs.append(None)
        return ("amd" if getattr(torch.version, "hip", None) else "nvidia"), names, archs
    except Exception:
        return "none", [], []


def _single(kinds: list[str]) -> str:
    distinct = set(kinds)
    return distinct.pop() if len(distinct) == 1 else "unknown"


def _override() -> str | None:
    """The kind BENCH_HARDWARE names, None when unset; HardwareError when it names none."""
    raw = os.environ.get(ENV_OVERRIDE, "").strip()
    if not raw:
        return None
    kind = raw.lower()
    if kind not in GPU_KINDS + ["cpu"]:
        raise HardwareError(
            f"{ENV_OVERRIDE}={raw!r} is not a hardware kind; use one of {', '.join(GPU_KINDS)}, cpu"
        )
    return kind


def detect() -> dict:
    """This machine: ``{vendor: nvidia|amd|none, gpu_names, gpu_count, kind, detected_kind,
    kind_source, partitioned}``.

    ``kind_source`` is "BENCH_HARDWARE" when that variable set ``kind`` (``detected_kind``
    keeps what detection found), else "detected". ``partitioned``: the AMD cards are in a
    compute-partition mode (more handles than physical cards; ``gpu_count`` counts handles).
    ``HardwareError`` when BENCH_HARDWARE names no known kind.
    """
    override = _override()
    vendor, names, archs, partitioned = "none", [], [], False
    backend, _ = open_backend("auto")
    if backend is not None:
        try:
            devices = backend.devices()
            archs = [d.get("arch") for d in devices]
            names = [_display_name(d.get("name"), a) for d, a in zip(devices, archs)]
            partitioned = any(d.get("partition") for d in devices)
            vendor = "nvidia" if backend.name == "nvml" else "amd"
        except Exception:
            names, archs = [], []
        finally:
            backend.close()
    kinds = [_kind_of(n, a) for n, a in zip(names, archs)]
    if not names or "unknown" in kinds:
        t_vendor, t_names, t_archs = _torch_gpus()
        t_kind = _single([_kind_of(n, a) for n, a in zip(t_names, t_archs)]) if t_names else "unknown"
        if not names:
            vendor, names, kinds = t_vendor, t_names, [t_kind] * len(t_names)
        elif t_kind != "unknown" and len(t_names) == len(names):
            kinds = [t_kind if k == "unknown" else k for k in kinds]
    detected = "cpu" if not names else _single(kinds)
    return {
        "vendor": vendor if names else "none",
        "gpu_names": names,
        "gpu_count": len(names),
        "kind": override or detected,
        "detected_kind": detected,
        "kind_source": ENV_OVERRIDE if override else "detected",
        "partitioned": partitioned,
    }


def machine_facts() -> dict:
    """What the report's provenance names in every mode, also with the poller off: ``hostname``,
    ``driver_version`` (the GPU driver's) and ``power_limits_w`` (per card, read and never set);
    None and [] where there is no GPU library. Never raises."""
    import socket

    facts: dict = {"hostname": socket.gethostname(), "driver_version": None, "power_limits_w": []}
    backend, _ = open_backend("auto")
    if backend is None:
        return facts
    try:
        facts["driver_version"] = backend.driver_version()
        read = getattr(backend, "power_limit_w", None)
        facts["power_limits_w"] = [None if w is None else round(w, 1) for w in read()] if read else []
    except Exception:
        pass
    finally:
        backend.close()
    return facts


def describe(info: dict) -> str:
    """ "no GPU" or e.g. "NVIDIA A100-SXM4-80GB x8" (partitioned AMD cards say so)."""
    names = info.get("gpu_names") or []
    if not names:
        return "no GPU"
    text = ", ".join(f"{name} x{n}" for name, n in Counter(names).items())
    return text + (" (partitioned: one entry per partition)" if info.get("partitioned") else "")


def config_for(kind: str, gpu: str | None = None) -> str:
    """Path of the sweep config for a hardware kind; ``HardwareError`` when none fits."""
    if kind not in _CONFIGS:
        raise HardwareError(
            f"no sweep config fits this machine's GPU ({gpu or kind}): run "
            "`make bench-a100|bench-h200|bench-mi355x`, `python -m bench sweep CONFIG`, "
            f"or set {ENV_OVERRIDE}=<{'|'.join(GPU_KINDS)}> (make HARDWARE=...)"
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
    info = detect() if info is None else info
    # a GPU kind named for a machine without one is refused whatever the config (a cpu one too:
    # its sweep.json would record the wrong kind)
    if info.get("kind_source") == ENV_OVERRIDE and info.get("kind") != "cpu" and not info.get("gpu_count"):
        return (
            f"{ENV_OVERRIDE}={info.get('kind')} names a GPU kind, but this machine has no GPU; "
            "unset it (make HARDWARE=) to run here"
        )
    if "cpu" in wanted or "any" in wanted:
        return None
    if info.get("kind") in wanted:
        return None
    return f"{config or 'this sweep config'} is for {'/'.join(wanted)} GPUs but this machine has {describe(info)}"


def main_detect() -> int:
    """Print the sweep config for this machine (``python -m bench detect``); exit 2 if none fits."""
    try:
        info = detect()
        path = config_for(info["kind"], describe(info))
    except HardwareError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(path)
    return 0
