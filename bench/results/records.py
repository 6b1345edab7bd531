"""A run's results: one run directory (cell.json, run.json and metrics.jsonl, read through
bench/record.py; vram.json and vram.jsonl) read into a RunRecord, and a record turned into its
runs.csv row (run_row: the one definition of a run's throughput, its memory peaks, startup costs,
GPU state and provenance, and of which runs enter the statistics: in_statistics).

A run's identity (cell, arm, repeat) is its directory's name, checked against sweep.json's
planned run order and cell.json; a run failing the check is an error, never a run of another
arm. A planned run with no directory in a round that has run directories is a "not run" record.

File layout and schemas: docs/run-contract.md. Numbers are kept at full precision here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bench import fmt
from bench.arms import ARMS, user_arm
from bench.config.model import parse_run_id
from bench.fileio import read_json, read_jsonl
from bench.record import (
    METRIC_FIELDS,
    CellDoc,
    RunDoc,
    cell_unread,
    has_run,
    numbered_metrics,
    read_cell,
    read_run,
)
from bench.results.columns import CELL_COLUMNS, DEFAULT_TRAINER, STATE_FIELDS, VRAM_PER_CARD_COLUMNS
from bench.results.energy import own_turns, run_energy
from bench.results.identity import odd_ones_out, plan_problem, workload_digest
from bench.results.step_checks import foreign_warning, outlier_warning, retries_warning, step_problem
from bench.results.versions import code_of, versions_text

NAN = float("nan")
# cell.json's keys that say which run it is and how many steps are warm-up: checked, never guessed.
IDENTITY_KEYS = ("run_id", "cell_id", "arm", "repeat", "warmup_steps")
NOT_RUN = "not run"
NOT_RUN_REASON = "planned in sweep.json, no run directory (not run yet, or its directory was removed)"


@dataclass
class RunRecord:
    """Everything one run directory holds; missing files are None (metrics: no rows). A cell.json
    that fails the identity check is kept out (None), and ``flag`` says why."""

    run_dir: Path
    cell: CellDoc | None  # the trusted cell.json
    run: RunDoc | None  # None: missing, torn or empty
    metrics: pd.DataFrame  # one row per optimizer step (METRIC_FIELDS), sorted by step
    vram: dict[str, Any] | None
    flag: tuple[str, str] | None = None  # (status, reason) instead of run.json's: error, or not run
    bad_metric: str | None = (
        None  # the first fact metrics.jsonl breaks ("metrics.jsonl line 4 (step 3): ...")
    )
    planned_index: int | None = None  # the run's position in sweep.json's planned order
    workload_digest: str | None = None  # bench/results/identity.py

    def _from_id(self, key: str) -> str | None:
        parsed = parse_run_id(self.run_id)
        if parsed:
            return parsed[key]
        return getattr(self.cell, key) if self.cell else None  # a name that is no run id: cell.json's

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    @property
    def cell_id(self) -> str | None:
        return self._from_id("cell_id")

    @property
    def trainer(self) -> str | None:
        """The trainer plug that ran it; a cell.json from before the key existed: ours; no
        trusted cell.json: unknown (None)."""
        return str(self.cell.trainer or DEFAULT_TRAINER) if self.cell else None

    @property
    def arm(self) -> str | None:
        return self._from_id("arm")

    @property
    def repeat(self) -> int | None:
        rep = self._from_id("repeat")
        return None if rep is None else int(rep)

    @property
    def order_index(self) -> Any:
        return self.cell.order_index if self.cell else self.planned_index

    @property
    def status(self) -> str:
        if self.flag:
            return self.flag[0]
        return str(self.run.status or "unknown") if self.run else "missing"

    @property
    def reason(self) -> str | None:
        if self.flag:
            return self.flag[1]
        if not self.run:
            if has_run(self.run_dir):
                return "run.json is not valid JSON (a torn write, or not written by a trainer)"
            return "run.json missing: the trainer never started or died before writing it"
        return self.run.reason

    @property
    def warmup_steps(self) -> int:
        return int(self.cell.warmup_steps or 0) if self.cell else 0

    @property
    def steady(self) -> pd.DataFrame:
        """Steady-state steps: everything after the first ``warmup_steps`` steps."""
        m = self.metrics
        return m[(m["step"] > self.warmup_steps) & m["step_time_s"].notna()]


def _identity_problem(d: Path, cell: CellDoc | None, plan: Sequence[str] | None) -> str | None:
    """Why the run in directory ``d`` cannot be counted as the run its name says, or None: a run
    sweep.json did not plan, a cell.json missing, unreadable, not an object, lacking an identity
    key or naming another run (its run_id is the directory's name; its cell_id, arm and repeat
    those the name says, where it is a run id: a priming or profiling run's is not)."""
    problems = []
    if plan is not None and d.name not in plan:
        problems.append("not in sweep.json's planned run order")
    if cell is None:
        problems.append(cell_unread(d))
    elif lacking := [k for k in IDENTITY_KEYS if not cell.has(k)]:
        problems.append(f"cell.json lacks {', '.join(lacking)}")
    else:
        named = {"run_id": d.name, **(parse_run_id(d.name) or {})}
        problems += [
            f"cell.json says {k} {getattr(cell, k)!r}, the directory {want!r}"
            for k, want in named.items()
            if str(getattr(cell, k)) != str(want)
        ]
    return "; ".join(problems) or None


def _load_metrics(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame.from_records(rows, columns=METRIC_FIELDS)
    df = df.apply(pd.to_numeric, errors="coerce").astype(float).dropna(subset=["step"])
    return df.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)


def _object(doc: Any) -> dict | None:
    return doc if isinstance(doc, dict) else None


def _run_doc(d: Path) -> RunDoc | None:
    """run.json; None when missing, torn, not an object or empty (``{}``: no record either)."""
    doc = read_run(d)
    return doc if doc is not None and doc.to_json() else None


def load_run(d: Path, plan: Sequence[str] | None = None, sweep: dict | None = None) -> RunRecord:
    """The record of one run directory; ``plan``: sweep.json's planned run order to check it
    against (None: no plan); ``sweep``: sweep.json, whose plan of the run's cell its cell.json
    must match on every workload key (bench/results/identity.py)."""
    cell = read_cell(d)
    problem = _identity_problem(d, cell, plan)
    if problem:
        problem += ": its cell, arm and repeat are unconfirmed"
    elif other := plan_problem(cell, sweep):
        problem = f"{other}: a run of another workload, not counted"
    rows = numbered_metrics(d)
    trusted = None if problem else cell
    return RunRecord(
        run_dir=d,
        cell=trusted,
        run=_run_doc(d),
        metrics=_load_metrics([r for _, r in rows]),
        vram=_object(read_json(d / "vram.json")),
        flag=("error", problem) if problem else None,
        bad_metric=step_problem(rows, trusted) if trusted else None,
        planned_index=list(plan).index(d.name) if plan and d.name in plan else None,
        workload_digest=workload_digest(trusted, sweep),
    )


def planned_order(sweep_dir: str | Path) -> list[str] | None:
    """sweep.json's planned run order (the driver's, as the precision rule extended it); None
    when there is none to check against (no sweep.json, or a capacity search's empty order)."""
    doc = read_json(Path(sweep_dir) / "sweep.json")
    order = doc.get("order") if isinstance(doc, dict) else None
    return [str(r) for r in order] if isinstance(order, list) and order else None


def _not_run(runs_dir: Path, plan: list[str], records: list[RunRecord]) -> list[RunRecord]:
    """A "not run" record per planned run with no directory whose round (cell, repeat) has run
    directories: a round the sweep has not reached (or that was removed whole) is no gap."""
    have = {r.run_id for r in records}
    rounds = {(r.cell_id, r.repeat) for r in records}
    out = []
    for i, run_id in enumerate(plan):
        parsed = parse_run_id(run_id)
        if run_id in have or not parsed or (parsed["cell_id"], int(parsed["repeat"])) not in rounds:
            continue
        out.append(
            RunRecord(
                run_dir=runs_dir / run_id, cell=None, run=None, metrics=_load_metrics([]), vram=None,
                flag=(NOT_RUN, NOT_RUN_REASON), planned_index=i,
            )
        )  # fmt: skip
    return out


def load_runs(sweep_dir: str | Path) -> list[RunRecord]:
    """One record per directory under ``<sweep_dir>/runs`` and per planned run missing from a
    round that has run directories (_not_run), in run order (order_index, run_id)."""
    runs_dir = Path(sweep_dir) / "runs"
    dirs = sorted(p for p in runs_dir.iterdir() if p.is_dir()) if runs_dir.is_dir() else []
    plan = planned_order(sweep_dir)
    sweep = read_json(Path(sweep_dir) / "sweep.json")
    sweep = sweep if isinstance(sweep, dict) else None
    records = [load_run(d, plan, sweep) for d in dirs]
    if not (sweep or {}).get("cells"):  # no plan of the cells: each run held to the others of its cell
        odd = odd_ones_out({r.run_id: r.cell for r in records if r.cell and not r.flag})
        for r in records:
            if r.run_id in odd:
                r.flag, r.cell, r.bad_metric = (
                    ("error", f"{odd[r.run_id]}: a run of another workload, not counted"),
                    None,
                    None,
                )
                r.workload_digest = None
    records += _not_run(runs_dir, plan or [], records)
    return sorted(records, key=lambda r: (fmt.num(r.order_index, math.inf), r.run_id))


def in_statistics(runs: pd.DataFrame) -> pd.Series:
    """Which runs.csv rows enter the statistics (summary.csv, the Δ columns): the ok runs whose
    throughput run_row measured; an ok run it leaves out (too few steps, a bad value in
    metrics.jsonl) has a note saying why and no samples/s."""
    return (runs["status"] == "ok") & runs["samples_per_s"].notna()


def vram_devices(vram: dict | None) -> pd.DataFrame:
    """Per-card rows of a vram.json (node, card_index, card_name, total/baseline/peak/delta GiB);
    node is 0 on a single node, a multi-node run's gathered cards carry theirs (bench/probe/nodevram.py)."""
    cols = VRAM_PER_CARD_COLUMNS[VRAM_PER_CARD_COLUMNS.index("node") :]
    devices = (vram or {}).get("devices") or []
    rows = [
        {
            "node": d.get("node", 0),
            "card_index": d.get("index", i),
            "card_name": d.get("name"),
            **{c: fmt.num(d.get(c)) for c in cols[3:]},
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
        busiest = max(devices, key=lambda d: fmt.num(d.get("peak_delta_gib"), -math.inf))
        state = busiest.get("state") or {}
        for f in STATE_FIELDS:
            stat = state.get(f) if isinstance(state.get(f), dict) else {}
            for k in ("min", "median", "max"):
                out[f"{f}_{k}"] = fmt.num(stat.get(k))
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
    busiest = max(range(len(devices)), key=lambda i: fmt.num(devices[i].get("peak_delta_gib"), -math.inf))
    t0, t1 = window
    rows = [
        r["state"][busiest]
        for r in read_jsonl(rec.run_dir / "vram.jsonl")
        if isinstance(r.get("state"), list) and len(r["state"]) > busiest and t0 <= fmt.num(r.get("t")) <= t1
    ]
    if not rows:
        return {}
    out: dict[str, Any] = {"state_window": "measured steps"}
    for f in STATE_FIELDS:
        values = [float(v) for v in (row.get(f) for row in rows if isinstance(row, dict)) if not fmt.isnan(v)]
        for k, fn in (("min", min), ("median", statistics.median), ("max", max)):
            out[f"{f}_{k}"] = fn(values) if values else NAN
    return out


def _energy(rec: RunRecord) -> dict[str, Any]:
    """runs.csv's energy columns: the run's cards over its measured window, or a lockstep run's
    over its own measured turns (bench/results/energy.py)."""
    s = rec.steady
    samples = s["samples"].fillna(s["samples_per_s"] * s["step_time_s"]).sum(min_count=1)
    cell = rec.cell or CellDoc()
    turns = own_turns(cell.pairing, rec.run_dir, list(s["step"].astype(int)))
    return run_energy(rec.run_dir, rec.vram, measured_window(rec), samples, cell.gpus, turns)


def _startup(rec: RunRecord) -> dict[str, Any]:
    """Startup costs: process start -> first step (trainer), of which imports (0 when a fork
    server imported them before the run started), step 1, and process start -> the first
    measured step (end of the last warm-up step, from metrics' elapsed_s); whether the
    compile cache was warm."""
    m, w = rec.metrics, rec.warmup_steps
    run, cell = rec.run or RunDoc(), rec.cell or CellDoc()
    first = m.loc[m["step"] == 1, "step_time_s"]
    at_w = m.loc[m["step"] == w, "elapsed_s"] if w > 0 else pd.Series(dtype=float)
    startup = fmt.num(run.startup_s)
    warm = (cell.compile_cache or {}).get("warm")
    phases = run.startup or {}
    preloaded = phases.get("imports_preloaded")
    return {
        "startup_s": startup,
        "imports_s": fmt.num(phases.get("imports_s")),
        "imports_preloaded": None if preloaded is None else str(bool(preloaded)).lower(),
        "first_step_s": first.iloc[0] if len(first) else NAN,
        "to_first_measured_step_s": at_w.iloc[0] if len(at_w) else (startup if w == 0 else NAN),
        "compile_cache_warm": None if warm is None else str(bool(warm)).lower(),
        "exit_s": fmt.num(run.exit_s),  # after the last step to the exit (specforge-cli)
        "run_wall_s": fmt.num(run.wall_s),
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
    run = rec.run or RunDoc()
    prov = run.provenance or {}
    names = [str(n) for n in prov.get("gpu_names") or []]
    return {
        "hostname": prov.get("hostname"),
        "gpu_name": ", ".join(dict.fromkeys(names)) or None,
        "gpu_count": prov.get("gpu_count"),
        "driver_version": prov.get("driver_version")
        or prov.get("rocm_version")
        or (rec.vram or {}).get("driver_version"),
        "cuda_version": f"CUDA {prov['cuda']}"
        if prov.get("cuda")
        else (f"HIP {prov['hip']}" if prov.get("hip") else None),
        "torch_version": prov.get("torch"),
        "triton_version": prov.get("triton"),
        "transformers_version": prov.get("transformers"),
        "liger_version": prov.get("liger_kernel") or (run.liger or {}).get("version"),
        "git_commit": prov.get("git_commit"),
        "code_versions": versions_text(code_of(run)),
    }


def run_row(rec: RunRecord) -> dict[str, Any]:
    """One runs.csv row. Non-ok runs keep steps logged and memory peaks; their timings stay NaN."""
    m, steady = rec.metrics, rec.steady
    run, cell = rec.run or RunDoc(), rec.cell or CellDoc()
    row: dict[str, Any] = {
        "run_id": rec.run_id,
        "cell_id": rec.cell_id,
        **{c: getattr(cell, c) for c in CELL_COLUMNS},
        "trainer": rec.trainer,
        "workload_digest": rec.workload_digest,
        "arm": rec.arm,
        "repeat": rec.repeat,
        "order_index": rec.order_index,
        "status": rec.status,
        "reason": rec.reason,
        "steps_total": len(m),
        "warmup_steps": rec.warmup_steps if rec.cell else None,  # no trusted cell.json: unknown
        "steps_measured": len(steady) if rec.cell else None,
        **_summarize_vram(rec.vram),
        **_window_state(rec),
        **_energy(rec),
        **_startup(rec),
        "torch_peak_allocated_gib": m["torch_peak_allocated_gib"].max(),
        "torch_peak_reserved_gib": m["torch_peak_reserved_gib"].max(),
        "start_time": run.start_time,
        "end_time": run.end_time,
        **_provenance(rec),
    }
    note = None
    planned = cell.steps
    if rec.flag:
        if len(m):
            note = f"{len(m)} step(s) logged (run.json: {run.status or 'no status'}); excluded from stats"
    elif rec.status != "ok":
        if len(m):
            note = f"{len(m)} step(s) logged before status '{rec.status}'; excluded from stats"
    elif m.empty:
        note = "no metrics logged"
    elif rec.bad_metric:
        note = f"{rec.bad_metric}: excluded from throughput stats"
    elif isinstance(planned, int) and len(m) < planned:
        note = f"only {len(m)} of {planned} steps in metrics.jsonl: excluded from throughput stats"
    elif len(steady) < 2:
        note = (
            f"only {len(steady)} steady-state step(s) after dropping {rec.warmup_steps} warm-up: "
            "excluded from throughput stats"
        )
    else:
        row.update(_step_stats(steady))
    row["arm_in_effect"] = arm_in_effect(rec)
    if rec.status == "ok" and not m.empty:
        row["loss_last"], row["accuracy_last"] = m["loss"].iloc[-1], m["accuracy"].iloc[-1]
        acc = run.accuracy_by_position_last  # a trainer that logs them (specforge-cli)
        if isinstance(acc, list) and acc:
            row["accuracy_by_position_last"] = " ".join(fmt.f(x, ".4f") for x in acc)
    counted = note is None  # the allocator and outlier warnings are about runs in the statistics
    warnings = [
        w
        for w in (
            foreign_warning(rec.vram),
            *((retries_warning(m), outlier_warning(steady)) if counted else ()),
        )
        if w
    ]
    row["note"] = "; ".join([note, *warnings] if note else warnings) or None
    return row


def arm_in_effect(rec: RunRecord) -> str | None:
    """Whether the run's own record shows its arm in effect: its Liger kernels in the model it
    trained and no others (bench.arms.Arm.in_effect), and each key the arm set — a sweep's own
    arm's (user_arms) or the keys a plug set for a built-in arm's intent (cell.json's arm_keys) —
    resolved by the trainer to the value asked (Arm.keys_in_effect). "no: ..." as soon as one
    record shows otherwise; "yes" only when every part was recorded; None when a part was not
    (keys set but no set_resolved; no module census of a Liger arm or of an arm without keys) or
    the arm is unknown: not proven."""
    run = rec.run or RunDoc()
    sets = rec.cell.arm_set if rec.cell else None
    base = rec.cell.arm_base if rec.cell and rec.cell.arm_base in ARMS else None
    arm = ARMS.get(str(rec.arm)) if base is None else None
    if arm is None and (isinstance(sets, dict) or base):  # a declared arm: its base with its keys
        arm = user_arm(str(rec.arm), "", sets or {}, base=base)
    if arm is None:
        return None
    keys = arm.sets if arm.user else (rec.cell.arm_keys if rec.cell else None) or {}
    census = isinstance(run.draft_module_types, list)
    said, unproven = [], not census and (arm.liger or not keys)  # keys alone prove a non-Liger arm
    if census:
        said.append(arm.in_effect(run.draft_module_types))
    if keys and isinstance(run.set_resolved, dict):
        said.append(user_arm(str(rec.arm), "", dict(keys)).keys_in_effect(run.set_resolved))
    elif keys:
        unproven = True  # keys set, nothing recorded of what the trainer made of them
    failed = [s.removeprefix("no: ") for s in said if s != "yes"]
    if failed:
        return "no: " + "; ".join(failed)
    return None if unproven else "yes"
