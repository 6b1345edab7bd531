"""Kernel attribution: ``python -m bench kernels CONFIG [--out DIR] [--cell CELL_ID] ...``.

For every cell of a sweep config, at that cell's training shapes, times forward + backward of
each module the Liger arms swap in the DFlash draft (specforge/draft.py), stock and Liger:
transformers' ``Qwen3RMSNorm`` vs Liger's RMSNorm, and ``Qwen3MLP`` vs Liger's SwiGLU MLP, the
Liger classes obtained the way the trainer obtains them (``specforge.liger.liger_patch``, then
built through ``modeling_qwen3`` like draft.py does). Beside each time: its spread, the peak
memory it allocates, its bytes and FLOPs by formula (bench/roofline.py), the device's measured
limits and the fraction of the roofline it reaches, and what the timings predict for one
training step, set beside the sweep's measured end-to-end Δ when the sweep has run.

Tokens the draft sees per micro-batch (from DFlashDraft.forward and Trainer.micro_step):
``anchors`` is always padded to ``training.num_anchors`` = N blocks per sample (padded blocks are
computed, then masked), so with batch b, sequence length S and block size B

    block tokens   b * N * B         queries: every layer's two RMSNorms, q_norm, the MLP, the final norm
    context tokens b * S             fc + hidden_norm over the target's hidden states
    key/value      b * (S + N * B)   k_proj / v_proj / k_norm over the context and the block tokens

docs/kernels.md says how to run it and how to read the result.
"""

from __future__ import annotations

import importlib.metadata
import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.config.sweep import ARM_OPTIONS, Cell, SweepConfig, SweepError, format_set_value, load_config
from bench.fileio import atomic_write_text
from bench.kernels import roofline

OUTPUTS = ("kernels.csv", "kernels.png", "kernels.md")
DEFAULT_REPS, DEFAULT_WARMUP = 50, 10
KINDS = {"rmsnorm": "RMSNorm", "swiglu": "SwiGLU MLP", "loss": "LM head + CE"}
IMPLS = ("stock", "liger")
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
MAX_REPS = 100_000

KERNEL_COLUMNS = [
    "cell_id", "profile", "mode", "batch_size", "seq_len", "num_anchors", "block_size",
    "accumulation_steps", "dtype", "device", "module", "kind", "impl", "module_class", "draft_modules",
    "input_shape", "rows", "dim", "intermediate_size", "vocab_size", "per_micro_batch", "micro_batches_per_step",
    "status", "reason", "reps", "warmup", "time_median_ms", "time_p20_ms", "time_p80_ms",
    "peak_mem_delta_mib", "bytes", "flops", "intensity_flop_per_byte", "bound", "achieved_gb_per_s",
    "achieved_tflops", "roofline_ms", "roofline_fraction", "saving_per_call_ms", "saving_per_step_ms",
    "copy_gb_per_s", "matmul_tflops", "timer", "device_name", "torch_version", "transformers_version",
    "liger_version", "git_commit",
]  # fmt: skip


# ---------------------------------------------------------------- shapes


@dataclass(frozen=True)
class DraftShapes:
    """What one micro-batch of a cell feeds the draft (per rank)."""

    batch: int
    seq_len: int
    num_anchors: int
    block_size: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    eps: float
    vocab: int = 0

    @property
    def scored_tokens(self) -> int:
        """b * N * (B - 1): at most this many positions are scored (k = 0 of a block never is)."""
        return self.batch * self.num_anchors * (self.block_size - 1)

    @property
    def block_tokens(self) -> int:
        """b * N * B: the noise blocks, the queries of every layer."""
        return self.batch * self.num_anchors * self.block_size

    @property
    def context_tokens(self) -> int:
        """b * S: the target's hidden states, projected by fc and normed by hidden_norm."""
        return self.batch * self.seq_len

    @property
    def kv_tokens(self) -> int:
        """b * (S + N * B): keys and values are the context and the block tokens."""
        return self.batch * (self.seq_len + self.num_anchors * self.block_size)


def draft_shapes(arch: Any, batch: int, seq_len: int, num_anchors: int) -> DraftShapes:
    """The shapes of a cell from its profile's draft architecture (specforge.config.DraftArch)."""
    return DraftShapes(
        batch=batch,
        seq_len=seq_len,
        num_anchors=num_anchors,
        block_size=arch.block_size,
        hidden=arch.hidden_size,
        intermediate=arch.intermediate_size,
        heads=arch.num_attention_heads,
        kv_heads=arch.num_key_value_heads,
        head_dim=arch.head_dim,
        layers=arch.num_hidden_layers,
        eps=arch.rms_norm_eps,
        vocab=arch.vocab_size,
    )


@dataclass(frozen=True)
class Site:
    """One shape at which the draft calls a swappable module, and how often per micro-batch."""

    name: str
    kind: str  # rmsnorm | swiglu | loss
    shape: tuple[int, ...]  # the module's input
    per_micro_batch: int
    draft_modules: str

    @property
    def dim(self) -> int:
        return self.shape[-1]

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])


def module_sites(s: DraftShapes) -> list[Site]:
    """Every RMSNorm and MLP call of DFlashDraft.forward, grouped by input shape."""
    b, n, ctx = s.batch, s.num_anchors * s.block_size, s.seq_len
    return [
        Site(
            "rmsnorm_block",
            "rmsnorm",
            (b, n, s.hidden),
            2 * s.layers + 1,
            "input_layernorm + post_attention_layernorm per layer, final norm",
        ),
        Site("rmsnorm_context", "rmsnorm", (b, ctx, s.hidden), 1, "hidden_norm (after fc)"),
        Site("rmsnorm_q", "rmsnorm", (b, n, s.heads, s.head_dim), s.layers, "self_attn.q_norm per layer"),
        Site(
            "rmsnorm_k",
            "rmsnorm",
            (b, ctx + n, s.kv_heads, s.head_dim),
            s.layers,
            "self_attn.k_norm per layer",
        ),
        Site("swiglu_mlp", "swiglu", (b, n, s.hidden), s.layers, "mlp per layer"),
    ]


def loss_site(s: DraftShapes) -> Site:
    """The LM head + decayed CE over the scored positions (the liger_flce arm swaps it)."""
    return Site(
        "lm_head_ce",
        "loss",
        (s.scored_tokens, s.hidden),
        1,
        "LM head + decayed CE over the scored positions (objective.decayed_ce)",
    )


def all_sites(s: DraftShapes) -> list[Site]:
    """The draft's modules, then the loss."""
    return [*module_sites(s), loss_site(s)]


def site_cost(site: Site, shapes: DraftShapes, elem_bytes: int) -> tuple[int, int]:
    """(FLOPs, bytes) of one forward + backward at a site (formulas: bench/roofline.py)."""
    if site.kind == "loss":
        return (
            roofline.linear_ce_flops(site.rows, site.dim, shapes.vocab),
            roofline.linear_ce_bytes(site.rows, site.dim, shapes.vocab, elem_bytes),
        )
    if site.kind == "rmsnorm":
        return roofline.rmsnorm_flops(site.rows, site.dim), roofline.rmsnorm_bytes(
            site.rows, site.dim, elem_bytes
        )
    return (
        roofline.mlp_flops(site.rows, shapes.hidden, shapes.intermediate),
        roofline.mlp_bytes(site.rows, shapes.hidden, shapes.intermediate, elem_bytes),
    )


LIGER_KEYS = {"model.liger_rms_norm", "model.liger_swiglu", "model.liger_fused_linear_ce"}


def swapped_kinds(arm: str) -> tuple[str, ...]:
    """Which module kinds an arm replaces by Liger's and nothing else (from ARM_OPTIONS: its liger
    flag and the keys it sets). An arm that changes more than the Liger kernels (liger_compile also
    compiles the layers) gets (): its Δ is not the swapped modules' alone, so no prediction."""
    opts = ARM_OPTIONS[arm]
    if not opts["liger"] or set(opts["set"]) - LIGER_KEYS:
        return ()
    kinds = []
    if opts["set"].get("model.liger_rms_norm", True):
        kinds.append("rmsnorm")
    if opts["set"].get("model.liger_swiglu", True):
        kinds.append("swiglu")
    if opts["set"].get("model.liger_fused_linear_ce", False):
        kinds.append("loss")
    return tuple(kinds)


LIGER_ARMS = tuple(a for a in ARM_OPTIONS if swapped_kinds(a))


# ---------------------------------------------------------------- cells


@dataclass(frozen=True)
class CellPlan:
    cell: Cell
    profile: str
    mode: str
    shapes: DraftShapes
    micro_batches: int  # training.accumulation_steps
    dtype: str
    device: str  # cuda | cpu
    arch: Any  # specforge.config.DraftArch
    max_positions: int
    loss_gamma: float = 7.0  # training.loss_decay_gamma
    loss_chunk: int = 1024  # model.loss_chunk_size


def plan_cell(cfg: SweepConfig, cell: Cell, device_type: str) -> CellPlan:
    """The cell's training config as its runs see it (the driver's --set keys and the cell's `set`),
    validated by the trainer's own config loader; SweepError with one line on bad input."""
    from specforge.config import ConfigError
    from specforge.config import load_config as load_train_config

    sets = {"data.seq_len": cell.seq_len, "training.batch_size": cell.batch_size, **cell.overrides}
    where = f"{cfg.path}: cells[{cell.entry}] ({cell.cell_id})"
    try:
        train, profile = load_train_config(
            cell.train_config, [f"{k}={format_set_value(v)}" for k, v in sets.items()]
        )
    except ConfigError as e:
        raise SweepError(f"{where}: {e}") from None
    want = train.training.device
    if want == "cuda" and device_type != "cuda":
        raise SweepError(f"{where}: training.device: cuda requested but no CUDA or ROCm GPU is visible")
    device = "cpu" if want == "cpu" else device_type
    tr = train.training
    return CellPlan(
        cell=cell,
        profile=profile.name,
        mode=train.mode,
        shapes=draft_shapes(profile.draft, tr.batch_size, train.data.seq_len, tr.num_anchors),
        micro_batches=tr.accumulation_steps,
        dtype=train.model.dtype,
        device=device,
        arch=profile.draft,
        max_positions=train.data.seq_len + profile.draft.block_size + 1,  # as the trainer builds it
        loss_gamma=tr.loss_decay_gamma,
        loss_chunk=train.model.loss_chunk_size,
    )


# ---------------------------------------------------------------- timing


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


# ---------------------------------------------------------------- modules


def loss_head(plan: CellPlan, site: Site, liger: bool):
    """The trainer's LM head + decayed CE at this site as a module of the hidden rows (its output the
    loss): the chunked, compiled ``_LinearCE`` or, with ``liger``, ``liger_linear_ce``. The frozen
    head, labels and weights are random but shaped as in training: every block position k = 1..B-1
    scored, weighted exp(-(k-1)/gamma), normalized. Raises ConfigError when Liger's is unavailable."""
    import torch

    from specforge import objective
    from specforge.liger import fused_linear_ce_fn

    if liger:
        fused_linear_ce_fn()
    n, h = site.shape
    dev, dt = plan.device, getattr(torch, plan.dtype)
    gen = torch.Generator(device=dev).manual_seed(1)
    head = (torch.randn(plan.shapes.vocab, h, generator=gen, device=dev) * h**-0.5).to(dt)
    labels = torch.randint(0, plan.shapes.vocab, (n,), generator=gen, device=dev)
    k = torch.arange(n, device=dev) % (plan.shapes.block_size - 1)
    w = torch.exp(-k.float() / plan.loss_gamma)
    w = w / w.sum()

    class LigerFusedLinearCE(torch.nn.Module):
        def forward(self, x):
            return objective.liger_linear_ce(x, head, labels, w)[0]

    class ChunkedLinearCE(torch.nn.Module):
        def forward(self, x):
            return objective._LinearCE.apply(x, head, labels, w, plan.loss_chunk)[0]

    return LigerFusedLinearCE() if liger else ChunkedLinearCE()


def build_module(plan: CellPlan, site: Site, liger: bool):
    """The module a draft layer builds at this site, stock or under the trainer's Liger patch
    (specforge.liger.liger_patch; draft.py resolves the classes through ``modeling_qwen3``), or the
    loss (``loss_head``). Raises specforge's ConfigError when Liger cannot be patched in (missing,
    too old, two Tritons)."""
    import torch
    from transformers.models.qwen3 import modeling_qwen3

    from specforge.draft import qwen3_config, rms_norm
    from specforge.liger import liger_patch

    if site.kind == "loss":
        return loss_head(plan, site, liger)

    config = qwen3_config(plan.arch, plan.max_positions)
    with liger_patch(liger, "draft"), torch.device(plan.device):
        if site.kind == "rmsnorm":
            module = rms_norm(site.dim, plan.shapes.eps)
        else:
            module = modeling_qwen3.Qwen3MLP(config)
    return module.to(getattr(torch, plan.dtype))


def liger_class_names() -> dict[str, str]:
    """{kind: class name} the Liger patch puts in place (building them needs no GPU); {} when
    liger-kernel cannot be patched in here."""
    from transformers.models.qwen3 import modeling_qwen3

    from specforge.config import ConfigError
    from specforge.liger import liger_patch

    try:
        with liger_patch(True, "draft"):
            return {
                "rmsnorm": modeling_qwen3.Qwen3RMSNorm.__name__,
                "swiglu": modeling_qwen3.Qwen3MLP.__name__,
                "loss": "LigerFusedLinearCE",
            }
    except ConfigError:
        return {}


def _fwd_bwd(module, shape: tuple[int, ...], dtype: str, device: str, scalar: bool = False):
    """(prep, run) for one forward + backward as in training: parameter and input gradients
    start empty every rep (the trainer sets them to None after each micro-batch). ``scalar``: the
    module returns a loss, whose backward starts from 1."""
    import torch

    tdtype = getattr(torch, dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape, generator=gen, device=device, dtype=tdtype).requires_grad_(True)
    if scalar:
        dy = torch.ones((), device=device, dtype=torch.float32)
    else:
        dy = torch.randn(shape, generator=gen, device=device, dtype=tdtype)
    params = list(module.parameters())

    def prep():
        x.grad = None
        for p in params:
            p.grad = None
        return dy.clone()  # Liger's RMSNorm backward writes dx into its dy (in_place=True)

    def run(grad):
        module(x).backward(grad)

    return prep, run


def _measure_module(
    plan: CellPlan, site: Site, liger: bool, timer: Timer, reps: int, warmup: int
) -> tuple[str, list[float], float | None]:
    """(class name, seconds per rep, peak bytes or None) of one module's forward + backward; its
    tensors are freed on return."""
    module = build_module(plan, site, liger)
    prep, run = _fwd_bwd(module, site.shape, plan.dtype, plan.device, scalar=site.kind == "loss")
    times = timer.time(prep, run, reps, warmup)
    return type(module).__name__, times, timer.peak_bytes(prep, run)


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".strip().rstrip(":")[:240]


def liger_unavailable(device: str) -> str | None:
    """Why Liger's modules cannot run on this cell's device, or None (the sweep's skip reasons)."""
    from bench.run.sweep import NO_GPU, liger_skip_reason

    if device == "cpu":
        import torch

        if torch.cuda.is_available():
            return "Liger's Triton kernels need a CUDA or ROCm GPU; this cell runs on the CPU (training.device: cpu)"
        return NO_GPU
    return liger_skip_reason()


def _versions() -> dict[str, str | None]:
    out = {}
    for key, dist in (("torch_version", "torch"), ("transformers_version", "transformers")):
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = None
    from specforge.liger import liger_version

    out["liger_version"] = liger_version()
    return out


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name()
    return f"CPU ({platform.processor() or platform.machine()})"


def measure_cell(
    plan: CellPlan, timer: Timer, limits: Limits, reps: int, warmup: int, common: dict, log=print
) -> list[dict]:
    """One row per site x implementation: times, memory, bytes, FLOPs, roofline, predicted saving."""
    import torch

    s = plan.shapes
    elem = roofline.dtype_bytes(plan.dtype)
    skip = liger_unavailable(plan.device)
    liger_names = liger_class_names() if skip else {}
    rows: list[dict] = []
    for site in all_sites(s):
        flops, nbytes = site_cost(site, s, elem)
        stock_median = math.nan
        for impl in IMPLS:
            row = {
                **common,
                "cell_id": plan.cell.cell_id,
                "profile": plan.profile,
                "mode": plan.mode,
                "batch_size": s.batch,
                "seq_len": s.seq_len,
                "num_anchors": s.num_anchors,
                "block_size": s.block_size,
                "accumulation_steps": plan.micro_batches,
                "dtype": plan.dtype,
                "device": plan.device,
                "module": site.name,
                "kind": site.kind,
                "impl": impl,
                "draft_modules": site.draft_modules,
                "input_shape": "x".join(map(str, site.shape)),
                "rows": site.rows,
                "dim": site.dim,
                "intermediate_size": s.intermediate if site.kind == "swiglu" else None,
                "vocab_size": s.vocab if site.kind == "loss" else None,
                "per_micro_batch": site.per_micro_batch,
                "micro_batches_per_step": plan.micro_batches,
                "reps": reps,
                "warmup": warmup,
                "bytes": nbytes,
                "flops": flops,
                "copy_gb_per_s": limits.copy_bytes_per_s / 1e9,
                "matmul_tflops": limits.matmul_flops_per_s / 1e12,
                "timer": timer.name,
            }
            bound = roofline.roofline(flops, nbytes, None, limits.copy_bytes_per_s, limits.matmul_flops_per_s)
            row.update(
                intensity_flop_per_byte=bound.intensity,
                bound=bound.bound,
                roofline_ms=bound.floor_s * 1e3,
            )
            if impl == "liger" and skip:
                row.update(status="skipped", reason=skip, module_class=liger_names.get(site.kind))
                rows.append(row)
                log(f"  {site.name:<16} {impl:<5} skipped: {skip}")
                continue
            try:
                cls, times, peak = _measure_module(plan, site, impl == "liger", timer, reps, warmup)
            except Exception as e:  # noqa: BLE001 - recorded (an OOM, a Liger that cannot patch or compile)
                from specforge.config import ConfigError

                row.update(status="skipped" if isinstance(e, ConfigError) else "error", reason=_short(e))
                rows.append(row)
                log(f"  {site.name:<16} {impl:<5} {row['status']}: {row['reason']}")
                continue
            finally:
                if plan.device == "cuda":
                    torch.cuda.empty_cache()
            row["module_class"] = cls
            median, p20, p80 = quantiles_ms(times)
            rl = roofline.roofline(
                flops, nbytes, median / 1e3, limits.copy_bytes_per_s, limits.matmul_flops_per_s
            )
            row.update(
                status="ok",
                time_median_ms=median,
                time_p20_ms=p20,
                time_p80_ms=p80,
                peak_mem_delta_mib=None if peak is None else peak / MIB,
                achieved_gb_per_s=rl.achieved_bytes_per_s / 1e9,
                achieved_tflops=rl.achieved_flops_per_s / 1e12,
                roofline_fraction=rl.fraction,
            )
            if impl == "stock":
                stock_median = median
            elif math.isfinite(stock_median):
                row["saving_per_call_ms"] = stock_median - median
                row["saving_per_step_ms"] = roofline.step_saving_s(
                    stock_median, median, site.per_micro_batch, plan.micro_batches
                )
            rows.append(row)
            log(
                f"  {site.name:<16} {impl:<5} {median:.4g} ms [{p20:.4g}, {p80:.4g}]  "
                f"{rl.bound}-bound, {rl.fraction:.0%} of the roofline"
            )
    return rows


# ---------------------------------------------------------------- predicted vs measured


def read_summary(sweep_dir: Path) -> pd.DataFrame | None:
    path = sweep_dir / "summary.csv"
    try:
        return pd.read_csv(path)
    except (OSError, ValueError):
        return None


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def _summary_row(summary: pd.DataFrame | None, cell_id: str, arm: str) -> dict:
    """The summary.csv row of (cell, arm) as a dict, {} when the sweep has none."""
    if summary is None or not {"cell_id", "arm"} <= set(summary.columns):
        return {}
    hit = summary[(summary["cell_id"] == cell_id) & (summary["arm"] == arm)]
    return hit.iloc[0].to_dict() if len(hit) else {}


def predictions(rows: pd.DataFrame, cell_id: str, summary: pd.DataFrame | None) -> list[dict]:
    """Per Liger arm: the step-time saving the module timings predict (the saving per step of every
    swapped site, summed), beside the sweep's measured Δ for the cell where summary.csv has it."""
    cell = rows[(rows["cell_id"] == cell_id) & (rows["impl"] == "liger")]
    base_step = _num(_summary_row(summary, cell_id, "baseline").get("s_per_step_median"))
    out = []
    for arm in LIGER_ARMS:
        kinds = swapped_kinds(arm)
        swapped = cell[cell["kind"].isin(kinds)]
        complete = len(swapped) > 0 and (swapped["status"] == "ok").all()
        saving_s = float(swapped["saving_per_step_ms"].sum()) / 1e3 if complete else math.nan
        m = _summary_row(summary, cell_id, arm)
        out.append(
            {
                "arm": arm,
                "swaps": " + ".join(KINDS[k] for k in kinds),
                "predicted_saving_ms": saving_s * 1e3,
                "baseline_s_per_step": base_step,
                "predicted_delta_samples_per_s_pct": roofline.samples_per_s_delta_pct(base_step, saving_s),
                "measured_saving_ms": (base_step - _num(m.get("s_per_step_median"))) * 1e3,
                "measured_delta_samples_per_s_pct": _num(m.get("delta_samples_per_s_pct")),
                "measured_ci95_low": _num(m.get("delta_samples_per_s_pct_ci95_low")),
                "measured_ci95_high": _num(m.get("delta_samples_per_s_pct_ci95_high")),
                "not_predicted": "" if complete else _why_not(swapped),
                "in_sweep": bool(m),
            }
        )
    return out


def _why_not(swapped: pd.DataFrame) -> str:
    bad = swapped[swapped["status"] != "ok"]
    reasons = list(dict.fromkeys(str(r) for r in bad.get("reason", pd.Series(dtype=object)).dropna()))
    return "; ".join(reasons) or "no timed Liger module"


# ---------------------------------------------------------------- the command


def select_cells(cfg: SweepConfig, wanted: list[str] | None) -> list[Cell]:
    if not wanted:
        return list(cfg.cells)
    known = [c.cell_id for c in cfg.cells]
    for cid in wanted:
        if cid not in known:
            raise SweepError(f"--cell {cid}: no such cell in {cfg.path} (cells: {', '.join(known)})")
    return [c for c in cfg.cells if c.cell_id in wanted]


def _check_machine(cfg: SweepConfig) -> None:
    from bench.probe.hardware import check_hardware

    try:
        problem = check_hardware(list(cfg.hardware), config=str(cfg.path))
    except ValueError as e:  # HardwareError: an unknown hardware name, a bad BENCH_HARDWARE
        raise SweepError(str(e)) from None
    if problem:
        raise SweepError(problem)


def run_kernels(
    config: str | Path,
    out: str | Path | None = None,
    cells: list[str] | None = None,
    sweep_dir: str | Path | None = None,
    reps: int | None = None,
    warmup: int | None = None,
    argv: list[str] | None = None,
    profile: bool = False,
    rebuild: bool = False,
) -> int:
    """The ``kernels`` command (``profile``: also the per-arm profiler buckets, bench/kernel_buckets.py;
    ``rebuild``: no measuring, see rebuild_kernels); SweepError (one line, exit 2) on bad input,
    before anything is written."""
    from bench.kernels.report import plot_kernels, render_markdown, write_csv
    from bench.run.sweepdir import check_out_path, git_commit

    if rebuild:
        given = [
            f for f, v in (("--cell", cells or None), ("--reps", reps), ("--warmup", warmup)) if v is not None
        ]
        given += ["--profile"] if profile else []
        if given:
            raise SweepError(
                f"--rebuild measures nothing, so {', '.join(given)} cannot apply; drop "
                f"{'it' if len(given) == 1 else 'them'} (it rebuilds every cell in kernels.csv)"
            )
        return rebuild_kernels(config, out, sweep_dir, argv)
    reps = DEFAULT_REPS if reps is None else reps
    warmup = DEFAULT_WARMUP if warmup is None else warmup
    if not 3 <= reps <= MAX_REPS:
        raise SweepError(f"--reps: expected 3 to {MAX_REPS} (p20/p80 need a few), got {reps}")
    if not 0 <= warmup <= MAX_REPS:
        raise SweepError(f"--warmup: expected 0 to {MAX_REPS}, got {warmup}")
    cfg = load_config(config)
    if cfg.trainer_module != "specforge":
        raise SweepError(
            f"{cfg.path}: trainer_module: kernels times specforge's draft modules; "
            f"{cfg.trainer_module!r} is not supported"
        )
    chosen = select_cells(cfg, cells)
    out_dir = Path(out) if out is not None else Path(f"{cfg.out.rstrip('/')}-kernels")
    check_out_path(out_dir)
    sweep_path = Path(sweep_dir) if sweep_dir is not None else Path(cfg.out)
    _check_machine(cfg)
    import torch

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    plans = [plan_cell(cfg, c, device_type) for c in chosen]

    meta = {
        "command": "python -m bench kernels " + " ".join(argv if argv is not None else [str(config)]),
        "device_name": ", ".join(dict.fromkeys(device_name(p.device) for p in plans)),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "reps": reps,
        "warmup": warmup,
        "git_commit": git_commit(),
        **_versions(),
    }
    timers: dict[str, Timer] = {}
    limits: dict[tuple[str, str], Limits] = {}
    all_rows: list[dict] = []
    for plan in plans:
        timer = timers.get(plan.device) or timers.setdefault(plan.device, Timer(plan.device))
        key = (plan.device, plan.dtype)
        if key not in limits:
            print(f"measuring {plan.device} limits ({plan.dtype}) ...", flush=True)
            limits[key] = measure_limits(timer, plan.dtype)
            lim = limits[key]
            print(
                f"  copy {lim.copy_bytes_per_s / 1e9:.4g} GB/s, matmul {lim.matmul_flops_per_s / 1e12:.4g} TFLOP/s",
                flush=True,
            )
        print(f"{plan.cell.cell_id}: {plan.dtype} on {plan.device}", flush=True)
        common = {
            "device_name": device_name(plan.device),
            **{k: meta[k] for k in ("torch_version", "transformers_version", "liger_version", "git_commit")},
        }
        all_rows += measure_cell(
            plan,
            timer,
            limits[key],
            reps,
            warmup,
            common,
            log=lambda line: print(line, flush=True),
        )
    rows = pd.DataFrame(all_rows).reindex(columns=KERNEL_COLUMNS)
    summary = read_summary(sweep_path)
    timer_names = "; ".join(t.name for t in timers.values())
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out_dir / "kernels.csv")
    plot_kernels(rows, plans, out_dir / "kernels.png")
    text = render_markdown(cfg, plans, rows, limits, timer_names, meta, sweep_path, summary)
    records: list[dict] = []
    if profile:
        from bench.kernels import buckets as kernel_buckets

        print("profiling a training step per cell and arm ...", flush=True)
        records = kernel_buckets.run_profiles(cfg, plans, out_dir, log=lambda line: print(line, flush=True))
    return _write_report(out_dir, text, list(OUTPUTS), records)


def _write_report(out_dir: Path, text: str, written: list[str], records: list[dict]) -> int:
    """kernels.md (with the bucket section and its CSV/plot when there are profile records)."""
    if records:
        from bench.kernels import buckets as kernel_buckets
        from bench.kernels.report import write_csv_plain

        buckets = kernel_buckets.bucket_rows(records)
        write_csv_plain(buckets, out_dir / "kernel_buckets.csv")
        kernel_buckets.plot_buckets(buckets, out_dir / "kernel_buckets.png")
        text += "\n" + kernel_buckets.render_markdown(buckets, records)
        written = [*written, *kernel_buckets.OUTPUTS]
    atomic_write_text(out_dir / "kernels.md", text)
    print(f"wrote {', '.join(str(out_dir / n) for n in written)}")
    return 0


def rebuild_kernels(
    config: str | Path, out: str | Path | None, sweep_dir: str | Path | None, argv: list[str] | None
) -> int:
    """``kernels --rebuild``: kernels.md and kernels.png again from an earlier run's kernels.csv and
    profiles/, with the measured Δ read now from the sweep's summary.csv (e.g. when the attribution
    ran before the sweep had finished). Measures nothing, so it runs anywhere."""
    from bench.kernels import buckets as kernel_buckets
    from bench.kernels.report import plot_kernels, render_markdown

    cfg = load_config(config)
    out_dir = Path(out) if out is not None else Path(f"{cfg.out.rstrip('/')}-kernels")
    if not (out_dir / "kernels.csv").is_file():
        raise SweepError(
            f"--rebuild: no {out_dir / 'kernels.csv'}; run `python -m bench kernels` there first"
        )
    rows = pd.read_csv(out_dir / "kernels.csv")
    if not len(rows):
        raise SweepError(f"--rebuild: {out_dir / 'kernels.csv'} has no rows")
    sweep_path = Path(sweep_dir) if sweep_dir is not None else Path(cfg.out)
    measured = [c for c in cfg.cells if c.cell_id in set(rows["cell_id"])]
    if not measured:
        raise SweepError(f"--rebuild: {out_dir / 'kernels.csv'} holds no cell of {cfg.path}")
    plans = [
        plan_cell(cfg, c, str(rows.loc[rows["cell_id"] == c.cell_id, "device"].iloc[0])) for c in measured
    ]
    limits = {}
    for (device, dtype), g in rows.groupby(["device", "dtype"], sort=False):
        limits[(device, dtype)] = Limits(
            device=device,
            dtype=dtype,
            copy_bytes_per_s=float(g["copy_gb_per_s"].iloc[0]) * 1e9,
            copy_buffer_bytes=COPY_BYTES[device],
            matmul_flops_per_s=float(g["matmul_tflops"].iloc[0]) * 1e12,
            gemm_n=GEMM_N[device],
        )
    first = rows.iloc[0]
    meta = {
        "command": "python -m bench kernels "
        + " ".join(argv if argv is not None else [str(config), "--rebuild"]),
        "device_name": ", ".join(dict.fromkeys(str(d) for d in rows["device_name"])),
        "date": f"rebuilt {datetime.now(timezone.utc).isoformat(timespec='seconds')} from kernels.csv",
        "reps": int(first["reps"]),
        "warmup": int(first["warmup"]),
        "git_commit": f"{first['git_commit']} (the timings)",
        "torch_version": first["torch_version"],
        "transformers_version": first["transformers_version"],
        "liger_version": first["liger_version"] if pd.notna(first["liger_version"]) else None,
    }
    timer_names = "; ".join(dict.fromkeys(str(t) for t in rows["timer"]))
    plot_kernels(rows, plans, out_dir / "kernels.png")
    text = render_markdown(cfg, plans, rows, limits, timer_names, meta, sweep_path, read_summary(sweep_path))
    return _write_report(
        out_dir, text, ["kernels.png", "kernels.md"], kernel_buckets.load_profiles(plans, out_dir)
    )
