"""report.md's text on how the numbers were taken: provenance (host, GPUs, versions, command),
the method paragraph, startup costs, the GPU state over the measured steps and the polled-VRAM
cross-check against the allocator; each a list of Markdown lines."""

from __future__ import annotations

import shlex

import pandas as pd

from bench import fmt
from bench.results.prsummary import power_limit_text
from bench.results.records import RunRecord
from bench.results.tables import join_unique


def provenance_section(sweep: dict, runs: pd.DataFrame) -> list[str]:
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
    hardware = sweep.get("hardware") or {}  # the driver's own reading, also with the poller off
    host = join_unique(src["hostname"]) or hardware.get("hostname") or "unknown"
    driver = join_unique(src["driver_version"]) or hardware.get("driver_version") or "unknown"
    limit = power_limit_text(hardware)
    limit = f"; power limit {limit} (read, never set)" if limit and gpus else ""
    return [
        f"- **Host:** {fmt.md(host)}",
        f"- **GPUs:** {fmt.md(gpu_text)}; driver {fmt.md(driver)}{limit}",
        f"- **Versions:** torch {val('torch_version')}, triton {val('triton_version')}, "
        f"transformers {val('transformers_version')}, liger-kernel {val('liger_version')}",
        f"- **Git commit:** {val('git_commit')}",
        f"- **Config:** {sweep.get('config_path') or 'unknown'}",
        f"- **Command:** `{command or 'unknown (no sweep.json)'}`",
    ]


def method_section(
    sweep: dict, records: list[RunRecord], runs: pd.DataFrame, summary: pd.DataFrame
) -> list[str]:
    steps = join_unique(pd.Series([r.cell.steps if r.cell else None for r in records], dtype=object)) or "?"
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
    pairing = (sweep.get("config") or {}).get("pairing") or "sequential"
    pair_text = (
        "a pair is one run of each arm started together, taking turns on the card one optimizer step each "
        "(pairing: lockstep; step 1 runs in both at once and is dropped): a step's time is its own turn, from "
        "taking the card to the end of its work on it, without the wait for the other run's step"
        if pairing == "lockstep"
        else "a pair is one run of each arm back to back"
    )
    per_process = [v for v in vrams if v.get("scope") == "process"]
    if pairing == "lockstep" and per_process:
        ms = join_unique(pd.Series([f"{1000 * fmt.num(v.get('interval_s')):g}" for v in per_process]))
        backend = join_unique(pd.Series([v.get("backend") for v in per_process], dtype=object))
        poll = (
            f"Peak VRAM per run: the pair shares the card, so each run's figure is its own process's memory "
            f"on the card, read from {backend}'s process list every {ms} ms while both ran, plus the card's "
            "idle baseline before the pair (what the card would show with the run alone; vram.json's "
            "`scope: process`), beside the allocator's own peaks (torch_peak_* in runs.csv); energy per "
            "sample: the card's energy over each run's own turns"
        )
    elif pairing == "lockstep":  # a lockstep sweep recorded before the per-process poll
        poll = (
            "Peak VRAM not polled: the pair shares the card; each run's own peak is its allocator's "
            "(torch_peak_reserved_gib in runs.csv)"
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
        f"samples ÷ total steady-state step time. The unit of replication is the run (a process): {pair_text} "
        f"({order_text}).",
        "",
        f"{poll}. Δ samples/s vs baseline: ratio of geometric means, a 95% Student-t interval on the per-pair "
        f"log-ratios, back-transformed (used here: {methods}); Δ peak VRAM: paired t on GiB. Verdicts: "
        f"'faster'/'slower' when the CI excludes 0, 'within ±{band:g}%' when the CI lies inside ±{band:g}%, "
        "'inconclusive' otherwise, and 'too few pairs' (with the per-pair values) below the pairs a verdict needs.",
        "",
        cache,
    ]


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
    return [*lines, *fmt.table(header, rows), "", *overhead_section(ok)]


def overhead_section(ok: pd.DataFrame) -> list[str]:
    """Per-run overhead of the runs whose wrapper timed their exit (specforge-cli): start → step 1,
    the measured steps, after the last step → exit, the whole run; medians per cell and arm."""
    if "exit_s" not in ok or ok["exit_s"].dropna().empty:
        return []
    rows = []
    for (cell, arm), g in ok[ok["exit_s"].notna()].groupby(["cell_id", "arm"], sort=False):
        steps = g["run_wall_s"] - g["startup_s"] - g["exit_s"]  # step 1 to the last step
        share = (steps / g["run_wall_s"]).median() * 100
        rows.append(
            [
                fmt.md(cell), fmt.md(arm), str(len(g)), fmt.f(g["startup_s"].median(), ".1f"),
                fmt.f(steps.median(), ".1f"), fmt.f(g["exit_s"].median(), ".1f"),
                fmt.f(g["run_wall_s"].median(), ".1f"), fmt.f(share, ".0f"),
            ]
        )  # fmt: skip
    header = ["cell", "arm", "runs", "start → step 1 (s)", "steps (s)", "last step → exit (s)",
              "run (s)", "steps' share of the run (%)"]  # fmt: skip
    return [
        "## Per-run overhead (medians)",
        "",
        "Where a run's wall time goes, for runs whose wrapper timed their exit (the SpecForge CLI: "
        "run.json's startup_s, exit_s and wall_s). With stop_after_last_step the run is stopped once "
        "its last measured step is logged, so no final checkpoint is written or waited for.",
        "",
        *fmt.table(header, rows),
        "",
    ]


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
