"""Measuring one cell: forward + backward of each site's stock and Liger module timed at the
cell's shapes, with its spread, peak memory, bytes and FLOPs, roofline and predicted saving per
step, as the rows of kernels.csv (KERNEL_COLUMNS)."""

from __future__ import annotations

import math

from bench.kernels import roofline
from bench.kernels.modules import build_module, is_config_error, liger_class_names, liger_unavailable
from bench.kernels.shapes import IMPLS, CellPlan, Site, all_sites, site_cost
from bench.kernels.timing import MIB, Limits, Timer, quantiles_ms

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


def _site_row(
    plan: CellPlan,
    site: Site,
    impl: str,
    cost: tuple[int, int],
    limits: Limits,
    timer: Timer,
    reps: int,
    warmup: int,
) -> dict:
    """A row's columns known before timing: the cell, the site, its bytes, FLOPs and bound."""
    s = plan.shapes
    flops, nbytes = cost
    bound = roofline.roofline(flops, nbytes, None, limits.copy_bytes_per_s, limits.matmul_flops_per_s)
    return {
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
        "intensity_flop_per_byte": bound.intensity,
        "bound": bound.bound,
        "roofline_ms": bound.floor_s * 1e3,
    }


def _time_row(row: dict, plan: CellPlan, site: Site, timer: Timer, limits: Limits, log) -> float | None:
    """Time the row's module and fill in its times, or its status and reason when it could not be
    timed; its median ms, or None."""
    import torch

    impl = row["impl"]
    try:
        cls, times, peak = _measure_module(plan, site, impl == "liger", timer, row["reps"], row["warmup"])
    except Exception as e:  # noqa: BLE001 - recorded (an OOM, a Liger that cannot patch or compile)
        row.update(status="skipped" if is_config_error(e) else "error", reason=_short(e))
        log(f"  {site.name:<16} {impl:<5} {row['status']}: {row['reason']}")
        return None
    finally:
        if plan.device == "cuda":
            torch.cuda.empty_cache()
    row["module_class"] = cls
    median, p20, p80 = quantiles_ms(times)
    rl = roofline.roofline(
        row["flops"], row["bytes"], median / 1e3, limits.copy_bytes_per_s, limits.matmul_flops_per_s
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
    log(
        f"  {site.name:<16} {impl:<5} {median:.4g} ms [{p20:.4g}, {p80:.4g}]  "
        f"{rl.bound}-bound, {rl.fraction:.0%} of the roofline"
    )
    return median


def measure_cell(
    plan: CellPlan, timer: Timer, limits: Limits, reps: int, warmup: int, common: dict, log=print
) -> list[dict]:
    """One row per site x implementation: times, memory, bytes, FLOPs, roofline, predicted saving."""
    elem = roofline.dtype_bytes(plan.dtype)
    skip = liger_unavailable(plan.device)
    liger_names = liger_class_names() if skip else {}
    rows: list[dict] = []
    for site in all_sites(plan.shapes):
        cost = site_cost(site, plan.shapes, elem)
        stock_median = math.nan
        for impl in IMPLS:
            row = {**common, **_site_row(plan, site, impl, cost, limits, timer, reps, warmup)}
            rows.append(row)
            if impl == "liger" and skip:
                row.update(status="skipped", reason=skip, module_class=liger_names.get(site.kind))
                log(f"  {site.name:<16} {impl:<5} skipped: {skip}")
                continue
            median = _time_row(row, plan, site, timer, limits, log)
            if median is None:
                continue
            if impl == "stock":
                stock_median = median
            elif math.isfinite(stock_median):
                row["saving_per_call_ms"] = stock_median - median
                row["saving_per_step_ms"] = roofline.step_saving_s(
                    stock_median, median, site.per_micro_batch, plan.micro_batches
                )
    return rows
