"""VRAM polling: NVML on NVIDIA, AMD SMI on AMD, nothing on CPU.

Every card of the machine is polled (not only the ones a run uses). ``VramPoller`` samples
from a daemon thread, appends ``{"t", "used_gib"}`` lines to ``vram.jsonl`` about once a
second and writes the ``vram.json`` summary (docs/run-contract.md) on ``stop()``. In the same
thread, at most once per ``state_interval_s``, it reads each card's clocks, temperature and
power (read only; nothing is ever set) and summarizes them per card.

A poller failure never raises: a missing library gives status "unavailable" with a reason,
and errors while sampling are counted. The management libraries are imported lazily, so
this module imports anywhere; ``preflight()`` tells, once at sweep start, when the machine
has GPUs whose library cannot be opened, and what to install.

AMD cards in a compute-partition mode (CPX, DPX, ...) give one handle per partition; they
are reported per handle, with ``partition`` set in the device dicts and ``partitioned`` in
the summary.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from bench.fileio import atomic_write_json

GIB = 2**30
MIB = 2**20  # AMD SMI's "MB" are MiB
FLUSH_EVERY_S = 1.0
STATE_FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w")
# Compute-partition modes that split one card into several handles.
_SPLIT_MODES = ("DPX", "TPX", "QPX", "CPX")


def _one_line(err: BaseException) -> str:
    msg = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {' '.join(m.strip() for m in msg)}" if msg else type(err).__name__
    return text[:300]


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# AMD SMI's "not supported" values where a wrapper passes them through unconverted.
_AMD_SENTINELS = (0xFFFF, 0xFFFFFFFF, 2**64 - 1)


def _number(value: Any, scale: float = 1.0, sentinels: tuple[int, ...] = ()) -> float | None:
    """A number from a library value; None for "N/A", NaN, ``sentinels`` and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value != value or value in sentinels:
        return None
    return float(value) * scale


def _read(fn: Callable[..., Any], *args: Any, scale: float = 1.0) -> float | None:
    """``fn(*args)`` as a number, None when the call fails or gives none (never raises)."""
    try:
        return _number(fn(*args), scale)
    except Exception:
        return None


class LibraryImportError(ImportError):
    """A management library is installed but cannot be imported (e.g. no libamd_smi.so)."""


def _import_quietly(name: str) -> Any:
    """Import a management library without letting it print to stdout.

    amdsmi's wrapper prints the dlopen error to stdout and then raises ``KeyError
    ('libamd_smi.so')`` when the shared library is missing, and ``AttributeError`` (undefined
    symbol) when it is older than the wrapper; stdout would end up in ``$(python -m bench
    detect)``. Any failure becomes one ``ImportError`` carrying what was printed.
    """
    if sys.modules.get(name) is not None:
        return sys.modules[name]
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            return __import__(name)  # top-level names only; goes through builtins.__import__
    except ImportError as err:
        if not printed.getvalue().strip():
            raise
        raise LibraryImportError(f"{_one_line(err)} ({' '.join(printed.getvalue().split())[:200]})") from None
    except Exception as err:
        out = " ".join(printed.getvalue().split())[:200]
        raise LibraryImportError(
            f"import {name} failed: {_one_line(err)}" + (f" ({out})" if out else "")
        ) from None


class Backend(Protocol):
    """One management library's view of every card. ``devices()``: per card ``{index, name,
    total_bytes, arch, partition}`` (None for what cannot be read, noted in ``problems``);
    ``used_bytes()``: per card; ``state()``: per card ``{sm_clock_mhz, mem_clock_mhz,
    temperature_c, power_w}``, None for any value the library cannot give (never raises)."""

    name: str
    count: int
    problems: list[str]  # one line per device field that could not be read by devices()

    def devices(self) -> list[dict]: ...
    def used_bytes(self) -> list[int]: ...
    def state(self) -> list[dict]: ...
    def driver_version(self) -> str | None: ...
    def close(self) -> None: ...


class _Fields:
    """Reads device fields one by one: a failing field is None and one line in ``problems``."""

    problems: list[str]

    def _field(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as err:
            self.problems.append(f"{what}: {_one_line(err)}")
            return None


class NvmlBackend(_Fields):
    """NVIDIA cards through NVML (physical numbering; CUDA_VISIBLE_DEVICES is ignored)."""

    name = "nvml"

    def __init__(self) -> None:
        pynvml = _import_quietly("pynvml")
        self._nv = pynvml
        self.problems = []
        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.count = len(self._handles)
        except BaseException:
            self.close()
            raise

    def devices(self) -> list[dict]:
        nv = self._nv
        out = []
        for i, h in enumerate(self._handles):
            name = self._field(f"card {i} name", nv.nvmlDeviceGetName, h)
            mem = self._field(f"card {i} memory info", nv.nvmlDeviceGetMemoryInfo, h)
            out.append(
                {
                    "index": i,
                    "name": None if name is None else _text(name),
                    "total_bytes": None if mem is None else int(mem.total),
                    "arch": None,
                    "partition": None,
                }
            )
        return out

    def used_bytes(self) -> list[int]:
        return [int(self._nv.nvmlDeviceGetMemoryInfo(h).used) for h in self._handles]

    def state(self) -> list[dict]:
        nv = self._nv
        return [
            {
                "sm_clock_mhz": _read(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                "mem_clock_mhz": _read(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                "temperature_c": _read(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                "power_w": _read(nv.nvmlDeviceGetPowerUsage, h, scale=1e-3),  # milliwatts
            }
            for h in self._handles
        ]

    def driver_version(self) -> str | None:
        try:
            return _text(self._nv.nvmlSystemGetDriverVersion())
        except Exception:
            return None

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception:
            pass


def _serial(value: Any) -> int | None:
    """An ASIC serial as a number; None when unreadable ("N/A", empty, zero)."""
    try:
        number = int(str(value), 16)
    except (TypeError, ValueError):
        return None
    return number or None


class AmdSmiBackend(_Fields):
    """AMD cards through AMD SMI (the amdsmi Python package of ROCm 6.x/7.x)."""

    name = "amdsmi"

    def __init__(self) -> None:
        amdsmi = _import_quietly("amdsmi")
        self._smi = amdsmi
        self.problems = []
        self.physical_count: int | None = None
        amdsmi.amdsmi_init()
        try:
            self._handles = list(amdsmi.amdsmi_get_processor_handles())
            self.count = len(self._handles)
        except BaseException:
            self.close()
            raise

    def _total(self, i: int, handle: Any) -> int | None:
        """Total VRAM in bytes (amdsmi_get_gpu_memory_total), else vram_usage's MiB."""
        smi = self._smi
        try:
            return int(smi.amdsmi_get_gpu_memory_total(handle, smi.AmdSmiMemoryType.VRAM))
        except Exception as err:
            first = _one_line(err)
        try:
            return int(smi.amdsmi_get_gpu_vram_usage(handle)["vram_total"]) * MIB
        except Exception as err:
            self.problems.append(f"card {i} total VRAM: {first}; {_one_line(err)}")
            return None

    def _partition_mode(self, handle: Any) -> str | None:
        try:
            mode = _text(self._smi.amdsmi_get_gpu_compute_partition(handle)).strip()
        except Exception:  # not supported before MI300
            return None
        return mode if mode and mode.upper() != "N/A" else None

    def devices(self) -> list[dict]:
        smi = self._smi
        infos = [
            self._field(f"card {i} asic info", smi.amdsmi_get_gpu_asic_info, h) or {}
            for i, h in enumerate(self._handles)
        ]
        modes = [self._partition_mode(h) for h in self._handles]
        # Partitions of one card share its serial ("0x..."); unknown serials count nothing.
        serials = [_serial(info.get("asic_serial")) for info in infos]
        known = bool(serials) and all(serials)
        self.physical_count = len(set(serials)) if known else None
        shared = self.physical_count is not None and self.physical_count < len(serials)
        out = []
        for i, h in enumerate(self._handles):
            mode = modes[i]
            split = bool(mode) and mode.upper() in _SPLIT_MODES
            name = infos[i].get("market_name")
            arch = infos[i].get("target_graphics_version")  # absent before ROCm 6.3
            out.append(
                {
                    "index": i,
                    "name": None if name is None else _text(name),
                    "total_bytes": self._total(i, h),
                    "arch": None if arch is None else _text(arch),
                    "partition": (mode or "shared card") if split or shared else None,
                }
            )
        return out

    def _used(self, handle: Any) -> int:
        smi = self._smi
        try:  # bytes, exact
            return int(smi.amdsmi_get_gpu_memory_usage(handle, smi.AmdSmiMemoryType.VRAM))
        except Exception:  # older library or unsupported: MB
            return int(smi.amdsmi_get_gpu_vram_usage(handle)["vram_used"]) * MIB

    def used_bytes(self) -> list[int]:
        return [self._used(h) for h in self._handles]

    def _clock(self, handle: Any, clk_type: Any) -> float | None:
        try:
            info = self._smi.amdsmi_get_clock_info(handle, clk_type)
        except Exception:
            return None
        # "clk" since ROCm 6.2, "cur_clk" before; MHz; "N/A" when not supported.
        return _number(info.get("clk", info.get("cur_clk")), sentinels=_AMD_SENTINELS)

    def _temperature(self, handle: Any) -> float | None:
        # Hotspot (junction) first: MI300-class cards (SMU 13.0.6) have no edge sensor, and
        # amd-smi itself shows edge as N/A there. Degrees C; 0 means no reading.
        smi = self._smi
        for sensor in ("HOTSPOT", "EDGE"):
            try:
                value = _number(
                    smi.amdsmi_get_temp_metric(
                        handle,
                        getattr(smi.AmdSmiTemperatureType, sensor),
                        smi.AmdSmiTemperatureMetric.CURRENT,
                    ),
                    sentinels=_AMD_SENTINELS,
                )
            except Exception:
                continue
            if value:
                return value
        return None

    def _power(self, handle: Any) -> float | None:
        # Watts. current_socket_power (MI300 and later), average_socket_power (older cards),
        # socket_power (7.x); each may be "N/A".
        try:
            info = self._smi.amdsmi_get_power_info(handle)
        except Exception:
            return None
        for key in ("current_socket_power", "average_socket_power", "socket_power"):
            value = _number(info.get(key), sentinels=_AMD_SENTINELS)
            if value:
                return value
        return None

    def state(self) -> list[dict]:
        smi = self._smi
        rows = []
        for h in self._handles:
            row = dict.fromkeys(STATE_FIELDS)
            try:
                row["sm_clock_mhz"] = self._clock(h, smi.AmdSmiClkType.GFX)
                row["mem_clock_mhz"] = self._clock(h, smi.AmdSmiClkType.MEM)
                row["temperature_c"] = self._temperature(h)
                row["power_w"] = self._power(h)
            except Exception:
                pass
            rows.append(row)
        return rows

    def driver_version(self) -> str | None:
        try:
            return _text(self._smi.amdsmi_get_gpu_driver_info(self._handles[0])["driver_version"])
        except Exception:
            return None

    def close(self) -> None:
        try:
            self._smi.amdsmi_shut_down()
        except Exception:
            pass


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


def _gib(value: float | None) -> float | None:
    return None if value is None else round(value / GIB, 3)


def _stats(values: list[float]) -> dict:
    if not values:
        return {"min": None, "median": None, "max": None}
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


class VramPoller:
    """Samples every card's used VRAM from a daemon thread; see the module docstring.

    Usage: ``with VramPoller(run_dir): run()`` or ``p.start(); ...; summary = p.stop()``.
    ``state_interval_s``: seconds between clock/temperature/power reads (<= 0: none).
    ``name``: the files' stem, ``<name>.jsonl`` and ``<name>.json`` (one node of a multi-node
    run writes ``vram_node_<node>``: bench/nodevram.py).
    """

    def __init__(
        self,
        run_dir: str | Path,
        interval_s: float = 0.05,
        backend: str = "auto",
        baseline_samples: int = 5,
        state_interval_s: float = 1.0,
        name: str = "vram",
    ) -> None:
        self.run_dir = Path(run_dir)
        self.name = name
        self.interval_s = float(interval_s)
        self.state_interval_s = float(state_interval_s or 0.0)
        self.prefer = backend
        self.baseline_samples = max(1, int(baseline_samples))
        self.n_samples = 0
        self.n_state_samples = 0
        self.errors = 0
        self.reason: str | None = None
        self._backend: Backend | None = None
        self._devices: list[dict] = []
        self._driver: str | None = None
        self._baseline: list[float] | None = None
        self._peak: list[int] | None = None
        self._state: list[dict[str, list[float]]] = []
        self._state_n: list[int] = []
        self._buffer: list[dict] = []
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._summary: dict | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> VramPoller:
        """Open the backend, take the idle baseline, start sampling. Never raises."""
        if self._started:
            return self
        self._started = True
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._backend, reason = open_backend(self.prefer)
            if self._backend is None:
                self.reason = reason
                return self
            self._devices = self._backend.devices()
            for problem in getattr(self._backend, "problems", None) or []:
                self._note(problem)  # a missing name or total does not stop the polling
            self._state = [{f: [] for f in STATE_FIELDS} for _ in self._devices]
            self._state_n = [0] * len(self._devices)
            self._driver = self._backend.driver_version()
            self._take_baseline()
            self._thread = threading.Thread(target=self._loop, name="vram-poller", daemon=True)
            self._thread.start()
        except Exception as err:
            self._error(err)
        return self

    def stop(self) -> dict:
        """Stop sampling, write <name>.json, close the backend; returns the summary. Never raises."""
        if self._summary is not None:
            return self._summary
        try:
            hung = False
            if self._thread is not None:
                self._stop_event.set()
                self._thread.join(timeout=max(5.0, 10 * self.interval_s))
                hung = self._thread.is_alive()
                if hung:
                    self._error(RuntimeError("poller thread did not stop"))
            self._flush()
            if self._backend is not None and not hung:
                self._backend.close()
        except Exception as err:
            self._error(err)
        if not self._started and self.reason is None:
            self.reason = "poller was never started"
        self._summary = self.summary()
        try:
            atomic_write_json(self.run_dir / f"{self.name}.json", self._summary)
        except Exception:
            pass
        return self._summary

    def __enter__(self) -> VramPoller:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- results -----------------------------------------------------------------------

    def summary(self) -> dict:
        """The vram.json object (docs/run-contract.md) for what has been sampled so far."""
        ok = self.n_samples > 0
        devices = []
        for i, dev in enumerate(self._devices):
            base = self._baseline[i] if self._baseline else None
            peak = self._peak[i] if self._peak and ok else None
            delta = peak - base if peak is not None and base is not None else None
            fields = self._state[i] if i < len(self._state) else {}
            state: dict[str, Any] = {f: _stats(fields.get(f) or []) for f in STATE_FIELDS}
            state["n"] = self._state_n[i] if i < len(self._state_n) else 0
            devices.append(
                {
                    "index": dev["index"],
                    "name": dev["name"],
                    "total_gib": _gib(dev["total_bytes"]),
                    "baseline_used_gib": _gib(base),
                    "peak_used_gib": _gib(peak),
                    "peak_delta_gib": _gib(delta),
                    "partition": dev.get("partition"),
                    "state": state,
                }
            )
        reason = self.reason if ok or self.reason else "no VRAM sample succeeded"
        return {
            "backend": self._backend.name if self._backend is not None else "none",
            "status": "ok" if ok else "unavailable",
            "reason": reason,
            "interval_s": self.interval_s,
            "state_interval_s": self.state_interval_s,
            "n_samples": self.n_samples,
            "errors": self.errors,
            "driver_version": self._driver,
            "partitioned": any(d.get("partition") for d in self._devices),
            "physical_count": getattr(self._backend, "physical_count", None),
            "devices": devices,
        }

    # -- sampling ----------------------------------------------------------------------

    def _error(self, err: BaseException) -> None:
        self._note(_one_line(err))

    def _note(self, line: str) -> None:
        self.errors += 1
        if self.reason is None:
            self.reason = line[:300]

    def _take_baseline(self) -> None:
        rows = []
        for i in range(self.baseline_samples):
            if i:
                time.sleep(min(self.interval_s, 0.01))
            try:
                rows.append(self._backend.used_bytes())
            except Exception as err:
                self._error(err)
        if rows:
            self._baseline = [sum(col) / len(col) for col in zip(*rows)]

    def _sample(self) -> None:
        try:
            used = self._backend.used_bytes()
        except Exception as err:
            self._error(err)
            return
        self._peak = used if self._peak is None else [max(a, b) for a, b in zip(self._peak, used)]
        self.n_samples += 1
        self._buffer.append({"t": round(time.time(), 3), "used_gib": [round(u / GIB, 3) for u in used]})

    def _sample_state(self) -> None:
        try:
            rows = self._backend.state()
        except Exception as err:  # backends do not raise here; a broken one is counted once per read
            self._error(err)
            return
        self.n_state_samples += 1
        # Also a timed row in <name>.jsonl, so aggregation can take the state over a run's measured
        # steps alone (a run's start, with its cards idle, would otherwise weigh in the medians).
        self._buffer.append(
            {
                "t": round(time.time(), 3),
                "state": [{f: r.get(f) if isinstance(r, dict) else None for f in STATE_FIELDS} for r in rows],
            }
        )
        for i, row in enumerate(rows[: len(self._state)]):
            self._state_n[i] += 1
            for f in STATE_FIELDS:
                value = row.get(f) if isinstance(row, dict) else None
                if isinstance(value, int | float) and not isinstance(value, bool):
                    self._state[i][f].append(float(value))

    def _flush(self) -> None:
        rows, self._buffer = self._buffer, []
        if not rows:
            return
        try:  # one open per flush, not per sample (a batched fileio.append_jsonl)
            with open(self.run_dir / f"{self.name}.jsonl", "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
                f.flush()
        except Exception as err:
            self._error(err)

    def _loop(self) -> None:
        next_flush = time.monotonic() + FLUSH_EVERY_S
        next_sample = time.monotonic()
        next_state = time.monotonic()
        while True:
            try:
                self._sample()
                now = time.monotonic()
                if self.state_interval_s > 0 and now >= next_state:
                    self._sample_state()
                    next_state = now + self.state_interval_s
                if time.monotonic() >= next_flush:
                    self._flush()
                    next_flush = time.monotonic() + FLUSH_EVERY_S
            except Exception as err:
                self._error(err)
            next_sample += self.interval_s
            if self._stop_event.wait(max(0.0, next_sample - time.monotonic())):
                return
