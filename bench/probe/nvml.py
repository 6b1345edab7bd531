"""NVIDIA cards through NVML (the pynvml module of nvidia-ml-py): ``NvmlBackend``.

Used memory is NVML's v2 memory call (``nvmlDeviceGetMemoryInfo_v2``) where the driver has it:
its ``used`` excludes the memory the driver reserves on every card (0.5–0.9 GiB, which
nvidia-smi does not show either), reported apart as ``reserved``. Without v2 (older drivers)
it is the v1 call, whose ``used`` includes that reserve; ``memory_api`` says which.

Energy (``energy()``, read several times a second): the card's energy counter
(``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver loaded; Volta and later),
exact over any interval; only a card without one gives its power instead: the instant power field
(``NVML_FI_DEV_POWER_INSTANT`` through ``nvmlDeviceGetFieldValues``, newer drivers), else
``nvmlDeviceGetPowerUsage``, which Ampere and later cards (but GA100) average over the last second.
"""

from __future__ import annotations

from typing import Any

from bench.probe.backends import _Fields, _import_quietly, _number, _read, _Support, _text

# c_nvmlValue_t's member for each NVML_VALUE_TYPE_* (pynvml.py): double, uint, ulong, ulonglong,
# longlong, int, ushort.
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _field_value(field: Any) -> float:
    """The number an ``nvmlFieldValue_t`` holds; raises when NVML returned none for it."""
    if getattr(field, "nvmlReturn", 1) != 0:  # NVML_SUCCESS
        raise ValueError(f"field {getattr(field, 'fieldId', '?')}: NVML return {field.nvmlReturn}")
    kind = int(field.valueType)
    value = _number(getattr(field.value, _VALUE_MEMBERS[kind])) if 0 <= kind < len(_VALUE_MEMBERS) else None
    if value is None:
        raise ValueError(f"field {getattr(field, 'fieldId', '?')}: value type {kind}")
    return value


def _checked(value: Any, scale: float) -> float:
    number = _number(value, scale)
    if number is None:
        raise ValueError(f"not a number: {value!r}")
    return number


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
        self._support = _Support()
        self._v2 = self._has_v2()
        self.memory_api = "nvml_v2" if self._v2 else "nvml_v1"

    def _has_v2(self) -> bool:
        version = getattr(self._nv, "nvmlMemory_v2", None)
        if version is None or not self._handles:
            return False
        try:
            self._nv.nvmlDeviceGetMemoryInfo(self._handles[0], version=version)
            return True
        except Exception:  # a driver without nvmlDeviceGetMemoryInfo_v2
            return False

    def _memory(self, handle):
        nv = self._nv
        return (
            nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
            if self._v2
            else nv.nvmlDeviceGetMemoryInfo(handle)
        )

    def devices(self) -> list[dict]:
        nv = self._nv
        out = []
        for i, h in enumerate(self._handles):
            name = self._field(f"card {i} name", nv.nvmlDeviceGetName, h)
            mem = self._field(f"card {i} memory info", self._memory, h)
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
        return [int(self._memory(h).used) for h in self._handles]

    def reserved_bytes(self) -> list[int | None]:
        """The driver's reserve per card (v2 only; None with v1, where it is inside ``used``)."""
        if not self._v2:
            return [None] * self.count
        return [_number(getattr(self._memory(h), "reserved", None)) for h in self._handles]

    def processes(self) -> list[list[dict]]:
        """Per card, the processes holding memory there: ``{pid, used_bytes}`` (compute and
        graphics contexts; ``used_bytes`` None where NVML cannot say, e.g. under some containers)."""
        nv = self._nv
        out = []
        for h in self._handles:
            seen: dict[int, int | None] = {}
            for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                try:
                    procs = getattr(nv, name)(h)
                except Exception:
                    continue
                for p in procs:
                    pid, used = int(p.pid), _number(getattr(p, "usedGpuMemory", None))
                    if pid not in seen or (used is not None and (seen[pid] or 0) < used):
                        seen[pid] = None if used is None else int(used)
            out.append([{"pid": pid, "used_bytes": used} for pid, used in seen.items()])
        return out

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

    def energy(self) -> list[dict]:
        """Per card ``{energy_j, power_w}``: the energy counter in J; where a card has none, its
        power in W (the instant field, else the averaged reading). Never raises."""
        nv, out = self._nv, []
        instant = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)
        for i, h in enumerate(self._handles):
            energy = self._support.read(
                "energy", i, lambda h=h: _checked(nv.nvmlDeviceGetTotalEnergyConsumption(h), 1e-3)
            )
            power = None
            if energy is None and instant is not None:
                power = self._support.read(
                    "instant",
                    i,
                    lambda h=h: 1e-3 * _field_value(nv.nvmlDeviceGetFieldValues(h, [instant])[0]),
                )
            if energy is None and power is None:
                power = self._support.read(
                    "power", i, lambda h=h: _checked(nv.nvmlDeviceGetPowerUsage(h), 1e-3)
                )
            out.append({"energy_j": energy, "power_w": power})
        return out

    def power_limit_w(self) -> list[float | None]:
        """Per card, the power limit the driver enforces (W; read, never set), None where NVML cannot say."""
        return [_read(self._nv.nvmlDeviceGetEnforcedPowerLimit, h, scale=1e-3) for h in self._handles]  # mW

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
