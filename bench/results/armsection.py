"""report.md's arms section: what each arm of the sweep changes against the baseline, and whether
its runs show it in effect (runs.csv's ``arm_in_effect``, read from each run: the module classes
of the model it trained and, for an arm of the sweep's own, what the trainer resolved its keys to,
run.json's ``set_resolved``). Shown only when some run recorded either."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd

from bench import fmt
from bench.arms import ARMS, BASELINE, as_written
from bench.results.records import RunRecord

HEADER = ["arm", "what it changes", "in effect (ok runs)"]


def _keys(sets: dict[str, Any]) -> str:
    return ", ".join(f"`{k}={as_written(v)}`" for k, v in sets.items())


def _user_arms(sweep: dict, records: list[RunRecord]) -> dict[str, dict[str, Any]]:
    """The sweep's own arms (name -> {"doc", "set"}): its config's user_arms, else the runs' cell.json."""
    declared = ((sweep.get("config") or {}).get("user_arms") or {}) if isinstance(sweep, dict) else {}
    out = {name: dict(v) for name, v in declared.items() if isinstance(v, dict)}
    for r in records:
        if r.cell is not None and isinstance(r.cell.arm_set, dict) and r.arm not in out:
            out[str(r.arm)] = {"doc": "", "set": r.cell.arm_set}
    return out


def _resolved(records: list[RunRecord], arm: str, keys: list[str]) -> str:
    """What the arm's runs resolved its keys to, each distinct value once: ``key: sdpa in the
    config; OnlineDFlashModel.attention_backend = sdpa``."""
    seen: dict[str, list[str]] = {}
    for r in records:
        got = (r.run.set_resolved if r.run is not None else None) or {}
        if r.arm != arm or not isinstance(got, dict):
            continue
        for key in keys:
            held = got.get(key) if isinstance(got.get(key), dict) else {}
            said = [f"{key}: {held['config']} in the config"] if "config" in held else []
            said += [f"{where} = {value}" for where, value in (held.get("model") or {}).items()]
            for s in said:
                seen.setdefault(key, [])
                if s not in seen[key]:
                    seen[key].append(s)
    return "; ".join(s for key in keys for s in seen.get(key, []))


def _tally(ok: pd.DataFrame, arm: str) -> str:
    """``3 of 3``, ``no: <why> (1 of 3)``, ``not recorded`` or ``no ok run``, over the arm's ok runs."""
    said = ok.loc[ok["arm"] == arm, "arm_in_effect"]
    n, known = len(said), said.dropna()
    if not n:
        return "no ok run"
    if not len(known):
        return "not recorded"
    counts = Counter(str(v) for v in known)
    yes = counts.pop("yes", 0)
    text = [f"{yes} of {n}"] if yes == n else [f"yes in {yes} of {n}"] if yes else []
    text += [f"{k} ({c} of {n})" for k, c in counts.items()]
    if len(known) < n:
        text.append(f"not recorded in {n - len(known)}")
    return "; ".join(text)


def arms_section(runs: pd.DataFrame, sweep: dict, records: list[RunRecord]) -> list[str]:
    """The arms table, or nothing when no run recorded whether its arm took effect."""
    if "arm_in_effect" not in runs or runs["arm_in_effect"].dropna().empty:
        return []
    ok = runs[runs["status"] == "ok"]
    user = _user_arms(sweep, records)
    rows = []
    present = list(dict.fromkeys(runs["arm"].dropna()))
    planned = list((sweep.get("config") or {}).get("arms") or []) if isinstance(sweep, dict) else []
    for arm in [a for a in dict.fromkeys([BASELINE, *planned, *present]) if a in present]:
        tally = _tally(ok, arm)
        if arm in user:
            sets = user[arm].get("set") or {}
            doc = user[arm].get("doc") or ""
            what = f"the sweep's own arm: {_keys(sets)}" + (f" ({doc})" if doc else "")
            evidence = _resolved(records, arm, list(sets))
            tally += f" ({evidence})" if evidence and tally != "not recorded" else ""
        else:
            what = ARMS[arm].doc if arm in ARMS else "—"
        rows.append([str(arm), what, tally])
    intro = (
        "**Arms.** Whether each arm took effect is read from its runs, not assumed from the keys set: "
        "the module classes of the model each run trained (a Liger arm's `LigerRMSNorm` and "
        "`LigerSwiGLUMLP`, none in the others) and what the trainer resolved each key the arm set to "
        "(an arm of the sweep's own, or the keys a built-in arm's intent became: runs.csv's "
        "`arm_in_effect`; a cell with a run not in effect gets no Δ; a run that recorded neither is "
        "'not recorded', never in effect)."
    )
    return [intro, "", *fmt.table(HEADER, rows), ""]
