"""What a VRAM backend is, and what every backend shares.

``Backend`` is the Protocol the poller, ``hardware.detect()`` and ``poll_once()`` use: one
management library's view of every card (bench/probe/nvml.py for NVIDIA, bench/probe/amd.py
for AMD). Here too: the helpers that read a library's values (never raising), the quiet
import of a library (``LibraryImportError``), and the units and state fields they all give.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable
from typing import Any, Protocol

GIB = 2**30
STATE_FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w")


def _one_line(err: BaseException) -> str:
    msg = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {' '.join(m.strip() for m in msg)}" if msg else type(err).__name__
    return text[:300]


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


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
    temperature_c, power_w}``, None for any value the library cannot give (never raises);
    ``reserved_bytes()``: per card, memory the driver reserves apart from ``used`` (None when the
    library does not say); ``processes()``: per card, ``{pid, used_bytes}`` of the processes
    holding memory there (never raises); ``energy()``: per card ``{energy_j, power_w}`` for the
    energy of a run, read often (docs/run-contract.md): ``energy_j`` the card's energy counter in
    joules (since the driver loaded; None where the card has none), ``power_w`` its power only
    where there is no counter (never raises); ``power_limit_w()``: per card, the power limit in
    force, read and never set (None where the library cannot say; never raises)."""

    name: str
    count: int
    memory_api: str  # which call ``used_bytes`` is (nvml_v2, nvml_v1, amdsmi): what "used" counts
    problems: list[str]  # one line per device field that could not be read by devices()

    def devices(self) -> list[dict]: ...
    def used_bytes(self) -> list[int]: ...
    def reserved_bytes(self) -> list[int | None]: ...
    def processes(self) -> list[list[dict]]: ...
    def state(self) -> list[dict]: ...
    def energy(self) -> list[dict]: ...
    def power_limit_w(self) -> list[float | None]: ...
    def driver_version(self) -> str | None: ...
    def close(self) -> None: ...


class _Support:
    """Calls a card may not support, tried until they first fail and never again after that
    (an unsupported call costs an exception and a driver round trip at every read)."""

    def __init__(self) -> None:
        self._works: dict[tuple[str, int], bool] = {}

    def read(self, kind: str, card: int, fn: Callable[[], Any]) -> Any:
        """``fn()``, or None when it fails (then, if it never worked on this card, never again)."""
        works = self._works.get((kind, card))
        if works is False:
            return None
        try:
            value = fn()
        except Exception:
            if works is None:
                self._works[(kind, card)] = False
            return None
        self._works[(kind, card)] = True
        return value


class _Fields:
    """Reads device fields one by one: a failing field is None and one line in ``problems``."""

    problems: list[str]

    def _field(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as err:
            self.problems.append(f"{what}: {_one_line(err)}")
            return None
