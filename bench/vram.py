"""VRAM polling: NVML on NVIDIA, AMD SMI on AMD, nothing on CPU.

Every card of the machine is polled (not only the ones a run uses). ``VramPoller`` samples
from a daemon thread, appends ``{"t", "used_gib"}`` lines to ``vram.jsonl`` about once a
second and writes the ``vram.json`` summary (docs/run-contract.md) on ``stop()``. A poller
failure never raises: a missing library gives status "unavailable" with a reason, and
errors while sampling are counted. The management libraries are imported lazily, so this
module imports anywhere.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from bench.fileio import atomic_write_json

GIB = 2**30
MIB = 2**20  # AMD SMI's "MB" are MiB
FLUSH_EVERY_S = 1.0


def _one_line(err: BaseException) -> str:
    msg = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {msg[0]}" if msg else type(err).__name__
    return text[:300]


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Backend(Protocol):
    name: str
    count: int

    def devices(self) -> list[dict]: ...
    def used_bytes(self) -> list[int]: ...
    def driver_version(self) -> str | None: ...
    def close(self) -> None: ...


class NvmlBackend:
    """NVIDIA cards through NVML (physical numbering; CUDA_VISIBLE_DEVICES is ignored)."""

    name = "nvml"

    def __init__(self) -> None:
        import pynvml

        self._nv = pynvml
        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.count = len(self._handles)
        except BaseException:
            self.close()
            raise

    def devices(self) -> list[dict]:
        return [
            {
                "index": i,
                "name": _text(self._nv.nvmlDeviceGetName(h)),
                "total_bytes": int(self._nv.nvmlDeviceGetMemoryInfo(h).total),
            }
            for i, h in enumerate(self._handles)
        ]

    def used_bytes(self) -> list[int]:
        return [int(self._nv.nvmlDeviceGetMemoryInfo(h).used) for h in self._handles]

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


class AmdSmiBackend:
    """AMD cards through AMD SMI (amdsmi 7.x)."""

    name = "amdsmi"

    def __init__(self) -> None:
        import amdsmi

        self._smi = amdsmi
        amdsmi.amdsmi_init()
        try:
            self._handles = list(amdsmi.amdsmi_get_processor_handles())
            self.count = len(self._handles)
        except BaseException:
            self.close()
            raise

    def devices(self) -> list[dict]:
        smi = self._smi
        return [
            {
                "index": i,
                "name": _text(smi.amdsmi_get_gpu_asic_info(h)["market_name"]),
                "total_bytes": int(smi.amdsmi_get_gpu_vram_usage(h)["vram_total"]) * MIB,
            }
            for i, h in enumerate(self._handles)
        ]

    def _used(self, handle: Any) -> int:
        smi = self._smi
        try:  # bytes, exact
            return int(smi.amdsmi_get_gpu_memory_usage(handle, smi.AmdSmiMemoryType.VRAM))
        except Exception:  # older library or unsupported: MB
            return int(smi.amdsmi_get_gpu_vram_usage(handle)["vram_used"]) * MIB

    def used_bytes(self) -> list[int]:
        return [self._used(h) for h in self._handles]

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
        except Exception as err:  # import (ImportError/OSError) or init failure
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
                "total_gib": d["total_bytes"] / GIB,
            }
            for d, u in zip(b.devices(), used)
        ]
    except Exception:
        return []
    finally:
        b.close()


def _gib(value: float | None) -> float | None:
    return None if value is None else round(value / GIB, 3)


class VramPoller:
    """Samples every card's used VRAM from a daemon thread; see the module docstring.

    Usage: ``with VramPoller(run_dir): run()`` or ``p.start(); ...; summary = p.stop()``.
    """

    def __init__(
        self,
        run_dir: str | Path,
        interval_s: float = 0.05,
        backend: str = "auto",
        baseline_samples: int = 5,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.interval_s = float(interval_s)
        self.prefer = backend
        self.baseline_samples = max(1, int(baseline_samples))
        self.n_samples = 0
        self.errors = 0
        self.reason: str | None = None
        self._backend: Backend | None = None
        self._devices: list[dict] = []
        self._driver: str | None = None
        self._baseline: list[float] | None = None
        self._peak: list[int] | None = None
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
            self._driver = self._backend.driver_version()
            self._take_baseline()
            self._thread = threading.Thread(target=self._loop, name="vram-poller", daemon=True)
            self._thread.start()
        except Exception as err:
            self._error(err)
        return self

    def stop(self) -> dict:
        """Stop sampling, write vram.json, close the backend; returns the summary. Never raises."""
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
            atomic_write_json(self.run_dir / "vram.json", self._summary)
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
            devices.append(
                {
                    "index": dev["index"],
                    "name": dev["name"],
                    "total_gib": _gib(dev["total_bytes"]),
                    "baseline_used_gib": _gib(base),
                    "peak_used_gib": _gib(peak),
                    "peak_delta_gib": _gib(delta),
                }
            )
        reason = self.reason if ok or self.reason else "no VRAM sample succeeded"
        return {
            "backend": self._backend.name if self._backend is not None else "none",
            "status": "ok" if ok else "unavailable",
            "reason": reason,
            "interval_s": self.interval_s,
            "n_samples": self.n_samples,
            "errors": self.errors,
            "driver_version": self._driver,
            "devices": devices,
        }

    # -- sampling ----------------------------------------------------------------------

    def _error(self, err: BaseException) -> None:
        self.errors += 1
        if self.reason is None:
            self.reason = _one_line(err)

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

    def _flush(self) -> None:
        rows, self._buffer = self._buffer, []
        if not rows:
            return
        try:  # one open per flush, not per sample (a batched fileio.append_jsonl)
            with open(self.run_dir / "vram.jsonl", "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
                f.flush()
        except Exception as err:
            self._error(err)

    def _loop(self) -> None:
        next_flush = time.monotonic() + FLUSH_EVERY_S
        next_sample = time.monotonic()
        while True:
            try:
                self._sample()
                if time.monotonic() >= next_flush:
                    self._flush()
                    next_flush = time.monotonic() + FLUSH_EVERY_S
            except Exception as err:
                self._error(err)
            next_sample += self.interval_s
            if self._stop_event.wait(max(0.0, next_sample - time.monotonic())):
                return
