"""Timing on the device: the Timer (CUDA events with the L2 flushed, or perf_counter on the
CPU), quantiles of its reps, and the device's own limits (copy bandwidth, matmul rate) that
the roofline is drawn against."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

MIB = 2**20
# Device limits: a copy of COPY_BYTES into another buffer (read + write counted) and an n x n x n
# GEMM in the cells' dtype. Large enough on a GPU to run at the device's rate (the copy is ~20x
# an H200's L2); small on the CPU, where the numbers are a smoke test of the pipeline.
COPY_BYTES = {"cuda": 2**30, "cpu": 64 * MIB}
GEMM_N = {"cuda": 8192, "cpu": 1024}
LIMIT_REPS = {"cuda": (3, 10), "cpu": (1, 5)}  # (warm-up, timed) repetitions
# The flush buffer: twice the L2, and at least 512 MiB, which also covers the 256 MB Infinity
# Cache (last-level cache) of an MI300X / MI355X.
MIN_FLUSH_BYTES = 512 * MIB


def quantiles_ms(times_s: list[float]) -> tuple[float, float, float]:
    """(median, p20, p80) in milliseconds."""
    p20, p50, p80 = np.percentile(np.asarray(times_s, dtype=float) * 1e3, [20, 50, 80])
    return float(p50), float(p20), float(p80)


class Timer:
    """Times a callable: CUDA events on a GPU (the L2 flushed before every rep by writing a
    buffer larger than it), time.perf_counter on the CPU (torch's CPU ops are synchronous)."""

    def __init__(self, device: str):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.flush_bytes = 0
        self._flush = None
        if self.cuda:
            l2 = int(getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 0) or 0)
            self.flush_bytes = max(MIN_FLUSH_BYTES, 2 * l2)
            self._flush = torch.empty(self.flush_bytes, dtype=torch.uint8, device=self.device)

    @property
    def name(self) -> str:
        if self.cuda:
            return f"CUDA events, L2 flushed between reps ({self.flush_bytes // MIB} MiB written)"
        return "time.perf_counter (CPU)"

    def time(
        self, prep: Callable[[], Any], run: Callable[[Any], Any], reps: int, warmup: int, flush: bool = True
    ) -> list[float]:
        """Seconds per rep of ``run(prep())``; ``prep`` (untimed) sets up each rep's inputs."""
        torch = self.torch
        for _ in range(warmup):
            run(prep())
        if not self.cuda:
            times = []
            for _ in range(reps):
                arg = prep()
                t0 = time.perf_counter()
                run(arg)
                times.append(time.perf_counter() - t0)
            return times
        torch.cuda.synchronize(self.device)
        events = []
        for _ in range(reps):
            arg = prep()
            if flush:
                self._flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(arg)
            end.record()
            events.append((start, end))
        torch.cuda.synchronize(self.device)
        return [s.elapsed_time(e) / 1e3 for s, e in events]

    def peak_bytes(self, prep: Callable[[], Any], run: Callable[[Any], Any]) -> float | None:
        """Bytes one ``run`` allocates at its peak above what was allocated before it (None on the CPU)."""
        if not self.cuda:
            return None
        torch = self.torch
        arg = prep()
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        run(arg)
        torch.cuda.synchronize(self.device)
        return float(torch.cuda.max_memory_allocated(self.device) - base)


@dataclass(frozen=True)
class Limits:
    """The device's measured limits for one dtype."""

    device: str
    dtype: str
    copy_bytes_per_s: float  # (read + write) bytes / s of a large copy
    copy_buffer_bytes: int
    matmul_flops_per_s: float  # of an n x n x n GEMM in ``dtype``
    gemm_n: int

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which a kernel is compute-bound."""
        return self.matmul_flops_per_s / self.copy_bytes_per_s


def recorded_limits(device: str, dtype: str, copy_gb_per_s: float, matmul_tflops: float) -> Limits:
    """The limits an earlier run measured, from its kernels.csv columns (kernels --rebuild)."""
    return Limits(
        device=device,
        dtype=dtype,
        copy_bytes_per_s=copy_gb_per_s * 1e9,
        copy_buffer_bytes=COPY_BYTES[device],
        matmul_flops_per_s=matmul_tflops * 1e12,
        gemm_n=GEMM_N[device],
    )


def _copy_seconds(timer: Timer, n_bytes: int, reps: int, warmup: int) -> list[float]:
    src = timer.torch.ones(n_bytes, dtype=timer.torch.uint8, device=timer.device)
    dst = timer.torch.empty_like(src)
    return timer.time(lambda: None, lambda _: dst.copy_(src), reps, warmup, flush=False)


def _gemm_seconds(timer: Timer, n: int, dtype: str, reps: int, warmup: int) -> list[float]:
    torch = timer.torch
    gen = torch.Generator(device=timer.device).manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen, device=timer.device, dtype=getattr(torch, dtype)) for _ in "ab")
    return timer.time(lambda: None, lambda _: torch.mm(a, b), reps, warmup, flush=False)


def measure_limits(timer: Timer, dtype: str) -> Limits:
    """Copy bandwidth from a large device-to-device copy and the matmul rate from a large GEMM,
    both medians over repetitions (no flush: each is far larger than the caches it could hit)."""
    kind = timer.device.type
    warmup, reps = LIMIT_REPS[kind]
    n_copy, n = COPY_BYTES[kind], GEMM_N[kind]
    copy_s = _copy_seconds(timer, n_copy, reps, warmup)
    gemm_s = _gemm_seconds(timer, n, dtype, reps, warmup)
    return Limits(
        device=kind,
        dtype=dtype,
        copy_bytes_per_s=2 * n_copy / float(np.median(copy_s)),
        copy_buffer_bytes=n_copy,
        matmul_flops_per_s=2 * n**3 / float(np.median(gemm_s)),
        gemm_n=n,
    )


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name()
    return f"CPU ({platform.processor() or platform.machine()})"
