"""``python -m bench kernels CONFIG --profile``: where a training step's time goes, per arm.

For each cell, the trainer runs once per arm (the baseline and each Liger arm of
bench.arms.LIGER_ARMS) with the cell's exact arguments, through the sweep's run loop (a Session,
via bench/kernels/bridge.py: the plug's command, the poller, the fork server, the timeout), for
``warmup_steps + 2`` steps, the last two under torch.profiler (``training.profile_steps``). Each run writes ``profile.json`` (specforge/profiling.py: time per
bucket of kernel names); this module gathers them into ``kernel_buckets.csv``,
``kernel_buckets.png`` and a section of ``kernels.md``. docs/kernels.md says how to read them.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from bench import fmt
from bench.arms import BASELINE, LIGER_ARMS
from bench.config import profile_run_id
from bench.kernels import bridge
from bench.kernels.bridge import Run, SweepConfig
from bench.kernels.modules import bucket_names, bucket_patterns, liger_unavailable
from bench.kernels.shapes import CellPlan

PROFILED_STEPS = 2
BUCKET_COLUMNS = [
    "cell_id", "arm", "bucket", "status", "reason", "device", "time_kind", "profiled_steps",
    "device_ms_per_step", "share_pct", "delta_ms_vs_baseline", "delta_share_pct_vs_baseline",
]  # fmt: skip
OUTPUTS = ("kernel_buckets.csv", "kernel_buckets.png")


def profile_arms() -> tuple[str, ...]:
    return (BASELINE, *LIGER_ARMS)


def profile_steps(warmup_steps: int) -> tuple[int, list[int]]:
    """(training.steps, training.profile_steps): the warm-up, then two steady steps, profiled."""
    steps = warmup_steps + PROFILED_STEPS
    return steps, list(range(warmup_steps + 1, steps + 1))


def profile_run(run: Run) -> Run:
    """The run as the profiler runs it: the cell's steps cut to its warm-up plus two, the last two
    profiled (``training.profile_steps``, which only the profiler sets)."""
    steps, profiled = profile_steps(run.cell.warmup_steps)
    cell = replace(
        run.cell, steps=steps, overrides={**run.cell.overrides, "training.profile_steps": profiled}
    )
    return replace(run, cell=cell)


def profile_argv(cfg: SweepConfig, run: Run, rdir: Path, cache_dir: Path | None) -> list[str]:
    """The sweep's command for the profiled run (bridge.train_command: the cell's --set values, the
    arm's keys, the launcher)."""
    return bridge.train_command(cfg, profile_run(run), rdir, cache_dir)


def _skip_reason(plan: CellPlan, arm: str) -> str | None:
    if plan.cell.nodes > 1:
        return "a multi-node cell: --profile runs single-node cells only"
    if arm != BASELINE:
        return liger_unavailable(plan.device)
    return None


def _record(cell_id: str, arm: str) -> dict:
    return {"cell_id": cell_id, "arm": arm, "status": "ok", "reason": None, "profile": None}


def run_profiles(cfg: SweepConfig, plans: list[CellPlan], out_dir: Path, log=print) -> list[dict]:
    """Run the trainer per cell and arm under the profiler; one record per (cell, arm):
    {cell_id, arm, status, reason, profile (profile.json or None)}."""
    root = out_dir / "profiles"
    root.mkdir(parents=True, exist_ok=True)
    session = bridge.open_session(cfg, out_dir)
    records = []
    try:
        for plan in plans:
            cell = plan.cell
            runs = [
                Run(profile_run_id(cell.cell_id, arm), cell, arm, 1, i)
                for i, arm in enumerate(profile_arms())
            ]
            cache_error = None
            if cell.mode == "offline" and cell.nodes == 1:
                # The offline cache lives beside the profiles (out_dir/cache), as in a sweep directory,
                # so a cache directory linked in from a sweep of the same cells is reused.
                cache_error = bridge.prepare_cache(session, runs[0])
            for run in runs:
                rec = _record(cell.cell_id, run.arm)
                records.append(rec)
                skip = _skip_reason(plan, run.arm)
                if skip or cache_error:
                    rec.update(status="skipped" if skip else "error", reason=skip or cache_error)
                    log(f"  profile {run.run_id}: {rec['status']}: {rec['reason']}")
                    continue
                rec.update(_profile_run(session, run, root / run.run_id, log))
    finally:
        session.close()
    return records


def _profile_run(session, run: Run, rdir: Path, log) -> dict:
    """One profile run into a fresh ``rdir`` (the offline cache already prepared), through the
    sweep's run loop; {status, reason, profile}."""
    log(f"  profile {run.run_id} ...")
    t0 = time.monotonic()
    doc = bridge.run_in_session(session, profile_run(run), rdir)
    path = rdir / "profile.json"
    out = {"status": "ok", "reason": None, "profile": None}
    if doc.status == "ok" and path.is_file():
        out["profile"] = json.loads(path.read_text())
    else:
        why = doc.reason or f"no {path.name} written"
        out.update(status=doc.status if doc.status != "ok" else "error", reason=why)
    log(f"    {out['status']} ({time.monotonic() - t0:.0f} s){': ' + out['reason'] if out['reason'] else ''}")
    return out


def load_profiles(plans: list[CellPlan], out_dir: Path) -> list[dict]:
    """The records run_profiles made, read back from out_dir/profiles (kernels --rebuild); an arm
    without a profile.json is recorded as not profiled. [] when no profile exists at all."""
    root = out_dir / "profiles"
    records = []
    for plan in plans:
        for arm in profile_arms():
            path = root / f"{plan.cell.cell_id}_{arm}" / "profile.json"
            rec = _record(plan.cell.cell_id, arm)
            if path.is_file():
                rec["profile"] = json.loads(path.read_text())
            else:
                rec.update(status="skipped", reason=f"no {path.relative_to(out_dir)}")
            records.append(rec)
    return records if any(r["profile"] for r in records) else []


def bucket_rows(records: list[dict]) -> pd.DataFrame:
    """kernel_buckets.csv: one row per cell x arm x bucket; a skipped or failed arm: one row per
    bucket with its status and reason and no times. Δ columns: arm minus the cell's baseline."""
    rows = []
    for rec in records:
        prof = rec["profile"] or {}
        by_bucket = {b["bucket"]: b for b in prof.get("buckets", [])}
        for bucket in bucket_names():
            b = by_bucket.get(bucket, {})
            rows.append(
                {
                    "cell_id": rec["cell_id"],
                    "arm": rec["arm"],
                    "bucket": bucket,
                    "status": rec["status"],
                    "reason": rec["reason"],
                    "device": prof.get("device"),
                    "time_kind": prof.get("time_kind"),
                    "profiled_steps": " ".join(map(str, prof.get("steps", []))) or None,
                    "device_ms_per_step": b.get("ms_per_step", math.nan),
                    "share_pct": b.get("share_pct", math.nan),
                }
            )
    df = pd.DataFrame(rows, columns=BUCKET_COLUMNS[:-2])
    base = df[df["arm"] == BASELINE].set_index(["cell_id", "bucket"])
    key = pd.MultiIndex.from_frame(df[["cell_id", "bucket"]])
    df["delta_ms_vs_baseline"] = df["device_ms_per_step"].to_numpy() - base["device_ms_per_step"].reindex(
        key
    ).to_numpy(dtype=float)
    df["delta_share_pct_vs_baseline"] = df["share_pct"].to_numpy() - base["share_pct"].reindex(key).to_numpy(
        dtype=float
    )
    return df.reindex(columns=BUCKET_COLUMNS)


def plot_buckets(df: pd.DataFrame, path: Path) -> Path:
    """Per cell: one stacked bar per arm, device ms per step split into buckets; skipped arms say so."""
    names = bucket_names()
    cells = list(dict.fromkeys(df["cell_id"]))
    fig, axes = bridge.plot_grid(len(cells), "Time per profiled step by kernel bucket")
    colors = {b: f"C{i}" for i, b in enumerate(names)}
    for ax, cid in zip(axes, cells):
        c = df[df["cell_id"] == cid]
        arms = list(dict.fromkeys(c["arm"]))
        bottom = np.zeros(len(arms))
        for bucket in names:
            v = c[c["bucket"] == bucket].set_index("arm")["device_ms_per_step"].reindex(arms).astype(float)
            vals = np.nan_to_num(v.to_numpy())
            ax.bar(np.arange(len(arms)), vals, bottom=bottom, color=colors[bucket], label=bucket)
            bottom += vals
        for i, arm in enumerate(arms):
            status = c[c["arm"] == arm]["status"].iloc[0]
            if status != "ok":
                ax.text(i, 0, status, ha="center", va="bottom", rotation=90, fontsize=8, color="0.3")
        kinds = c["time_kind"].dropna()
        unit = "CPU op ms" if len(kinds) and str(kinds.iloc[0]).startswith("CPU") else "device ms"
        ax.set_xticks(np.arange(len(arms)), arms, fontsize=8)
        ax.set_ylabel(f"{unit} per step")
        ax.set_title(cid, fontsize=9)
        ax.legend(fontsize=7, ncol=2)
    return bridge.save_plot(fig, path)


def render_markdown(df: pd.DataFrame, records: list[dict]) -> str:
    """The kernels.md section: per cell, bucket x arm (ms per step and share), Δ vs the baseline."""
    lines = ["## Where a step's time goes (profiler, `--profile`)", ""]
    kinds = sorted({str(k) for k in df["time_kind"].dropna()})
    lines += [
        "Each arm trained once with the cell's arguments for its warm-up steps plus two, the last two "
        "under torch.profiler (`training.profile_steps`); times are per profiled step, "
        f"{'; '.join(kinds) or 'no profile finished'}. Buckets come from kernel or op names "
        "(first match wins, in this order: "
        + "; ".join(f"{b} `{p}`" for b, p in bucket_patterns())
        + "; else other). Profiled steps are slower than unprofiled ones: compare arms by these "
        "shares and differences, and take throughput from the sweep.",
        "",
    ]
    for cid in dict.fromkeys(df["cell_id"]):
        c = df[df["cell_id"] == cid]
        arms = list(dict.fromkeys(c["arm"]))
        lines += [f"### {cid}: per bucket, ms per step (share)", ""]
        body = []
        for bucket in dict.fromkeys(c["bucket"]):
            r = c[c["bucket"] == bucket].set_index("arm")
            cells = []
            for arm in arms:
                ms, share, d = (
                    r.loc[arm, k] for k in ("device_ms_per_step", "share_pct", "delta_ms_vs_baseline")
                )
                if fmt.isnan(ms):
                    cells.append(fmt.DASH)
                    continue
                text = f"{fmt.f(ms, '.4g')} ({fmt.f(share, '.1f')}%)"
                if arm != BASELINE and not fmt.isnan(d):
                    text += f" Δ {fmt.f(d, '+.4g')}"
                cells.append(text)
            body.append([bucket, *cells])
        totals = c.groupby("arm", sort=False)["device_ms_per_step"].sum(min_count=1).reindex(arms)
        body.append(["**total**", *(fmt.f(t, ".4g") for t in totals)])
        lines += fmt.table(["bucket", *arms], body)
        bad = [r for r in records if r["cell_id"] == cid and r["status"] != "ok"]
        lines += [""] + [f"- {r['arm']}: {r['status']}: {fmt.md(r['reason'])}" for r in bad]
        lines.append("")
    lines += ["![kernel buckets](kernel_buckets.png)", ""]
    return "\n".join(lines)
