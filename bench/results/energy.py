"""The energy of a run's measured steps: every card of the run, from the poller's timed rows
(vram.jsonl; vram_node_<node>.jsonl per node of a multi-node run), into runs.csv's energy
columns (ENERGY_COLUMNS), and per arm into summary.csv's mean J/sample.

Per card, the first source that works of: its energy counter, read every ``power_interval_s``
(exact: the counter's values at the window's two ends, each interpolated between the two readings
around it); the trapezoid integral of its power read as often (a card without a counter); the
integral of the power in the state rows (about once a second; runs recorded before the energy
rows existed). The integral interpolates the power at the window's two ends too. A source counts
only when its readings cover the window (one at or before its start, one at or after its end),
at least MIN_READINGS fall inside it and no gap between two readings exceeds MAX_GAP_FRACTION of
it; otherwise the run's energy is NaN and ``energy_source`` says why: "n/a (...)", never 0.
``power_interval_s`` is the median interval between the readings used (the coarsest card's), so
the resolution is stated with the number.

A lockstep run (``pairing: lockstep``) shares its card with its partner, taking turns one optimizer
step each: its energy is the sum over its own measured turns (``turns``: each turn's wall-clock start
and end from lockstep.jsonl), each turn's joules from the same sources, the readings interpolated at
the turn's two ends. A turn counts when readings bracket it and no gap between the readings around
it exceeds MAX_TURN_GAP_FRACTION of it (a turn has no minimum of readings inside: it lasts about a
second, and the counter itself moves about every 0.1 s on the H200); a turn that fails makes the run
n/a, naming the turn. The source then reads "... over own turns".

The run's cards: on each node, the cell's ``gpus`` cards whose memory rose most over their idle
baseline (every polled card when the cell does not say). Cards split into compute partitions
give n/a: the power a partition reports is the whole card's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench import fmt
from bench.fileio import read_jsonl
from bench.record import read_turns
from bench.results.columns import ENERGY_COLUMNS

NAN = float("nan")
COUNTER = "energy counter"
INTEGRAL = "power integral"
MIN_READINGS = 5  # readings strictly inside the measured window
MAX_GAP_FRACTION = 0.2  # the largest gap between readings, as a share of the window
MAX_TURN_GAP_FRACTION = 0.5  # the same for one lockstep turn
OWN_TURNS = " over own turns"


def energy_na(reason: str) -> dict[str, Any]:
    return {**dict.fromkeys(ENERGY_COLUMNS, NAN), "energy_source": f"n/a ({reason[:300]})"}


def _series(rows: list[dict], card: int, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(times, values) of one card's readings, sorted, one per time: ``key`` "energy_j" or
    "power_w" from the energy rows, "state" for the power of the state rows; values that are no
    finite number >= 0 are left out."""
    points: dict[float, float] = {}
    for row in rows:
        values = row.get(key)
        if not isinstance(values, list) or card >= len(values):
            continue
        value = values[card]
        if key == "state":
            value = value.get("power_w") if isinstance(value, dict) else None
        t, v = fmt.num(row.get("t")), fmt.num(value)
        if math.isfinite(t) and math.isfinite(v) and v >= 0:
            points[t] = v
    times = np.array(sorted(points), dtype=float)
    return times, np.array([points[t] for t in times], dtype=float)


def _coverage(t: np.ndarray, t0: float, t1: float, turn: bool = False) -> tuple[slice, float] | str:
    """The readings from the last at or before ``t0`` to the first at or after ``t1`` and the
    median interval between them, or why they do not measure the window (``turn``: one lockstep
    turn, held to its own rule: no minimum of readings inside, MAX_TURN_GAP_FRACTION)."""
    span = t1 - t0
    what = "turn" if turn else "measured window"
    if t[0] > t0:
        return f"its first reading is {t[0] - t0:.2f} s after the {what}'s start"
    if t[-1] < t1:
        return f"its last reading is {t1 - t[-1]:.2f} s before the {what}'s end"
    inside = int(((t > t0) & (t < t1)).sum())
    if not turn and inside < MIN_READINGS:
        return f"{inside} readings inside the {span:.2f}-s measured window, at least {MIN_READINGS} needed"
    i0 = int(np.searchsorted(t, t0, side="right")) - 1
    i1 = int(np.searchsorted(t, t1, side="left"))
    gaps = np.diff(t[i0 : i1 + 1])
    limit = MAX_TURN_GAP_FRACTION if turn else MAX_GAP_FRACTION
    if not len(gaps):  # a reading exactly at both ends
        return slice(i0, i1 + 1), span
    if gaps.max() > limit * span:
        return f"a {gaps.max():.2f}-s gap between readings, more than {limit:.0%} of the {span:.2f}-s {what}"
    return slice(i0, i1 + 1), float(np.median(gaps))


def _counter(
    t: np.ndarray, v: np.ndarray, t0: float, t1: float, turn: bool = False
) -> tuple[float, float] | str:
    """Joules from an energy counter: its value at ``t1`` minus at ``t0``, each interpolated."""
    covered = _coverage(t, t0, t1, turn)
    if isinstance(covered, str):
        return covered
    span, dt = covered
    if np.any(np.diff(v[span]) < 0):
        return "the energy counter went backwards (reset or wrapped)"
    return float(np.interp(t1, t, v) - np.interp(t0, t, v)), dt


def _integral(
    t: np.ndarray, v: np.ndarray, t0: float, t1: float, turn: bool = False
) -> tuple[float, float] | str:
    """Joules from power readings: the trapezoid rule from ``t0`` to ``t1``, the power at the two
    ends interpolated between the readings around them."""
    covered = _coverage(t, t0, t1, turn)
    if isinstance(covered, str):
        return covered
    inner = (t > t0) & (t < t1)
    ts = np.concatenate([[t0], t[inner], [t1]])
    ps = np.concatenate([[np.interp(t0, t, v)], v[inner], [np.interp(t1, t, v)]])
    return float(np.sum((ps[1:] + ps[:-1]) / 2 * np.diff(ts))), covered[1]


def _over_turns(
    integrate, t: np.ndarray, v: np.ndarray, turns: list[tuple[float, float]]
) -> tuple[float, float] | str:
    """Joules summed over a lockstep run's own turns, and the median interval of the readings; or
    the first turn the readings cannot attribute, and why."""
    total, intervals = 0.0, []
    for i, (t0, t1) in enumerate(turns):
        result = integrate(t, v, t0, t1, True)
        if isinstance(result, str):
            return f"own turn {i + 1} of {len(turns)}: {result}"
        total += result[0]
        intervals.append(result[1])
    return total, float(np.median(intervals))


def _card(
    rows: list[dict], card: int, t0: float, t1: float, turns: list[tuple[float, float]] | None = None
) -> tuple[float, str, float] | str:
    """(joules, source, median interval) of one card over the window (``turns``: over a lockstep
    run's own turns alone), or why there are none."""
    problems = []
    for source, key, integrate in (
        (COUNTER, "energy_j", _counter),
        (INTEGRAL, "power_w", _integral),
        (INTEGRAL, "state", _integral),
    ):
        t, v = _series(rows, card, key)
        if not len(t):
            continue
        result = integrate(t, v, t0, t1) if turns is None else _over_turns(integrate, t, v, turns)
        if not isinstance(result, str):
            return result[0], source + (OWN_TURNS if turns is not None else ""), result[1]
        problems.append(f"{'power (state rows)' if key == 'state' else source}: {result}")
    return "; ".join(problems) or "no energy or power readings"


def _run_cards(devices: list[dict], gpus: Any) -> dict[Any, list[int]]:
    """Per node (None on a single node), the indices of the run's cards: the ``gpus`` whose
    memory rose most over their idle baseline, or every card when ``gpus`` is not a count."""
    nodes: dict[Any, list[dict]] = {}
    for i, d in enumerate(devices):
        nodes.setdefault(d.get("node"), []).append({**d, "index": d.get("index", i)})
    want = int(gpus) if isinstance(gpus, int | float) and not isinstance(gpus, bool) and gpus >= 1 else None
    out = {}
    for node, devs in nodes.items():
        if want is not None and want < len(devs):
            rose = sorted(devs, key=lambda d: (-fmt.num(d.get("peak_delta_gib"), -math.inf), d["index"]))
            devs = rose[:want]
        out[node] = sorted(int(d["index"]) for d in devs)
    return out


def own_turns(
    pairing: dict | None, run_dir: Path, steps: list[int]
) -> list[tuple[float, float]] | str | None:
    """A lockstep run's own turns over its measured ``steps`` (wall-clock start, end, from
    lockstep.jsonl); why they are unknown (a measured step without its turn); None for a run that
    did not take turns (``pairing``: cell.json's)."""
    if (pairing or {}).get("mode") != "lockstep":
        return None
    turns, out = read_turns(run_dir), []
    for step in steps:
        t = turns.get(step, {})
        started, ended = fmt.num(t.get("started")), fmt.num(t.get("ended"))
        if not (math.isfinite(started) and math.isfinite(ended) and ended > started):
            return f"measured step {step} has no turn in lockstep.jsonl: its own time on the card is unknown"
        out.append((started, ended))
    return out


def _unusable(vram: dict | None, window: tuple[float, float] | None) -> str | None:
    """Why a run can have no energy at all (no readings, no window), or None."""
    if vram is None:
        return "no vram.json"
    status, reason = vram.get("status"), vram.get("reason")
    if status == "disabled":
        return f"poller off: {reason or 'disabled'}"
    if status != "ok":
        return f"no GPU readings: {reason or status or 'unknown'}"
    if not [d for d in vram.get("devices") or [] if isinstance(d, dict)]:
        return "no cards polled"
    if vram.get("partitioned"):
        return "cards split into compute partitions: a partition's power is the whole card's"
    if window is None:
        return "no step times: the measured window is unknown"
    if not window[1] > window[0]:
        return "an empty measured window"
    return None


def run_energy(
    run_dir: Path,
    vram: dict | None,
    window: tuple[float, float] | None,
    samples: float,
    gpus: Any,
    turns: list[tuple[float, float]] | str | None = None,
) -> dict[str, Any]:
    """runs.csv's energy columns (ENERGY_COLUMNS) of one run: the joules of its cards over the
    measured ``window`` (wall-clock start, end), per sample (``samples`` measured in it); ``turns``:
    a lockstep run's own measured turns, summed instead (the window then spans them), or why they
    are unknown (own_turns)."""
    if isinstance(turns, str):
        return energy_na(turns)
    if turns is not None:
        window = (turns[0][0], turns[-1][1]) if turns else None
    why = _unusable(vram, window)
    if why:
        return energy_na(why)
    t0, t1 = window
    devices = [d for d in vram["devices"] if isinstance(d, dict)]
    total, sources, intervals, problems = 0.0, [], [], []
    for node, cards in _run_cards(devices, gpus).items():
        rows = read_jsonl(run_dir / ("vram.jsonl" if node is None else f"vram_node_{node}.jsonl"))
        for card in cards:
            result = _card(rows, card, t0, t1, turns)
            name = f"card {card}" if node is None else f"node {node} card {card}"
            if isinstance(result, str):
                problems.append(f"{name}: {result}")
                continue
            total += result[0]
            sources.append(result[1])
            intervals.append(result[2])
    if problems:
        return energy_na("; ".join(problems))
    return {
        "energy_j": total,
        "energy_j_per_sample": total / samples if samples > 0 else NAN,
        "energy_source": " + ".join(dict.fromkeys(sources)),
        "energy_cards": len(sources),
        "power_interval_s": max(intervals),
    }


def arm_energy(ok: pd.DataFrame) -> dict[str, Any]:
    """summary.csv's energy columns of one arm: the mean J/sample of its runs in the statistics
    that have one, and where it comes from: the sources, then how many runs had none and the
    first one's reason ("power integral; 3 of 6 runs n/a (card 0: ...)"), or that reason alone."""
    per_sample = pd.to_numeric(ok["energy_j_per_sample"], errors="coerce")
    sources = " + ".join(dict.fromkeys(str(s) for s in ok.loc[per_sample.notna(), "energy_source"].dropna()))
    missing = ok.loc[per_sample.isna(), "energy_source"]
    reason = str(missing.dropna().iloc[0]) if missing.notna().any() else "n/a"
    if sources and len(missing):
        sources += f"; {len(missing)} of {len(ok)} runs {reason}"
    return {
        "energy_j_per_sample_mean": per_sample.mean(),
        "energy_source": sources or (reason if len(missing) else None),
    }
