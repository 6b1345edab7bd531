"""The kernel attribution's outputs: kernels.md (tables of the module timings, the roofline
and the predicted vs measured step saving), kernels.png and kernels.csv. The measurements
come from bench/kernels.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.config.sweep import SweepConfig
from bench.fmt import md as _md
from bench.fmt import table as _table
from bench.kernels.measure import IMPLS, KERNEL_COLUMNS, MIB, CellPlan, Limits, _num, predictions


def _f(x: Any, spec: str) -> str:
    v = _num(x)
    return "—" if math.isnan(v) else format(v, spec)


def _pct(x: Any) -> str:
    v = _num(x)
    return "—" if math.isnan(v) else f"{v:.0%}"


def render_markdown(
    cfg: SweepConfig,
    plans: list[CellPlan],
    rows: pd.DataFrame,
    limits: dict[tuple[str, str], Limits],
    timer_name: str,
    meta: dict,
    sweep_dir: Path,
    summary: pd.DataFrame | None,
) -> str:
    lines = [f"## Kernel attribution: {cfg.name}", ""]
    lines += [
        f"`{meta['command']}` on {meta['device_name']}, torch {meta.get('torch_version')}, transformers "
        f"{meta.get('transformers_version')}, liger-kernel {meta.get('liger_version') or 'not installed'}, "
        f"commit {meta.get('git_commit') or 'unknown'}, {meta['date']}.",
        "",
        f"Each rep is one forward + backward of one module at the cell's training shape, with fresh "
        f"gradients; {meta['reps']} reps after {meta['warmup']} warm-up reps, timed with {timer_name}. "
        "Times are medians with [p20, p80]. Bytes and FLOPs are by formula (compulsory traffic, the "
        "same for both implementations; docs/kernels.md), so GB/s and TFLOP/s are effective rates.",
        "",
        "Device limits, measured by this command:",
        "",
    ]
    for lim in limits.values():
        lines.append(
            f"- {lim.device}, {lim.dtype}: copy {lim.copy_bytes_per_s / 1e9:.4g} GB/s (a "
            f"{lim.copy_buffer_bytes // MIB} MiB copy, read + write counted); matmul "
            f"{lim.matmul_flops_per_s / 1e12:.4g} TFLOP/s ({lim.gemm_n}³ GEMM); ridge point "
            f"{lim.ridge:.3g} FLOP/byte (below it a kernel is memory-bound)."
        )
    lines.append("")
    if summary is None:
        lines += [f"No sweep results at {sweep_dir / 'summary.csv'}: the measured columns are empty.", ""]
    for plan in plans:
        s, cid = plan.shapes, plan.cell.cell_id
        c = rows[rows["cell_id"] == cid]
        lines += [f"### {cid}", ""]
        lines += [
            f"{plan.profile}, {plan.mode}; batch b = {s.batch}, S = {s.seq_len}, N = {s.num_anchors} anchors, "
            f"block B = {s.block_size}; H = {s.hidden}, I = {s.intermediate}, {s.layers} layers, "
            f"{s.heads} / {s.kv_heads} heads of {s.head_dim}; {plan.dtype} on {plan.device}; "
            f"{plan.micro_batches} micro-batches per optimizer step.",
            "",
            f"Tokens per micro-batch: block b·N·B = {s.block_tokens}, context b·S = {s.context_tokens}, "
            f"keys/values b·(S + N·B) = {s.kv_tokens}.",
            "",
        ]
        body = []
        for r in c.itertuples():
            t = (
                f"{_f(r.time_median_ms, '.4g')} [{_f(r.time_p20_ms, '.4g')}, {_f(r.time_p80_ms, '.4g')}]"
                if r.status == "ok"
                else f"{r.status}: {_md(r.reason)}"
            )
            body.append(
                [
                    r.module,
                    _md(r.module_class),
                    str(r.per_micro_batch),
                    r.input_shape,
                    t,
                    _f(r.peak_mem_delta_mib, ".4g"),
                    _f(r.achieved_gb_per_s, ".4g"),
                    _f(r.achieved_tflops, ".3g"),
                    f"{r.bound} ({_f(r.intensity_flop_per_byte, '.3g')} FLOP/B)",
                    _pct(r.roofline_fraction),
                    _f(r.saving_per_step_ms, "+.4g"),
                ]
            )
        lines += _table(
            [
                "module",
                "class",
                "calls / µbatch",
                "input shape",
                "fwd+bwd ms [p20, p80]",
                "peak mem MiB",
                "GB/s",
                "TFLOP/s",
                "bound (intensity)",
                "of roofline",
                "saving / step ms",
            ],
            body,
        )
        lines += ["", "Predicted (sum of the swapped modules' savings per step) vs measured (the sweep):", ""]
        pred_rows = []
        for p in predictions(rows, cid, summary):
            note = f"not predicted: {p['not_predicted']}" if p["not_predicted"] else ""
            measured = (
                f"{_f(p['measured_delta_samples_per_s_pct'], '+.1f')}% "
                f"[{_f(p['measured_ci95_low'], '+.1f')}, {_f(p['measured_ci95_high'], '+.1f')}]"
                if p["in_sweep"]
                else "not in the sweep"
            )
            pred_rows.append(
                [
                    p["arm"],
                    p["swaps"],
                    _f(p["predicted_saving_ms"], "+.4g"),
                    _f(p["predicted_delta_samples_per_s_pct"], "+.1f"),
                    _f(p["baseline_s_per_step"] * 1e3, ".4g"),
                    _f(p["measured_saving_ms"], "+.4g"),
                    measured,
                    _md(note),
                ]
            )
        lines += _table(
            [
                "arm",
                "swaps",
                "predicted saving ms/step",
                "predicted Δ samples/s %",
                "baseline ms/step",
                "measured saving ms/step",
                "measured Δ samples/s % (95% CI)",
                "note",
            ],
            pred_rows,
        )
        lines.append("")
    lines += [
        "Saving / step = (stock − Liger median) × calls per micro-batch × micro-batches per step. An "
        "end-to-end Δ can differ from the sum: other kernels, overlap, the allocator and launch overheads "
        "change with the arm too (docs/kernels.md).",
        "",
        "![kernels](kernels.png)",
        "",
    ]
    return "\n".join(lines)


def plot_kernels(rows: pd.DataFrame, plans: list[CellPlan], path: Path) -> Path:
    """Per cell: fwd+bwd time per module (log scale), stock vs Liger, p20-p80 error bars, the
    fraction of the roofline above each bar; skipped or failed bars say so."""
    from matplotlib.ticker import FuncFormatter

    from bench.results.plots import _grid, _save

    colors = {"stock": "tab:blue", "liger": "tab:orange"}
    fig, axes = _grid(
        len(plans), "Forward + backward per module call (median, p20-p80; label: % of roofline)"
    )
    for ax, plan in zip(axes, plans):
        c = rows[rows["cell_id"] == plan.cell.cell_id]
        sites = list(dict.fromkeys(c["module"]))
        width = 0.38
        timed = c[c["status"] == "ok"]["time_median_ms"].astype(float)
        floor = float(timed.min()) if len(timed) else 1.0
        for k, impl in enumerate(IMPLS):
            d = c[c["impl"] == impl].set_index("module").reindex(sites)
            x = np.arange(len(sites)) + (k - 0.5) * width
            med = d["time_median_ms"].astype(float).to_numpy()
            lo = np.nan_to_num(med - d["time_p20_ms"].astype(float).to_numpy())
            hi = np.nan_to_num(d["time_p80_ms"].astype(float).to_numpy() - med)
            has = ~np.isnan(med)
            ax.bar(
                x[has],
                med[has],
                width,
                yerr=[lo[has], hi[has]],
                capsize=3,
                color=colors[impl],
                label=impl,
            )
            for xi, (_, r) in zip(x, d.iterrows()):
                if r["status"] == "ok":
                    text, y = _pct(r["roofline_fraction"]), float(r["time_p80_ms"])
                else:
                    text, y = str(r["status"]), floor
                ax.text(
                    xi,
                    y,
                    text,
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    rotation=90 if r["status"] != "ok" else 0,
                )
        bounds = c.drop_duplicates("module").set_index("module")["bound"].reindex(sites)
        counts = c.drop_duplicates("module").set_index("module")["per_micro_batch"].reindex(sites)
        ax.set_xticks(
            np.arange(len(sites)),
            [f"{m.replace('_', chr(10), 1)}\n×{int(n)}, {b}" for m, n, b in zip(sites, counts, bounds)],
            fontsize=7,
        )
        ax.set_yscale("log")
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_ylabel("ms per call (log)")
        ax.set_title(f"{plan.cell.cell_id} ({plan.dtype}, {plan.device})", fontsize=9)
        ax.legend(fontsize=8)
    return _save(fig, path)


def write_csv(rows: pd.DataFrame, path: Path) -> Path:
    return write_csv_plain(rows.reindex(columns=KERNEL_COLUMNS), path)


def write_csv_plain(df: pd.DataFrame, path: Path) -> Path:
    from bench.results.report import write_csv as _write

    return _write(df, path)
