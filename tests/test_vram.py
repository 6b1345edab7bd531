"""VRAM pollers against fake pynvml / amdsmi modules with scripted memory values.

The fakes follow the real APIs: nvidia-ml-py >= 12.535 (pynvml.py: names and the driver
version are ``str``, ``NVMLError(code)`` takes an integer code, power is in milliwatts) and
the amdsmi package of ROCm 6.x/7.x (amdsmi_interface.py / amdsmi_exception.py:
``AmdSmiLibraryException(err_code)``, IntEnum arguments checked with isinstance, the dict
keys of each call per library version, "N/A" for unsupported values).
"""

from __future__ import annotations

import builtins
import enum
import sys
import textwrap
import time
import types

import pytest

from bench.fileio import read_json, read_jsonl
from bench.probe import poller as vram_poller
from bench.probe import vram
from tests.helpers import REPO, run_cli

GIB = 2**30
MIB = 2**20
INTERVAL = 0.005
BASELINE = 3
# Calls to the memory query made by VramPoller.start() before the thread runs:
# one in devices() (NVML reads .total there) and one per baseline sample.
NVML_PREFIX = 1 + BASELINE

# -- NVML (pynvml.py of nvidia-ml-py) ------------------------------------------------------

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
_NVML_ERRORS = {
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """pynvml.NVMLError: built from an integer code, str() is the code's text."""

    def __new__(cls, value):
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self):
        return _NVML_ERRORS.get(self.value, f"NVML Error with code {self.value}")


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


def fake_pynvml(script: Script, names=None, total=80 * GIB, init_error=None, state=None) -> types.ModuleType:
    """A module with exactly the NVML calls bench.probe.nvml may use, returning what pynvml returns.

    ``state``: per-call overrides {"sm": int|NVMLError, "mem", "temp", "power_mw"}.
    """
    mod = types.ModuleType("pynvml")
    n = len(script.per_card)
    names = names or ["NVIDIA H200"] * n
    state = {"sm": 1980, "mem": 3201, "temp": 41, "power_mw": 350_125, **(state or {})}
    mod.state = {"init": 0, "shutdown": 0, "state_reads": 0}
    mod.NVML_CLOCK_GRAPHICS, mod.NVML_CLOCK_SM, mod.NVML_CLOCK_MEM = 0, 1, 2
    mod.NVML_TEMPERATURE_GPU = 0

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
        return "550.54.15"

    def _value(key):
        value = state[key]
        if isinstance(value, BaseException):
            raise value
        return value

    def nvmlDeviceGetClockInfo(h, clock_type):
        mod.state["state_reads"] += 1
        return _value({mod.NVML_CLOCK_SM: "sm", mod.NVML_CLOCK_MEM: "mem"}[clock_type])

    def nvmlDeviceGetTemperature(h, sensor):
        assert sensor == mod.NVML_TEMPERATURE_GPU
        return _value("temp")

    def nvmlDeviceGetPowerUsage(h):
        return _value("power_mw")

    def nvmlShutdown():
        mod.state["shutdown"] += 1

    for fn in (
        nvmlInit,
        nvmlDeviceGetCount,
        nvmlDeviceGetHandleByIndex,
        nvmlDeviceGetMemoryInfo,
        nvmlDeviceGetName,
        nvmlSystemGetDriverVersion,
        nvmlDeviceGetClockInfo,
        nvmlDeviceGetTemperature,
        nvmlDeviceGetPowerUsage,
        nvmlShutdown,
    ):
        setattr(mod, fn.__name__, fn)
    mod.NVMLError = NVMLError
    return mod


# -- AMD SMI (amdsmi_interface.py / amdsmi_exception.py / amdsmi_wrapper.py) ---------------

AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_DRM_ERROR = 6
AMDSMI_STATUS_NO_PERM = 10
_AMDSMI_ERRORS = {
    AMDSMI_STATUS_NOT_SUPPORTED: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    AMDSMI_STATUS_DRM_ERROR: "AMDSMI_STATUS_DRM_ERROR - Error when called libdrm",
    AMDSMI_STATUS_NO_PERM: "AMDSMI_STATUS_NO_PERM - Permission Denied",
}


class AmdSmiException(Exception):
    """amdsmi.AmdSmiException."""


class AmdSmiLibraryException(AmdSmiException):
    """amdsmi.AmdSmiLibraryException: built from an integer status code."""

    def __init__(self, err_code):
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = _AMDSMI_ERRORS.get(
            err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred"
        )

    def __str__(self):
        return f"Error code:\n\t{self.err_code} | {self.err_info}"


class AmdSmiParameterException(AmdSmiException):
    """amdsmi.AmdSmiParameterException(receivedValue, expectedType)."""

    def __init__(self, received, expected, msg=None):
        super().__init__(msg)
        self.err_code = None
        self.msg = msg or f"Invalid parameter: expected {expected}, received {type(received)}"

    def __str__(self):
        return self.msg


class AmdSmiInitFlags(enum.IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2
    INIT_NON_AMD_CPUS = 4
    INIT_NON_AMD_GPUS = 8
    INIT_AMD_APUS = 3


class AmdSmiMemoryType(enum.IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class AmdSmiClkType(enum.IntEnum):
    SYS = 0
    GFX = 0  # an alias of SYS, as in the wrapper (AMDSMI_CLK_TYPE_GFX = 0)
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4
    PCIE = 5
    VCLK0 = 6
    VCLK1 = 7
    DCLK0 = 8
    DCLK1 = 9


class AmdSmiTemperatureType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2
    HBM_0 = 3
    HBM_1 = 4
    HBM_2 = 5
    HBM_3 = 6
    PLX = 7


class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0
    MAX = 1
    MIN = 2
    MAX_HYST = 3
    MIN_HYST = 4
    CRITICAL = 5
    CRITICAL_HYST = 6
    EMERGENCY = 7
    EMERGENCY_HYST = 8
    CRIT_MIN = 9
    CRIT_MIN_HYST = 10
    OFFSET = 11
    LOWEST = 12
    HIGHEST = 13


class ProcessorHandle:
    """Stands in for amdsmi_wrapper.amdsmi_processor_handle (a ctypes c_void_p)."""

    def __init__(self, index: int) -> None:
        self.index = index


def fake_amdsmi(
    script: Script,
    memory_usage_works=True,
    total_bytes=288 * GIB,
    names=None,
    archs=None,
    version="7.0",
    partition=None,
    serials=None,
    memory_total_error=None,
    vram_usage_error=None,
    state=None,
) -> types.ModuleType:
    """A module with exactly the AMD SMI calls bench.probe.amd may use, as the real package has them.

    ``script`` holds bytes when ``memory_usage_works`` else MB (the vram_usage fallback).
    ``version``: "7.0" (the 7.0.2 wheel), "6.2" (no target_graphics_version, socket_power)
    or "6.1" (clock keys cur_clk/sleep_clk). ``state``: overrides of {"gfx_clk", "mem_clk",
    "hotspot", "edge", "current_power", "average_power"}; an int is a library status code to
    raise as AmdSmiLibraryException, "N/A" as the interface reports it.
    """
    mod = types.ModuleType("amdsmi")
    n = len(script.per_card)
    names = names or ["AMD Instinct MI355X"] * n
    archs = archs or ["gfx950"] * n
    serials = serials or [f"0x{0x5A1E0000 + i:016X}" for i in range(n)]
    values = {"gfx_clk": 2100, "mem_clk": 1900, "hotspot": 52, "edge": AMDSMI_STATUS_NOT_SUPPORTED}
    values.update({"current_power": 748, "average_power": "N/A", **(state or {})})
    mod.state = {"shutdown": 0, "memory_usage_calls": 0, "init_flag": None, "state_reads": 0}

    def check_handle(h):
        if not isinstance(h, ProcessorHandle):
            raise AmdSmiParameterException(h, ProcessorHandle)

    def check_enum(value, enum_type):
        if not isinstance(value, enum_type):
            raise AmdSmiParameterException(value, enum_type)

    def lib_value(key):
        value = values[key]
        if isinstance(value, int) and value in _AMDSMI_ERRORS:
            raise AmdSmiLibraryException(value)
        return value

    def amdsmi_init(flag=AmdSmiInitFlags.INIT_AMD_GPUS):
        check_enum(flag, AmdSmiInitFlags)
        mod.state["init_flag"] = flag

    def amdsmi_get_processor_handles():
        return [ProcessorHandle(i) for i in range(n)]

    def amdsmi_get_gpu_memory_usage(h, mem_type):
        check_handle(h)
        check_enum(mem_type, AmdSmiMemoryType)
        mod.state["memory_usage_calls"] += 1
        if not memory_usage_works:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return script.next(h.index)

    def amdsmi_get_gpu_memory_total(h, mem_type):
        check_handle(h)
        check_enum(mem_type, AmdSmiMemoryType)
        if memory_total_error is not None:
            raise AmdSmiLibraryException(memory_total_error)
        return total_bytes

    def amdsmi_get_gpu_vram_usage(h):
        check_handle(h)
        if vram_usage_error is not None:
            raise AmdSmiLibraryException(vram_usage_error)
        used = script.next(h.index) if not memory_usage_works else 0
        return {"vram_total": total_bytes // MIB, "vram_used": used}

    def amdsmi_get_gpu_asic_info(h):
        check_handle(h)
        info = {
            "market_name": names[h.index],
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": "0x75a3",
            "rev_id": "0x00",
            "asic_serial": serials[h.index],
            "oam_id": h.index,
            "num_compute_units": 256,
            "target_graphics_version": archs[h.index],
            "subsystem_id": "0x75a3",
        }
        if version != "7.0":  # ROCm 6.2 and before: no target_graphics_version
            info = {k: info[k] for k in ("market_name", "vendor_id", "vendor_name", "subvendor_id")}
            info.update({"device_id": 0x75A3, "rev_id": "0x00", "asic_serial": serials[h.index], "oam_id": 0})
        return info

    def amdsmi_get_gpu_compute_partition(h):
        check_handle(h)
        if partition is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return partition

    def amdsmi_get_clock_info(h, clock_type):
        check_handle(h)
        check_enum(clock_type, AmdSmiClkType)
        mod.state["state_reads"] += 1
        clk = lib_value({AmdSmiClkType.GFX: "gfx_clk", AmdSmiClkType.MEM: "mem_clk"}[clock_type])
        if version == "6.1":
            return {"cur_clk": clk, "max_clk": 2400, "min_clk": 500, "sleep_clk": 0}
        return {"clk": clk, "min_clk": 500, "max_clk": 2400, "clk_locked": False, "clk_deep_sleep": 0}

    def amdsmi_get_temp_metric(h, sensor_type, metric):
        check_handle(h)
        check_enum(sensor_type, AmdSmiTemperatureType)
        check_enum(metric, AmdSmiTemperatureMetric)
        assert metric == AmdSmiTemperatureMetric.CURRENT
        key = {AmdSmiTemperatureType.HOTSPOT: "hotspot", AmdSmiTemperatureType.EDGE: "edge"}[sensor_type]
        return lib_value(key)

    def amdsmi_get_power_info(h):
        check_handle(h)
        info = {
            "socket_power": lib_value("current_power"),
            "current_socket_power": lib_value("current_power"),
            "average_socket_power": lib_value("average_power"),
            "gfx_voltage": "N/A",
            "soc_voltage": "N/A",
            "mem_voltage": "N/A",
            "power_limit": 1400,
        }
        if version != "7.0":
            del info["socket_power"]
        return info

    def amdsmi_get_gpu_driver_info(h):
        check_handle(h)
        return {"driver_name": "amdgpu", "driver_version": "6.12.12", "driver_date": "2015/01/01 00:00"}

    def amdsmi_shut_down():
        mod.state["shutdown"] += 1

    for fn in (
        amdsmi_init,
        amdsmi_get_processor_handles,
        amdsmi_get_gpu_memory_usage,
        amdsmi_get_gpu_memory_total,
        amdsmi_get_gpu_vram_usage,
        amdsmi_get_gpu_asic_info,
        amdsmi_get_gpu_compute_partition,
        amdsmi_get_clock_info,
        amdsmi_get_temp_metric,
        amdsmi_get_power_info,
        amdsmi_get_gpu_driver_info,
        amdsmi_shut_down,
    ):
        setattr(mod, fn.__name__, fn)
    for cls in (
        AmdSmiException,
        AmdSmiLibraryException,
        AmdSmiParameterException,
        AmdSmiInitFlags,
        AmdSmiMemoryType,
        AmdSmiClkType,
        AmdSmiTemperatureType,
        AmdSmiTemperatureMetric,
    ):
        setattr(mod, cls.__name__, cls)
    return mod


# amdsmi_wrapper.py's loader, as in the amdsmi 7.0.2 wheel: a failed dlopen is printed to
# stdout, then the module-level binding of amdsmi_free_name_value_pairs indexes the missing
# library (KeyError) or, on a ROCm 6.x library without that symbol, fails on the symbol.
BROKEN_AMDSMI = """
import ctypes
_libraries = {{}}
try:
    _libraries['libamd_smi.so'] = ctypes.CDLL({lib!r})
except OSError as e:
    print(e)
    print("Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager")
amdsmi_free_name_value_pairs = _libraries['libamd_smi.so'].amdsmi_free_name_value_pairs
"""


@pytest.fixture
def broken_amdsmi(tmp_path, monkeypatch):
    """Put an importable-but-broken amdsmi package on sys.path; returns a setup(lib) function."""

    def setup(lib: str) -> None:
        pkg = tmp_path / "site" / "amdsmi"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text(textwrap.dedent(BROKEN_AMDSMI.format(lib=lib)))
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
        monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
        monkeypatch.setitem(sys.modules, "pynvml", None)

    return setup


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


def make_poller(tmp_path, backend="auto", **kwargs) -> vram.VramPoller:
    return vram.VramPoller(
        tmp_path / "run", interval_s=INTERVAL, backend=backend, baseline_samples=BASELINE, **kwargs
    )


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
    assert card0["partition"] is None and summary["partitioned"] is False
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

    lines = read_jsonl(tmp_path / "run" / "vram.jsonl")
    rows = [r for r in lines if "used_gib" in r]
    assert len(rows) == summary["n_samples"] >= 5
    assert all(len(r["used_gib"]) == 8 and isinstance(r["t"], float) for r in rows)
    assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)
    assert max(r["used_gib"][0] for r in rows) == 90.0
    # the clock/temperature/power reads are timed rows too (aggregation takes the measured steps' window)
    states = [r for r in lines if "state" in r]
    energy = [r for r in lines if "energy_j" in r]  # and the energy reads (tests/test_energy.py)
    assert len(states) == poller.n_state_samples >= 1 and len(states) + len(rows) + len(energy) == len(lines)
    assert all(len(r["state"]) == 8 and set(r["state"][0]) == set(vram.STATE_FIELDS) for r in states)


def test_nvml_str_names_and_driver_version(tmp_path, monkeypatch):
    # nvidia-ml-py >= 12.535 decodes both (convertStrBytes); older bytes are still decoded.
    script = Script([[GIB], [GIB]])
    install(monkeypatch, pynvml=fake_pynvml(script, names=["NVIDIA H200", b"NVIDIA H200"]))
    summary = run_until(make_poller(tmp_path), 1)
    assert [d["name"] for d in summary["devices"]] == ["NVIDIA H200", "NVIDIA H200"]
    assert summary["driver_version"] == "550.54.15"


def test_nvml_error_mid_run_is_counted_not_fatal(tmp_path, monkeypatch):
    script = Script([[GIB] * NVML_PREFIX + [NVMLError(NVML_ERROR_GPU_IS_LOST), 40 * GIB, 3 * GIB]])
    install(monkeypatch, pynvml=fake_pynvml(script))
    summary = run_until(make_poller(tmp_path), 4)

    assert summary["status"] == "ok"
    assert summary["errors"] == 1
    assert summary["reason"] == "NVMLError: GPU is lost"
    assert summary["devices"][0]["peak_used_gib"] == 40.0


def test_no_successful_sample_is_unavailable(tmp_path, monkeypatch):
    # devices() works, then every query fails
    script = Script([[GIB, NVMLError(NVML_ERROR_UNKNOWN)]])
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
    nv = fake_pynvml(Script([[GIB]]), init_error=NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND))
    amd = fake_amdsmi(Script([[4 * GIB]]))
    install(monkeypatch, pynvml=nv, amdsmi=amd)
    backend, reason = vram.open_backend("auto")
    assert reason is None and backend.name == "amdsmi"
    backend.close()

    backend, reason = vram.open_backend("nvml")
    assert backend is None and "NVML Shared Library Not Found" in reason


def test_nvml_state_units_and_summary(tmp_path, monkeypatch):
    install(monkeypatch, pynvml=fake_pynvml(Script([[GIB], [GIB]])))
    summary = run_until(make_poller(tmp_path, state_interval_s=0.01), 20)
    state = summary["devices"][0]["state"]
    assert state["n"] >= 1 and summary["state_interval_s"] == 0.01
    assert state["sm_clock_mhz"] == {"min": 1980.0, "median": 1980.0, "max": 1980.0}
    assert state["mem_clock_mhz"]["max"] == 3201.0
    assert state["temperature_c"]["median"] == 41.0
    assert state["power_w"]["median"] == 350.125  # nvmlDeviceGetPowerUsage is in milliwatts


def test_nvml_state_field_failure_is_none_not_fatal(tmp_path, monkeypatch):
    nv = fake_pynvml(Script([[GIB]]), state={"power_mw": NVMLError(NVML_ERROR_NOT_SUPPORTED)})
    install(monkeypatch, pynvml=nv)
    backend, _ = vram.open_backend("nvml")
    assert backend.state() == [
        {"sm_clock_mhz": 1980.0, "mem_clock_mhz": 3201.0, "temperature_c": 41.0, "power_w": None}
    ]
    summary = run_until(make_poller(tmp_path), 3)
    assert summary["errors"] == 0
    assert summary["devices"][0]["state"]["power_w"] == {"min": None, "median": None, "max": None}


def test_state_is_read_far_less_often_than_memory(tmp_path, monkeypatch):
    nv = fake_pynvml(Script([[GIB]]))
    install(monkeypatch, pynvml=nv)
    poller = make_poller(tmp_path, state_interval_s=0.1)
    t0 = time.monotonic()
    summary = run_until(poller, 60)
    elapsed = time.monotonic() - t0
    n_state = summary["devices"][0]["state"]["n"]
    assert summary["n_samples"] >= 60
    assert 1 <= n_state <= 2 + elapsed / 0.1
    assert n_state < summary["n_samples"] / 4
    assert nv.state["state_reads"] == 2 * poller.n_state_samples  # SM + memory clock per read


# -- AMD SMI ------------------------------------------------------------------------------


def test_amdsmi_uses_memory_usage_bytes_and_memory_total(tmp_path, monkeypatch):
    script = Script([[GIB] * BASELINE + [100 * GIB + 123, 2 * GIB]])
    amd = fake_amdsmi(script, total_bytes=288 * GIB - 512 * MIB, vram_usage_error=AMDSMI_STATUS_DRM_ERROR)
    install(monkeypatch, amdsmi=amd)
    summary = run_until(make_poller(tmp_path, backend="amdsmi"), 3)

    assert summary["backend"] == "amdsmi" and summary["status"] == "ok"
    assert summary["errors"] == 0  # the DRM query is not needed
    dev = summary["devices"][0]
    assert dev["name"] == "AMD Instinct MI355X"
    assert dev["total_gib"] == 287.5  # bytes from amdsmi_get_gpu_memory_total
    assert dev["peak_used_gib"] == 100.0 and dev["baseline_used_gib"] == 1.0
    assert summary["driver_version"] == "6.12.12"
    assert amd.state["init_flag"] == AmdSmiInitFlags.INIT_AMD_GPUS
    assert amd.state["shutdown"] == 1


def test_amdsmi_falls_back_to_vram_usage_mb(tmp_path, monkeypatch):
    # devices() reads vram_usage once for the total, consuming one scripted value.
    script = Script([[1024] * (1 + BASELINE) + [65536, 2048]])
    amd = fake_amdsmi(script, memory_usage_works=False, memory_total_error=AMDSMI_STATUS_NOT_SUPPORTED)
    install(monkeypatch, amdsmi=amd)
    summary = run_until(make_poller(tmp_path, backend="amdsmi"), 3)

    assert amd.state["memory_usage_calls"] > 0  # tried the bytes call first
    assert summary["errors"] == 0
    dev = summary["devices"][0]
    assert dev["total_gib"] == 288.0  # vram_usage's vram_total (MB) when memory_total fails
    assert dev["peak_used_gib"] == 64.0 and dev["baseline_used_gib"] == 1.0


def test_amdsmi_failing_total_does_not_stop_polling(tmp_path, monkeypatch):
    script = Script([[GIB] * BASELINE + [9 * GIB]])
    amd = fake_amdsmi(
        script, memory_total_error=AMDSMI_STATUS_NOT_SUPPORTED, vram_usage_error=AMDSMI_STATUS_DRM_ERROR
    )
    install(monkeypatch, amdsmi=amd)
    summary = run_until(make_poller(tmp_path, backend="amdsmi"), 3)

    assert summary["status"] == "ok" and summary["n_samples"] >= 3
    dev = summary["devices"][0]
    assert dev["total_gib"] is None and dev["peak_used_gib"] == 9.0
    assert summary["errors"] == 1
    assert "total VRAM" in summary["reason"] and "AMDSMI_STATUS_DRM_ERROR" in summary["reason"]


def test_amdsmi_rejects_plain_ints_like_the_real_interface():
    amd = fake_amdsmi(Script([[GIB]]))
    with pytest.raises(AmdSmiParameterException):
        amd.amdsmi_get_gpu_memory_usage(ProcessorHandle(0), 0)
    assert (
        str(AmdSmiLibraryException(-2))
        == "Error code:\n\t2 | AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported"
    )
    assert vram._one_line(AmdSmiLibraryException(2)) == (
        "AmdSmiLibraryException: Error code: 2 | AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported"
    )


@pytest.mark.parametrize(
    "version, state, expected",
    [
        # MI300/MI355: no edge sensor (NOT_SUPPORTED), hotspot works; current_socket_power
        (
            "7.0",
            {},
            {"sm_clock_mhz": 2100.0, "mem_clock_mhz": 1900.0, "temperature_c": 52.0, "power_w": 748.0},
        ),
        # ROCm 6.2 keys; an MI200-like card: no current power, average works, edge only
        (
            "6.2",
            {
                "current_power": "N/A",
                "average_power": 410,
                "hotspot": AMDSMI_STATUS_NOT_SUPPORTED,
                "edge": 47,
            },
            {"sm_clock_mhz": 2100.0, "mem_clock_mhz": 1900.0, "temperature_c": 47.0, "power_w": 410.0},
        ),
        # ROCm 6.1's clock keys (cur_clk), clock values "N/A"
        (
            "6.1",
            {"mem_clk": "N/A", "gfx_clk": 1700},
            {"sm_clock_mhz": 1700.0, "mem_clock_mhz": None, "temperature_c": 52.0, "power_w": 748.0},
        ),
        # Everything failing: None per field, never an exception
        (
            "7.0",
            {
                "gfx_clk": AMDSMI_STATUS_NO_PERM,
                "mem_clk": AMDSMI_STATUS_NO_PERM,
                "hotspot": AMDSMI_STATUS_NOT_SUPPORTED,
                "current_power": "N/A",
            },
            {"sm_clock_mhz": None, "mem_clock_mhz": None, "temperature_c": None, "power_w": None},
        ),
    ],
)
def test_amdsmi_state(monkeypatch, version, state, expected):
    install(monkeypatch, amdsmi=fake_amdsmi(Script([[GIB], [GIB]]), version=version, state=state))
    backend, reason = vram.open_backend("amdsmi")
    assert reason is None
    assert backend.state() == [expected, expected]
    backend.close()


def test_amdsmi_state_summary_in_vram_json(tmp_path, monkeypatch):
    install(monkeypatch, amdsmi=fake_amdsmi(Script([[GIB]])))
    summary = run_until(make_poller(tmp_path, backend="amdsmi", state_interval_s=0.01), 10)
    state = read_json(tmp_path / "run" / "vram.json")["devices"][0]["state"]
    assert state == summary["devices"][0]["state"]
    assert set(state) == {"sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w", "n"}
    assert state["temperature_c"] == {"min": 52.0, "median": 52.0, "max": 52.0}
    assert state["power_w"]["max"] == 748.0 and state["n"] >= 1


@pytest.mark.parametrize(
    "name, arch, version",
    [
        ("AMD Instinct MI355X", "gfx950", "7.0"),
        ("AMD Instinct MI350X", "gfx950", "7.0"),
        ("MI300X-O", "gfx942", "7.0"),
        ("AMD Instinct MI300X", "gfx942", "6.2"),
        ("0x74a5", "gfx942", "7.0"),
        ("N/A", "gfx950", "7.0"),
    ],
)
def test_amdsmi_real_world_names(monkeypatch, name, arch, version):
    install(monkeypatch, amdsmi=fake_amdsmi(Script([[GIB]]), names=[name], archs=[arch], version=version))
    backend, _ = vram.open_backend("amdsmi")
    (dev,) = backend.devices()
    assert dev["name"] == name
    assert dev["arch"] == (arch if version == "7.0" else None)  # no target_graphics_version in 6.2
    assert dev["partition"] is None
    backend.close()


def test_amdsmi_partition_mode_reported_per_handle(tmp_path, monkeypatch):
    # One MI300X in CPX mode: eight handles, one ASIC serial.
    script = Script([[GIB] * BASELINE + [20 * GIB]] + [[GIB]] * 7)
    amd = fake_amdsmi(
        script,
        names=["AMD Instinct MI300X"] * 8,
        archs=["gfx942"] * 8,
        partition="CPX",
        serials=["0x1A2B3C4D5E6F7081"] * 8,
        total_bytes=24 * GIB,
    )
    install(monkeypatch, amdsmi=amd)
    summary = run_until(make_poller(tmp_path, backend="amdsmi"), 3)
    assert summary["partitioned"] is True and summary["physical_count"] == 1
    assert [d["partition"] for d in summary["devices"]] == ["CPX"] * 8
    assert summary["devices"][0]["peak_used_gib"] == 20.0 and summary["devices"][0]["total_gib"] == 24.0

    # SPX (one handle per card) is not partitioned.
    install(monkeypatch, amdsmi=fake_amdsmi(Script([[GIB]] * 8), partition="SPX"))
    summary = run_until(make_poller(tmp_path / "spx", backend="amdsmi"), 1)
    assert summary["partitioned"] is False and summary["physical_count"] == 8


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


def test_amdsmi_without_library_keyerror_and_nothing_on_stdout(broken_amdsmi, capfd):
    broken_amdsmi("/nonexistent/rocm/lib/libamd_smi.so")
    backend, reason = vram.open_backend("amdsmi")
    assert backend is None
    assert "KeyError: 'libamd_smi.so'" in reason
    assert "Unable to find libamd_smi.so" in reason  # what the wrapper printed, kept in the reason
    assert capfd.readouterr().out == ""  # never on stdout (it would land in $(python -m bench detect))


def test_amdsmi_newer_than_library_missing_symbol(broken_amdsmi, capfd):
    # The 7.0.2 wrapper on a ROCm 6.x library: the symbol is missing.
    broken_amdsmi("libc.so.6")
    backend, reason = vram.open_backend("amdsmi")
    assert backend is None
    assert "AttributeError" in reason and "amdsmi_free_name_value_pairs" in reason
    assert capfd.readouterr().out == ""


def test_bench_detect_stdout_is_only_the_config_path(tmp_path):
    site = tmp_path / "site" / "amdsmi"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text(textwrap.dedent(BROKEN_AMDSMI.format(lib="/nonexistent/libamd_smi.so")))
    r = run_cli("bench", "detect", env={"PYTHONPATH": f"{tmp_path / 'site'}:{REPO}", "BENCH_HARDWARE": ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{REPO / 'configs' / 'cpu.yaml'}\n"


# -- preflight ----------------------------------------------------------------------------


def test_preflight_none_without_gpus_or_with_working_libraries(monkeypatch, no_libs):
    monkeypatch.setattr(vram, "gpu_vendors_present", lambda root="/": set())
    assert vram.preflight() is None
    monkeypatch.setattr(vram, "gpu_vendors_present", lambda root="/": {"amd"})
    install(monkeypatch, amdsmi=fake_amdsmi(Script([[GIB]])))
    assert vram.preflight() is None
    assert vram.preflight("none") is None


def test_preflight_amd_library_missing_names_rocm_package(broken_amdsmi, monkeypatch, tmp_path):
    broken_amdsmi("/nonexistent/libamd_smi.so")
    monkeypatch.setattr(vram, "gpu_vendors_present", lambda root="/": {"amd"})
    rocm = tmp_path / "rocm"
    (rocm / "share" / "amd_smi" / "amdsmi").mkdir(parents=True)
    (rocm / "share" / "amd_smi" / "pyproject.toml").write_text("[project]\nname = 'amdsmi'\n")
    monkeypatch.setenv("ROCM_PATH", str(rocm))

    msg = vram.preflight()
    assert "\n" not in msg
    assert msg.startswith("VRAM polling will be unavailable: AMD GPUs present but AMD SMI cannot be opened")
    assert "KeyError: 'libamd_smi.so'" in msg
    assert f"cp -r {rocm}/share/amd_smi /tmp/amd_smi && pip install /tmp/amd_smi" in msg
    assert "docs/rocm.md" in msg

    (rocm / "share" / "amd_smi" / "pyproject.toml").unlink()  # Core SDK layout: the module only
    (rocm / "share" / "amd_smi" / "amdsmi" / "__init__.py").write_text("")
    assert f"export PYTHONPATH={rocm}/share/amd_smi" in vram.preflight()


def test_preflight_pins_pypi_amdsmi_to_the_rocm_version(broken_amdsmi, monkeypatch, tmp_path):
    broken_amdsmi("libc.so.6")  # a 7.0.2 wrapper on a ROCm 6.2 library
    monkeypatch.setattr(vram, "gpu_vendors_present", lambda root="/": {"amd"})
    (tmp_path / "rocm" / ".info").mkdir(parents=True)
    (tmp_path / "rocm" / ".info" / "version").write_text("6.2.0-66\n")
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm"))
    msg = vram.preflight()
    assert "amdsmi_free_name_value_pairs" in msg and "pip install 'amdsmi==6.2.*'" in msg


def test_preflight_nvidia_and_permissions(monkeypatch, no_libs):
    monkeypatch.setattr(vram, "gpu_vendors_present", lambda root="/": {"nvidia", "amd"})
    msg = vram.preflight("nvml")
    assert "NVIDIA GPUs present but NVML cannot be opened" in msg and "nvidia-ml-py" in msg
    assert "AMD" not in msg

    amd = fake_amdsmi(Script([[GIB]]))

    def no_perm(flag=AmdSmiInitFlags.INIT_AMD_GPUS):
        raise AmdSmiLibraryException(AMDSMI_STATUS_NO_PERM)

    amd.amdsmi_init = no_perm
    install(monkeypatch, amdsmi=amd)
    msg = vram.preflight("amdsmi")
    assert "AMDSMI_STATUS_NO_PERM" in msg and "render,video" in msg


def test_preflight_never_raises(monkeypatch):
    def boom(root="/"):
        raise RuntimeError("sysfs exploded")

    monkeypatch.setattr(vram, "gpu_vendors_present", boom)
    assert vram.preflight() == "VRAM preflight failed: RuntimeError: sysfs exploded"
    assert "unknown VRAM backend" in vram.preflight("rocm-smi")


def test_gpu_vendors_present_from_driver_files(tmp_path):
    assert vram.gpu_vendors_present(tmp_path) == set()
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kfd").touch()
    (tmp_path / "proc" / "driver" / "nvidia").mkdir(parents=True)
    (tmp_path / "proc" / "driver" / "nvidia" / "version").touch()
    assert vram.gpu_vendors_present(tmp_path) == {"amd", "nvidia"}


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
        "state_interval_s",
        "power_interval_s",
        "n_power_samples",
        "n_samples",
        "errors",
        "driver_version",
        "partitioned",
        "physical_count",
        "memory_api",
        "devices",
        "processes",
    }
    assert on_disk["memory_api"] == "nvml_v1" and on_disk["processes"] == []  # the fake has neither
    assert set(on_disk["devices"][0]) == {
        "index",
        "name",
        "total_gib",
        "baseline_used_gib",
        "peak_used_gib",
        "peak_delta_gib",
        "partition",
        "reserved_gib",
        "state",
    }
    assert on_disk["interval_s"] == INTERVAL and on_disk["state_interval_s"] == 1.0
    assert sorted(p.name for p in run_dir.iterdir()) == ["vram.json", "vram.jsonl"]  # no temp files


def test_samples_buffered_not_one_open_per_sample(tmp_path, monkeypatch):
    install(monkeypatch, pynvml=fake_pynvml(Script([[GIB]])))
    opens = []
    real_open = builtins.open

    def counting_open(*args, **kwargs):
        opens.append(args[0])
        return real_open(*args, **kwargs)

    monkeypatch.setattr(vram_poller, "open", counting_open, raising=False)
    t0 = time.monotonic()
    summary = run_until(make_poller(tmp_path), 20)
    elapsed = time.monotonic() - t0
    assert summary["n_samples"] >= 20
    # About one flush a second plus the final one, never one open per sample.
    assert 1 <= len(opens) <= 2 + int(elapsed / vram.FLUSH_EVERY_S)
    assert len(opens) < summary["n_samples"] / 4
    assert (
        len([r for r in read_jsonl(tmp_path / "run" / "vram.jsonl") if "used_gib" in r])
        == summary["n_samples"]
    )


def test_backend_none_and_unstarted_poller(tmp_path):
    summary = run_until(make_poller(tmp_path, backend="none"), 1, timeout=0.05)
    assert summary["status"] == "unavailable" and "disabled" in summary["reason"]

    unstarted = vram.VramPoller(tmp_path / "other").stop()
    assert unstarted["status"] == "unavailable" and "never started" in unstarted["reason"]


def test_device_field_error_in_start_is_counted_not_fatal(tmp_path, monkeypatch):
    mod = fake_pynvml(Script([[GIB]]))

    def broken_name(h):
        raise NVMLError(NVML_ERROR_NO_PERMISSION)

    mod.nvmlDeviceGetName = broken_name
    install(monkeypatch, pynvml=mod)
    summary = run_until(make_poller(tmp_path), 2)
    assert summary["status"] == "ok" and summary["n_samples"] >= 2
    assert summary["devices"][0]["name"] is None and summary["devices"][0]["total_gib"] == 80.0
    assert summary["errors"] == 1 and summary["reason"] == "card 0 name: NVMLError: Insufficient Permissions"


def test_devices_error_in_start_never_raises(tmp_path, monkeypatch):
    mod = fake_pynvml(Script([[GIB]]))

    def broken_count():
        raise NVMLError(NVML_ERROR_UNKNOWN)

    mod.nvmlDeviceGetCount = broken_count
    install(monkeypatch, pynvml=mod)
    summary = run_until(make_poller(tmp_path, backend="nvml"), 1, timeout=0.05)
    assert summary["status"] == "unavailable"
    assert summary["reason"] == "nvml: NVMLError: Unknown Error"
    assert mod.state["shutdown"] == 1  # a failed open still shuts NVML down


def test_poll_once(monkeypatch, no_libs):
    assert vram.poll_once() == []
    install(monkeypatch, pynvml=fake_pynvml(Script([[3 * GIB]] * 8)))
    cards = vram.poll_once()
    assert [c["index"] for c in cards] == list(range(8))
    assert cards[0] == {"index": 0, "name": "NVIDIA H200", "used_gib": 3.0, "total_gib": 80.0}
