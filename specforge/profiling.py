"""Where a training step's time goes: ``training.profile_steps`` (docs/kernels.md, docs/run-contract.md).

The chosen steps run under ``torch.profiler.profile``; their kernels (on a GPU: each CUDA/HIP
kernel, memcpy and memset, timed on the device) or ops (on the CPU: each op's self time, so
nothing is counted twice) are put into buckets by name, and rank 0 writes ``profile.json``.

Bucketing is :data:`BUCKETS`, a table of regexes tried in order on the lower-cased name; the
first that matches wins, and a name no pattern matches is ``other``. It is a reading aid, not
an exact attribution: a name says what a kernel is only as far as its author named it (a
TorchInductor ``triton_poi_fused_...`` kernel or a generic elementwise kernel says little), and
``mul`` in *activation* also catches the plain multiplies elsewhere in the step.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# (bucket, pattern), tried in this order. Attention comes before GEMM so that a fused attention
# kernel built from CUTLASS (fmha_cutlassF_...) is attention; optimizer before norm and
# activation so that _foreach_norm / _foreach_mul_ (gradient clipping, AdamW) and their CUDA
# multi_tensor_apply kernels (whose functor names say "multiplies") are optimizer.
BUCKETS: tuple[tuple[str, str], ...] = (
    ("attention", r"flex_attention|sdpa|scaled_dot_product|attention|fmha|flash"),
    ("GEMM", r"gemm|cutlass|cublas|matmul|mm|addmm|bmm|nvjet"),
    ("loss", r"cross_entropy|_ce_|linearce|log_softmax|logsoftmax|logsumexp|nll"),
    ("optimizer", r"adam|foreach|fused_adam|multi_tensor_apply"),
    ("norm", r"rms|norm"),
    ("activation", r"silu|swiglu|gelu|mul"),
    ("copies", r"copy|memcpy|memset|\bcat\b|to_copy|fill|zero_"),
)
OTHER = "other"
BUCKET_NAMES: tuple[str, ...] = (*(b for b, _ in BUCKETS), OTHER)
_COMPILED = tuple((b, re.compile(p)) for b, p in BUCKETS)
TOP_N = 20


def bucket_of(name: str) -> str:
    """The bucket of one kernel or op name (the first pattern of BUCKETS that matches, else other)."""
    low = name.lower()
    for bucket, pattern in _COMPILED:
        if pattern.search(low):
            return bucket
    return OTHER


def bucket_times(items: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Sum (name, time) pairs per bucket: every bucket of BUCKET_NAMES, in that order (0 when empty)."""
    out = dict.fromkeys(BUCKET_NAMES, 0.0)
    for name, t in items:
        out[bucket_of(name)] += float(t)
    return out


def summarize(
    items: list[tuple[str, float]], steps: list[int], device: str, time_kind: str, top: int = TOP_N
) -> dict:
    """The profile.json record from (name, microseconds) pairs of ``len(steps)`` profiled steps:
    the total, per bucket the time and its share, and the ``top`` names by time with their bucket."""
    n = max(1, len(steps))
    total_us = sum(t for _, t in items)
    share = (lambda us: 100.0 * us / total_us) if total_us > 0 else (lambda us: 0.0)
    by_name: dict[str, list[float]] = {}
    for name, t in items:
        acc = by_name.setdefault(name, [0.0, 0])
        acc[0] += t
        acc[1] += 1
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "steps": list(steps),
        "device": device,
        "time_kind": time_kind,
        "total_ms": total_us / 1e3,
        "total_ms_per_step": total_us / 1e3 / n,
        "buckets": [  # a list, in BUCKET_NAMES order (profile.json's keys are written sorted)
            {"bucket": b, "ms": us / 1e3, "ms_per_step": us / 1e3 / n, "share_pct": share(us)}
            for b, us in bucket_times(items).items()
        ],
        "top": [
            {
                "name": name,
                "bucket": bucket_of(name),
                "calls": int(calls),
                "ms": us / 1e3,
                "ms_per_step": us / 1e3 / n,
                "share_pct": share(us),
            }
            for name, (us, calls) in ranked
        ],
        "bucket_patterns": [{"bucket": b, "pattern": p} for b, p in BUCKETS],
        "note": "profiled steps run under torch.profiler: their step times are not for timing",
    }


# ---------------------------------------------------------------- the profiler (needs torch)

GPU_TIME = "device kernel time (CUDA/HIP kernels, memcpy, memset)"
CPU_TIME = "CPU self time of ops (no GPU: a CPU profile, not kernel time)"


def profiler(device_type: str):
    """A ``torch.profiler.profile`` context for one step: CPU activity, plus CUDA on a GPU (ROCm too)."""
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU]
    if device_type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=acts)


def _annotation(e) -> bool:
    """record_function ranges (e.g. torch's ``Optimizer.step#AdamW.step``), on the CPU or as GPU
    spans: they enclose kernels or ops already counted."""
    if getattr(e, "is_user_annotation", False):
        return True
    return "annotation" in str(getattr(e, "activity_type", "") or "").lower()


def events(prof, device_type: str) -> list[tuple[str, float]]:
    """(name, microseconds) of a finished profile: device-side kernels on a GPU, each CPU op's
    self time on the CPU (self time: a parent's time less its children's, so the sum is not
    double-counted)."""
    from torch.autograd import DeviceType

    out = []
    for e in prof.events():
        if getattr(e, "is_async", False) or _annotation(e):
            continue
        if device_type == "cuda":
            if e.device_type != DeviceType.CPU:
                out.append((e.name, float(e.time_range.elapsed_us())))
        elif e.device_type == DeviceType.CPU:
            out.append((e.name, float(e.self_cpu_time_total)))
    return [(n, t) for n, t in out if t > 0]


def profile_record(events: list[tuple[str, float]], steps: list[int], device_name: str, liger: bool) -> dict:
    """profile.json's content (rank 0): the profiled steps' time per bucket and the top kernels or ops
    (``device_name`` "cpu" on the CPU, else the GPU's name)."""
    gpu = device_name != "cpu"
    record = summarize(events, steps, "cuda" if gpu else "cpu", GPU_TIME if gpu else CPU_TIME)
    record["device_name"] = device_name
    record["arm"] = "liger" if liger else "baseline"
    return record
