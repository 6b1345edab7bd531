"""NVIDIA cards through NVML (the pynvml module of nvidia-ml-py): ``NvmlBackend``."""

from __future__ import annotations

from bench.probe.backends import _Fields, _import_quietly, _read, _text


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
