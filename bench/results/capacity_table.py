"""capacity.csv: per series and arm, the largest batch size (or sequence length) that trained,
read back from a capacity search's probes in runs.csv (the search itself: bench/run/capacity_search.py)."""

from __future__ import annotations

import pandas as pd

from bench.arms import BASELINE
from bench.results.columns import CAPACITY_COLUMNS, DEFAULT_TRAINER
from bench.results.tables import with_trainer


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
    runs = with_trainer(runs).assign(nodes=runs["nodes"].fillna(1) if "nodes" in runs else 1)
    for (trainer, profile, mode, fixed, gpus, nodes, arm), g in runs.groupby(
        ["trainer", "profile", "mode", other, "gpus", "nodes", "arm"], sort=False, dropna=False
    ):
        sid = (
            f"{profile}_{mode}_{'s' if other == 'seq_len' else 'bs'}{int(fixed)}"
            + (f"_g{int(gpus)}" if gpus and gpus > 1 else "")
            + (f"_n{int(nodes)}" if nodes and nodes > 1 else "")
            + (f"_{trainer}" if trainer != DEFAULT_TRAINER else "")
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
                "series": sid, "trainer": trainer, "profile": profile, "mode": mode, "gpus": gpus, "nodes": nodes, "axis": axis, "arm": arm,
                "largest_fit": best[axis] if best is not None else float("nan"),
                "first_oom": above[axis].min() if len(above) else float("nan"),
                "probes": len(g), "stopped_by": stopped,
                "peak_vram_gib_at_largest": best["peak_vram_gib"] if best is not None else float("nan"),
                "samples_per_s_at_largest": best["samples_per_s"] if best is not None else float("nan"),
                "card_total_gib": _card_total(vram, best["run_id"]) if best is not None else float("nan"),
            }
        )  # fmt: skip
    df = pd.DataFrame(rows).reindex(columns=CAPACITY_COLUMNS)
    base = df[df["arm"] == BASELINE].set_index("series")
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
