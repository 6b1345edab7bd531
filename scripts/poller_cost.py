"""What the VRAM poller's reads cost on this machine, in one line.

Usage: python scripts/poller_cost.py [--backend auto|nvml|amdsmi|fake] [--reads 200] [--seconds 5]

Per read of every card (median of ``--reads`` calls): the memory read (``used_bytes``, every
``interval_s``), the state read (``state``: clocks, temperature, power, once a second), the energy
read (``energy``: the energy counter or the power, every ``power_interval_s``) and the process list
(with each state read); what the energy read gave (counter or power); how often the first card's
counter changes value (its update period: readings faster than that resolve nothing); and the CPU
time of a real ``VramPoller`` over ``--seconds`` with its default energy reads and with them off,
as a percentage of one core. Nothing is ever set on a card. Without a management library (or with
``--backend fake``) a pure-Python fake backend stands in: the numbers are then the poller's own
Python cost, not the library's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.probe import poller as poller_module  # noqa: E402
from bench.probe.opener import open_backend  # noqa: E402
from bench.probe.poller import POWER_INTERVAL_S, VramPoller  # noqa: E402


class FakeBackend:
    """Constant readings from pure Python (no library): the poller's own cost."""

    name = "fake"
    memory_api = "fake"

    def __init__(self, count: int = 1) -> None:
        self.count, self.problems, self._t0 = count, [], time.monotonic()

    def devices(self) -> list[dict]:
        return [{"index": i, "name": "fake", "total_bytes": 2**37, "arch": None, "partition": None}
                for i in range(self.count)]  # fmt: skip

    def used_bytes(self) -> list[int]:
        return [2**34] * self.count

    def reserved_bytes(self) -> list[int | None]:
        return [None] * self.count

    def processes(self) -> list[list[dict]]:
        return [[] for _ in range(self.count)]

    def state(self) -> list[dict]:
        row = {"sm_clock_mhz": 1980.0, "mem_clock_mhz": 3201.0, "temperature_c": 45.0, "power_w": 650.0}
        return [dict(row) for _ in range(self.count)]

    def energy(self) -> list[dict]:
        joules = 650.0 * (time.monotonic() - self._t0)
        return [{"energy_j": joules, "power_w": None} for _ in range(self.count)]

    def driver_version(self) -> str | None:
        return None

    def close(self) -> None:
        pass


def per_read_ms(fn, reads: int) -> float:
    times = []
    for _ in range(reads):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def counter_period_s(backend, seconds: float = 1.5) -> float | None:
    """Median time between changes of the first card's energy counter, read as fast as it goes."""
    changes, last, end = [], None, time.monotonic() + seconds
    while time.monotonic() < end:
        value = backend.energy()[0].get("energy_j")
        if value is None:
            return None
        if last is not None and value != last:
            changes.append(time.monotonic())
        last = value
        time.sleep(0.001)
    gaps = [b - a for a, b in zip(changes, changes[1:])]
    return statistics.median(gaps) if gaps else None


def poller_cpu_pct(prefer: str, seconds: float, power_interval_s: float) -> float:
    """The CPU time of a VramPoller (defaults but ``power_interval_s``) over ``seconds``, as % of a core."""
    with tempfile.TemporaryDirectory() as d:
        poller = VramPoller(d, backend=prefer, power_interval_s=power_interval_s).start()
        cpu, wall = time.process_time(), time.monotonic()
        time.sleep(seconds)  # this thread sleeps: the process's CPU time is the poller thread's
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        poller.stop()
    return 100 * cpu / wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="auto", choices=["auto", "nvml", "amdsmi", "fake"])
    p.add_argument("--reads", type=int, default=200, help="calls timed per read")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds of each real-poller run")
    args = p.parse_args()
    backend, why = (None, "--backend fake") if args.backend == "fake" else open_backend(args.backend)
    prefer = args.backend
    if backend is None:
        why = "--backend fake" if args.backend == "fake" else "no management library opened here"
        backend, prefer = FakeBackend(), "fake"
        poller_module.open_backend = lambda _prefer: (FakeBackend(), None)  # the real poller, on the fake
    try:
        ms = {
            what: per_read_ms(getattr(backend, what), args.reads)
            for what in ("used_bytes", "state", "energy", "processes")
        }
        first = backend.energy()
        source = "energy counter" if all(r.get("energy_j") is not None for r in first) else "power"
        period = counter_period_s(backend) if source == "energy counter" and prefer != "fake" else None
    finally:
        backend.close()
    on = poller_cpu_pct(prefer, args.seconds, POWER_INTERVAL_S)
    off = poller_cpu_pct(prefer, args.seconds, 0.0)
    label = backend.name if backend.name != "fake" else f"fake ({why})"
    reads = ", ".join(f"{k} {1e3 * v:.1f} µs" for k, v in ms.items())
    step = f"counter steps every {period:.3f} s" if period else "counter period not measured"
    print(
        f"poller cost [{label}, {backend.count} card(s)]: per read of every card {reads}; energy read gives "
        f"{source}, {step}; poller thread {on:.2f}% of a core with energy reads every {POWER_INTERVAL_S:g} s, "
        f"{off:.2f}% without (interval_s 0.05, state every 1 s, {args.seconds:g} s each)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
