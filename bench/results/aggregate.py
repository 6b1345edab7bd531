"""Aggregate a sweep directory into tables: per run, per (cell, arm), loss parity, VRAM per card.

Pure functions over pandas (no plotting, no writing). File layout and schemas:
docs/run-contract.md; method: DESIGN.md §8. Numbers are kept at full precision here and
rounded only when written (bench/report.py).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.fileio import read_json, read_jsonl
from bench.results import stats

BASELINE_ARM = "baseline"
AA_ARM = "aa"
CONFIDENCE = 0.95

METRIC_FIELDS = [
    "step", "loss", "accuracy", "step_time_s", "samples", "tokens", "samples_per_s", "tokens_per_s",
    "lr", "grad_norm", "torch_peak_allocated_gib", "torch_peak_reserved_gib", "mfu", "elapsed_s", "time",
]  # fmt: skip
# Read-only GPU state of the run's busiest card, sampled by the poller: min/median/max over the
# measured steps (vram.jsonl's timed state rows against metrics' "time"), else over the whole run
# (vram.json); state_window says which.
STATE_FIELDS = ["sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w"]
STATE_COLUMNS = [f"{f}_{s}" for f in STATE_FIELDS for s in ("min", "median", "max")] + ["state_window"]
STARTUP_COLUMNS = [
    "startup_s", "imports_s", "imports_preloaded", "first_step_s", "to_first_measured_step_s",
    "compile_cache_warm",
]  # fmt: skip

CELL_COLUMNS = [
    "profile",
    "mode",
    "batch_size",
    "seq_len",
    "accumulation_steps",
    "num_anchors",
    "gpus",
    "nodes",
]
# Cells that differ only in their world size (gpus x nodes) form one scaling series.
SCALING_KEY = ["profile", "mode", "batch_size", "seq_len", "accumulation_steps", "num_anchors"]
SCALING_COLUMNS = [
    *SCALING_KEY, "arm", "gpus", "nodes", "world_size", "n_ok", "samples_per_s_mean", "samples_per_s_per_gpu",
    "scaling_efficiency_pct", "delta_samples_per_s_pct", "delta_samples_per_s_pct_ci95_low",
    "delta_samples_per_s_pct_ci95_high", "peak_vram_gib",
]  # fmt: skip
PROVENANCE_COLUMNS = [
    "hostname", "gpu_name", "gpu_count", "driver_version", "torch_version", "triton_version",
    "transformers_version", "liger_version", "git_commit",
]  # fmt: skip

RUNS_COLUMNS = [
    "run_id", "cell_id", *CELL_COLUMNS, "arm", "repeat", "order_index", "status", "reason", "note",
    "steps_total", "warmup_steps", "steps_measured",
    "s_per_step_mean", "s_per_step_median", "s_per_step_std", "s_per_step_p10", "s_per_step_p90",
    "samples_per_s", "tokens_per_s", "mfu",
    "peak_vram_gib", "peak_vram_sum_gib", "peak_vram_delta_gib", "vram_status",
    "torch_peak_allocated_gib", "torch_peak_reserved_gib", "loss_last", "accuracy_last",
    *STARTUP_COLUMNS, *STATE_COLUMNS, "start_time", "end_time", *PROVENANCE_COLUMNS,
]  # fmt: skip
RUNS_TEXT_COLUMNS = {
    "run_id", "cell_id", "profile", "mode", "arm", "status", "reason", "note", "vram_status",
    "start_time", "end_time", "state_window", "compile_cache_warm", "imports_preloaded", *PROVENANCE_COLUMNS,
} - {"gpu_count"}  # fmt: skip

SUMMARY_PROVENANCE_COLUMNS = ["hostname", "gpu_name", "torch_version", "liger_version", "git_commit"]
SUMMARY_COLUMNS = [
    "cell_id", *CELL_COLUMNS, "arm", "n_runs", "n_ok",
    "samples_per_s_mean", "samples_per_s_std", "samples_per_s_ci95_low", "samples_per_s_ci95_high",
    "tokens_per_s_mean", "s_per_step_mean", "s_per_step_median", "s_per_step_ci95_low", "s_per_step_ci95_high",
    "peak_vram_gib", "peak_vram_gib_max", "torch_peak_allocated_gib", "torch_peak_reserved_gib",
    "mfu_mean", "loss_last_mean",
    "n_pairs", "delta_samples_per_s_pct", "delta_samples_per_s_pct_ci95_low", "delta_samples_per_s_pct_ci95_high",
    "delta_samples_per_s_halfwidth_pct", "delta_samples_per_s_pct_per_pair",
    "precision_target_pct", "pairs_planned", "pairs_wanted", "hit_pair_cap",
    "delta_peak_vram_gib", "delta_peak_vram_gib_ci95_low", "delta_peak_vram_gib_ci95_high",
    "delta_peak_vram_pct", "delta_torch_peak_allocated_gib",
    "verdict_speed", "verdict_memory", "loss_parity", "ci_method", *SUMMARY_PROVENANCE_COLUMNS,
]  # fmt: skip

LOSS_PARITY_COLUMNS = [
    "cell_id", "profile", "mode", "batch_size", "seq_len", "gpus", "nodes", "arm", "repeat", "steps_compared",
    "max_abs_delta", "max_abs_delta_step", "last_step", "last_step_abs_delta",
    "loss_last_baseline", "loss_last_arm", "tolerance", "criterion", "passed",
]  # fmt: skip
PARITY_CRITERION = "last_step_abs_delta <= tolerance"

VRAM_PER_CARD_COLUMNS = [
    "run_id", "cell_id", "arm", "repeat", "node", "card_index", "card_name", "total_gib",
    "baseline_used_gib", "peak_used_gib", "peak_delta_gib",
]  # fmt: skip

_RUN_ID_RE = re.compile(r"^(?P<cell_id>.+)_(?P<arm>[A-Za-z0-9]+)_r(?P<repeat>\d+)$")
NAN = float("nan")


@dataclass
class RunRecord:
    """Everything one run directory holds; missing files are empty ({} / no rows / None)."""

    run_dir: Path
    cell: dict[str, Any]
    run: dict[str, Any]
    metrics: pd.DataFrame  # one row per optimizer step (METRIC_FIELDS), sorted by step
    vram: dict[str, Any] | None

    def _from_id(self, key: str) -> str | None:
        m = _RUN_ID_RE.match(self.run_id)
        return m.group(key) if m else None

    @property
    def run_id(self) -> str:
        return str(self.cell.get("run_id") or self.run_dir.name)

    @property
    def cell_id(self) -> str | None:
        return self.cell.get("cell_id") or self._from_id("cell_id")

    @property
    def arm(self) -> str | None:
        return self.cell.get("arm") or self.run.get("arm") or self._from_id("arm")

    @property
    def repeat(self) -> int | None:
        rep = self.cell.get("repeat", self._from_id("repeat"))
        return None if rep is None else int(rep)

    @property
    def status(self) -> str:
        return str(self.run.get("status") or ("missing" if not self.run else "unknown"))

    @property
    def reason(self) -> str | None:
        if not self.run:
            if (self.run_dir / "run.json").exists():
                return "run.json is not valid JSON (a torn write, or not written by a trainer)"
            return "run.json missing: the trainer never started or died before writing it"
        return self.run.get("reason")

    @property
    def warmup_steps(self) -> int:
        return int(self.cell.get("warmup_steps") or 0)

    @property
    def steady(self) -> pd.DataFrame:
        """Steady-state steps: everything after the first ``warmup_steps`` steps."""
        m = self.metrics
        return m[(m["step"] > self.warmup_steps) & m["step_time_s"].notna()]


def _load_metrics(path: Path) -> pd.DataFrame:
    df = pd.DataFrame.from_records(read_jsonl(path), columns=METRIC_FIELDS)
    df = df.apply(pd.to_numeric, errors="coerce").astype(float).dropna(subset=["step"])
    return df.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)


def load_run(d: Path) -> RunRecord:
    """The record of one run directory."""
    return RunRecord(
        run_dir=d,
        cell=read_json(d / "cell.json") or {},
        run=read_json(d / "run.json") or {},
        metrics=_load_metrics(d / "metrics.jsonl"),
        vram=read_json(d / "vram.json"),
    )


def load_runs(sweep_dir: str | Path) -> list[RunRecord]:
    """One record per directory under ``<sweep_dir>/runs``, in run order (order_index, run_id)."""
    runs_dir = Path(sweep_dir) / "runs"
    dirs = sorted(p for p in runs_dir.iterdir() if p.is_dir()) if runs_dir.is_dir() else []
    records = [load_run(d) for d in dirs]
    return sorted(records, key=lambda r: (_num(r.cell.get("order_index"), math.inf), r.run_id))


def _num(x: Any, default: float = NAN) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return default


def vram_devices(vram: dict | None) -> pd.DataFrame:
    """Per-card rows of a vram.json (node, card_index, card_name, total/baseline/peak/delta GiB);
    node is 0 on a single node, a multi-node run's gathered cards carry theirs (bench/nodevram.py)."""
    cols = VRAM_PER_CARD_COLUMNS[VRAM_PER_CARD_COLUMNS.index("node") :]
    devices = (vram or {}).get("devices") or []
    rows = [
        {
            "node": d.get("node", 0),
            "card_index": d.get("index", i),
            "card_name": d.get("name"),
            **{c: _num(d.get(c)) for c in cols[3:]},
        }
        for i, d in enumerate(devices)
        if isinstance(d, dict)
    ]
    df = pd.DataFrame(rows, columns=cols)
    df["peak_delta_gib"] = df["peak_delta_gib"].fillna(df["peak_used_gib"] - df["baseline_used_gib"])
    return df


def _summarize_vram(vram: dict | None) -> dict[str, Any]:
    """Busiest card's peak used, sum over cards, busiest delta over idle baseline, poller status,
    and the busiest card's clocks, temperature and power (min/median/max over the run)."""
    dev = vram_devices(vram)
    out = {
        "peak_vram_gib": dev["peak_used_gib"].max(),
        "peak_vram_sum_gib": dev["peak_used_gib"].sum(min_count=1),
        "peak_vram_delta_gib": dev["peak_delta_gib"].max(),
        "vram_status": "missing" if vram is None else str(vram.get("status") or "unknown"),
    }
    devices = [d for d in (vram or {}).get("devices") or [] if isinstance(d, dict)]
    if devices:
        busiest = max(devices, key=lambda d: _num(d.get("peak_delta_gib"), -math.inf))
        state = busiest.get("state") or {}
        for f in STATE_FIELDS:
            stat = state.get(f) if isinstance(state.get(f), dict) else {}
            for k in ("min", "median", "max"):
                out[f"{f}_{k}"] = _num(stat.get(k))
        out["state_window"] = "whole run" if any(state.get(f) for f in STATE_FIELDS) else None
    return out


def measured_window(rec: RunRecord) -> tuple[float, float] | None:
    """Wall-clock start and end of a run's measured steps (metrics' "time" at the end of each step,
    minus the first measured step's duration), or None when the trainer wrote no times."""
    steady = rec.steady
    if steady.empty or steady["time"].isna().any():
        return None
    first = steady.iloc[0]
    return float(first["time"] - first["step_time_s"]), float(steady["time"].iloc[-1])


def _window_state(rec: RunRecord) -> dict[str, Any]:
    """The busiest card's state over the measured steps, from the poller's timed state rows in
    vram.jsonl; {} when the run has no step times, no state rows or none inside the window (the
    whole-run summary of vram.json stands then)."""
    window = measured_window(rec)
    devices = [d for d in (rec.vram or {}).get("devices") or [] if isinstance(d, dict)]
    if window is None or not devices:
        return {}
    busiest = max(range(len(devices)), key=lambda i: _num(devices[i].get("peak_delta_gib"), -math.inf))
    t0, t1 = window
    rows = [
        r["state"][busiest]
        for r in read_jsonl(rec.run_dir / "vram.jsonl")
        if isinstance(r.get("state"), list) and len(r["state"]) > busiest and t0 <= _num(r.get("t")) <= t1
    ]
    if not rows:
        return {}
    out: dict[str, Any] = {"state_window": "measured steps"}
    for f in STATE_FIELDS:
        values = [
            float(v) for v in (row.get(f) for row in rows if isinstance(row, dict)) if _num(v) == _num(v)
        ]
        for k, fn in (("min", min), ("median", statistics.median), ("max", max)):
            out[f"{f}_{k}"] = fn(values) if values else NAN
    return out


def _startup(rec: RunRecord) -> dict[str, Any]:
    """Startup costs: process start -> first step (trainer), of which imports (0 when a fork
    server imported them before the run started), step 1, and process start -> the first
    measured step (end of the last warm-up step, from metrics' elapsed_s); whether the
    compile cache was warm."""
    m, w = rec.metrics, rec.warmup_steps
    first = m.loc[m["step"] == 1, "step_time_s"]
    at_w = m.loc[m["step"] == w, "elapsed_s"] if w > 0 else pd.Series(dtype=float)
    startup = _num(rec.run.get("startup_s"))
    warm = (rec.cell.get("compile_cache") or {}).get("warm")
    phases = rec.run.get("startup") if isinstance(rec.run.get("startup"), dict) else {}
    preloaded = phases.get("imports_preloaded")
    return {
        "startup_s": startup,
        "imports_s": _num(phases.get("imports_s")),
        "imports_preloaded": None if preloaded is None else str(bool(preloaded)).lower(),
        "first_step_s": first.iloc[0] if len(first) else NAN,
        "to_first_measured_step_s": at_w.iloc[0] if len(at_w) else (startup if w == 0 else NAN),
        "compile_cache_warm": None if warm is None else str(bool(warm)).lower(),
    }


def _step_stats(steady: pd.DataFrame) -> dict[str, float]:
    """Step-time statistics; throughput as total work over total steady-state time."""
    t = steady["step_time_s"]
    total = t.sum()
    samples = steady["samples"].fillna(steady["samples_per_s"] * t)
    tokens = steady["tokens"].fillna(steady["tokens_per_s"] * t)
    return {
        "s_per_step_mean": t.mean(),
        "s_per_step_median": t.median(),
        "s_per_step_std": t.std(),
        "s_per_step_p10": t.quantile(0.1),
        "s_per_step_p90": t.quantile(0.9),
        "samples_per_s": samples.sum(min_count=1) / total if total > 0 else NAN,
        "tokens_per_s": tokens.sum(min_count=1) / total if total > 0 else NAN,
        "mfu": steady["mfu"].mean(),
    }


def _provenance(rec: RunRecord) -> dict[str, Any]:
    prov = rec.run.get("provenance") or {}
    names = [str(n) for n in prov.get("gpu_names") or []]
    return {
        "hostname": prov.get("hostname"),
        "gpu_name": ", ".join(dict.fromkeys(names)) or None,
        "gpu_count": prov.get("gpu_count"),
        "driver_version": prov.get("driver_version")
        or prov.get("rocm_version")
        or (rec.vram or {}).get("driver_version"),
        "torch_version": prov.get("torch"),
        "triton_version": prov.get("triton"),
        "transformers_version": prov.get("transformers"),
        "liger_version": prov.get("liger_kernel") or (rec.run.get("liger") or {}).get("version"),
        "git_commit": prov.get("git_commit"),
    }


def run_row(rec: RunRecord) -> dict[str, Any]:
    """One runs.csv row. Non-ok runs keep steps logged and memory peaks; their timings stay NaN."""
    m, steady = rec.metrics, rec.steady
    row: dict[str, Any] = {
        "run_id": rec.run_id,
        "cell_id": rec.cell_id,
        **{c: rec.cell.get(c) for c in CELL_COLUMNS},
        "arm": rec.arm,
        "repeat": rec.repeat,
        "order_index": rec.cell.get("order_index"),
        "status": rec.status,
        "reason": rec.reason,
        "steps_total": len(m),
        "warmup_steps": rec.warmup_steps,
        "steps_measured": len(steady),
        **_summarize_vram(rec.vram),
        **_window_state(rec),
        **_startup(rec),
        "torch_peak_allocated_gib": m["torch_peak_allocated_gib"].max(),
        "torch_peak_reserved_gib": m["torch_peak_reserved_gib"].max(),
        "start_time": rec.run.get("start_time"),
        "end_time": rec.run.get("end_time"),
        **_provenance(rec),
    }
    note = None
    planned = rec.cell.get("steps")
    if rec.status != "ok":
        if len(m):
            note = f"{len(m)} step(s) logged before status '{rec.status}'; excluded from stats"
    elif m.empty:
        note = "no metrics logged"
    elif isinstance(planned, int) and len(m) < planned:
        note = f"only {len(m)} of {planned} steps in metrics.jsonl: excluded from throughput stats"
    elif len(steady) < 2:
        note = (
            f"only {len(steady)} steady-state step(s) after dropping {rec.warmup_steps} warm-up: "
            "excluded from throughput stats"
        )
    else:
        row.update(_step_stats(steady))
    if rec.status == "ok" and not m.empty:
        row["loss_last"], row["accuracy_last"] = m["loss"].iloc[-1], m["accuracy"].iloc[-1]
    row["note"] = note
    return row


def runs_table(records: list[RunRecord]) -> pd.DataFrame:
    """runs.csv: one row per run (RUNS_COLUMNS), none dropped, whatever its status."""
    df = pd.DataFrame([run_row(r) for r in records]).reindex(columns=RUNS_COLUMNS)
    for c in RUNS_COLUMNS:
        if c not in RUNS_TEXT_COLUMNS:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def mean_ci(values: pd.Series) -> tuple[float, float, float, float]:
    """Mean, sample std and Student-t 95% interval of the non-NaN values (NaN where n is too small)."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    n = len(v)
    if n == 0:
        return NAN, NAN, NAN, NAN
    mean = float(v.mean())
    if n < 2:
        return mean, NAN, NAN, NAN
    std = float(v.std())
    half = stats.t_quantile(n - 1) * std / math.sqrt(n)
    return mean, std, mean - half, mean + half


def _first(s: pd.Series) -> Any:
    s = s.dropna()
    return s.iloc[0] if len(s) else None


def join_unique(s: pd.Series) -> str | None:
    """The distinct non-null values, in order of appearance, joined by ", " (None when there are none)."""
    vals = [str(v) for v in dict.fromkeys(s.dropna())]
    return ", ".join(vals) or None


def _by_repeat(ok: pd.DataFrame, col: str) -> pd.Series:
    return ok.drop_duplicates("repeat", keep="last").set_index("repeat")[col]


def log_ratios(base_ok: pd.DataFrame, ok: pd.DataFrame) -> pd.Series:
    """Per pair (repeat) where both runs are ok: ln(arm samples/s / baseline samples/s)."""
    b, o = _by_repeat(base_ok, "samples_per_s"), _by_repeat(ok, "samples_per_s")
    common = b.index.intersection(o.index)
    with np.errstate(divide="ignore", invalid="ignore"):
        lr = np.log(o[common].astype(float) / b[common].astype(float))
    return lr[np.isfinite(lr)].sort_index()


def _pilot_decision(lr: pd.Series, target: dict) -> stats.SteinDecision:
    pilot = lr[lr.index <= target["min_pairs"]]
    return stats.stein_pairs(
        list(pilot), target["ci_halfwidth_pct"], target["min_pairs"], target["max_pairs"]
    )


def stein_decisions(runs_df: pd.DataFrame, targets: dict[str, dict]) -> dict[str, stats.SteinDecision]:
    """Per cell with a precision target: how many pairs Stein's rule asks for after the pilot.

    Every non-baseline arm of the cell is judged from its own pilot log-ratios; the cell runs
    as many pairs as its most demanding arm needs. Arms with no usable pilot pair (e.g. a
    skipped Liger arm) do not extend the cell.
    """
    df = runs_df.reindex(columns=RUNS_COLUMNS)
    ok = df[df["status"] == "ok"]
    out: dict[str, stats.SteinDecision] = {}
    for cell_id, target in targets.items():
        cell_ok = ok[ok["cell_id"] == cell_id]
        base = cell_ok[cell_ok["arm"] == BASELINE_ARM]
        arms = [a for a in dict.fromkeys(df.loc[df["cell_id"] == cell_id, "arm"]) if a != BASELINE_ARM]
        decisions = [_pilot_decision(log_ratios(base, cell_ok[cell_ok["arm"] == a]), target) for a in arms]
        usable = [d for d in decisions if d.pilot_sd is not None]
        if usable:
            out[cell_id] = max(usable, key=lambda d: d.wanted)
        else:
            out[cell_id] = stats.stein_pairs(
                [], target["ci_halfwidth_pct"], target["min_pairs"], target["max_pairs"]
            )
    return out


def _one_sided(
    base_ok, ok, base_statuses: set, statuses: set, arm: str, ref: str = BASELINE_ARM
) -> dict[str, Any]:
    """Verdicts when one arm (or both) has no ok run: which arm fits is itself the finding.
    ``ref``: the arm compared against (the baseline, or a contrast's reference)."""
    base_oom = base_ok.empty and "oom" in base_statuses
    arm_oom = ok.empty and "oom" in statuses
    no_base = not base_statuses  # e.g. a capacity probe only one arm's search reached
    if base_oom and arm_oom:
        text = "both arms OOM"
    elif base_oom:
        text = f"{arm} fits, {ref} OOM"
    elif arm_oom and not base_ok.empty:
        text = f"{ref} fits, {arm} OOM"
    elif arm_oom:
        text = f"{arm} OOM; " + (f"no {ref} run" if no_base else f"no ok {ref} run")
    elif ok.empty:
        text = "n/a (no ok runs)"
    else:
        text = f"n/a (no {ref} run)" if no_base else f"n/a (no ok {ref})"
    return {"verdict_speed": text, "verdict_memory": text}


def _deltas(
    base_ok: pd.DataFrame,
    ok: pd.DataFrame,
    target: dict | None,
    equivalence_pct: float,
    arm: str = "",
    base_statuses: set | None = None,
    statuses: set | None = None,
    ref: str = BASELINE_ARM,
) -> dict[str, Any]:
    """Columns comparing one arm's ok runs with the baseline's (or ``ref``'s) ok runs of the same cell.

    Δ samples/s: ratio of geometric means over pairs, t-interval on the per-pair log-ratios
    (Stein's interval with the pilot's spread when the cell has a precision target); runs of
    the two arms that share no pair fall back to Welch's interval on log throughput.
    """
    if ok.empty or base_ok.empty:
        return _one_sided(base_ok, ok, base_statuses or set(), statuses or set(), arm, ref)
    min_pairs = target["min_pairs"] if target else 3
    lr = log_ratios(base_ok, ok)
    row: dict[str, Any] = {}
    if len(lr):
        decision = _pilot_decision(lr, target) if target else None
        if decision is not None and decision.pilot_sd is not None:
            sps = stats.paired_log_delta(list(lr), decision.pilot_sd, decision.pilot_df)
        else:
            sps = stats.paired_log_delta(list(lr))
        if decision is not None:
            row.update(
                precision_target_pct=target["ci_halfwidth_pct"],
                pairs_planned=decision.pairs,
                pairs_wanted=decision.wanted,
                hit_pair_cap=decision.capped,
            )
    else:
        sps = stats.welch_log_delta(
            list(base_ok["samples_per_s"].dropna()), list(ok["samples_per_s"].dropna())
        )
    b_vram, o_vram = _by_repeat(base_ok, "peak_vram_gib"), _by_repeat(ok, "peak_vram_gib")
    common = b_vram.index.intersection(o_vram.index)
    vram = stats.paired_abs_delta(list(b_vram[common]), list(o_vram[common]))
    base_vram = base_ok["peak_vram_gib"].mean()
    band_gib = equivalence_pct / 100 * base_vram if base_vram > 0 else 0.0
    row.update(
        {
            "n_pairs": sps.n,
            "delta_samples_per_s_pct": sps.pct,
            "delta_samples_per_s_pct_ci95_low": sps.lo,
            "delta_samples_per_s_pct_ci95_high": sps.hi,
            "delta_samples_per_s_halfwidth_pct": sps.halfwidth,
            "delta_samples_per_s_pct_per_pair": " ".join(f"{v:+.2f}" for v in sps.per_pair) or None,
            "delta_peak_vram_gib": vram.pct,
            "delta_peak_vram_gib_ci95_low": vram.lo,
            "delta_peak_vram_gib_ci95_high": vram.hi,
            "delta_peak_vram_pct": 100 * vram.pct / base_vram if base_vram > 0 else NAN,
            "delta_torch_peak_allocated_gib": ok["torch_peak_allocated_gib"].mean()
            - base_ok["torch_peak_allocated_gib"].mean(),
            "verdict_speed": stats.speed_verdict(sps, min_pairs, equivalence_pct)
            if not math.isnan(sps.pct)
            else "n/a (no throughput data)",
            "verdict_memory": stats.memory_verdict(vram, min_pairs, band_gib)
            if not math.isnan(vram.pct)
            else "n/a (no VRAM data)",
            "ci_method": sps.method,
        }
    )
    if arm == AA_ARM and not math.isnan(sps.lo):  # the baseline against itself: a check, not a finding
        ok_aa = sps.lo <= 0 <= sps.hi
        row["verdict_speed"] = (
            f"A/A check passed: CI contains 0 (±{sps.halfwidth:.2f} points)"
            if ok_aa
            else "A/A check FAILED: CI excludes 0 (a false positive: the suite's noise is underestimated)"
        )
    return row


def summary_table(
    runs_df: pd.DataFrame, precision: dict[str, dict] | None = None, equivalence_pct: float = 1.0
) -> pd.DataFrame:
    """summary.csv: one row per (cell_id, arm), statistics over its ok runs, deltas vs baseline.

    ``precision``: per cell_id, the sweep's precision target (ci_halfwidth_pct, min_pairs,
    max_pairs); ``equivalence_pct``: differences inside ±this are reported as "within".
    Arms with no ok run keep a row (n_ok = 0, NaN statistics) so a skipped arm stays visible.
    """
    precision = precision or {}
    df = runs_df.reindex(columns=RUNS_COLUMNS)
    ok_all = df[df["status"] == "ok"]
    cells = list(dict.fromkeys(df["cell_id"]))
    rows = []
    for (cell_id, arm), g in df.groupby(["cell_id", "arm"], sort=False, dropna=False):
        ok = g[g["status"] == "ok"]
        sps = mean_ci(ok["samples_per_s"])
        sps_step = mean_ci(ok["s_per_step_mean"])
        prov = ok if len(ok) else g
        row = {
            "cell_id": cell_id,
            **{c: _first(g[c]) for c in CELL_COLUMNS},
            "arm": arm,
            "n_runs": len(g),
            "n_ok": len(ok),
            "samples_per_s_mean": sps[0],
            "samples_per_s_std": sps[1],
            "samples_per_s_ci95_low": sps[2],
            "samples_per_s_ci95_high": sps[3],
            "tokens_per_s_mean": ok["tokens_per_s"].mean(),
            "s_per_step_mean": sps_step[0],
            "s_per_step_median": ok["s_per_step_median"].median(),
            "s_per_step_ci95_low": sps_step[2],
            "s_per_step_ci95_high": sps_step[3],
            "peak_vram_gib": ok["peak_vram_gib"].mean(),
            "peak_vram_gib_max": ok["peak_vram_gib"].max(),
            "torch_peak_allocated_gib": ok["torch_peak_allocated_gib"].mean(),
            "torch_peak_reserved_gib": ok["torch_peak_reserved_gib"].mean(),
            "mfu_mean": ok["mfu"].mean(),
            "loss_last_mean": ok["loss_last"].mean(),
            **{c: join_unique(prov[c]) for c in SUMMARY_PROVENANCE_COLUMNS},
        }
        if arm != BASELINE_ARM:
            base_ok = ok_all[(ok_all["cell_id"] == cell_id) & (ok_all["arm"] == BASELINE_ARM)]
            base_all = df[(df["cell_id"] == cell_id) & (df["arm"] == BASELINE_ARM)]
            row.update(
                _deltas(
                    base_ok, ok, precision.get(cell_id), equivalence_pct, str(arm),
                    set(base_all["status"]), set(g["status"]),
                )
            )  # fmt: skip
        rows.append(row)
    out = pd.DataFrame(rows).reindex(columns=SUMMARY_COLUMNS)
    if out.empty:
        return out
    order = out["cell_id"].map({c: i for i, c in enumerate(cells)})
    out = out.assign(_c=order, _a=out["arm"] != BASELINE_ARM).sort_values(["_c", "_a", "arm"], kind="stable")
    return out.drop(columns=["_c", "_a"]).reset_index(drop=True)


CONTRAST_COLUMNS = [
    "cell_id", *CELL_COLUMNS, "arm", "reference", "n_pairs", "delta_samples_per_s_pct",
    "delta_samples_per_s_pct_ci95_low", "delta_samples_per_s_pct_ci95_high",
    "delta_samples_per_s_halfwidth_pct", "delta_samples_per_s_pct_per_pair", "delta_peak_vram_gib",
    "delta_peak_vram_gib_ci95_low", "delta_peak_vram_gib_ci95_high", "delta_peak_vram_pct",
    "verdict_speed", "verdict_memory", "ci_method",
]  # fmt: skip


def contrast_table(
    runs_df: pd.DataFrame, contrasts: list | tuple, equivalence_pct: float = 1.0
) -> pd.DataFrame:
    """contrasts.csv: per cell and [arm, reference] of the sweep's ``contrasts``, the arm against
    the reference arm, with the estimator of summary.csv's Δ columns: the two arms' runs of the
    same round are a pair (every round runs every arm), a 95% t-interval on the per-pair
    log-ratios (no stopping rule of its own: the rounds are those the baseline comparisons
    planned; verdicts need 3 pairs)."""
    df = runs_df.reindex(columns=RUNS_COLUMNS)
    ok_all = df[df["status"] == "ok"]
    rows = []
    for cell_id, g in df.groupby("cell_id", sort=False, dropna=False):
        for arm, ref in contrasts:
            a_all, r_all = g[g["arm"] == arm], g[g["arm"] == ref]
            if a_all.empty and r_all.empty:
                continue
            a_ok = ok_all[(ok_all["cell_id"] == cell_id) & (ok_all["arm"] == arm)]
            r_ok = ok_all[(ok_all["cell_id"] == cell_id) & (ok_all["arm"] == ref)]
            row = {
                "cell_id": cell_id,
                **{c: _first(g[c]) for c in CELL_COLUMNS},
                "arm": arm,
                "reference": ref,
            }
            row.update(
                _deltas(
                    r_ok, a_ok, None, equivalence_pct, arm, set(r_all["status"]), set(a_all["status"]), ref
                )
            )
            rows.append(row)
    return pd.DataFrame(rows).reindex(columns=CONTRAST_COLUMNS)


def _arm_pairs(records: list[RunRecord]) -> dict[tuple[Any, Any], dict[str, RunRecord]]:
    pairs: dict[tuple[Any, Any], dict[str, RunRecord]] = {}
    for r in records:
        pairs.setdefault((r.cell_id, r.repeat), {})[str(r.arm)] = r
    return pairs


def _parity_row(base: RunRecord, other: RunRecord, default_tolerance: float) -> dict[str, Any] | None:
    j = base.metrics[["step", "loss"]].merge(
        other.metrics[["step", "loss"]], on="step", suffixes=("_baseline", "_arm")
    )
    if j.empty:
        return None
    delta = (j["loss_arm"] - j["loss_baseline"]).abs()
    tol = _num(base.cell.get("loss_tolerance", other.cell.get("loss_tolerance")), default_tolerance)
    last = j.iloc[-1]
    last_delta = float(delta.iloc[-1])
    return {
        "cell_id": base.cell_id,
        **{c: base.cell.get(c) for c in ("profile", "mode", "batch_size", "seq_len", "gpus")},
        "nodes": base.cell.get("nodes") or 1,  # cells recorded before multi-node have no key
        "arm": other.arm,
        "repeat": base.repeat,
        "steps_compared": len(j),
        "max_abs_delta": delta.max(skipna=False),
        "max_abs_delta_step": j.loc[delta.idxmax(), "step"] if delta.notna().any() else NAN,
        "last_step": last["step"],
        "last_step_abs_delta": last_delta,
        "loss_last_baseline": last["loss_baseline"],
        "loss_last_arm": last["loss_arm"],
        "tolerance": tol,
        "criterion": PARITY_CRITERION,
        "passed": bool(last_delta <= tol),
    }


def _other_arms(arms: dict[str, RunRecord]) -> list[str]:
    return [a for a in arms if a != BASELINE_ARM]


def loss_parity_table(records: list[RunRecord], default_tolerance: float = 1e-2) -> pd.DataFrame:
    """loss_parity.csv: per cell, arm and repeat where the arm and the baseline of the same pair
    logged losses, step-by-step |Δ loss|.

    max_abs_delta is over every common step (warm-up included); pass/fail is PARITY_CRITERION.
    Repeats missing a counterpart get no row; see loss_parity_gaps.
    """
    rows = []
    for arms in _arm_pairs(records).values():
        if BASELINE_ARM not in arms:
            continue
        for arm in _other_arms(arms):
            row = _parity_row(arms[BASELINE_ARM], arms[arm], default_tolerance)
            if row is not None:
                rows.append(row)
    return pd.DataFrame(rows).reindex(columns=LOSS_PARITY_COLUMNS)


def parity_verdict(rows: pd.DataFrame) -> str:
    """One (cell, arm)'s loss parity in words: 'pass (n/n)' or 'FAIL in k of n pairs (...)'."""
    if not len(rows):
        return ""
    failed = rows[~rows["passed"].astype(bool)]
    if not len(failed):
        return f"pass ({len(rows)}/{len(rows)})"
    worst = failed["last_step_abs_delta"].max()
    return (
        f"FAIL in {len(failed)} of {len(rows)} pairs (|Δ loss| at the last step up to {worst:.3g}, "
        f"tolerance {failed['tolerance'].iloc[0]:g})"
    )


def with_loss_parity(summary: pd.DataFrame, parity: pd.DataFrame) -> pd.DataFrame:
    """summary.csv's loss_parity column from loss_parity.csv: a speed Δ of an arm that fails it
    compares two different trainings."""
    out = summary.copy()
    out["loss_parity"] = [
        parity_verdict(parity[(parity["cell_id"] == c) & (parity["arm"] == a)]) if len(parity) else ""
        for c, a in zip(out["cell_id"], out["arm"], strict=True)
    ]
    return out.reindex(columns=SUMMARY_COLUMNS)


def loss_parity_gaps(records: list[RunRecord]) -> list[str]:
    """One line per (cell, repeat) with no loss-parity row, saying why."""
    gaps = []
    for (cell_id, repeat), arms in _arm_pairs(records).items():
        where = f"{cell_id} repeat {repeat}"
        if BASELINE_ARM not in arms or not _other_arms(arms):
            have = ", ".join(arms) or "none"
            gaps.append(f"{where}: no pair to compare (runs of arms: {have})")
            continue
        for arm in _other_arms(arms):
            pair = (BASELINE_ARM, arm)
            empty = [a for a in pair if arms[a].metrics["loss"].dropna().empty]
            if empty:
                why = "; ".join(
                    f"{a} has no losses (status {arms[a].status}: {arms[a].reason or '-'})" for a in empty
                )
                gaps.append(f"{where}: {why}")
            elif _parity_row(arms[BASELINE_ARM], arms[arm], NAN) is None:
                gaps.append(f"{where}: {arm} and baseline share no logged step")
    return gaps


def vram_per_card_table(records: list[RunRecord]) -> pd.DataFrame:
    """vram_per_card.csv: one row per (run, card) from each run's vram.json, idle cards included."""
    frames = [
        vram_devices(r.vram).assign(run_id=r.run_id, cell_id=r.cell_id, arm=r.arm, repeat=r.repeat)
        for r in records
    ]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=VRAM_PER_CARD_COLUMNS)
    return pd.concat(frames, ignore_index=True).reindex(columns=VRAM_PER_CARD_COLUMNS)


def scaling_table(summary: pd.DataFrame) -> pd.DataFrame:
    """scaling.csv: for every series of cells that differ only in world size (gpus x nodes), one
    row per arm and size: samples/s, per-GPU samples/s, efficiency vs the smallest size of the
    same arm (100 = per-GPU throughput held), the arm's Δ vs baseline with its CI, and the
    busiest card's peak VRAM. Empty when no series has two sizes."""
    df = summary.reindex(columns=SUMMARY_COLUMNS).copy()
    df["nodes"] = pd.to_numeric(df["nodes"], errors="coerce").fillna(1)
    df["gpus"] = pd.to_numeric(df["gpus"], errors="coerce")
    df["world_size"] = df["gpus"] * df["nodes"]
    df["samples_per_s_per_gpu"] = df["samples_per_s_mean"] / df["world_size"]
    frames = []
    for _, series in df.groupby(SCALING_KEY, sort=False, dropna=False):
        if series["world_size"].nunique() < 2:
            continue
        for _, arm_rows in series.groupby("arm", sort=False):
            arm_rows = arm_rows.sort_values("world_size")
            ok = arm_rows[arm_rows["samples_per_s_per_gpu"].notna()]
            ref = ok["samples_per_s_per_gpu"].iloc[0] if len(ok) else NAN
            frames.append(
                arm_rows.assign(scaling_efficiency_pct=100 * arm_rows["samples_per_s_per_gpu"] / ref)
            )
    if not frames:
        return pd.DataFrame(columns=SCALING_COLUMNS)
    return pd.concat(frames, ignore_index=True).reindex(columns=SCALING_COLUMNS)
