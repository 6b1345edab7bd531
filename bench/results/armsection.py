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
from bench.results.versions import code_of, declared_packages, reference_codes, shown, undeclared

HEADER = ["arm", "what it changes", "in effect (ok runs)"]


def _keys(sets: dict[str, Any]) -> str:
    return ", ".join(f"`{k}={as_written(v)}`" for k, v in sets.items())


def _user_arms(sweep: dict, records: list[RunRecord]) -> dict[str, dict[str, Any]]:
    """The sweep's own arms (name -> {"doc", "set", and python, path, env, differs, base where
    declared}): its config's user_arms, else the runs' cell.json."""
    declared = ((sweep.get("config") or {}).get("user_arms") or {}) if isinstance(sweep, dict) else {}
    out = {name: dict(v) for name, v in declared.items() if isinstance(v, dict)}
    for r in records:
        c = r.cell
        if c is not None and (isinstance(c.arm_set, dict) or c.arm_env) and r.arm not in out:
            if r.arm != BASELINE:
                out[str(r.arm)] = {"doc": "", "set": c.arm_set or {}, **(c.arm_env or {}), "base": c.arm_base}
    return out


def _environment(arm: dict[str, Any]) -> str:
    """An arm's declared environment: ``python /envs/pr/bin/python, path /src/SpecForge, env K=V``."""
    said = [f"python `{arm['python']}`"] if arm.get("python") else []
    path = arm.get("path") or []
    said += [f"path `{':'.join(path) if isinstance(path, list) else path}`"] if path else []
    said += [f"`{k}={v}`" for k, v in (arm.get("env") or {}).items()]
    said += [f"differs: {', '.join(arm['differs'])}"] if arm.get("differs") else []
    return ", ".join(said)


def _code(records: list[RunRecord], arm: str) -> str:
    """What an arm with its own environment ran against the baseline's runs, from the runs' own
    records of their code: `` — its runs imported specforge checkout … (baseline: specforge
    0.2.0)``, and the versions that differ without the arm declaring them."""
    mine = [r for r in records if r.arm == arm and r.cell is not None and r.cell.arm_env]
    code = next((c for r in mine if (c := code_of(r.run)) is not None), None)
    if not mine or code is None:
        return ""
    ref = reference_codes(records, mine[0].cell_id)
    declared = declared_packages(mine[0].cell.arm_env, code)
    pkgs = (code.get("packages") or {}) if isinstance(code, dict) else {}
    theirs = (ref[0].get("packages") or {}) if ref else {}
    said = "; ".join(
        f"{shown(p, pkgs.get(p) or {})} from `{(pkgs.get(p) or {}).get('file')}`"
        + (f" (baseline: {shown(p, theirs.get(p) or {})})" if ref else "")
        for p in declared
    )
    drift = undeclared(mine[0].cell.arm_env, code, ref[0] if ref else None)
    return f" — its runs imported {said}" + (f"; not declared: {'; '.join(drift)}" if drift else "")


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
    """The arms table: whether each arm took effect, or that its runs did not record it (whose Δ
    then carries no verdict); nothing for a table without the column or a sweep of the baseline
    alone."""
    if "arm_in_effect" not in runs or set(runs["arm"].dropna()) <= {BASELINE}:
        return []
    ok = runs[runs["status"] == "ok"]
    user = _user_arms(sweep, records)
    base_arm = ((sweep.get("config") or {}).get("baseline_arm") if isinstance(sweep, dict) else None) or None
    rows = []
    present = list(dict.fromkeys(runs["arm"].dropna()))
    planned = list((sweep.get("config") or {}).get("arms") or []) if isinstance(sweep, dict) else []
    for arm in [a for a in dict.fromkeys([BASELINE, *planned, *present]) if a in present]:
        tally = _tally(ok, arm)
        if arm in user:
            sets = user[arm].get("set") or {}
            doc = user[arm].get("doc") or ""
            changes = [_keys(sets)] if sets else []
            changes += [_environment(user[arm])] if _environment(user[arm]) else []
            base = user[arm].get("base") or base_arm
            changes += [f"kept from {base}: {ARMS[base].doc}"] if base in ARMS else []
            what = f"the sweep's own arm: {'; '.join(changes)}" + (f" ({doc})" if doc else "")
            evidence = _resolved(records, arm, list(sets))
            tally += f" ({evidence})" if evidence and tally != "not recorded" else ""
            what += _code(records, arm)
        elif arm == BASELINE and base_arm in ARMS:
            what = f"{ARMS[base_arm].doc} (baseline_arm: {base_arm})"
        else:
            what = ARMS[arm].doc if arm in ARMS else "—"
        rows.append([str(arm), what, tally])
    intro = (
        "**Arms.** Whether each arm took effect is read from its runs, not assumed from the keys set: "
        "the module classes of the model each run trained (a Liger arm's `LigerRMSNorm` and "
        "`LigerSwiGLUMLP`, none in the others) and what the trainer resolved each key the arm set to "
        "(an arm of the sweep's own, or the keys a built-in arm's intent became: runs.csv's "
        "`arm_in_effect`; a cell with a run not in effect gets no Δ; a run that recorded neither is "
        "'not recorded', never in effect: its Δ is shown with the verdict 'effect not recorded', and no "
        "verdict or gate rests on it). An arm with an environment of its own (another interpreter, "
        "import path or variables) is in effect only where its runs imported other code than the "
        "baseline's for each package it declares (run.json's `code`, read inside each run)."
    )
    return [intro, "", *fmt.table(HEADER, rows), ""]
