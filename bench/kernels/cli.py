"""The ``kernels`` command: ``python -m bench kernels CONFIG [--out DIR] [--cell CELL_ID] ...``.

For every cell of a sweep config, at that cell's training shapes, it times forward + backward
of each module the Liger arms swap in the DFlash draft (specforge/draft.py), stock and Liger
(bench/kernels/cell.py), sets them against the device's measured limits (timing.py,
roofline.py), predicts each Liger arm's step-time saving beside the sweep's measured Δ
(predict.py), and writes kernels.csv, kernels.png and kernels.md (report.py); with
``--profile`` also the per-arm profiler buckets (buckets.py); with ``--rebuild`` it measures
nothing and writes the report again from an earlier kernels.csv. Bad input is a SweepError
(one line, exit 2) before anything is written. docs/kernels.md says how to run it and how to
read the result.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from bench.fileio import atomic_write_text
from bench.kernels import bridge, buckets
from bench.kernels.bridge import Cell, SweepConfig, SweepError
from bench.kernels.cell import KERNEL_COLUMNS, measure_cell
from bench.kernels.modules import plan_cell, versions
from bench.kernels.predict import read_summary
from bench.kernels.report import plot_kernels, render_markdown, write_csv, write_csv_plain
from bench.kernels.shapes import CellPlan
from bench.kernels.timing import Limits, Timer, device_name, measure_limits, recorded_limits

OUTPUTS = ("kernels.csv", "kernels.png", "kernels.md")
DEFAULT_REPS, DEFAULT_WARMUP = 50, 10
MAX_REPS = 100_000
VERSION_KEYS = ("torch_version", "transformers_version", "liger_version", "git_commit")


def select_cells(cfg: SweepConfig, wanted: list[str] | None) -> list[Cell]:
    if not wanted:
        return list(cfg.cells)
    known = [c.cell_id for c in cfg.cells]
    for cid in wanted:
        if cid not in known:
            raise SweepError(f"--cell {cid}: no such cell in {cfg.path} (cells: {', '.join(known)})")
    return [c for c in cfg.cells if c.cell_id in wanted]


def _default_out(cfg: SweepConfig, out: str | Path | None) -> Path:
    return Path(out) if out is not None else Path(f"{cfg.out.rstrip('/')}-kernels")


def _check_rebuild_options(
    cells: list[str] | None, reps: int | None, warmup: int | None, profile: bool
) -> None:
    given = [
        f for f, v in (("--cell", cells or None), ("--reps", reps), ("--warmup", warmup)) if v is not None
    ]
    given += ["--profile"] if profile else []
    if given:
        raise SweepError(
            f"--rebuild measures nothing, so {', '.join(given)} cannot apply; drop "
            f"{'it' if len(given) == 1 else 'them'} (it rebuilds every cell in kernels.csv)"
        )


def _check_reps(reps: int, warmup: int) -> None:
    if not 3 <= reps <= MAX_REPS:
        raise SweepError(f"--reps: expected 3 to {MAX_REPS} (p20/p80 need a few), got {reps}")
    if not 0 <= warmup <= MAX_REPS:
        raise SweepError(f"--warmup: expected 0 to {MAX_REPS}, got {warmup}")


def _load_specforge_config(config: str | Path) -> SweepConfig:
    cfg = bridge.load_config(config)
    other = next((c for c in cfg.cells if c.trainer_tag), None)  # not the default trainer
    if other is not None:
        raise SweepError(
            f"{cfg.path}: cells[{other.entry}]: kernels times our trainer's draft modules; trainer "
            f"{other.trainer} is not supported (its Δ is in the sweep's report)"
        )
    if cfg.trainer_module != bridge.OUR_MODULE:
        raise SweepError(
            f"{cfg.path}: trainer_module: kernels times specforge's draft modules; "
            f"{cfg.trainer_module!r} is not supported"
        )
    return cfg


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
    """The ``kernels`` command (``profile``: also the per-arm profiler buckets, bench/kernels/buckets.py;
    ``rebuild``: no measuring, see rebuild_kernels); SweepError (one line, exit 2) on bad input,
    before anything is written."""
    if rebuild:
        _check_rebuild_options(cells, reps, warmup, profile)
        return rebuild_kernels(config, out, sweep_dir, argv)
    reps = DEFAULT_REPS if reps is None else reps
    warmup = DEFAULT_WARMUP if warmup is None else warmup
    _check_reps(reps, warmup)
    cfg = _load_specforge_config(config)
    chosen = select_cells(cfg, cells)
    out_dir = _default_out(cfg, out)
    bridge.check_out_path(out_dir)
    sweep_path = Path(sweep_dir) if sweep_dir is not None else Path(cfg.out)
    bridge.check_machine(cfg)
    import torch

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    plans = [plan_cell(cfg, c, device_type) for c in chosen]

    meta = {
        "command": "python -m bench kernels " + " ".join(argv if argv is not None else [str(config)]),
        "device_name": ", ".join(dict.fromkeys(device_name(p.device) for p in plans)),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "reps": reps,
        "warmup": warmup,
        "git_commit": bridge.git_commit(),
        **versions(),
    }
    rows, limits, timer_names = _measure_all(plans, reps, warmup, meta)
    summary = read_summary(sweep_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out_dir / "kernels.csv")
    plot_kernels(rows, plans, out_dir / "kernels.png")
    text = render_markdown(cfg, plans, rows, limits, timer_names, meta, sweep_path, summary)
    records: list[dict] = []
    if profile:
        print("profiling a training step per cell and arm ...", flush=True)
        records = buckets.run_profiles(cfg, plans, out_dir, log=lambda line: print(line, flush=True))
    return _write_report(out_dir, text, list(OUTPUTS), records)


def _measure_all(
    plans: list[CellPlan], reps: int, warmup: int, meta: dict
) -> tuple[pd.DataFrame, dict[tuple[str, str], Limits], str]:
    """Every cell measured (its device's limits first, once per device and dtype): (the rows of
    kernels.csv, the limits, the timers' names)."""
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
        common = {"device_name": device_name(plan.device), **{k: meta[k] for k in VERSION_KEYS}}
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
    return rows, limits, "; ".join(t.name for t in timers.values())


def _write_report(out_dir: Path, text: str, written: list[str], records: list[dict]) -> int:
    """kernels.md (with the bucket section and its CSV/plot when there are profile records)."""
    if records:
        table = buckets.bucket_rows(records)
        write_csv_plain(table, out_dir / "kernel_buckets.csv")
        buckets.plot_buckets(table, out_dir / "kernel_buckets.png")
        text += "\n" + buckets.render_markdown(table, records)
        written = [*written, *buckets.OUTPUTS]
    atomic_write_text(out_dir / "kernels.md", text)
    print(f"wrote {', '.join(str(out_dir / n) for n in written)}")
    return 0


def rebuild_kernels(
    config: str | Path, out: str | Path | None, sweep_dir: str | Path | None, argv: list[str] | None
) -> int:
    """``kernels --rebuild``: kernels.md and kernels.png again from an earlier run's kernels.csv and
    profiles/, with the measured Δ read now from the sweep's summary.csv (e.g. when the attribution
    ran before the sweep had finished). Measures nothing, so it runs anywhere."""
    cfg = bridge.load_config(config)
    out_dir = _default_out(cfg, out)
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
    limits = {
        (device, dtype): recorded_limits(
            device, dtype, float(g["copy_gb_per_s"].iloc[0]), float(g["matmul_tflops"].iloc[0])
        )
        for (device, dtype), g in rows.groupby(["device", "dtype"], sort=False)
    }
    meta = _recorded_meta(rows, argv if argv is not None else [str(config), "--rebuild"])
    timer_names = "; ".join(dict.fromkeys(str(t) for t in rows["timer"]))
    plot_kernels(rows, plans, out_dir / "kernels.png")
    text = render_markdown(cfg, plans, rows, limits, timer_names, meta, sweep_path, read_summary(sweep_path))
    return _write_report(out_dir, text, ["kernels.png", "kernels.md"], buckets.load_profiles(plans, out_dir))


def _recorded_meta(rows: pd.DataFrame, argv: list[str]) -> dict:
    """The provenance of an earlier run, from its kernels.csv (kernels --rebuild)."""
    first = rows.iloc[0]
    return {
        "command": "python -m bench kernels " + " ".join(argv),
        "device_name": ", ".join(dict.fromkeys(str(d) for d in rows["device_name"])),
        "date": f"rebuilt {datetime.now(timezone.utc).isoformat(timespec='seconds')} from kernels.csv",
        "reps": int(first["reps"]),
        "warmup": int(first["warmup"]),
        "git_commit": f"{first['git_commit']} (the timings)",
        "torch_version": first["torch_version"],
        "transformers_version": first["transformers_version"],
        "liger_version": first["liger_version"] if pd.notna(first["liger_version"]) else None,
    }
