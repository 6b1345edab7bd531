"""AMD cards through AMD SMI (the amdsmi package of ROCm 6.x/7.x): ``AmdSmiBackend``.

Cards in a compute-partition mode (CPX, DPX, ...) give one handle per partition; each handle
is one device here, with its ``partition`` set.

Energy (``energy()``, read several times a second): ``amdsmi_get_energy_count``'s accumulator
times its ``counter_resolution`` (microjoules per tick; the accumulator is ``energy_accumulator``
since ROCm 6.4, ``power`` before), exact over any interval; a card without it gives its socket
power instead (``amdsmi_get_power_info``, as ``state()`` reads it).
"""

from __future__ import annotations

from typing import Any

from bench.probe.backends import (
    STATE_FIELDS,
    _Fields,
    _import_quietly,
    _number,
    _one_line,
    _Support,
    _text,
)

MIB = 2**20  # AMD SMI's "MB" are MiB
# Compute-partition modes that split one card into several handles.
_SPLIT_MODES = ("DPX", "TPX", "QPX", "CPX")

# AMD SMI's "not supported" values where a wrapper passes them through unconverted.
_AMD_SENTINELS = (0xFFFF, 0xFFFFFFFF, 2**64 - 1)


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
        self._support = _Support()
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

    memory_api = "amdsmi"  # amdsmi_get_gpu_memory_usage(VRAM), else vram_usage's vram_used

    def reserved_bytes(self) -> list[int | None]:
        return [None] * self.count  # AMD SMI reports no driver reserve apart

    def _process(self, handle: Any, entry: Any) -> dict | None:
        """``{pid, used_bytes}`` of one process-list entry: a dict (ROCm 6.4 and later: pid and
        memory_usage.vram_mem in bytes) or a process handle (6.0-6.3: its amdsmi_get_gpu_process_info)."""
        info = entry if isinstance(entry, dict) else self._smi.amdsmi_get_gpu_process_info(handle, entry)
        if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
            return None
        usage = info.get("memory_usage") if isinstance(info.get("memory_usage"), dict) else {}
        used = _number(usage.get("vram_mem"), sentinels=_AMD_SENTINELS)
        return {"pid": info["pid"], "used_bytes": None if used is None else int(used)}

    def processes(self) -> list[list[dict]]:
        """Per card, the processes holding memory there, ``{pid, used_bytes}`` (never raises)."""
        out = []
        for h in self._handles:
            rows = []
            try:
                for entry in self._smi.amdsmi_get_gpu_process_list(h):
                    try:
                        row = self._process(h, entry)
                    except Exception:
                        continue
                    if row is not None:
                        rows.append(row)
            except Exception:
                pass
            out.append(rows)
        return out

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

    def _energy_j(self, handle: Any) -> float:
        """The card's energy counter in J; raises when the library gives none."""
        info = self._smi.amdsmi_get_energy_count(handle)
        ticks = info.get("energy_accumulator", info.get("power"))  # "power": ROCm 6.3 and before
        ticks = _number(ticks, sentinels=_AMD_SENTINELS)
        resolution = _number(info.get("counter_resolution"))  # microjoules per tick
        if ticks is None or not resolution:
            raise ValueError(f"energy count {info!r}")
        return ticks * resolution * 1e-6

    def _power_w(self, handle: Any) -> float:
        power = self._power(handle)
        if power is None:
            raise ValueError("no socket power")
        return power

    def energy(self) -> list[dict]:
        """Per card ``{energy_j, power_w}``: the energy counter in J; where a card has none, its
        socket power in W. Never raises."""
        out = []
        for i, h in enumerate(self._handles):
            energy = self._support.read("energy", i, lambda h=h: self._energy_j(h))
            power = None
            if energy is None:
                power = self._support.read("power", i, lambda h=h: self._power_w(h))
            out.append({"energy_j": energy, "power_w": power})
        return out

    def power_limit_w(self) -> list[float | None]:
        """Per card, the power cap (W; read, never set): ``amdsmi_get_power_cap_info``'s ``power_cap``,
        in microwatts (amdsmi.h, Linux); None where it cannot be read."""
        out = []
        for h in self._handles:
            try:
                out.append(
                    _number(self._smi.amdsmi_get_power_cap_info(h).get("power_cap"), 1e-6, _AMD_SENTINELS)
                )
            except Exception:
                out.append(None)
        return out

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
