"""The summary a user pastes into a pull request, in the form the seeds' PRs used: per cell the
arms' samples/s, s/step and peak VRAM, then one Δ line with its CIs and loss parity, and the
hardware and versions in one line. ``pr_summary`` is report.md's first section (Markdown);
``console_summary`` is the same facts as plain text no wider than CONSOLE_WIDTH, for the end of
a sweep.
"""

from __future__ import annotations

import shlex
import textwrap
from typing import Any

import pandas as pd

from bench import fmt
from bench.arms import AA, BASELINE
from bench.results import parity_gate
from bench.results.forest import cell_label, delta_text
from bench.results.tables import distinct_values
from bench.results.verdicts import Speed, speed_kind

CONSOLE_WIDTH = 100
PR_TABLE_HEADER = [
    "arm",
    "runs ok",
    "samples/s",
    "s/step",
    "peak VRAM (GiB)",
    "Δ samples/s (95% CI)",
    "loss parity",
]
HEADLINE_ARM = "liger"


def _cells(summary: pd.DataFrame) -> list[pd.DataFrame]:
    return [g for _, g in summary.groupby("cell_id", sort=False)]


def _vram(r: Any) -> str:
    if fmt.isnan(r.delta_peak_vram_gib):
        return "peak VRAM n/a (no VRAM data)"
    # the interval even where it has no width (the same peak in every pair), as for throughput: it
    # says the pairs agreed, where a bare point would not say whether there was a CI at all
    lo, hi = r.delta_peak_vram_gib_ci95_low, r.delta_peak_vram_gib_ci95_high
    ci = delta_text(r.delta_peak_vram_gib, lo, hi, "+.2f", " GiB")
    pct = "" if fmt.isnan(r.delta_peak_vram_pct) else f" ({fmt.f(r.delta_peak_vram_pct, '+.1f')}%)"
    verdict = getattr(r, "verdict_memory", None)
    word = f" ({_words(verdict)})" if isinstance(verdict, str) and verdict else ""
    return f"{ci}{pct} peak VRAM{word}"


def _words(verdict: str) -> str:
    """A verdict's words without its detail: ``faster``, ``too few pairs (2)``, ``effect not
    recorded, no verdict`` (whose runs are counted in the Results table)."""
    if speed_kind(verdict) is Speed.NOT_PROVEN:
        return f"{Speed.NOT_PROVEN.value}, no verdict"
    return verdict.split(":")[0]


def _energy(r: Any) -> str:
    """``, -12.0% [-13.1, -10.9] energy/sample`` when the summary has energy per sample for the arm."""
    point = getattr(r, "delta_energy_per_sample_pct", float("nan"))
    if fmt.isnan(point):
        return ""
    lo = getattr(r, "delta_energy_per_sample_pct_ci95_low", float("nan"))
    hi = getattr(r, "delta_energy_per_sample_pct_ci95_high", float("nan"))
    return f", {delta_text(point, lo, hi)} energy/sample"


def _precision(r: Any) -> str:
    """``; missed the ±1-point target: ±1.81 (pair cap hit, 20 pairs wanted)`` when the cell asked for a
    half-width its CI did not reach."""
    target = getattr(r, "precision_target_pct", float("nan"))
    half = getattr(r, "delta_samples_per_s_halfwidth_pct", float("nan"))
    if fmt.isnan(target) or fmt.isnan(half) or half <= target:
        return ""
    why = []
    if str(getattr(r, "hit_pair_cap", "")).lower() == "true":
        wanted = getattr(r, "pairs_wanted", float("nan"))
        why.append("pair cap hit" + ("" if fmt.isnan(wanted) else f", {fmt.integer(wanted)} pairs wanted"))
    return f"; MISSED the ±{target:g}-point precision target: ±{half:.2f}" + (f" ({why[0]})" if why else "")


def energy_coverage(runs: pd.DataFrame, cell_id: Any) -> str:
    """`` (power integral at ~1 s, 9 of 12 runs; 3 n/a)``: where a cell's energies come from and how
    many of its counted runs have one."""
    if "energy_source" not in runs or "cell_id" not in runs:
        return ""
    ok = runs[(runs["cell_id"] == cell_id) & (runs["status"] == "ok") & runs["samples_per_s"].notna()]
    if ok.empty:
        return ""
    src = ok["energy_source"].astype(str)
    have = ok[ok["energy_j_per_sample"].notna()] if "energy_j_per_sample" in ok else ok.iloc[:0]
    names = list(dict.fromkeys(s for s in src[have.index] if not s.startswith("n/a")))
    if "power_interval_s" in have and "power integral" in names and have["power_interval_s"].notna().any():
        names[names.index("power integral")] = f"power integral at ~{have['power_interval_s'].median():.2g} s"
    missing = len(ok) - len(have)
    tail = f"; {missing} n/a" if missing else ""
    return f" ({', '.join(names) or 'no source'}, {len(have)} of {len(ok)} runs{tail})"


def delta_line(r: Any, energy_note: str = "") -> str:
    """``liger vs baseline: +16.2% [+15.3, +17.2] throughput (6 pairs; faster), -5.21 GiB [...] (-18.0%)
    peak VRAM (leaner), loss parity pass (6/6)``: each Δ with its verdict's words; the verdict in words
    when there is no Δ. A precision target the CI missed is said in the pairs' parenthesis;
    ``energy_note``: energy_coverage's."""
    speed = delta_text(
        r.delta_samples_per_s_pct, r.delta_samples_per_s_pct_ci95_low, r.delta_samples_per_s_pct_ci95_high
    )
    verdict = r.verdict_speed if isinstance(r.verdict_speed, str) else "no Δ"
    if not speed:
        return f"{r.arm} vs baseline: {verdict}"
    pairs = f"{fmt.integer(r.n_pairs)} pairs"
    kind = speed_kind(verdict)
    if kind is Speed.AA_TOO_NOISY:  # the reason, which is the message: this machine, not the suite
        pairs += f"; A/A: {verdict.removeprefix('A/A check not passed: ').split(' (')[0]}"
    else:  # the verdict's words, decided or not (faster, within ±1%, inconclusive, ...)
        pairs += f"; {_words(verdict)}"
    pairs += _precision(r)
    parity = r.loss_parity if isinstance(r.loss_parity, str) else "n/a"
    energy = _energy(r) + (energy_note if _energy(r) else "")
    return f"{r.arm} vs baseline: {speed} throughput ({pairs}), {_vram(r)}{energy}, loss parity {parity}"


def _headline(cell: pd.DataFrame) -> Any | None:
    others = [r for r in cell.itertuples() if r.arm not in (BASELINE, AA)]
    liger = [r for r in others if r.arm == HEADLINE_ARM]
    return (liger or others or [None])[0]


def machine_line(runs: pd.DataFrame, sweep: dict | None = None) -> str:
    """``NVIDIA H200 × 1, driver 580.159.04, power limit 700 W · torch 2.11.0+cu130 · liger-kernel
    0.8.5 · commit 14a81195fd82``: the driver from the runs, else from the driver's own reading
    (sweep.json's ``hardware``, taken also with the poller off), and the power limit read there."""

    def val(col: str) -> str:
        return ", ".join(distinct_values(runs[col])) if col in runs else ""

    hardware = (sweep or {}).get("hardware") or {}
    gpu = val("gpu_name") or "CPU"
    count = val("gpu_count")
    parts = [f"{gpu} × {count}" if count and gpu != "CPU" else gpu]
    driver = val("driver_version") or hardware.get("driver_version")
    if driver:
        parts[0] += f", driver {driver}"
    limit = power_limit_text(hardware)
    if limit and gpu != "CPU":
        parts[0] += f", power limit {limit}"
    parts += [
        f"{name} {val(col)}"
        for name, col in (("torch", "torch_version"), ("liger-kernel", "liger_version"))
        if val(col)
    ]
    if val("git_commit"):
        parts.append(f"commit {val('git_commit')}")
    return " · ".join(parts)


def power_limit_text(hardware: dict) -> str:
    """``700 W`` (each distinct card limit once) from sweep.json's ``hardware``; "" when unknown."""
    limits = [w for w in hardware.get("power_limits_w") or [] if isinstance(w, int | float)]
    return ", ".join(f"{w:g} W" for w in dict.fromkeys(limits))


def _row(r: Any) -> list[str]:
    delta = delta_text(
        r.delta_samples_per_s_pct, r.delta_samples_per_s_pct_ci95_low, r.delta_samples_per_s_pct_ci95_high
    )
    return [
        fmt.md(r.arm),
        f"{fmt.integer(r.n_ok)}/{fmt.integer(r.n_runs)}",
        fmt.f(r.samples_per_s_mean, ".2f"),
        fmt.f(r.s_per_step_mean, ".3f"),
        fmt.f(r.peak_vram_gib, ".2f"),
        "—" if r.arm == BASELINE else delta or fmt.md(r.verdict_speed),
        "—" if r.arm == BASELINE else fmt.md(r.loss_parity),
    ]


def pr_summary(
    summary: pd.DataFrame, runs: pd.DataFrame, sweep: dict, training: pd.DataFrame | None = None
) -> list[str]:
    """report.md's "Summary" section: first, the arms that failed parity (``training``: the
    training-parity table); a table and a Δ line per cell, the machine line, the command."""
    found = parity_gate.failures(summary, training)
    lines = ["## Summary", "", *([f"**{fmt.md(parity_gate.headline(found))}**", ""] if found else [])]
    lines += [f"{machine_line(runs, sweep)}.", ""]
    for cell in _cells(summary):
        first = next(cell.itertuples())
        lines += [
            f"**{fmt.md(cell_label(first))}**",
            "",
            *fmt.table(PR_TABLE_HEADER, [_row(r) for r in cell.itertuples()]),
            "",
        ]
        head = _headline(cell)
        if head is not None:
            lines += [f"{fmt.md(delta_line(head, energy_coverage(runs, head.cell_id)))}.", ""]
    command = sweep.get("command")
    if isinstance(command, list):
        command = shlex.join(str(c) for c in command)
    lines.append(
        "Steady-state means over ok runs; Δ is the paired ratio over back-to-back pairs of runs, 95% CI"
        + (f"; made by `{command}`." if command else ".")
    )
    return lines


def _wrap(text: str, width: int, indent: str = "  ") -> list[str]:
    return textwrap.wrap(text, width=width, subsequent_indent=indent, break_on_hyphens=False) or [""]


def console_summary(
    summary: pd.DataFrame,
    runs: pd.DataFrame,
    sweep: dict,
    width: int = CONSOLE_WIDTH,
    training: pd.DataFrame | None = None,
) -> list[str]:
    """The same facts as ``pr_summary`` in plain text, every line at most ``width`` columns."""
    found = parity_gate.failures(summary, training)
    lines = [
        *(_wrap(parity_gate.headline(found), width) if found else []),
        *_wrap(machine_line(runs, sweep), width),
    ]
    for cell in _cells(summary):
        lines += ["", *_wrap(cell_label(next(cell.itertuples())), width)]
        lines.append(f"  {'arm':<16} {'ok':>5} {'samples/s':>10} {'s/step':>8} {'peak VRAM':>10}")
        for r in cell.itertuples():
            vram = fmt.f(r.peak_vram_gib, ".2f")
            lines.append(
                f"  {str(r.arm)[:16]:<16} {fmt.integer(r.n_ok) + '/' + fmt.integer(r.n_runs):>5} "
                f"{fmt.f(r.samples_per_s_mean, '.2f'):>10} {fmt.f(r.s_per_step_mean, '.3f'):>8} "
                f"{vram + (' GiB' if vram != '—' else ''):>10}"
            )
        for r in cell.itertuples():
            if r.arm != BASELINE:
                lines += _wrap("  " + delta_line(r, energy_coverage(runs, r.cell_id)), width, indent="    ")
    return lines
