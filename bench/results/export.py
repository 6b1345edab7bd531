"""`bench export SWEEP_DIR --to tensorboard|mlflow|wandb [--out DIR]`: a finished sweep's runs and
verdicts into the tracker SpecForge logs to (its ``report_to``), written with that tracker's own
library from the ``trackers`` extra (pip install 'dflash-liger-bench[trackers]'), imported only here.

The sweep is read once, tracker-neutral (bench/results/export_data.py); each tracker's module writes
it (export_tensorboard.py, export_mlflow.py, export_wandb.py). Nothing leaves the machine unless the
user's own tracker configuration says so: TensorBoard writes files under OUT; MLflow a local file
store under OUT unless MLFLOW_TRACKING_URI is set (and no --out given); W&B offline runs under OUT
unless WANDB_MODE is set. Default OUT: SWEEP_DIR/tracker/<tensorboard|mlruns|wandb>.
"""

from __future__ import annotations

from pathlib import Path

from bench.errors import SweepError
from bench.results.export_data import read_sweep

# tracker -> its default folder under SWEEP_DIR/tracker/
TRACKERS = {"tensorboard": "tensorboard", "mlflow": "mlruns", "wandb": "wandb"}


def run_export(args) -> int:
    """`bench export` (``args``: add_export_parser's): read the sweep, write it to the tracker,
    print where it went."""
    sweep_dir, to, out = args.dir, args.to, args.out
    if to not in TRACKERS:
        raise SweepError(f"unknown tracker {to!r} (--to one of {', '.join(TRACKERS)})")
    sweep = read_sweep(sweep_dir)
    folder = Path(out) if out is not None else Path(sweep_dir) / "tracker" / TRACKERS[to]
    print(f"exporting {len(sweep.runs)} runs and the summary of {sweep.name} to {to} ...", flush=True)
    if to == "tensorboard":
        from bench.results import export_tensorboard

        lines = export_tensorboard.export(sweep, folder)
        where = str(folder)
    elif to == "mlflow":
        from bench.results import export_mlflow

        where, lines = export_mlflow.export(sweep, out)
    else:
        from bench.results import export_wandb

        lines = export_wandb.export(sweep, folder)
        where = str(folder)
    print(f"exported {len(sweep.runs)} runs and the summary to {where} ({to})")
    for line in lines:
        print(line)
    return 0
