"""Each run's own memory and energy rows from the one poll of a lockstep pair (``pairing: lockstep``).

Both runs of a lockstep pair share one card, so the card's used memory is the pair's, not a run's.
The pair's poller (bench/run/execute.py) therefore also reads the memory each process holds on the
card at every sample (``VramPoller(per_process=True)``: NVML's running processes, AMD SMI's process
list) into the pair directory's ``vram.json`` (``process_peaks``) and ``vram.jsonl``. Each run's
process wrote its pid into the pair directory (``pid0``, ``pid1``: turns.py's Lockstep, in the
training process itself). ``split`` then writes each run's ``vram.json`` in the shape a sequential
run's has, from its own process's peak: a card's ``peak_delta_gib`` is what the run's process held
at its peak, ``peak_used_gib`` that plus the card's idle baseline before the pair (what the card
would have shown with the run alone on it), ``scope: "process"`` and the pid saying so. Its
``vram.jsonl`` gets the pair's energy and state rows (the card's: energy is attributed per own turn
at report time, bench/results/energy.py), without the card's used-memory rows, which are the pair's.

A run whose pid the library never listed (another PID namespace, a library without per-process
figures) gets ``status: unavailable`` and the reason: never the pair's card peak in its place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.fileio import atomic_write_json, atomic_write_text, read_json, read_jsonl

PID_FILE = "pid{role}"  # written by bench/trainers/specforge_cli/turns.py (the user's interpreter)
SCOPE = "process"


def run_pid(pair_dir: Path, role: int) -> int | None:
    """The pid of the training process of the pair's run ``role``, as it wrote it; None without one."""
    try:
        return int((pair_dir / PID_FILE.format(role=role)).read_text().strip())
    except (OSError, ValueError):
        return None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run_view(pair: dict, pid: int | None) -> dict[str, Any]:
    """One run's vram.json from the pair's (``pair``) and its process's pid."""
    out = {k: v for k, v in pair.items() if k != "process_peaks"}
    out.update(scope=SCOPE, pid=pid)
    if pair.get("status") != "ok":
        return out
    backend = pair.get("backend") or "the management library"
    why = None
    if pid is None:
        why = "the run wrote no pid (its turn-taking hook never started), so its memory cannot be told apart"
    peaks = [p for p in pair.get("process_peaks") or [] if isinstance(p, dict) and p.get("pid") == pid]
    if why is None and not peaks:
        why = f"{backend} never listed the run's process (pid {pid}) on a card (another PID namespace?)"
    if why is None and all(p.get("peak_used_gib") is None for p in peaks):
        why = f"{backend} listed the run's process (pid {pid}) without its memory"
    if why is not None:
        return {**out, "status": "unavailable", "reason": why}
    by_card = {int(p["card"]): p for p in peaks}
    devices = []
    for i, dev in enumerate(pair.get("devices") or []):
        if not isinstance(dev, dict):
            continue
        own = by_card.get(int(dev.get("index", i)))
        held = (own or {}).get("peak_used_gib") or 0.0  # not listed on a card: it held nothing there
        base = dev.get("baseline_used_gib")
        devices.append(
            {
                **dev,
                "peak_used_gib": _rounded(held + (base or 0.0)),
                "peak_delta_gib": _rounded(held),
                "pair_peak_used_gib": dev.get("peak_used_gib"),  # the card's, both runs on it
            }
        )
    samples = max(int(p.get("n_samples") or 0) for p in peaks)
    return {**out, "devices": devices, "n_samples": samples}


def split(pair_dir: Path, run_dirs: list[Path]) -> None:
    """Each run's vram.json and vram.jsonl from the pair's (see the module docstring)."""
    pair = read_json(pair_dir / "vram.json")
    pair = (
        pair
        if isinstance(pair, dict)
        else {"backend": "none", "status": "unavailable", "reason": "no vram.json"}
    )
    rows = [r for r in read_jsonl(pair_dir / "vram.jsonl") if "used_gib" not in r]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    for role, rdir in enumerate(run_dirs):
        atomic_write_json(rdir / "vram.json", run_view(pair, run_pid(pair_dir, role)))
        if text:
            atomic_write_text(rdir / "vram.jsonl", text)
