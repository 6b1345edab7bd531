"""VRAM pollers against fake pynvml / amdsmi modules with scripted memory values."""

from __future__ import annotations

import builtins
import sys
import time
import types

import pytest

from bench import vram
from bench.fileio import read_json, read_jsonl

GIB = 2**30
MIB = 2**20
INTERVAL = 0.005
BASELINE = 3
# Calls to the memory query made by VramPoller.start() before the thread runs:
# one in devices() (NVML reads .total there) and one per baseline sample.
NVML_PREFIX = 1 + BASELINE


class NVMLError(Exception):
    """Stands in for pynvml.NVMLError."""


class AmdSmiException(Exception):
    """Stands in for amdsmi.AmdSmiException."""


class Script:
    """Per-card sequences of values, one consumed per query; the last one repeats.

    A value that is an exception instance is raised instead of returned.
    """

    def __init__(self, per_card: list[list]) -> None:
        self.per_card = per_card
        self.calls = [0] * len(per_card)

    def next(self, card: int):
        seq = self.per_card[card]
        value = seq[min(self.calls[card], len(seq) - 1)]
        self.calls[card] += 1
        if isinstance(value, BaseException):
            raise value
        return value


def fake_pynvml(script: Script, names=None, total=80 * GIB, init_error=None) -> types.ModuleType:
    """A module with exactly the NVML calls bench.vram may use."""
    mod = types.ModuleType("pynvml")
    n = len(script.per_card)
    names = names or [b"NVIDIA H200"] * n
    mod.state = {"init": 0, "shutdown": 0}

    def nvmlInit():
        if init_error is not None:
            raise init_error
        mod.state["init"] += 1

    def nvmlDeviceGetCount():
        return n

    def nvmlDeviceGetHandleByIndex(i):
        return ("nvml-handle", i)

    def nvmlDeviceGetMemoryInfo(h):
        return types.SimpleNamespace(used=script.next(h[1]), total=total, free=0)

    def nvmlDeviceGetName(h):
        return names[h[1]]

    def nvmlSystemGetDriverVersion():
        return b"550.54.15"

    def nvmlShutdown():
        mod.state["shutdown"] += 1

    for fn in (
        nvmlInit,
        nvmlDeviceGetCount,
        nvmlDeviceGetHandleByIndex,
        nvmlDeviceGetMemoryInfo,
        nvmlDeviceGetName,
        nvmlSystemGetDriverVersion,
        nvmlShutdown,
    ):
        setattr(mod, fn.__name__, fn)
    mod.NVMLError = NVMLError
    return mod


def fake_amdsmi(script: Script, memory_usage_works=True, total_mb=288 * 1024) -> types.ModuleType:
    """A module with exactly the AMD SMI calls bench.vram may use.

    ``script`` holds bytes when ``memory_usage_works`` else MB (the vram_usage fallback).
    """
    mod = types.ModuleType("amdsmi")
    n = len(script.per_card)
    mod.state = {"shutdown": 0, "memory_usage_calls": 0}

    class AmdSmiLibraryException(AmdSmiException):
        pass

    class AmdSmiMemoryType:
        VRAM = 0

    def amdsmi_init():
        pass

    def amdsmi_get_processor_handles():
        return [("amd-handle", i) for i in range(n)]

    def amdsmi_get_gpu_memory_usage(h, mem_type):
        assert mem_type == AmdSmiMemoryType.VRAM
        mod.state["memory_usage_calls"] += 1
        if not memory_usage_works:
            raise AmdSmiLibraryException("AMDSMI_STATUS_NOT_SUPPORTED")
        return script.next(h[1])

    def amdsmi_get_gpu_vram_usage(h):
        used = script.next(h[1]) if not memory_usage_works else 0
        return {"vram_total": total_mb, "vram_used": used}

    def amdsmi_get_gpu_asic_info(h):
        return {"market_name": "AMD Instinct MI355X"}

    def amdsmi_get_gpu_driver_info(h):
        return {"driver_version": "6.12.12"}

    def amdsmi_shut_down():
        mod.state["shutdown"] += 1

    for fn in (
        amdsmi_init,
        amdsmi_get_processor_handles,
        amdsmi_get_gpu_memory_usage,
        amdsmi_get_gpu_vram_usage,
        amdsmi_get_gpu_asic_info,
        amdsmi_get_gpu_driver_info,
        amdsmi_shut_down,
    ):
        setattr(mod, fn.__name__, fn)
    mod.AmdSmiException = AmdSmiException
    mod.AmdSmiMemoryType = AmdSmiMemoryType
    return mod


@pytest.fixture
def no_libs(monkeypatch):
    """Neither management library importable (a None entry makes `import` raise ImportError)."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)


def install(monkeypatch, pynvml=None, amdsmi=None) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    monkeypatch.setitem(sys.modules, "amdsmi", amdsmi)


def run_until(poller: vram.VramPoller, n_samples: int, timeout: float = 5.0) -> dict:
    poller.start()
    deadline = time.monotonic() + timeout
    while poller.n_samples < n_samples and time.monotonic() < deadline:
        time.sleep(INTERVAL)
    return poller.stop()


def make_poller(tmp_path, backend="auto") -> vram.VramPoller:
    return vram.VramPoller(tmp_path / "run", interval_s=INTERVAL, backend=backend, baseline_samples=BASELINE)


# -- NVML --------------------------------------------------------------------------------


def test_peak_and_baseline_over_scripted_samples(tmp_path, monkeypatch):
    idle = [1 * GIB] * NVML_PREFIX
    script = Script([idle + [30 * GIB, 50 * GIB, 20 * GIB], [2 * GIB]])
    install(monkeypatch, pynvml=fake_pynvml(script))
    summary = run_until(make_poller(tmp_path), 10)

    assert summary["status"] == "ok" and summary["backend"] == "nvml"
    assert summary["errors"] == 0 and summary["reason"] is None
    card0, card1 = summary["devices"]
    assert card0["baseline_used_gib"] == 1.0  # taken before the busy samples
    assert card0["peak_used_gib"] == 50.0
    assert card0["peak_delta_gib"] == 49.0
    assert card1["peak_used_gib"] == 2.0 and card1["peak_delta_gib"] == 0.0
    assert card0["total_gib"] == 80.0
    assert sys.modules["pynvml"].state["shutdown"] == 1


def test_every_card_polled_and_busiest_is_card0(tmp_path, monkeypatch):
    busy = [0.5 * GIB] * NVML_PREFIX + [70 * GIB, 90 * GIB, 10 * GIB]
    script = Script([busy] + [[0.5 * GIB]] * 7)
    install(monkeypatch, pynvml=fake_pynvml(script))
    poller = make_poller(tmp_path)
    summary = run_until(poller, 5)

    assert [d["index"] for d in summary["devices"]] == list(range(8))
    assert all(script.calls[i] >= NVML_PREFIX + 5 for i in range(8))
    peaks = [d["peak_used_gib"] for d in summary["devices"]]
    assert max(peaks) == 90.0 and sum(peaks) == pytest.approx(90 + 7 * 0.5)
    assert max(d["peak_delta_gib"] for d in summary["devices"]) == 89.5
    busiest = max(summary["devices"], key=lambda d: d["peak_used_gib"])
    assert busiest["index"] == 0

    rows = read_jsonl(tmp_path / "run" / "vram.jsonl")
    assert len(rows) == summary["n_samples"] >= 5
    assert all(len(r["used_gib"]) == 8 and isinstance(r["t"], float) for r in rows)
    assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)
    assert max(r["used_gib"][0] for r in rows) == 90.0


def test_nvml_bytes_names_are_decoded(tmp_path, monkeypatch):
    script = Script([[GIB], [GIB]])
    install(monkeypatch, pynvml=fake_pynvml(script, names=[b"NVIDIA H200", "NVIDIA H200"]))
    summary = run_until(make_poller(tmp_path), 1)
    assert [d["name"] for d in summary["devices"]] == ["NVIDIA H200", "NVIDIA H200"]
    assert summary["driver_version"] == "550.54.15"


def test_nvml_error_mid_run_is_counted_not_fatal(tmp_path, monkeypatch):
    script = Script([[GIB] * NVML_PREFIX + [NVMLError("GPU is lost"), 40 * GIB, 3 * GIB]])
    install(monkeypatch, pynvml=fake_pynvml(script))
    summary = run_until(make_poller(tmp_path), 4)

    assert summary["status"] == "ok"
    assert summary["errors"] == 1
    assert "GPU is lost" in summary["reason"]
    assert summary["devices"][0]["peak_used_gib"] == 40.0


def test_no_successful_sample_is_unavailable(tmp_path, monkeypatch):
    script = Script([[GIB, NVMLError("Unknown Error")]])  # devices() works, then every query fails
    install(monkeypatch, pynvml=fake_pynvml(script))
    poller = make_poller(tmp_path, backend="nvml")
    poller.start()
    time.sleep(0.05)
    summary = poller.stop()

    assert summary["status"] == "unavailable"
    assert summary["n_samples"] == 0 and summary["errors"] >= BASELINE
    assert "Unknown Error" in summary["reason"]
    assert summary["devices"][0]["peak_used_gib"] is None


def test_nvml_init_failure_falls_back_to_amdsmi(tmp_path, monkeypatch):
    nv = fake_pynvml(Script([[GIB]]), init_error=NVMLError("NVML Shared Library Not Found"))
    amd = fake_amdsmi(Script([[4 * GIB]]))
    install(monkeypatch, pynvml=nv, amdsmi=amd)
    backend, reason = vram.open_backend("auto")
    assert reason is None and backend.name == "amdsmi"
    backend.close()

    backend, reason = vram.open_backend("nvml")
    assert backend is None and "NVML Shared Library Not Found" in reason


# -- AMD SMI ------------------------------------------------------------------------------


def test_amdsmi_uses_memory_usage_bytes(tmp_path, monkeypatch):
    script = Script([[GIB] * BASELINE + [100 * GIB + 123, 2 * GIB]])
    amd = fake_amdsmi(script)
    install(monkeypatch, amdsmi=amd)
    summary = run_until(make_poller(tmp_path, backend="amdsmi"), 3)

    assert summary["backend"] == "amdsmi" and summary["status"] == "ok"
    dev = summary["devices"][0]
    assert dev["name"] == "AMD Instinct MI355X"
    assert dev["total_gib"] == 288.0
    assert dev["peak_used_gib"] == 100.0 and dev["baseline_used_gib"] == 1.0
    assert summary["driver_version"] == "6.12.12"
    assert amd.state["shutdown"] == 1


def test_amdsmi_falls_back_to_vram_usage_mb(tmp_path, monkeypatch):
    # devices() reads vram_usage once for the total, consuming one scripted value.
    script = Script([[1024] * (1 + BASELINE) + [65536, 2048]])
    amd = fake_amdsmi(script, memory_usage_works=False)
    install(monkeypatch, amdsmi=amd)
    summary = run_until(make_poller(tmp_path, backend="amdsmi"), 3)

    assert amd.state["memory_usage_calls"] > 0  # tried the bytes call first
    assert summary["errors"] == 0
    dev = summary["devices"][0]
    assert dev["peak_used_gib"] == 64.0 and dev["baseline_used_gib"] == 1.0


def test_amdsmi_import_oserror_is_unavailable(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "amdsmi":
            raise OSError("libamd_smi.so: cannot open shared object file")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(builtins, "__import__", fake_import)

    backend, reason = vram.open_backend("amdsmi")
    assert backend is None and "libamd_smi.so" in reason

    summary = run_until(make_poller(tmp_path), 1, timeout=0.1)
    assert summary["status"] == "unavailable" and summary["backend"] == "none"
    assert summary["devices"] == [] and summary["n_samples"] == 0
    assert "no NVML or AMD SMI" in summary["reason"] and "libamd_smi.so" in summary["reason"]
    assert read_json(tmp_path / "run" / "vram.json") == summary


# -- files, lifecycle ---------------------------------------------------------------------


def test_vram_json_atomic_and_schema(tmp_path, monkeypatch):
    install(monkeypatch, pynvml=fake_pynvml(Script([[GIB], [2 * GIB]])))
    with make_poller(tmp_path) as poller:
        deadline = time.monotonic() + 5
        while poller.n_samples < 3 and time.monotonic() < deadline:
            time.sleep(INTERVAL)
    run_dir = tmp_path / "run"
    on_disk = read_json(run_dir / "vram.json")
    assert on_disk == poller.stop()  # stop() is idempotent and returns the written summary
    assert set(on_disk) == {
        "backend",
        "status",
        "reason",
        "interval_s",
        "n_samples",
        "errors",
        "driver_version",
        "devices",
    }
    assert set(on_disk["devices"][0]) == {
        "index",
        "name",
        "total_gib",
        "baseline_used_gib",
        "peak_used_gib",
        "peak_delta_gib",
    }
    assert on_disk["interval_s"] == INTERVAL
    assert sorted(p.name for p in run_dir.iterdir()) == ["vram.json", "vram.jsonl"]  # no temp files


def test_samples_buffered_not_one_open_per_sample(tmp_path, monkeypatch):
    install(monkeypatch, pynvml=fake_pynvml(Script([[GIB]])))
    opens = []
    real_open = builtins.open

    def counting_open(*args, **kwargs):
        opens.append(args[0])
        return real_open(*args, **kwargs)

    monkeypatch.setattr(vram, "open", counting_open, raising=False)
    t0 = time.monotonic()
    summary = run_until(make_poller(tmp_path), 20)
    elapsed = time.monotonic() - t0
    assert summary["n_samples"] >= 20
    # About one flush a second plus the final one, never one open per sample.
    assert 1 <= len(opens) <= 2 + int(elapsed / vram.FLUSH_EVERY_S)
    assert len(opens) < summary["n_samples"] / 4
    assert len(read_jsonl(tmp_path / "run" / "vram.jsonl")) == summary["n_samples"]


def test_backend_none_and_unstarted_poller(tmp_path):
    summary = run_until(make_poller(tmp_path, backend="none"), 1, timeout=0.05)
    assert summary["status"] == "unavailable" and "disabled" in summary["reason"]

    unstarted = vram.VramPoller(tmp_path / "other").stop()
    assert unstarted["status"] == "unavailable" and "never started" in unstarted["reason"]


def test_devices_error_in_start_never_raises(tmp_path, monkeypatch):
    mod = fake_pynvml(Script([[GIB]]))

    def broken_name(h):
        raise NVMLError("Insufficient Permissions")

    mod.nvmlDeviceGetName = broken_name
    install(monkeypatch, pynvml=mod)
    summary = run_until(make_poller(tmp_path), 1, timeout=0.05)
    assert summary["status"] == "unavailable"
    assert "Insufficient Permissions" in summary["reason"] and summary["errors"] == 1


def test_poll_once(monkeypatch, no_libs):
    assert vram.poll_once() == []
    install(monkeypatch, pynvml=fake_pynvml(Script([[3 * GIB]] * 8)))
    cards = vram.poll_once()
    assert [c["index"] for c in cards] == list(range(8))
    assert cards[0] == {"index": 0, "name": "NVIDIA H200", "used_gib": 3.0, "total_gib": 80.0}
