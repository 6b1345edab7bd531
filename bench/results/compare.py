"""Compare two sweeps' results (two machines or two commits), workload by workload, and hold B to A.

Each input is read by compare_inputs.py (per-run data decides; a summary is checked against its
runs). Rows pair only when their whole workload identity is equal (KEY_COLUMNS); an A row and a
B row of one profile, mode and arm that differ in another key are listed as "not compared:
different workloads" with the keys that differ, and never pass a gate. Where both sides have
per-run data, a row's Δ and its 95% CI come from the same Welch interval on log throughput
(runs of two sweeps are not paired), so the CI always holds its point; a summary alone gives
the ratio of means, labelled a point estimate, and no CI. Each arm's gain over its baseline is
compared too (gain.py; a sweep's own arm against the baseline of its cell), and the gates (gate.py)
judge both. A row whose arm was not in effect on a side (a run's ``arm_in_effect`` "no: ...", or its
summary's verdict "arm not in effect") gets that as its verdict, no gain, and never passes a gate.
Output: compare_format.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bench.arms import ARMS, BASELINE
from bench.results import gain, gate, parity_gate, stats
from bench.results.columns import COMPARE_COLUMNS
from bench.results.compare_format import label, render, write_outputs
from bench.results.compare_inputs import KEY_COLUMNS, NUMERIC_KEYS, load_summary, per_run_values, row_key
from bench.results.deltas import not_in_effect, not_proven
from bench.results.verdicts import Speed, speed_kind

__all__ = ["COMPARE_COLUMNS", "KEY_COLUMNS", "compare", "compare_tables", "run_compare"]

MIN_RUNS = 3  # per side, for a verdict on an unpaired comparison
PER_RUN, POINT = "per-run data (Welch)", "point estimate (summary.csv only)"
_VALUES = {
    "samples_per_s_mean": "samples_per_s",
    "s_per_step_mean": "s_per_step",
    "peak_vram_gib": "peak_vram_gib",
    "peak_vram_delta_gib": "vram_over_idle_gib",
    "delta_samples_per_s_pct": "delta_samples_per_s_pct",
    "delta_samples_per_s_pct_ci95_low": "delta_samples_per_s_pct_ci95_low",
    "delta_samples_per_s_pct_ci95_high": "delta_samples_per_s_pct_ci95_high",
}
_COARSE = ["trainer", "profile", "mode", "arm"]  # rows alike in these but not the rest: different workloads


def _side(df: pd.DataFrame, suffix: str) -> pd.DataFrame:
    out = df.reindex(columns=KEY_COLUMNS + list(_VALUES)).rename(
        columns={k: f"{v}_{suffix}" for k, v in _VALUES.items()}
    )
    out["wkey"] = [row_key(r) for r in df.itertuples(index=False)]
    return out.assign(**{f"_order_{suffix}": range(len(out))})


def _differ(ra: pd.Series, rb: pd.Series) -> list[str]:
    out = []
    for c in KEY_COLUMNS:
        va, vb = ra[c], rb[c]
        same = (pd.isna(va) and pd.isna(vb)) or va == vb
        if not same:
            shown = [
                ("unknown" if pd.isna(v) else f"{v:g}" if isinstance(v, float) else str(v)) for v in (va, vb)
            ]
            out.append(f"{c} {shown[0]} in A, {shown[1]} in B")
    return out


def _join(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Rows of equal identity side by side; then each leftover A row with the leftover B row of its
    profile, mode and arm that differs in the fewest keys (a "different workloads" row)."""
    sa, sb = _side(a, "a"), _side(b, "b")
    keys_b = {k: i for i, k in enumerate(sb["wkey"])}
    rows, used_b = [], set()
    for _, ra in sa.iterrows():
        j = keys_b.get(ra["wkey"])
        if j is not None and j not in used_b:
            used_b.add(j)
            rows.append(
                {**ra.to_dict(), **sb.iloc[j].drop(KEY_COLUMNS + ["wkey"]).to_dict(), "present": "both"}
            )
        else:
            rows.append({**ra.to_dict(), "present": "A only"})
    for row in rows:
        if row["present"] != "A only":
            continue
        ra = pd.Series(row)
        near = [
            (len(_differ(ra, sb.iloc[j])), j)
            for j in range(len(sb))
            if j not in used_b and all(_eq(ra[c], sb.iloc[j][c]) for c in _COARSE)
        ]
        if near:
            _, j = min(near)
            used_b.add(j)
            row.update(sb.iloc[j].drop(KEY_COLUMNS + ["wkey"]).to_dict())
            row.update(present=gate.DIFFERENT, workloads_differ="; ".join(_differ(ra, sb.iloc[j])))
            if _digest_unknowable(ra, sb.iloc[j]):
                row.update(present="both", workloads_differ=None)
    rows += [{**sb.iloc[j].to_dict(), "present": "B only"} for j in range(len(sb)) if j not in used_b]
    m = pd.DataFrame(rows)
    return m.sort_values(["_order_a", "_order_b"], na_position="last", kind="stable").reset_index(drop=True)


def _digest_unknowable(ra: pd.Series, rb: pd.Series) -> bool:
    """Whether two rows differ only in a digest one side cannot know: its arm has no ok run (its
    planned runs never ran, so no cell.json said what their workload was). Such a row is held to
    the other side's as the same row: nothing measured of it can be of another workload."""
    diff = [c for c in KEY_COLUMNS if not _eq(ra[c], rb[c])]
    unknown = [
        pd.isna(r["workload_digest"]) and pd.isna(r[f"samples_per_s_{s}"]) for r, s in ((ra, "a"), (rb, "b"))
    ]
    return diff == ["workload_digest"] and any(unknown)


def _eq(x, y) -> bool:
    return (pd.isna(x) and pd.isna(y)) or x == y


def compare_tables(a: pd.DataFrame, b: pd.DataFrame, equivalence_pct: float = 1.0) -> pd.DataFrame:
    """COMPARE_COLUMNS, one row per workload in A or B (``present``: both / A only / B only /
    different workloads), A's order first."""
    m = _join(a, b)
    runs_a, runs_b = per_run_values(a.attrs.get("runs")), per_run_values(b.attrs.get("runs"))
    cols: dict[str, list] = {
        c: [] for c in ("est", "pct", "lo", "hi", "na", "nb", "verdict", "g", "glo", "ghi", "pa", "pb")
    }
    off = _not_in_effect(m, a, b)
    pairing = [_pairing(r, a, b) for r in m.itertuples()]
    for r, why, by_cell in zip(m.itertuples(), off, pairing, strict=True):
        key = r.wkey
        va, vb = runs_a.get(key) if a.attrs.get("runs") is not None else None, None
        if b.attrs.get("runs") is not None:
            vb = runs_b.get(key, [])
        if a.attrs.get("runs") is not None:
            va = runs_a.get(key, [])
        _row_delta(cols, r, va, vb, equivalence_pct)
        if why and r.present == "both":  # a Δ of something else than the arm: no verdict on it
            cols["verdict"][-1] = why.replace(" (", ": ", 1).removesuffix(")")
        paired = r.present == "both" and r.arm != BASELINE and not why
        la = gain.side_log_ratios(a.attrs.get("runs"), key, by_cell is not None) if paired else []
        lb = gain.side_log_ratios(b.attrs.get("runs"), key, by_cell is not None) if paired else []
        g = gain.gain_change(la, lb)
        cols["g"].append(g.pct)
        cols["glo"].append(g.lo)
        cols["ghi"].append(g.hi)
        cols["pa"].append(len(la) if la else np.nan)
        cols["pb"].append(len(lb) if lb else np.nan)
    m = m.assign(
        estimate=cols["est"], samples_per_s_delta_pct=cols["pct"], samples_per_s_delta_pct_ci95_low=cols["lo"],
        samples_per_s_delta_pct_ci95_high=cols["hi"], n_runs_a=cols["na"], n_runs_b=cols["nb"],
        verdict=cols["verdict"], gain_change_points=cols["g"], gain_change_points_ci95_low=cols["glo"],
        gain_change_points_ci95_high=cols["ghi"], n_pairs_a=cols["pa"], n_pairs_b=cols["pb"],
    )  # fmt: skip
    m["samples_per_s_ratio_b_over_a"] = 1 + m["samples_per_s_delta_pct"] / 100
    m["vram_over_idle_b_minus_a_gib"] = m["vram_over_idle_gib_b"] - m["vram_over_idle_gib_a"]
    m["peak_vram_b_minus_a_gib"] = m["peak_vram_gib_b"] - m["peak_vram_gib_a"]
    for c in NUMERIC_KEYS:
        m[c] = pd.to_numeric(m[c], errors="coerce")
    out = m.reindex(columns=COMPARE_COLUMNS)
    out.attrs.update(not_in_effect=off, gain_pairing=pairing)
    return out


def _side_not_in_effect(side: pd.DataFrame) -> dict[tuple, tuple[str, str]]:
    """Per identity (row_key): (the words, why) where the side's arm was not in effect, or not
    proven in effect, in its report's words: its summary's verdict "arm not in effect (...)" /
    "effect not recorded (...)" (which count its baseline's runs too), else its ok runs whose
    ``arm_in_effect`` says "no: ..." or, for an arm that is not the baseline, nothing."""
    said: list[tuple[tuple, str | None]] = []
    runs = side.attrs.get("runs")
    if runs is not None and "arm_in_effect" in runs:
        keys = runs.apply(lambda r: row_key(r.to_dict()), axis=1)
        for key, rows in runs.groupby(keys, sort=False):  # the report's own rule, on one row's runs
            arm, none = key[KEY_COLUMNS.index("arm")], rows.iloc[:0]
            why = not_in_effect(none, rows, arm) or (not_proven(none, rows, arm) if arm != BASELINE else None)
            said.append((key, why))
    if "verdict_speed" in side:
        said += [(row_key(r), r.verdict_speed) for r in side.itertuples(index=False)]
    held = (Speed.NOT_IN_EFFECT, Speed.NOT_PROVEN)
    return {
        key: (kind.value, text.removeprefix(kind.value).strip(" ()"))
        for key, text in said
        if (kind := speed_kind(text)) in held
    }


def _not_in_effect(m: pd.DataFrame, a: pd.DataFrame, b: pd.DataFrame) -> list[str | None]:
    """Per joined row: "arm not in effect in A (...)" (in B, in A and in B; "effect not recorded"
    where a side's runs recorded nothing of whether the arm took effect), or None."""
    said = {"A": _side_not_in_effect(a), "B": _side_not_in_effect(b)}
    out = []
    for r in m.itertuples():
        sides = [s for s in ("A", "B") if r.present in ("both", f"{s} only") and r.wkey in said[s]]
        if not sides:
            out.append(None)
            continue
        words = said[sides[0]][r.wkey][0]
        why = "; ".join(f"{s}: {said[s][r.wkey][1]}" if len(sides) > 1 else said[s][r.wkey][1] for s in sides)
        out.append(f"{words} in {' and '.join(sides)} ({why})")
    return out


def _pairing(r, a: pd.DataFrame, b: pd.DataFrame) -> str | None:
    """For a sweep's own arm (not a built-in one) compared on both sides: how its gain was paired,
    in words naming its declared keys (sweep.json's user_arms); None for a built-in arm."""
    if r.present != "both" or r.arm in ARMS:
        return None
    keys = a.attrs.get("user_arms", {}).get(r.arm) or b.attrs.get("user_arms", {}).get(r.arm)
    shown = ", ".join(f"{k}={v}" for k, v in keys.items()) if keys else "not recorded (no sweep.json beside)"
    return f"paired with its cell's baseline by cell plus the arm's declared keys: {shown}"


def _row_delta(cols: dict, r, va: list | None, vb: list | None, equivalence_pct: float) -> None:
    """One row's Δ B vs A, its CI and verdict: from the runs (Welch) or the means (a point estimate)."""
    nan = float("nan")
    cols["na"].append(len(va) if va is not None else nan)
    cols["nb"].append(len(vb) if vb is not None else nan)
    if r.present in ("A only", "B only") or r.present == gate.DIFFERENT:
        cols["est"].append(None)
        cols["pct"].append(
            100 * (r.samples_per_s_b / r.samples_per_s_a - 1) if r.present == gate.DIFFERENT else nan
        )
        cols["lo"].append(nan)
        cols["hi"].append(nan)
        cols["verdict"].append("not compared: different workloads" if r.present == gate.DIFFERENT else None)
        return
    if not va or not vb:
        cols["est"].append(POINT if va is None or vb is None else None)
        cols["pct"].append(100 * (r.samples_per_s_b / r.samples_per_s_a - 1))
        cols["lo"].append(nan)
        cols["hi"].append(nan)
        cols["verdict"].append(
            "n/a (point estimate: give the runs.csv files)" if va is None or vb is None else "n/a (no ok run)"
        )
        return
    d = stats.welch_log_delta(va, vb)
    cols["est"].append(PER_RUN)
    cols["pct"].append(d.pct)
    cols["lo"].append(d.lo)
    cols["hi"].append(d.hi)
    if min(len(va), len(vb)) < MIN_RUNS:
        cols["verdict"].append(f"too few runs ({len(va)} vs {len(vb)}): {d.pct:+.1f}%")
    else:
        verdict = stats.speed_verdict(d, MIN_RUNS, equivalence_pct)
        cols["verdict"].append(verdict.replace("faster", "B faster").replace("slower", "B slower"))


def compare(
    a_csv: str | Path,
    b_csv: str | Path,
    out_dir: str | Path | None = None,
    fail_if_slower: float | None = None,
    fail_if_gain_drops: float | None = None,
    fmt_name: str = "text",
    fail_if_inconclusive: bool = False,
) -> pd.DataFrame:
    """Compare B with A and print it (``fmt_name``: text, md or json, with the gates' lines); with
    out_dir also write compare.csv, compare.md, compare.json and compare.png. ``attrs["gate"]``:
    (lines, final line, exit status) when a gate was asked for."""
    a_csv, b_csv = Path(a_csv), Path(b_csv)
    a, b = load_summary(a_csv), load_summary(b_csv)
    df = compare_tables(a, b)
    df["parity_a"], df["parity_b"] = _parity(df, a), _parity(df, b)
    off, pairing = df.attrs["not_in_effect"], df.attrs["gain_pairing"]
    df.attrs["notes"] = _notes(df, a, b)
    gates = []
    if fail_if_slower is not None:
        decisions = gate.decide(df, fail_if_slower, MIN_RUNS, off)
        df["gate"] = [d.outcome if d else None for d in decisions]
        gates.append((gate.slower_heading(fail_if_slower), decisions))
    if fail_if_gain_drops is not None:
        decisions = gate.decide_gain(df, fail_if_gain_drops, gain.MIN_PAIRS, off, pairing)
        df["gain_gate"] = [d.outcome if d else None for d in decisions]
        gates.append((gate.gain_heading(fail_if_gain_drops), decisions))
    limits = [f"-{fail_if_slower:g}%"] if fail_if_slower is not None else []
    limits += [f"-{fail_if_gain_drops:g} points"] if fail_if_gain_drops is not None else []
    within = " and ".join(limits)
    if gates:
        df.attrs["gate"] = gate.verdict(gates, fail_if_inconclusive, within)
    sides = {"A": (a, label(a, a_csv)), "B": (b, label(b, b_csv))}
    print(render(df, sides, fmt_name, df.attrs.get("gate")))
    if out_dir is not None:
        write_outputs(df, sides, Path(out_dir), fail_if_slower, df.attrs.get("gate"))
    return df


def _parity(df: pd.DataFrame, side: pd.DataFrame) -> list[str | None]:
    """Per comparison row, that side's parity of its arm (parity_gate.side_verdict): from the
    sweep's summary (``loss_parity``: the given summary, or the summary.csv beside a given runs.csv)
    and its training_parity.csv, where they are."""
    loss = side.attrs.get("loss_parity", {})
    beside = side.attrs.get("path", Path("-")).parent / "training_parity.csv"
    training = pd.read_csv(beside) if beside.is_file() else None
    verdicts = {}
    for r in side.itertuples():
        cell = str(getattr(r, "cell_id", ""))
        verdicts[row_key(r)] = parity_gate.side_verdict(loss.get((cell, str(r.arm))), training, cell, r.arm)
    return [verdicts.get(row_key(r)) for r in df.itertuples()]


def _notes(df: pd.DataFrame, a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    """What the output must say beside the table: each side's runs that never ran, each row whose
    arm was not in effect, and how a sweep's own arm's gain was paired."""
    out = [f"{k}: {line}" for k, side in (("A", a), ("B", b)) for line in side.attrs.get("missing", [])]
    for r, why, how in zip(df.itertuples(), df.attrs["not_in_effect"], df.attrs["gain_pairing"], strict=True):
        if why and r.present != "B only":
            out.append(f"{gate.row_name(r)}: {why}: no verdict, no gain, never a gate's pass")
        if how:
            out.append(f"{gate.row_name(r)}: a sweep's own arm (user_arms): its gain is {how}")
    return out


def run_compare(
    a_csv: str | Path,
    b_csv: str | Path,
    out_dir: str | Path | None = None,
    fail_if_slower: str | float | None = None,
    fail_if_inconclusive: bool = False,
    fail_if_gain_drops: str | float | None = None,
    fmt_name: str = "text",
) -> int:
    """`bench compare`: the table, the files, the gates' lines; the exit status: 0, or
    gate.EXIT_FAILED when a gate failed (docs/reference.md). Bad input: ValueError (one line), checked
    before anything is written, except a gate's finding that no row could be judged."""
    pct = None if fail_if_slower is None else gate.parse_threshold(fail_if_slower)
    points = (
        None
        if fail_if_gain_drops is None
        else gate.parse_threshold(fail_if_gain_drops, "--fail-if-gain-drops")
    )
    if fail_if_inconclusive and pct is None and points is None:
        raise ValueError("--fail-if-inconclusive: needs --fail-if-slower PCT or --fail-if-gain-drops POINTS")
    if fmt_name not in ("text", "md", "json"):
        raise ValueError(f"--format: {fmt_name!r} is not one of text, md, json")
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ValueError(f"--out {out_dir}: is a file; expected a directory for compare.csv and compare.png")
    df = compare(a_csv, b_csv, out_dir, pct, points, fmt_name, fail_if_inconclusive)
    if "gate" not in df.attrs:
        return 0
    _, final, status = df.attrs["gate"]
    if status == 2:
        raise ValueError(final)
    return status
