"""report.md's warning when an arm's first run was an outlier among its runs (as hyperfine warns
that a command's first run was significantly slower): the machine or its caches still settling
when the sweep began, which a pilot then carries into Stein's rule. A run is an outlier by its
modified z-score, 0.6745·(x − median)/MAD over the arm's runs in the cell (Iglewicz and Hoaglin:
above 3.5), x its mean step time; only when it is also the arm's slowest run. The run stays in
the statistics as it ran: this says so, it does not drop it."""

from __future__ import annotations

import pandas as pd

from bench import fmt
from bench.results.records import in_statistics

THRESHOLD = 3.5  # Iglewicz and Hoaglin's cut for the modified z-score
MIN_RUNS = 4  # fewer runs give no median absolute deviation worth the name


def slow_first_runs(runs: pd.DataFrame) -> list[dict]:
    """Per cell and arm whose first run (by order_index) was its slowest and an outlier: cell_id,
    arm, the run's mean s/step, the median of the arm's runs, the modified z-score, the run count."""
    need = {"cell_id", "arm", "order_index", "s_per_step_mean"}
    if runs.empty or not need <= set(runs.columns):
        return []
    ok = runs[in_statistics(runs)].dropna(subset=["order_index", "s_per_step_mean"])
    found = []
    for (cell, arm), g in ok.groupby(["cell_id", "arm"], sort=False):
        if len(g) < MIN_RUNS:
            continue
        times = g.sort_values("order_index")["s_per_step_mean"].astype(float)
        median = times.median()
        mad = (times - median).abs().median()
        first = times.iloc[0]
        if mad <= 0 or first < times.max():
            continue
        z = 0.6745 * (first - median) / mad
        if z > THRESHOLD:
            found.append({"cell_id": cell, "arm": arm, "first": first, "median": median, "z": z, "n": len(g)})
    return found


def first_run_section(runs: pd.DataFrame, sweep: dict) -> list[str]:
    """The warning's lines (none when no arm's first run stood out)."""
    found = slow_first_runs(runs)
    if not found:
        return []
    config = (sweep.get("config") or {}) if isinstance(sweep, dict) else {}
    primed = int(config.get("prime_runs") or 0)
    paired = (
        " (with `pairing: lockstep`, one pair of them taking turns)"
        if config.get("pairing") == "lockstep"
        else ""
    )
    said = "; ".join(
        f"{f['arm']} in {f['cell_id']}: {fmt.f(f['first'], '.3f')} s/step against a median of "
        f"{fmt.f(f['median'], '.3f')} over its {f['n']} runs (modified z {fmt.f(f['z'], '.1f')})"
        for f in found
    )
    fix = (
        f"This sweep already ran {primed} priming run(s) per cell and arm before it."
        if primed
        else f"`prime_runs: 1` runs each cell and arm once, unmeasured, before its first measured run{paired}."
    )
    return [
        f"**First runs slower.** An arm's first run was its slowest, and an outlier among its runs: "
        f"{said}. The machine or its caches were likely still settling when the sweep began. The run "
        f"stays in the statistics as it ran; a pilot that holds it asks for more pairs. {fix}",
        "",
    ]
