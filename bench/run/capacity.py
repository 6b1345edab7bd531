"""Capacity search: per cell and arm, the largest batch size (or sequence length) that trains.

    python -m bench capacity CONFIG [--out DIR] [--resume] [--force] [--dry-run]

The sweep config's ``capacity: {axis, start, max, granularity, steps}`` names the axis. For
every cell (its other axis fixed) and every arm, probes grow the value geometrically from
``start`` (doubling, capped at ``max``) until one runs out of memory, then bisect between the
largest value that fit and the smallest that did not, down to ``granularity``. A start that
does not fit halves instead. Each probe is an ordinary run of the cell at that value (its own
process, ``steps`` optimizer steps, the first dropped), so an OOM is an answer that cannot
poison the next probe, and the probes' files, runs.csv and the report are a sweep's. An
error or timeout (anything but ok / oom) ends that arm's search, recorded as such.

The next value depends only on the outcomes so far, so a killed search resumes with
``--resume`` to the same answer, redoing only the probe in flight.
"""

from __future__ import annotations

import functools
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from bench.config.sweep import ARM_OPTIONS, Capacity, Cell, Run, SweepConfig, _cell_id
from bench.fileio import read_json
from bench.run import console
from bench.run.sweepdir import is_finished, run_dir

CAPACITY_COLUMNS = [
    "series", "profile", "mode", "gpus", "nodes", "axis", "arm", "largest_fit", "first_oom", "probes", "stopped_by",
    "peak_vram_gib_at_largest", "samples_per_s_at_largest", "card_total_gib", "fit_ratio_vs_baseline",
    "fit_ratio_bound",
]  # fmt: skip


def next_value(history: dict[int, str], cap: Capacity) -> int | None:
    """The next value to probe given {value: status} so far, or None when the search is over."""
    if any(s not in ("ok", "oom") for s in history.values()):
        return None  # an error or timeout is no answer about memory: stop, say so
    fits = [v for v, s in history.items() if s == "ok"]
    lo = max(fits, default=None)
    fails = [v for v, s in history.items() if s == "oom" and (lo is None or v > lo)]
    hi = min(fails, default=None)
    g = cap.granularity
    if lo is None and hi is None:
        return cap.start
    if lo is None:  # even the smallest probe so far OOMs: halve
        smaller = (hi // 2) // g * g
        return smaller if smaller >= g and smaller not in history else None
    if hi is None:  # everything so far fits: double, up to the cap
        if lo >= cap.max:
            return None
        return min(lo * 2, cap.max)
    if hi - lo <= g:
        return None
    mid = (lo + hi) // 2 // g * g
    return mid if lo < mid < hi else None


def probe_cell(cfg: SweepConfig, cell: Cell, value: int) -> Cell:
    """The cell at one probed value, trained for ``capacity.steps`` steps (the first dropped)."""
    cap = cfg.capacity
    assert cap is not None
    probed = replace(cell, **{cap.axis: value}, steps=cap.steps, warmup_steps=1)
    return replace(probed, cell_id=_cell_id(probed, None))


def series(cfg: SweepConfig) -> list[tuple[str, Cell]]:
    """One (series id, representative cell) per cell with the searched axis left out."""
    cap = cfg.capacity
    assert cap is not None
    seen: dict[str, Cell] = {}
    for cell in cfg.cells:
        other = f"s{cell.seq_len}" if cap.axis == "batch_size" else f"bs{cell.batch_size}"
        key = f"{cell.profile}_{cell.mode}_{other}" + (f"_g{cell.gpus}" if cell.gpus > 1 else "")
        seen.setdefault(key, cell)
    return list(seen.items())


def _status(out_dir: Path, run: Run) -> str | None:
    rdir = run_dir(out_dir, run)
    if not is_finished(rdir):
        return None
    doc = read_json(rdir / "run.json") or {}
    return str(doc.get("status"))


def search(cfg: SweepConfig, out_dir: Path, info: dict) -> int:
    """Run every arm's search of every series; write the report and capacity.csv/png."""
    from bench.run import sweep as driver

    skip = driver.liger_skip_reason() if any(ARM_OPTIONS[a]["liger"] for a in cfg.arms) else None
    compile_dir = driver.compile_cache_dir(out_dir, info) if cfg.compile_cache else None
    progress = console.Progress(total=0, done=0)
    server = functools.cache(
        lambda: driver.start_fork_server(cfg, out_dir, compile_dir, info, progress.write)
    )
    caches: dict[str, str | None] = {}  # offline caches prepared (or verified) once, shared by probes
    order = 0
    try:
        for _sid, cell in series(cfg):
            for arm in cfg.arms:
                history: dict[int, str] = {}
                while (value := next_value(history, cfg.capacity)) is not None:
                    pcell = probe_cell(cfg, cell, value)
                    run = Run(f"{pcell.cell_id}_{arm}_r1", pcell, arm, 1, order)
                    order += 1
                    status = _status(out_dir, run)
                    if status is None:
                        if run.liger and skip:
                            driver.execute_run(cfg, run, out_dir, skip, {}, None, compile_dir)
                            history[value] = "skipped"
                            continue
                        caches = driver._prepare_caches(cfg, out_dir, [run], known=caches)
                        server()  # before the first probe that launches, not on a finished search
                        progress.grow(progress.bar.total + 1)
                        progress.start(run)
                        t0 = time.monotonic()
                        line = driver.execute_run(
                            cfg, run, out_dir, skip, caches, progress.ticker(run, out_dir), compile_dir
                        )
                        progress.done(run, line, time.monotonic() - t0)
                        status = _status(out_dir, run) or "error"
                    history[value] = status
    except KeyboardInterrupt:
        print("\ninterrupted: the probe in flight was stopped; --resume redoes it", file=sys.stderr)
        return 130
    finally:
        progress.close()
    return driver.report(out_dir)


def capacity_table(runs: pd.DataFrame, sweep: dict, vram: pd.DataFrame | None = None) -> pd.DataFrame:
    """capacity.csv from the probes in runs.csv: per series and arm, the largest value that fit,
    the first that did not, peak VRAM and samples/s at the largest, the card's size, and the
    ratio of the arm's largest fit to the baseline's: exact (to the granularity) when both searches
    found an OOM, a bound when one reached the search's max, none when both did."""
    cap = (sweep.get("config") or {}).get("capacity")
    if not cap or runs.empty:
        return pd.DataFrame(columns=CAPACITY_COLUMNS)
    axis = cap["axis"]
    other = "seq_len" if axis == "batch_size" else "batch_size"
    rows = []
    runs = runs.assign(nodes=runs["nodes"].fillna(1) if "nodes" in runs else 1)
    for (profile, mode, fixed, gpus, nodes, arm), g in runs.groupby(
        ["profile", "mode", other, "gpus", "nodes", "arm"], sort=False, dropna=False
    ):
        sid = (
            f"{profile}_{mode}_{'s' if other == 'seq_len' else 'bs'}{int(fixed)}"
            + (f"_g{int(gpus)}" if gpus and gpus > 1 else "")
            + (f"_n{int(nodes)}" if nodes and nodes > 1 else "")
        )
        ok, oom = g[g["status"] == "ok"], g[g["status"] == "oom"]
        best = ok.loc[ok[axis].idxmax()] if len(ok) else None
        above = oom[oom[axis] > (best[axis] if best is not None else 0)]
        other_status = sorted(set(g["status"]) - {"ok", "oom"})
        stopped = (
            f"{other_status[0]}: {g[g['status'] == other_status[0]]['reason'].iloc[0]}"
            if other_status
            else ("oom" if len(above) else "max reached")
        )
        rows.append(
            {
                "series": sid, "profile": profile, "mode": mode, "gpus": gpus, "nodes": nodes, "axis": axis, "arm": arm,
                "largest_fit": best[axis] if best is not None else float("nan"),
                "first_oom": above[axis].min() if len(above) else float("nan"),
                "probes": len(g), "stopped_by": stopped,
                "peak_vram_gib_at_largest": best["peak_vram_gib"] if best is not None else float("nan"),
                "samples_per_s_at_largest": best["samples_per_s"] if best is not None else float("nan"),
                "card_total_gib": _card_total(vram, best["run_id"]) if best is not None else float("nan"),
            }
        )  # fmt: skip
    df = pd.DataFrame(rows).reindex(columns=CAPACITY_COLUMNS)
    base = df[df["arm"] == "baseline"].set_index("series")
    df["fit_ratio_vs_baseline"] = df["largest_fit"] / df["series"].map(base["largest_fit"])
    # Exact (to the granularity) when both searches ended at an OOM; an arm that reached the
    # search's max fits at least that much, so its ratio is a bound; none when both reached it or
    # an error ended either search.
    stop, base_stop = df["stopped_by"], df["series"].map(base["stopped_by"])
    df["fit_ratio_bound"] = pd.Series(pd.NA, index=df.index, dtype=object)
    for arm_end, base_end, bound in (
        ("oom", "oom", "exact"),
        ("max reached", "oom", "at least"),
        ("oom", "max reached", "at most"),
        ("max reached", "max reached", "unknown: both fit the max"),
    ):
        df.loc[(stop == arm_end) & (base_stop == base_end), "fit_ratio_bound"] = bound
    no_ratio = df["fit_ratio_bound"].isna() | (df["fit_ratio_bound"] == "unknown: both fit the max")
    df.loc[no_ratio, "fit_ratio_vs_baseline"] = float("nan")
    return df


def _card_total(vram: pd.DataFrame | None, run_id: str) -> float:
    """The size of the busiest card of a run (from vram_per_card), NaN when not polled."""
    if vram is None or vram.empty:
        return float("nan")
    cards = vram[vram["run_id"] == run_id]
    if cards.empty or cards["peak_delta_gib"].isna().all():
        return float("nan")
    return float(cards.loc[cards["peak_delta_gib"].idxmax(), "total_gib"])


def print_capacity_plan(cfg: SweepConfig, out_dir: Path, hardware_problem: str | None) -> None:
    """--dry-run: the series, the first probe of each arm and its command; nothing is written."""
    from bench.run import sweep as driver

    cap = cfg.capacity
    assert cap is not None
    print(f"capacity search {cfg.name} ({cfg.path}) -> {out_dir}   [dry run: nothing is written]")
    if hardware_problem:
        print(f"note: a real run would be refused here: {hardware_problem}")
    print(
        f"axis {cap.axis}: from {cap.start}, doubling up to {cap.max}, then bisecting to multiples of "
        f"{cap.granularity}; {cap.steps} steps per probe"
    )
    for sid, cell in series(cfg):
        for arm in cfg.arms:
            pcell = probe_cell(cfg, cell, cap.start)
            run = Run(f"{pcell.cell_id}_{arm}_r1", pcell, arm, 1, 0)
            argv = driver.train_command(cfg, run, run_dir(out_dir, run), driver.cache_dir_for(out_dir, pcell))
            print(f"{sid} {arm}: first probe {cap.axis}={cap.start}")
            print(f"      {shlex.join(argv)}")
