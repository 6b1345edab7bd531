"""The VRAM poller of one run: ``VramPoller`` samples every card from a daemon thread.

Every card of the machine is polled (not only the ones a run uses). ``VramPoller`` appends
``{"t", "used_gib"}`` lines to ``vram.jsonl`` about once a second and writes the ``vram.json``
summary (docs/run-contract.md) on ``stop()``. In the same thread, at most once per
``state_interval_s``, it reads each card's clocks, temperature and power (read only; nothing
is ever set) and summarizes them per card; at most once per ``power_interval_s`` (0.1 s) it
reads each card's energy counter, or its power where there is none, into timed rows for the
energy of the run's measured steps (bench/results/energy.py). With ``per_process`` it also reads,
at every sample, the memory each process holds on each card (``Backend.processes``: NVML's running
processes, AMD SMI's process list) and keeps each process's peak (``process_peaks`` in the summary):
what a lockstep pair's two runs, sharing one card, each held (bench/probe/pairvram.py). It never
raises: a missing library gives status "unavailable" with a reason, and errors while sampling are
counted.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from bench.fileio import atomic_write_json
from bench.probe.backends import GIB, STATE_FIELDS, Backend, _one_line
from bench.probe.opener import open_backend
from bench.probe.processes import ProcessLog

FLUSH_EVERY_S = 1.0
# Seconds between energy reads. 1 s (the state rows') leaves a 12-s measured window about 12
# readings, each end of it up to a second from the nearest, and the trainer exits within a
# second of its last step, so often no reading follows the window (9 of results/h200's 18 runs
# at 14a81195fd82). On the H200 (driver 580.159.04) NVML's energy counter steps every 0.1 s and
# one read of it takes 3.2 ms (scripts/poller_cost.py): at 0.1 s the poller thread used 4-11% of
# a core; at 0.25 s, 2.6% (0.5% without energy reads): 48 readings in a 12-s window, each end
# within 0.25 s of one; the nopoll arm shows no slowdown (results/h200-noise).
POWER_INTERVAL_S = 0.25


def _gib(value: float | None) -> float | None:
    return None if value is None else round(value / GIB, 3)


def _rounded(value: object) -> float | None:
    """A reading as written to the jsonl: to 1e-3 (mJ, mW), None for anything not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return round(float(value), 3)


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
    ``power_interval_s``: seconds between energy reads (``Backend.energy``; <= 0: none).
    ``name``: the files' stem, ``<name>.jsonl`` and ``<name>.json`` (one node of a multi-node
    run writes ``vram_node_<node>``: bench/probe/nodevram.py).
    ``per_process``: each process's memory per card read at every sample, its peak kept.
    """

    def __init__(
        self,
        run_dir: str | Path,
        interval_s: float = 0.05,
        backend: str = "auto",
        baseline_samples: int = 5,
        state_interval_s: float = 1.0,
        name: str = "vram",
        power_interval_s: float = POWER_INTERVAL_S,
        per_process: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.name = name
        self.interval_s = float(interval_s)
        self.state_interval_s = float(state_interval_s or 0.0)
        self.power_interval_s = float(power_interval_s or 0.0)
        self.prefer = backend
        self.baseline_samples = max(1, int(baseline_samples))
        self.n_samples = 0
        self.n_state_samples = 0
        self.n_power_samples = 0
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
        self._procs = ProcessLog()
        self._reserved: list[int | None] = []
        self.per_process = bool(per_process)
        self._proc_peaks: dict[tuple[int, int], list[int]] = {}  # (card, pid) -> [peak bytes, samples]

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
            self._reserved = self._read("reserved_bytes") or []
            self._procs.add(self._read("processes"), "before")
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
                elif self.power_interval_s > 0:
                    self._sample_power()  # after the run's processes ended: a reading past its last step
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
                    "reserved_gib": _gib(self._reserved[i]) if i < len(self._reserved) else None,
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
            "power_interval_s": self.power_interval_s,
            "n_power_samples": self.n_power_samples,
            "n_samples": self.n_samples,
            "errors": self.errors,
            "driver_version": self._driver,
            "partitioned": any(d.get("partition") for d in self._devices),
            "physical_count": getattr(self._backend, "physical_count", None),
            "memory_api": getattr(self._backend, "memory_api", None),
            "devices": devices,
            "processes": self._procs.summary(),
            **({"process_peaks": self._process_peaks()} if self.per_process else {}),
        }

    def _process_peaks(self) -> list[dict]:
        """Per (card, pid) seen at the samples: its largest memory and in how many samples it was seen."""
        return [
            {"card": card, "pid": pid, "peak_used_gib": _gib(peak), "n_samples": n}
            for (card, pid), (peak, n) in sorted(self._proc_peaks.items())
        ]

    # -- sampling ----------------------------------------------------------------------

    def _error(self, err: BaseException) -> None:
        self._note(_one_line(err))

    def _note(self, line: str) -> None:
        self.errors += 1
        if self.reason is None:
            self.reason = line[:300]

    def _read(self, what: str) -> list | None:
        """``backend.<what>()`` (reserved_bytes, processes), None where it fails or is absent."""
        fn = getattr(self._backend, what, None)
        try:
            return fn() if fn is not None else None
        except Exception as err:
            self._error(err)
            return None

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
        if self.per_process:
            self._sample_processes()

    def _sample_processes(self) -> None:
        """Each process's memory per card now, into its peak (a process NVML lists without a figure
        counts as seen, not as 0 bytes)."""
        for card, procs in enumerate(self._read("processes") or []):
            for p in procs or []:
                if not isinstance(p, dict) or not isinstance(p.get("pid"), int):
                    continue
                peak = self._proc_peaks.setdefault((card, p["pid"]), [None, 0])
                used = p.get("used_bytes")
                peak[1] += 1
                if isinstance(used, int | float) and (peak[0] is None or used > peak[0]):
                    peak[0] = int(used)

    def _sample_state(self) -> None:
        try:
            rows = self._backend.state()
        except Exception as err:  # backends do not raise here; a broken one is counted once per read
            self._error(err)
            return
        self.n_state_samples += 1
        self._procs.add(self._read("processes"), "during")
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

    def _sample_power(self) -> None:
        """One timed row of every card's energy counter (J) and, where a card has none, its power
        (W), stamped at the middle of the read; no row when no card gave either."""
        read = getattr(self._backend, "energy", None)
        if read is None:
            return
        before = time.time()
        try:
            rows = read()
        except Exception as err:  # backends do not raise here; a broken one is counted once per read
            self._error(err)
            return
        t = (before + time.time()) / 2
        rows = [r if isinstance(r, dict) else {} for r in rows]
        energy = [_rounded(r.get("energy_j")) for r in rows]
        power = [_rounded(r.get("power_w")) for r in rows]
        if all(v is None for v in energy + power):
            return
        self.n_power_samples += 1
        self._buffer.append({"t": round(t, 3), "energy_j": energy, "power_w": power})

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
        next_state = next_power = time.monotonic()
        while True:
            try:
                self._sample()
                now = time.monotonic()
                if self.state_interval_s > 0 and now >= next_state:
                    self._sample_state()
                    next_state = now + self.state_interval_s
                if self.power_interval_s > 0 and now >= next_power:
                    self._sample_power()
                    # On a grid, not from now: a read that lands a tick late would stretch every
                    # interval by that tick (0.1 s of reads at 0.05-s ticks would come every 0.15 s).
                    next_power = max(next_power + self.power_interval_s, now)
                if time.monotonic() >= next_flush:
                    self._flush()
                    next_flush = time.monotonic() + FLUSH_EVERY_S
            except Exception as err:
                self._error(err)
            next_sample += self.interval_s
            if self._stop_event.wait(max(0.0, next_sample - time.monotonic())):
                return
