"""What `bench history` writes: the series (bench/results/history.py) as a text or Markdown table
per series, a JSON document, and with ``--out`` history.md, history.json and one trend plot per
series of two or more points with a Δ (the 95% CI drawn, step changes marked); run by `bench history` (bench/__main__.py)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from matplotlib.figure import Figure

from bench import fmt
from bench.errors import SweepError
from bench.fileio import atomic_write_json, atomic_write_text
from bench.results.canvas import save
from bench.results.forest import delta_text
from bench.results.history import KEY, Point, Series, build

HEADER = ["date", "sweep", "commit", "versions", "pairs", "Δ samples/s (95% CI)", "verdict",
          "samples/s", "peak VRAM", "Δ energy/sample", "loss parity", "step change"]  # fmt: skip


def _row(p: Point) -> list[str]:
    date = f"{p.date[:10]} ({p.date_source})" if p.date else "—"
    versions = ", ".join(f"{k} {v}" for k, v in p.versions.items() if k != "code") or "—"
    return [
        date,
        Path(p.sweep).name,
        p.commit or "—",
        versions,
        fmt.integer(p.n_pairs),
        delta_text(p.delta_pct, p.ci_low, p.ci_high) or "—",
        p.verdict or "—",
        fmt.f(p.samples_per_s, ".2f"),
        fmt.f(p.peak_vram_gib, ".2f") + (" GiB" if p.peak_vram_gib is not None else ""),
        delta_text(p.delta_energy_pct, None, None) or "—",
        p.loss_parity or "—",
        f"STEP: {p.change}" if p.change else "",
    ]


def title(s: Series) -> str:
    shape = f"bs{s.batch_size} s{s.seq_len}" + (f" {s.gpus} GPUs" if s.gpus not in ("", "1") else "")
    return f"{s.points[0].cell_id} ({shape}) · {s.arm} · {s.gpu_name or 'no GPU named'} · workload {s.workload_digest}"


def markdown(series: list[Series]) -> str:
    """Each multi-point series as a table, then the series kept apart, each with its reason."""
    lines = ["# Benchmark history", ""]
    steps = sum(1 for s in series for p in s.points if p.change)
    lines.append(
        f"{sum(len(s.points) for s in series)} points in {len(series)} series "
        f"(trainer, workload, arm, GPU); {steps} step change(s): consecutive 95% CIs that do not overlap."
    )
    for s in series:
        if s.apart:
            continue
        lines += [
            "",
            f"## {title(s)} ({s.trainer})",
            "",
            *fmt.table(HEADER, [[fmt.md(c) for c in _row(p)] for p in s.points]),
        ]
    apart = [s for s in series if s.apart]
    if apart:
        lines += ["", "## Kept apart (one point each: not comparable with another sweep given)", ""]
        rows = [[fmt.md(c) for c in (title(s), s.trainer, Path(s.points[0].sweep).name,
                 delta_text(s.points[0].delta_pct, s.points[0].ci_low, s.points[0].ci_high) or "—", s.apart)]
                for s in apart]  # fmt: skip
        lines += fmt.table(["series", "trainer", "sweep", "Δ samples/s", "why apart"], rows)
    return "\n".join(lines) + "\n"


def text(series: list[Series]) -> str:
    """The console form: one block per multi-point series, one line per point; then those apart."""
    out = []
    for s in (s for s in series if not s.apart):
        out.append(f"{title(s)} ({s.trainer})")
        for p in s.points:
            r = _row(p)
            out.append(f"  {r[0]:<19} {r[1]:<34} {r[2]:<13} {r[5]:<24} {r[6]:<18} {r[11]}".rstrip())
    apart = [s for s in series if s.apart]
    if apart:
        out.append(f"kept apart ({len(apart)} series of one point):")
        out += [f"  {title(s)} ({Path(s.points[0].sweep).name}): {s.apart}" for s in apart]
    steps = [(s, p) for s in series for p in s.points if p.change]
    out.append(f"step changes: {len(steps)}")
    out += [f"  {title(s)}: at {Path(p.sweep).name}: {p.change}" for s, p in steps]
    return "\n".join(out) + "\n"


def document(series: list[Series]) -> dict:
    return {"schema_version": 1, "key": list(KEY),
            "series": [s.to_json() for s in series]}  # fmt: skip


def plot(s: Series, path: Path) -> Path:
    """Δ samples/s per point with its 95% CI, in the series' order; a step change in red."""
    pts = [p for p in s.points if p.delta_pct is not None]
    fig = Figure(figsize=(max(4.0, 0.9 * len(pts) + 2), 3.2))
    ax = fig.add_subplot()
    for i, p in enumerate(pts):
        color = "tab:red" if p.change else "tab:blue"
        if p.has_ci:
            ax.errorbar(i, p.delta_pct, yerr=[[p.delta_pct - p.ci_low], [p.ci_high - p.delta_pct]],
                        fmt="o", color=color, capsize=3)  # fmt: skip
        else:
            ax.plot(i, p.delta_pct, "o", color=color, mfc="none")
    ax.axhline(0, color="0.6", lw=0.8)
    ticks = [f"{Path(p.sweep).name}\n{p.date[:10]} {p.commit[:7]}" for p in pts]
    ax.set_xticks(range(len(pts)), ticks, fontsize=6, rotation=25, ha="right")
    ax.set_ylabel("Δ samples/s (%)")
    ax.set_title(title(s), fontsize=8)
    return save(fig, path)


def plot_name(s: Series) -> str:
    key = (s.trainer, s.workload_digest, s.batch_size, s.seq_len, s.gpus, s.nodes, s.arm, s.gpu_name)
    digest = hashlib.sha256("|".join(key).encode()).hexdigest()
    return f"history_{s.arm}_{digest[:8]}.png"


def write(series: list[Series], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "history.md", markdown(series))
    atomic_write_json(out / "history.json", document(series))
    written = [out / "history.md", out / "history.json"]
    if os.environ.get("BENCH_NO_PLOTS") != "1":
        for s in series:
            if sum(p.delta_pct is not None for p in s.points) >= 2:
                written.append(plot(s, out / plot_name(s)))
    return written


def run_history(args) -> int:
    series, skipped = build(args.dirs)
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    if args.arm:
        series = [s for s in series if s.arm in set(args.arm)]
        if not series:
            raise SweepError(f"--arm {', '.join(args.arm)}: no such arm in the sweeps given")
    shown = {"md": markdown, "json": lambda s: json.dumps(document(s), indent=1) + "\n", "text": text}
    print(shown[args.format](series), end="")
    if args.out:
        files = write(series, Path(args.out))
        print(f"history: {len(files)} files in {args.out}", file=sys.stderr)
    return 0
