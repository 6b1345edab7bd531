"""Build a sweep's results: runs.csv, summary.csv, loss_parity.csv, vram_per_card.csv, four PNGs
and report.md, every file written atomically into the sweep directory.

The CSV column lists (RUNS_COLUMNS, SUMMARY_COLUMNS, LOSS_PARITY_COLUMNS, VRAM_PER_CARD_COLUMNS)
are defined in bench.results.aggregate and re-exported here.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

import pandas as pd

from bench import fmt
from bench.fileio import atomic_write_text, read_json
from bench.results import plots
from bench.results.aggregate import (
    BASELINE_ARM,
    CONTRAST_COLUMNS,
    LOSS_PARITY_COLUMNS,
    PARITY_CRITERION,
    RUNS_COLUMNS,
    SUMMARY_COLUMNS,
    VRAM_PER_CARD_COLUMNS,
    RunRecord,
    contrast_table,
    join_unique,
    load_runs,
    loss_parity_gaps,
    loss_parity_table,
    runs_table,
    scaling_table,
    summary_table,
    vram_per_card_table,
    with_loss_parity,
)
from bench.results.capacity import capacity_table

__all__ = [
    "CONTRAST_COLUMNS",
    "CSV_FLOAT_FORMAT",
    "LOSS_PARITY_COLUMNS",
    "MAIN_TABLE_HEADER",
    "RUNS_COLUMNS",
    "SUMMARY_COLUMNS",
    "VRAM_PER_CARD_COLUMNS",
    "build_report",
    "write_csv",
]

CSV_FLOAT_FORMAT = "%.6g"  # rounding happens here only, at write time
MAIN_TABLE_HEADER = [
    "profile", "mode", "batch", "seq", "gpus", "arm", "runs ok", "samples/s", "s/step", "peak VRAM (GiB, polled)",
    "torch peak alloc (GiB)", "loss @ last step", "Δ samples/s (95% CI)", "Δ peak VRAM (95% CI)", "verdict",
]  # fmt: skip
PARITY_TABLE_HEADER = [
    "profile", "mode", "batch", "seq", "gpus", "arm", "repeat", "steps compared", "max |Δ loss| (step)",
    "|Δ loss| @ last step", "loss baseline", "loss arm", "tolerance", "result",
]  # fmt: skip
PLOT_FILES = {
    "throughput.png": "Throughput (samples/s, 95% CI)",
    "vram_per_card.png": "Peak VRAM per card",
    "loss_curves.png": "Loss curves",
    "step_time_dist.png": "Steady-state step times",
}


def write_csv(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a table atomically, floats to 6 significant digits."""
    atomic_write_text(path, df.to_csv(index=False, float_format=CSV_FLOAT_FORMAT))
    return Path(path)


def build_report(sweep_dir: str | Path) -> dict[str, Any]:
    """Aggregate ``sweep_dir`` and write its CSVs, plots and report.md.

    Returns {"paths": {file name: Path}, "runs", "summary", "loss_parity", "vram_per_card": DataFrames}.
    Raises ValueError when the directory is missing or holds no runs.
    """
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ValueError(f"{sweep_dir}: no such sweep directory")
    records = load_runs(sweep_dir)
    if not records:
        raise ValueError(f"{sweep_dir}: no run directories under {sweep_dir / 'runs'}")
    sweep = read_json(sweep_dir / "sweep.json") or {}
    tables = {
        "runs": runs_table(records),
        "loss_parity": loss_parity_table(records),
        "vram_per_card": vram_per_card_table(records),
    }
    tables["summary"] = with_loss_parity(
        summary_table(
            tables["runs"],
            precision=sweep.get("precision_targets") or {},
            equivalence_pct=fmt.num(sweep.get("equivalence_pct")) if sweep.get("equivalence_pct") else 1.0,
        ),
        tables["loss_parity"],
    )
    paths = {f"{name}.csv": write_csv(df, sweep_dir / f"{name}.csv") for name, df in tables.items()}
    paths["throughput.png"] = plots.plot_throughput(tables["summary"], sweep_dir / "throughput.png")
    paths["vram_per_card.png"] = plots.plot_vram_per_card(
        tables["vram_per_card"], sweep_dir / "vram_per_card.png"
    )
    paths["loss_curves.png"] = plots.plot_loss_curves(records, sweep_dir / "loss_curves.png")
    paths["step_time_dist.png"] = plots.plot_step_time_dist(records, sweep_dir / "step_time_dist.png")
    tables["scaling"] = scaling_table(tables["summary"])
    contrasts = (sweep.get("config") or {}).get("contrasts") or []
    tables["contrasts"] = contrast_table(
        tables["runs"],
        contrasts,
        equivalence_pct=fmt.num(sweep.get("equivalence_pct")) if sweep.get("equivalence_pct") else 1.0,
    )
    for name in ("scaling.csv", "scaling.png", "capacity.csv", "capacity.png", "contrasts.csv"):
        (sweep_dir / name).unlink(missing_ok=True)  # the sweep's own, from an earlier build
    if len(tables["contrasts"]):
        paths["contrasts.csv"] = write_csv(tables["contrasts"], sweep_dir / "contrasts.csv")
    if len(tables["scaling"]):
        paths["scaling.csv"] = write_csv(tables["scaling"], sweep_dir / "scaling.csv")
        paths["scaling.png"] = plots.plot_scaling(tables["scaling"], sweep_dir / "scaling.png")
    tables["capacity"] = capacity_table(tables["runs"], sweep, tables["vram_per_card"])
    if len(tables["capacity"]):
        paths["capacity.csv"] = write_csv(tables["capacity"], sweep_dir / "capacity.csv")
        paths["capacity.png"] = plots.plot_capacity(
            tables["runs"], tables["capacity"], sweep_dir / "capacity.png"
        )
    text = render_markdown(sweep, sweep_dir, records, tables)
    atomic_write_text(sweep_dir / "report.md", text)
    paths["report.md"] = sweep_dir / "report.md"
    return {"paths": paths, **tables}


# --- formatting --------------------------------------------------------------------------------


def _delta_cell(point: Any, lo: Any, hi: Any, spec: str, unit: str, extra: str = "") -> str:
    """``+10.2% [+8.1, +12.3]``: a point estimate with its CI when there is one."""
    if fmt.isnan(point):
        return "—"
    text = f"{fmt.f(point, spec)}{unit}{extra}"
    return text if fmt.isnan(lo) else f"{text} [{fmt.f(lo, spec)}, {fmt.f(hi, spec)}]"


def _not_run_reasons(runs: pd.DataFrame, cell_id: Any, arm: Any) -> str:
    g = runs[(runs["cell_id"] == cell_id) & (runs["arm"] == arm) & (runs["status"] != "ok")]
    reasons = dict.fromkeys(
        f"{r.status}: {r.reason if pd.notna(r.reason) else 'no reason recorded'}" for r in g.itertuples()
    )
    return f"no ok run ({'; '.join(reasons)})" if reasons else "no ok run"


def _world(gpus: Any, nodes: Any) -> str:
    """``2`` GPUs, or ``2×2`` for 2 GPUs on each of 2 nodes."""
    n = fmt.num(nodes)
    return fmt.integer(gpus) if math.isnan(n) or n <= 1 else f"{fmt.integer(gpus)}×{fmt.integer(n)}"


def scaling_section(scaling: pd.DataFrame) -> list[str]:
    """Per series of world sizes: samples/s, per GPU, efficiency vs the smallest size, Δ with CI, VRAM."""
    if not len(scaling):
        return []
    rows = [
        [
            fmt.md(r.profile), fmt.md(r.mode), fmt.integer(r.batch_size), fmt.integer(r.seq_len), fmt.md(r.arm), _world(r.gpus, r.nodes),
            fmt.f(r.samples_per_s_mean, ".2f"), fmt.f(r.samples_per_s_per_gpu, ".2f"), fmt.f(r.scaling_efficiency_pct, ".1f"),
            _delta_cell(r.delta_samples_per_s_pct, r.delta_samples_per_s_pct_ci95_low,
                        r.delta_samples_per_s_pct_ci95_high, "+.1f", "%"),
            fmt.f(r.peak_vram_gib, ".2f"),
        ]
        for r in scaling.itertuples()
    ]  # fmt: skip
    header = ["profile", "mode", "batch", "seq", "arm", "gpus", "samples/s", "per GPU", "efficiency %",
              "Δ samples/s vs baseline (95% CI)", "peak VRAM per card (GiB)"]  # fmt: skip
    note = (
        "Efficiency: per-GPU samples/s as a percentage of the same arm's at the smallest world size "
        "(100 = perfect scaling). Plot: scaling.png; data: scaling.csv."
    )
    return ["## Scaling", "", *fmt.table(header, rows), "", note, ""]


def _fit_ratio(r: Any) -> str:
    """``1.67×``, ``≥ 2.00×`` / ``≤ 0.50×`` when one search reached its max, or why there is none."""
    if r.arm == BASELINE_ARM:
        return "—"
    bound = getattr(r, "fit_ratio_bound", None)
    if isinstance(bound, str) and bound.startswith("unknown"):
        return "both fit the search's max"
    if fmt.isnan(r.fit_ratio_vs_baseline):
        return "—"
    sign = {"at least": "≥ ", "at most": "≤ "}.get(bound, "") if isinstance(bound, str) else ""
    return f"{sign}{r.fit_ratio_vs_baseline:.2f}×"


def capacity_section(capacity: pd.DataFrame) -> list[str]:
    """Per series and arm: the largest value that fit, the first that did not, and the ratio."""
    if not len(capacity):
        return []
    rows = [
        [
            fmt.md(r.series), _world(r.gpus, r.nodes), fmt.md(r.arm), fmt.integer(r.largest_fit), fmt.integer(r.first_oom), fmt.integer(r.probes), fmt.md(r.stopped_by),
            fmt.f(r.peak_vram_gib_at_largest, ".2f"), fmt.f(r.card_total_gib, ".1f"), fmt.f(r.samples_per_s_at_largest, ".2f"),
            _fit_ratio(r),
        ]
        for r in capacity.itertuples()
    ]  # fmt: skip
    axis = capacity["axis"].iloc[0]
    header = ["series", "gpus", "arm", f"largest {axis} that fits", "first OOM", "probes", "stopped by",
              "peak VRAM at largest (GiB)", "card (GiB)", "samples/s at largest", "vs baseline"]  # fmt: skip
    return ["## Capacity", "", *fmt.table(header, rows), "", "Plot: capacity.png; data: capacity.csv.", ""]


def main_table(summary: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """The seeds'-style table: one row per (cell, arm)."""
    rows = []
    for r in summary.itertuples():
        if r.arm == BASELINE_ARM:
            d_sps, d_vram, verdict = "—", "—", "baseline"
        else:
            d_sps = _delta_cell(
                r.delta_samples_per_s_pct, r.delta_samples_per_s_pct_ci95_low, r.delta_samples_per_s_pct_ci95_high,
                "+.1f", "%",
            )  # fmt: skip
            d_vram = _delta_cell(
                r.delta_peak_vram_gib, r.delta_peak_vram_gib_ci95_low, r.delta_peak_vram_gib_ci95_high,
                "+.2f", " GiB", f" ({fmt.f(r.delta_peak_vram_pct, '+.1f')}%)",
            )  # fmt: skip
            same = r.verdict_speed == r.verdict_memory  # e.g. "liger fits, baseline OOM"
            verdict = r.verdict_speed if same else f"speed: {r.verdict_speed}; memory: {r.verdict_memory}"
            if str(r.loss_parity).startswith("FAIL"):  # not the same training: say so beside the speed
                verdict += f"; loss parity {r.loss_parity}"
        if r.n_ok == 0:
            verdict = _not_run_reasons(runs, r.cell_id, r.arm)
            if r.arm != BASELINE_ARM and "OOM" in str(r.verdict_speed):
                verdict = f"{r.verdict_speed}; {verdict}"
        rows.append(
            [
                fmt.md(r.profile), fmt.md(r.mode), fmt.integer(r.batch_size), fmt.integer(r.seq_len), _world(r.gpus, r.nodes),
                fmt.md(r.arm), f"{fmt.integer(r.n_ok)}/{fmt.integer(r.n_runs)}", fmt.f(r.samples_per_s_mean, ".2f"), fmt.f(r.s_per_step_mean, ".3f"), fmt.f(r.peak_vram_gib, ".2f"),
                fmt.f(r.torch_peak_allocated_gib, ".2f"), fmt.f(r.loss_last_mean, ".4f"), d_sps, d_vram, fmt.md(verdict),
            ]
        )  # fmt: skip
    return fmt.table(MAIN_TABLE_HEADER, rows)


def contrast_section(contrasts: pd.DataFrame, summary: pd.DataFrame | None = None) -> list[str]:
    """Arm against arm (the sweep's ``contrasts``), paired by round like the baseline comparisons;
    an arm whose loss parity against the baseline fails (summary) is flagged here too."""
    if not len(contrasts):
        return []
    parity = {}
    if summary is not None and "loss_parity" in summary:
        parity = {
            (c, a): str(p) for c, a, p in zip(summary["cell_id"], summary["arm"], summary["loss_parity"])
        }
    rows = []
    for r in contrasts.itertuples():
        same = r.verdict_speed == r.verdict_memory
        verdict = r.verdict_speed if same else f"speed: {r.verdict_speed}; memory: {r.verdict_memory}"
        for arm in (r.arm, r.reference):
            if parity.get((r.cell_id, arm), "").startswith("FAIL"):
                verdict += f"; {arm}'s loss parity against the baseline FAILED"
        rows.append(
            [
                fmt.md(r.profile), fmt.md(r.mode), fmt.integer(r.batch_size), fmt.integer(r.seq_len), _world(r.gpus, r.nodes),
                fmt.md(r.arm), fmt.md(r.reference), fmt.integer(r.n_pairs),
                _delta_cell(r.delta_samples_per_s_pct, r.delta_samples_per_s_pct_ci95_low,
                            r.delta_samples_per_s_pct_ci95_high, "+.1f", "%"),
                _delta_cell(r.delta_peak_vram_gib, r.delta_peak_vram_gib_ci95_low, r.delta_peak_vram_gib_ci95_high,
                            "+.2f", " GiB", f" ({fmt.f(r.delta_peak_vram_pct, '+.1f')}%)"),
                fmt.md(verdict),
            ]
        )  # fmt: skip
    header = ["profile", "mode", "batch", "seq", "gpus", "arm", "against", "pairs", "Δ samples/s (95% CI)",
              "Δ peak VRAM (95% CI)", "verdict"]  # fmt: skip
    note = (
        "Each arm against another (the sweep's `contrasts`): the two arms' runs of one round form a pair, "
        "Δ is the ratio of geometric means with a t-interval on the per-pair log-ratios, as for the "
        "baseline comparisons; the rounds are those the baseline comparisons planned. Data: contrasts.csv."
    )
    return ["## Arm against arm", "", *fmt.table(header, rows), "", note, ""]


def parity_table(parity: pd.DataFrame) -> list[str]:
    rows = [
        [
            fmt.md(r.profile), fmt.md(r.mode), fmt.integer(r.batch_size), fmt.integer(r.seq_len), _world(r.gpus, r.nodes), fmt.md(r.arm),
            fmt.integer(r.repeat), fmt.integer(r.steps_compared), f"{fmt.f(r.max_abs_delta, '.2e')} ({fmt.integer(r.max_abs_delta_step)})",
            fmt.f(r.last_step_abs_delta, ".2e"), fmt.f(r.loss_last_baseline, ".4f"), fmt.f(r.loss_last_arm, ".4f"),
            fmt.f(r.tolerance, "g"),
            "pass" if r.passed else "FAIL",
        ]
        for r in parity.itertuples()
    ]  # fmt: skip
    return fmt.table(PARITY_TABLE_HEADER, rows)


def _provenance(sweep: dict, runs: pd.DataFrame) -> list[str]:
    ok = runs[runs["status"] == "ok"]
    src = ok if len(ok) else runs

    def val(col: str) -> str:
        return join_unique(src[col]) or "unknown"

    command = sweep.get("command") or sweep.get("argv")
    if isinstance(command, list):
        command = shlex.join(str(c) for c in command)
    gpus = join_unique(src["gpu_name"])
    # The driver's machine (sweep.json), not what a run saw: a rank of a multi-node run, or a run
    # given some of the cards, sees fewer than the machine has.
    machine = (sweep.get("hardware") or {}).get("gpu_count")
    count = f"{machine} on the driver's machine" if machine else val("gpu_count")
    gpu_text = f"{gpus} × {count}" if gpus else "none (CPU)"
    return [
        f"- **Host:** {fmt.md(val('hostname'))}",
        f"- **GPUs:** {fmt.md(gpu_text)}; driver {fmt.md(val('driver_version'))}",
        f"- **Versions:** torch {val('torch_version')}, triton {val('triton_version')}, "
        f"transformers {val('transformers_version')}, liger-kernel {val('liger_version')}",
        f"- **Git commit:** {val('git_commit')}",
        f"- **Config:** {sweep.get('config_path') or 'unknown'}",
        f"- **Command:** `{command or 'unknown (no sweep.json)'}`",
    ]


def _method(sweep: dict, records: list[RunRecord], runs: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    steps = join_unique(pd.Series([r.cell.get("steps") for r in records], dtype=object)) or "?"
    warmup = join_unique(runs["warmup_steps"].astype("Int64")) or "0"
    first_cell = records[0].cell_id
    seq = [f"{r.arm} r{r.repeat}" for r in records if r.cell_id == first_cell]
    order = ", ".join(seq[:8]) + (", …" if len(seq) > 8 else "")
    mode, seed = sweep.get("order_mode"), sweep.get("order_seed")
    order_text = f"run order of the first cell: {order}"
    order_text += "".join(f"; order {k} {v}" for k, v in (("mode", mode), ("seed", seed)) if v is not None)
    vrams = [r.vram for r in records if r.vram and r.vram.get("status") == "ok"]
    if vrams:
        ms = join_unique(pd.Series([f"{1000 * fmt.num(v.get('interval_s')):g}" for v in vrams]))
        backend = join_unique(pd.Series([v.get("backend") for v in vrams], dtype=object))
        poll = f"Peak VRAM polled on every card every {ms} ms ({backend}); the busiest card is shown"
    else:
        poll = "Peak VRAM not polled (CPU run, poller off or unavailable)"
    methods = join_unique(summary["ci_method"]) or "none"
    band = sweep.get("equivalence_pct") or 1.0
    warm = runs["compile_cache_warm"].dropna()
    cache = (
        f"Runs share one compile cache (TorchInductor FX-graph/AOTAutograd/autotune and Triton kernels, keyed "
        f"by torch/Triton version and GPU kind): {int((warm == 'true').sum())} of {len(warm)} runs started "
        "with it warm. A shared cache also fixes the autotuner's choices across runs, so between-run "
        "variance from autotuning is removed from the comparison (and from the CIs)."
        if len(warm)
        else "Runs compile from scratch (no shared compile cache)."
    )
    prime = (sweep.get("config") or {}).get("prime_runs") or 0
    if isinstance(prime, int) and prime > 0:
        cache += (
            f" Before the first measured run of each cell and arm, every invocation of the sweep ran {prime} "
            "discarded priming run(s) of it (prime/), so that no measured run compiles a kernel inside its "
            "measured steps."
        )
    return [
        f"**Method.** {steps} optimizer steps per run, the first {warmup} dropped as warm-up; samples/s = total "
        f"samples ÷ total steady-state step time. The unit of replication is the run (a process): a pair is "
        f"one run of each arm back to back ({order_text}).",
        "",
        f"{poll}. Δ samples/s vs baseline: ratio of geometric means, a 95% Student-t interval on the per-pair "
        f"log-ratios, back-transformed (used here: {methods}); Δ peak VRAM: paired t on GiB. Verdicts: "
        f"'faster'/'slower' when the CI excludes 0, 'within ±{band:g}%' when the CI lies inside ±{band:g}%, "
        "'inconclusive' otherwise, and 'too few pairs' (with the per-pair values) below the pairs a verdict needs.",
        "",
        cache,
    ]


def precision_section(summary: pd.DataFrame, sweep: dict) -> list[str]:
    """The precision rule and, per cell and arm, the pairs it asked for and the half-width reached."""
    targets = sweep.get("precision_targets") or {}
    if not targets:
        return []
    lines = [
        "## Precision",
        "",
        "Stein's two-stage rule: every cell runs a pilot of `min_pairs` pairs; the pilot's spread of the "
        "per-pair log-ratios fixes the total N = max(n0, ⌈(t·s0/h)²⌉) (capped at `max_pairs`) that gives a 95% "
        "CI of half-width h (h chosen so that the back-transformed interval is ±target percentage points "
        "around the pilot's ratio); the interval uses the pilot's s0 and its t quantile (n0−1 degrees of "
        "freedom), so its coverage does not depend on how many pairs the pilot asked for. A cell runs as many "
        "pairs as its most demanding arm wants. A resumed sweep recomputes the same N from the same pilot.",
        "",
    ]
    rows = []
    for r in summary[summary["arm"] != BASELINE_ARM].itertuples():
        t = targets.get(r.cell_id)
        if not t:
            continue
        used, planned = fmt.num(r.n_pairs), fmt.num(r.pairs_planned)
        if r.hit_pair_cap is True:
            state = "cap hit: target not reached"
        elif not math.isnan(planned) and not math.isnan(used) and used < planned:
            state = f"unfinished: {int(planned - used)} more pair(s) planned (--resume)"
        else:
            state = (
                "target met" if fmt.num(r.delta_samples_per_s_halfwidth_pct) <= t["ci_halfwidth_pct"] else "—"
            )
        rows.append(
            [
                fmt.md(r.cell_id), fmt.md(r.arm), f"±{t['ci_halfwidth_pct']:g}", str(t["min_pairs"]),
                fmt.integer(r.pairs_wanted), str(t["max_pairs"]), fmt.integer(r.n_pairs),
                f"±{fmt.f(r.delta_samples_per_s_halfwidth_pct, '.2f')}", state,
            ]
        )  # fmt: skip
    header = ["cell", "arm", "target (points)", "pilot pairs", "pairs this arm wants", "cap", "pairs used",
              "half-width achieved", "state"]  # fmt: skip
    return [*lines, *fmt.table(header, rows), ""]


def startup_section(runs: pd.DataFrame, fork_server: dict | None = None) -> list[str]:
    """Median startup costs per cell and arm, split by how the run started (forked from the
    warm server, or a fresh interpreter) and whether the compile cache was warm."""
    ok = runs[(runs["status"] == "ok") & runs["startup_s"].notna()]
    if not len(ok):
        return []
    rows = []
    keys = ["cell_id", "arm", "imports_preloaded", "compile_cache_warm"]
    for (cell, arm, preloaded, warm), g in ok.groupby(keys, sort=False, dropna=False):
        rows.append(
            [
                fmt.md(cell), fmt.md(arm), "fork server" if preloaded == "true" else "new interpreter",
                fmt.md(warm if isinstance(warm, str) else "—"), str(len(g)), fmt.f(g["startup_s"].median(), ".1f"),
                fmt.f(g["imports_s"].median(), ".1f"), fmt.f(g["first_step_s"].median(), ".1f"),
                fmt.f(g["to_first_measured_step_s"].median(), ".1f"),
            ]
        )  # fmt: skip
    header = ["cell", "arm", "started from", "compile cache warm", "runs", "start → step 1 (s)",
              "of which imports (s)", "step 1 (s)", "start → first measured step (s)"]  # fmt: skip
    lines = ["## Startup (medians)", ""]
    if fork_server and fork_server.get("ready_s") is not None:
        lines += [
            f"Single-process runs were forked from a server that imported {', '.join(fork_server['preload'])} "
            f"once ({fork_server['ready_s']:.1f} s, before the first run); a forked run's startup counts "
            "from its fork. Each run is still its own process with its own CUDA context.",
            "",
        ]
    return [*lines, *fmt.table(header, rows), ""]


def machine_state_line(runs: pd.DataFrame) -> list[str]:
    """The range of the busiest card's SM clock, temperature and power over ok runs (read-only NVML/AMD SMI)."""
    ok = runs[runs["status"] == "ok"]
    if not len(ok) or ok["sm_clock_mhz_median"].dropna().empty:
        return []

    def span(col_lo: str, col_hi: str, spec: str) -> str:
        return f"{fmt.f(ok[col_lo].min(), spec)}–{fmt.f(ok[col_hi].max(), spec)}"

    windows = ok["state_window"].dropna() if "state_window" in ok else pd.Series(dtype=object)
    whole = int((windows == "whole run").sum())
    if not whole:
        over = "over each run's measured steps"
    elif whole == len(windows):
        over = "over each run's whole life, its start included (the runs carry no step times)"
    else:
        over = (
            f"over the measured steps; over the whole run, start included, for {whole} of {len(windows)} "
            "runs without step times or state samples in that window"
        )
    return [
        f"Machine state (busiest card, read only, {over}; per run in runs.csv): SM clock {span('sm_clock_mhz_min', 'sm_clock_mhz_max', '.0f')} MHz "
        f"(run medians {span('sm_clock_mhz_median', 'sm_clock_mhz_median', '.0f')}), memory clock "
        f"{span('mem_clock_mhz_min', 'mem_clock_mhz_max', '.0f')} MHz, temperature "
        f"{span('temperature_c_min', 'temperature_c_max', '.0f')} °C, power {span('power_w_min', 'power_w_max', '.0f')} W.",
        "",
    ]


def vram_crosscheck(runs: pd.DataFrame) -> list[str]:
    """Polled peak vs the allocator's reserved peak: a poll below it means the poller missed the peak."""
    both = runs[
        (runs["status"] == "ok") & runs["peak_vram_gib"].notna() & runs["torch_peak_reserved_gib"].notna()
    ]
    if not len(both):
        return []
    gap = both["peak_vram_gib"] - both["torch_peak_reserved_gib"]
    missed = both[gap < 0]
    spread = (
        f"{gap.min():.2f}"
        if round(gap.min(), 2) == round(gap.max(), 2)
        else f"{gap.min():.2f}–{gap.max():.2f}"
    )
    head = (
        f"VRAM cross-check: the polled peak exceeds torch's reserved peak by {spread} GiB "
        "(CUDA context and allocations outside PyTorch's allocator)"
    )
    if not len(missed):
        return [head + " on every ok run.", ""]
    names = ", ".join(missed["run_id"].astype(str))
    return [head + f"; **below** it on {names}: the poller missed the peak (poll more often).", ""]


def render_markdown(
    sweep: dict, sweep_dir: Path, records: list[RunRecord], tables: dict[str, pd.DataFrame]
) -> str:
    """report.md: provenance, method, main table, loss parity, runs not ok, plots."""
    runs, summary, parity = tables["runs"], tables["summary"], tables["loss_parity"]
    lines = [f"# Benchmark report: {sweep.get('name') or sweep_dir.name}", "", "## Provenance", ""]
    lines += _provenance(sweep, runs) + [""]
    lines += _method(sweep, records, runs, summary) + ["", "## Results", ""]
    lines += main_table(summary, runs)
    lines += ["", "Means over ok runs; Δ columns are the arm vs the baseline arm of the same cell.", ""]
    lines += vram_crosscheck(runs)
    lines += machine_state_line(runs)
    lines += precision_section(summary, sweep)
    lines += contrast_section(tables.get("contrasts", pd.DataFrame()), summary)
    lines += scaling_section(tables.get("scaling", pd.DataFrame()))
    lines += capacity_section(tables.get("capacity", pd.DataFrame()))
    lines += startup_section(runs, sweep.get("fork_server"))
    lines += ["## Loss parity", ""]
    if len(parity):
        lines += parity_table(parity)
        lines += [
            "",
            f"Criterion: `{PARITY_CRITERION}`; max |Δ loss| is over every common step, warm-up included.",
        ]
    else:
        lines += ["No (cell, repeat) has losses from both arms."]
    gaps = loss_parity_gaps(records)
    if gaps:
        lines += ["", "Not compared:", *(f"- {fmt.md(g)}" for g in gaps)]
    lines += ["", "## Runs that did not finish ok", ""]
    bad = runs[runs["status"] != "ok"]
    if len(bad):
        lines += fmt.table(
            ["run", "status", "reason", "note"],
            [
                [fmt.md(r.run_id), fmt.md(r.status), fmt.md(r.reason), fmt.md(r.note)]
                for r in bad.itertuples()
            ],
        )
    else:
        lines += [f"All {len(runs)} runs finished ok."]
    noted = runs[(runs["status"] == "ok") & runs["note"].notna()]
    if len(noted):
        lines += [
            "",
            "Notes on ok runs:",
            *(f"- {fmt.md(r.run_id)}: {fmt.md(r.note)}" for r in noted.itertuples()),
        ]
    lines += ["", "## Plots", ""]
    lines += [f"![{title}]({name})" for name, title in PLOT_FILES.items()]
    lines += [
        "",
        "Data: runs.csv, summary.csv, loss_parity.csv, vram_per_card.csv (columns: see the README).",
        "",
    ]
    return "\n".join(lines)
