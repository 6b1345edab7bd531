"""The kernel attribution's outputs: kernels.md (tables of the module timings, the roofline
and the predicted vs measured step saving), kernels.png and kernels.csv. The measurements
come from bench/kernels/cell.py, the predictions from bench/kernels/predict.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bench import fmt
from bench.kernels.bridge import SweepConfig, plot_grid, save_plot
from bench.kernels.bridge import write_csv as write_table
from bench.kernels.cell import KERNEL_COLUMNS
from bench.kernels.predict import predictions
from bench.kernels.shapes import IMPLS, CellPlan
from bench.kernels.timing import MIB, Limits

MODULE_HEADER = [
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
]
PREDICTION_HEADER = [
    "arm",
    "swaps",
    "predicted saving ms/step",
    "predicted Δ samples/s %",
    "baseline ms/step",
    "measured saving ms/step",
    "measured Δ samples/s % (95% CI)",
    "note",
]


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
    lines += _provenance(meta, timer_name, limits)
    if summary is None:
        lines += [f"No sweep results at {sweep_dir / 'summary.csv'}: the measured columns are empty.", ""]
    for plan in plans:
        lines += _cell_section(plan, rows, summary)
    lines += [
        "Saving / step = (stock − Liger median) × calls per micro-batch × micro-batches per step. An "
        "end-to-end Δ can differ from the sum: other kernels, overlap, the allocator and launch overheads "
        "change with the arm too (docs/kernels.md).",
        "",
        "![kernels](kernels.png)",
        "",
    ]
    return "\n".join(lines)


def _provenance(meta: dict, timer_name: str, limits: dict[tuple[str, str], Limits]) -> list[str]:
    """The command, the versions, how a rep is timed, and the device limits."""
    lines = [
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
    return lines


def _cell_section(plan: CellPlan, rows: pd.DataFrame, summary: pd.DataFrame | None) -> list[str]:
    """One cell: its shapes and token counts, the module table, predicted vs measured."""
    s, cid = plan.shapes, plan.cell.cell_id
    lines = [f"### {cid}", ""]
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
    lines += fmt.table(MODULE_HEADER, [_module_cells(r) for r in rows[rows["cell_id"] == cid].itertuples()])
    lines += ["", "Predicted (sum of the swapped modules' savings per step) vs measured (the sweep):", ""]
    lines += fmt.table(PREDICTION_HEADER, [_prediction_cells(p) for p in predictions(rows, cid, summary)])
    lines.append("")
    return lines


def _module_cells(r) -> list[str]:
    """One row of the module table (``r``: a kernels.csv row as a namedtuple)."""
    t = (
        f"{fmt.f(r.time_median_ms, '.4g')} [{fmt.f(r.time_p20_ms, '.4g')}, {fmt.f(r.time_p80_ms, '.4g')}]"
        if r.status == "ok"
        else f"{r.status}: {fmt.md(r.reason)}"
    )
    return [
        r.module,
        fmt.md(r.module_class),
        str(r.per_micro_batch),
        r.input_shape,
        t,
        fmt.f(r.peak_mem_delta_mib, ".4g"),
        fmt.f(r.achieved_gb_per_s, ".4g"),
        fmt.f(r.achieved_tflops, ".3g"),
        f"{r.bound} ({fmt.f(r.intensity_flop_per_byte, '.3g')} FLOP/B)",
        fmt.pct(r.roofline_fraction),
        fmt.f(r.saving_per_step_ms, "+.4g"),
    ]


def _prediction_cells(p: dict) -> list[str]:
    """One row of the predicted vs measured table (``p``: one of predict.predictions)."""
    note = f"not predicted: {p['not_predicted']}" if p["not_predicted"] else ""
    measured = (
        f"{fmt.f(p['measured_delta_samples_per_s_pct'], '+.1f')}% "
        f"[{fmt.f(p['measured_ci95_low'], '+.1f')}, {fmt.f(p['measured_ci95_high'], '+.1f')}]"
        if p["in_sweep"]
        else "not in the sweep"
    )
    return [
        p["arm"],
        p["swaps"],
        fmt.f(p["predicted_saving_ms"], "+.4g"),
        fmt.f(p["predicted_delta_samples_per_s_pct"], "+.1f"),
        fmt.f(p["baseline_s_per_step"] * 1e3, ".4g"),
        fmt.f(p["measured_saving_ms"], "+.4g"),
        measured,
        fmt.md(note),
    ]


def plot_kernels(rows: pd.DataFrame, plans: list[CellPlan], path: Path) -> Path:
    """Per cell: fwd+bwd time per module (log scale), stock vs Liger, p20-p80 error bars, the
    fraction of the roofline above each bar; skipped or failed bars say so."""
    from matplotlib.ticker import FuncFormatter

    colors = {"stock": "tab:blue", "liger": "tab:orange"}
    fig, axes = plot_grid(
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
                    text, y = fmt.pct(r["roofline_fraction"]), float(r["time_p80_ms"])
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
    return save_plot(fig, path)


def write_csv(rows: pd.DataFrame, path: Path) -> Path:
    return write_csv_plain(rows.reindex(columns=KERNEL_COLUMNS), path)


def write_csv_plain(df: pd.DataFrame, path: Path) -> Path:
    return write_table(df, path)
