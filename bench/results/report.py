"""Build a sweep's results: runs.csv, summary.csv, loss_parity.csv, vram_per_card.csv (and
contrasts/scaling/capacity/trainers CSVs when the sweep has them), the PNGs and report.md, every file
written atomically into the sweep directory (``python -m bench report DIR``).

The CSV column lists (RUNS_COLUMNS, SUMMARY_COLUMNS, LOSS_PARITY_COLUMNS, VRAM_PER_CARD_COLUMNS,
CONTRAST_COLUMNS) come from the column registry (bench.results.columns), report.md's sections
from bench.results.sections and bench.results.method; all are re-exported here.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd

from bench import fmt
from bench.fileio import atomic_write_text, read_json
from bench.results import plots, runplots
from bench.results.armsection import arms_section
from bench.results.capacity_table import capacity_table
from bench.results.columns import (
    CONTRAST_COLUMNS,
    LOSS_PARITY_COLUMNS,
    OPTIONAL_REPORT_FILES,
    RUNS_COLUMNS,
    SUMMARY_COLUMNS,
    VRAM_PER_CARD_COLUMNS,
)
from bench.results.crosstrainer import trainers_section, trainers_table
from bench.results.firstrun import first_run_section
from bench.results.forest import plot_forest, sweep_forest_rows
from bench.results.manifest import write_manifest
from bench.results.method import (
    machine_state_line,
    method_section,
    provenance_section,
    startup_section,
    vram_crosscheck,
)
from bench.results.parity import excluded_runs, in_statistics_records, loss_parity_table, with_loss_parity
from bench.results.parity_report import parity_console, parity_section, plot_training_parity
from bench.results.prsummary import CONSOLE_WIDTH, console_summary, pr_summary
from bench.results.records import RunRecord, load_runs
from bench.results.sections import (
    MAIN_TABLE_HEADER,
    PARITY_TABLE_HEADER,
    PLOT_FILES,
    capacity_section,
    contrast_section,
    energy_section,
    loss_parity_section,
    main_table,
    not_ok_section,
    parity_table,
    plots_section,
    precision_section,
    scaling_section,
)
from bench.results.startlines import start_phases_section
from bench.results.summary_json import write_summary_json
from bench.results.tables import (
    contrast_table,
    runs_table,
    scaling_table,
    summary_table,
    vram_per_card_table,
)
from bench.results.training_parity import training_parity_table

__all__ = [
    "CONTRAST_COLUMNS",
    "CSV_FLOAT_FORMAT",
    "LOSS_PARITY_COLUMNS",
    "MAIN_TABLE_HEADER",
    "PARITY_TABLE_HEADER",
    "PLOT_FILES",
    "RUNS_COLUMNS",
    "SUMMARY_COLUMNS",
    "VRAM_PER_CARD_COLUMNS",
    "build_report",
    "capacity_section",
    "contrast_section",
    "machine_state_line",
    "main_table",
    "parity_table",
    "precision_section",
    "render_markdown",
    "scaling_section",
    "startup_section",
    "vram_crosscheck",
    "write_csv",
]

NO_PLOTS_ENV = "BENCH_NO_PLOTS"
CSV_FLOAT_FORMAT = "%.6g"  # rounding happens here only, at write time
# Files of an earlier build that this build writes only when the sweep has them.
OPTIONAL_FILES = tuple(OPTIONAL_REPORT_FILES)


def write_csv(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a table atomically, floats to 6 significant digits."""
    atomic_write_text(path, df.to_csv(index=False, float_format=CSV_FLOAT_FORMAT))
    return Path(path)


def _equivalence_pct(sweep: dict) -> float:
    return fmt.num(sweep.get("equivalence_pct")) if sweep.get("equivalence_pct") else 1.0


def _base_tables(records: list[RunRecord], sweep: dict) -> dict[str, pd.DataFrame]:
    """runs, loss_parity, vram_per_card and summary (its loss_parity column filled in)."""
    runs = runs_table(records)
    tables = {
        "runs": runs,
        "loss_parity": loss_parity_table(records, runs=runs),
        "vram_per_card": vram_per_card_table(records),
    }
    tables["summary"] = with_loss_parity(
        summary_table(
            tables["runs"],
            precision=sweep.get("precision_targets") or {},
            equivalence_pct=_equivalence_pct(sweep),
        ),
        tables["loss_parity"],
    )
    return tables


def _write_plots(
    sweep_dir: Path, sweep: dict, records: list[RunRecord], tables: dict[str, pd.DataFrame]
) -> dict[str, Path]:
    name = sweep.get("name") or sweep_dir.name
    return {
        "forest.png": plot_forest(
            sweep_forest_rows(tables["summary"]),
            sweep_dir / "forest.png",
            f"{name}: each arm vs its cell's baseline (points labelled with their paired 95% CI)",
            band_pct=_equivalence_pct(sweep),
        ),
        "throughput.png": plots.plot_throughput(tables["summary"], sweep_dir / "throughput.png"),
        "vram_per_card.png": plots.plot_vram_per_card(
            tables["vram_per_card"], sweep_dir / "vram_per_card.png"
        ),
        "loss_curves.png": runplots.plot_loss_curves(records, sweep_dir / "loss_curves.png", tables["runs"]),
        "step_time_dist.png": runplots.plot_step_time_dist(
            records, sweep_dir / "step_time_dist.png", tables["runs"]
        ),
    }


def plots_wanted() -> bool:
    """False when ``BENCH_NO_PLOTS`` is set (to anything but 0): CSVs and report.md only, e.g. for a
    CI job that gates on the CSVs (and the test suite, whose figure tests draw them)."""
    return os.environ.get(NO_PLOTS_ENV, "").strip() in ("", "0")


def _write_optional(
    sweep_dir: Path, sweep: dict, tables: dict[str, pd.DataFrame], draw: bool = True
) -> dict[str, Path]:
    """scaling, contrasts, trainers and capacity: computed into ``tables``, written only when not
    empty (an earlier build's files removed first; their PNGs only when ``draw``)."""
    tables["scaling"] = scaling_table(tables["summary"])
    tables["trainers"] = trainers_table(tables["summary"])
    contrasts = (sweep.get("config") or {}).get("contrasts") or []
    tables["contrasts"] = contrast_table(tables["runs"], contrasts, equivalence_pct=_equivalence_pct(sweep))
    for name in OPTIONAL_FILES:
        (sweep_dir / name).unlink(missing_ok=True)  # the sweep's own, from an earlier build
    paths = {}
    if len(tables["contrasts"]):
        paths["contrasts.csv"] = write_csv(tables["contrasts"], sweep_dir / "contrasts.csv")
    if len(tables["trainers"]):
        paths["trainers.csv"] = write_csv(tables["trainers"], sweep_dir / "trainers.csv")
    if len(tables["scaling"]):
        paths["scaling.csv"] = write_csv(tables["scaling"], sweep_dir / "scaling.csv")
        if draw:
            paths["scaling.png"] = plots.plot_scaling(tables["scaling"], sweep_dir / "scaling.png")
    tables["capacity"] = capacity_table(tables["runs"], sweep, tables["vram_per_card"])
    if len(tables["capacity"]):
        paths["capacity.csv"] = write_csv(tables["capacity"], sweep_dir / "capacity.csv")
        if draw:
            paths["capacity.png"] = plots.plot_capacity(
                tables["runs"], tables["capacity"], sweep_dir / "capacity.png"
            )
    return paths


def build_report(sweep_dir: str | Path) -> dict[str, Any]:
    """Aggregate ``sweep_dir`` and write its CSVs, plots and report.md.

    summary.json (bench/results/summary_json.py) is the verdict as data, from the same tables.
    Returns {"paths": {file name: Path}, "runs", "summary", "loss_parity", "vram_per_card",
    "scaling", "contrasts", "trainers", "capacity": DataFrames, "main_table": the main table's Markdown
    lines, "console_summary": the PR summary as plain text lines of at most 100 columns}.
    Raises ValueError when the directory is missing or holds no runs.
    """
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ValueError(f"{sweep_dir}: no such sweep directory")
    records = load_runs(sweep_dir)
    if not records:
        raise ValueError(f"{sweep_dir}: no run directories under {sweep_dir / 'runs'}")
    sweep = read_json(sweep_dir / "sweep.json") or {}
    if not isinstance(sweep, dict) or not isinstance(sweep.get("config"), dict):
        # the runs alone still make a report, but what the sweep planned is not known: say so
        print(
            f"warning: {sweep_dir / 'sweep.json'}: missing or holds no config (damaged, or not a sweep's); the "
            "report is of the runs alone: no precision targets, planned runs or parity settings",
            file=sys.stderr,
        )
        sweep = sweep if isinstance(sweep, dict) else {}
    tables = _base_tables(records, sweep)
    paths = {f"{name}.csv": write_csv(df, sweep_dir / f"{name}.csv") for name, df in tables.items()}
    draw = plots_wanted()
    if draw:
        paths.update(_write_plots(sweep_dir, sweep, records, tables))
    else:
        for name in PLOT_FILES:  # an earlier build's pictures would not match these tables
            (sweep_dir / name).unlink(missing_ok=True)
    paths.update(_write_optional(sweep_dir, sweep, tables, draw))
    paths.update(
        _write_training_parity(sweep_dir, sweep, in_statistics_records(records, tables["runs"]), tables, draw)
    )
    paths["manifest.json"] = write_manifest(sweep_dir, [p for n, p in paths.items() if n.endswith(".csv")])
    main = main_table(tables["summary"], tables["runs"])
    text = render_markdown(sweep, sweep_dir, records, tables, main, drawn=draw)
    atomic_write_text(sweep_dir / "report.md", text)
    paths["report.md"] = sweep_dir / "report.md"
    # the verdict as data, last (words no verdict kind names stop it, every other file written);
    # not in the manifest, which covers the CSVs `bench compare` reads
    paths["summary.json"] = write_summary_json(sweep, sweep_dir, tables)
    console = console_summary(
        tables["summary"], tables["runs"], sweep, training=tables.get("training_parity")
    )
    console += parity_console(tables.get("training_parity", pd.DataFrame()))
    console += left_out_lines(records, tables["runs"])
    for line in first_run_section(tables["runs"], sweep)[:1]:  # as hyperfine warns, on the console too
        text = "warning: " + line.replace("**", "").replace("`", "")
        console += [
            "",
            *textwrap.wrap(text, width=CONSOLE_WIDTH, subsequent_indent="  ", break_on_hyphens=False),
        ]
    return {"paths": paths, **tables, "main_table": main, "console_summary": console}


def left_out_lines(records: list[RunRecord], runs: pd.DataFrame) -> list[str]:
    """A warning per ok run that stayed out of the statistics (its records cut short, unreadable,
    duplicated, of another workload...): "runs: N ok" counts it, so the console says why it
    weighs nothing, never only runs.csv's note."""
    ok = set(runs.loc[runs["status"] == "ok", "run_id"].astype(str))
    out = [(rid, why) for rid, why in excluded_runs(records, runs).items() if rid in ok]
    if not out:
        return []
    lines = ["", f"warning: {len(out)} ok run(s) left out of the statistics (runs.csv's note):"]
    said = [f"  {rid}: {why}" for rid, why in out]
    return lines + [s if len(s) <= CONSOLE_WIDTH else s[: CONSOLE_WIDTH - 4] + " ..." for s in said]


def _write_training_parity(
    sweep_dir: Path, sweep: dict, records: list[RunRecord], tables: dict[str, pd.DataFrame], draw: bool
) -> dict[str, Path]:
    """training_parity.csv (and .png) of a parity sweep, from the runs in the statistics."""
    tables["training_parity"] = training_parity_table(records, sweep)
    if not len(tables["training_parity"]):
        return {}
    paths = {"training_parity.csv": write_csv(tables["training_parity"], sweep_dir / "training_parity.csv")}
    if draw:
        paths["training_parity.png"] = plot_training_parity(records, sweep, sweep_dir / "training_parity.png")
    return paths


def render_markdown(
    sweep: dict,
    sweep_dir: Path,
    records: list[RunRecord],
    tables: dict[str, pd.DataFrame],
    main: list[str] | None = None,
    drawn: bool = True,
) -> str:
    """report.md: the PR summary and the headline figure, provenance, method, main table (``main``, else built here), the sections the
    sweep has, loss parity, runs not ok, plots."""
    runs, summary = tables["runs"], tables["summary"]
    lines = [f"# Benchmark report: {sweep.get('name') or sweep_dir.name}", ""]
    lines += pr_summary(summary, runs, sweep, tables.get("training_parity")) + [""]
    if drawn:
        lines += ["![Each arm vs its baseline, paired 95% CIs](forest.png)", ""]
    lines += ["## Provenance", ""]
    lines += provenance_section(sweep, runs) + [""]
    lines += method_section(sweep, records, runs, summary) + ["", "## Results", ""]
    lines += main if main is not None else main_table(summary, runs)
    lines += ["", "Means over ok runs; Δ columns are the arm vs the baseline arm of the same cell.", ""]
    lines += vram_crosscheck(runs)
    lines += energy_section(summary, runs)
    lines += machine_state_line(runs)
    lines += arms_section(runs, sweep, records)
    lines += first_run_section(runs, sweep)
    lines += precision_section(summary, sweep)
    lines += contrast_section(tables.get("contrasts", pd.DataFrame()), summary)
    lines += trainers_section(tables.get("trainers", pd.DataFrame()))
    lines += scaling_section(tables.get("scaling", pd.DataFrame()))
    lines += capacity_section(tables.get("capacity", pd.DataFrame()))
    lines += startup_section(runs, sweep.get("fork_server"))
    lines += start_phases_section(records)
    lines += loss_parity_section(tables["loss_parity"], records, runs)
    parity = parity_section(
        tables.get("training_parity", pd.DataFrame()), in_statistics_records(records, runs), sweep
    )
    lines += ["", *parity] if parity else []
    lines += ["", *not_ok_section(runs)]
    lines += ["", *plots_section(drawn)]
    return "\n".join(lines)
