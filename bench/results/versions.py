"""The code each run ran, and whether an arm that declares another environment ran other code.

Each run records from inside its process the packages whose versions decide the work (run.json's
``code``: the SpecForge CLI's from instrument.py, ours in ``provenance.code``): for each, the folder
it was imported from, the installed version and, for a checkout, its commit and dirty state. An
arm with an environment of its own (cell.json's ``arm_env``: python, path, env, differs) is in
effect only when its runs show each package it declares changed against the baseline's runs of the
same cell (another version, commit, diff or folder) and each variable it declares set inside the
run; otherwise its cell gets no Δ (bench/results/deltas.py's not_in_effect, as for an arm whose
kernels did not land). Versions that differ without being declared are named (``undeclared``),
for the report's Arms section.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from bench.arms import BASELINE, VERSIONED
from bench.record import RunDoc

TRAINER_PACKAGE = "specforge"  # the trainer both plugs run imports as specforge (ours, or upstream)


def code_of(run: RunDoc | None) -> dict[str, Any] | None:
    """The run's record of its code: run.json's ``code`` (the SpecForge CLI), else provenance's (ours)."""
    if run is None:
        return None
    if isinstance(run.code, dict):
        return run.code
    prov = run.provenance if isinstance(run.provenance, dict) else {}
    return prov.get("code") if isinstance(prov.get("code"), dict) else None


def _package(code: dict | None, name: str) -> dict:
    pkgs = (code or {}).get("packages")
    got = pkgs.get(name) if isinstance(pkgs, dict) else None
    return got if isinstance(got, dict) else {}


def _release(p: dict) -> tuple:
    """What a package's version is, apart from where it lies: version, commit, dirty."""
    return (p.get("version"), p.get("commit"), p.get("dirty"))


def shown(name: str, p: dict) -> str:
    """``specforge 0.2.0``, ``specforge checkout 1a2b3c4d5e6f (dirty 9f8e…)``, ``torch absent``."""
    if not p:
        return f"{name} absent"
    said = [p["version"]] if p.get("version") else []
    if p.get("commit"):
        said.append(f"checkout {p['commit']}" + (f" (dirty {p['dirty']})" if p.get("dirty") else ""))
    return f"{name} {' '.join(said) or 'unversioned'}"


def versions_text(code: dict | None) -> str | None:
    """runs.csv's ``code_versions``: each package's version as the run imported it, joined by ``·``."""
    if not isinstance(code, dict) or not isinstance(code.get("packages"), dict):
        return None
    return " · ".join(shown(n, _package(code, n)) for n in VERSIONED if n in code["packages"])


def declared_packages(arm_env: dict, code: dict | None) -> list[str]:
    """The packages an arm means to change: its ``differs``; else those the run imported from the
    arm's path folders; else (another interpreter alone) the trainer."""
    if arm_env.get("differs"):
        return list(arm_env["differs"])
    folders = [os.path.realpath(p) for p in arm_env.get("path") or []]
    under = [
        n
        for n in VERSIONED
        if any(str(_package(code, n).get("file") or "").startswith(f + os.sep) for f in folders)
    ]
    return under or [TRAINER_PACKAGE]


def env_in_effect(arm_env: dict, code: dict | None, reference: list[dict]) -> str | None:
    """Whether a run of an arm with its own environment ran other code than the reference (the
    baseline's runs of its cell): "yes", "no: ..." or None (not recorded: no code record here or
    in any reference run)."""
    if not isinstance(code, dict) or not reference:
        return None
    said = []
    for name, want in (arm_env.get("env") or {}).items():
        got = (code.get("vars") or {}).get(name)
        if got != want:
            said.append(f"{name} is {got!r} inside the run, not {want!r}")
    ref = reference[0]
    for name in declared_packages(arm_env, code):
        mine, theirs = _package(code, name), _package(ref, name)
        if mine == theirs or (_release(mine) == _release(theirs) and mine.get("file") == theirs.get("file")):
            said.append(
                f"its runs imported the same {shown(name, mine)} as the baseline's ({mine.get('file')})"
            )
    return "no: " + "; ".join(said) if said else "yes"


def undeclared(arm_env: dict, code: dict | None, reference: dict | None) -> list[str]:
    """Packages whose version (or checkout) differs from the reference's though the arm does not
    declare them: ``torch 2.9.0 (baseline: torch 2.8.0)``."""
    if not isinstance(code, dict) or not isinstance(reference, dict):
        return []
    declared = set(declared_packages(arm_env, code)) if arm_env else set()
    out = []
    for name in VERSIONED:
        mine, theirs = _package(code, name), _package(reference, name)
        if name not in declared and _release(mine) != _release(theirs):
            out.append(f"{shown(name, mine)} (baseline: {shown(name, theirs)})")
    return out


def combined(said: Iterable[str | None]) -> str | None:
    """One arm_in_effect from several checks: "no: ..." when any says no, None when any is
    unproven, else "yes"."""
    said = list(said)
    failed = [s.removeprefix("no: ") for s in said if isinstance(s, str) and s.startswith("no")]
    if failed:
        return "no: " + "; ".join(failed)
    return None if any(s is None for s in said) else "yes"


def reference_codes(records: Iterable, cell_id: str | None) -> list[dict]:
    """The code records of the baseline's runs of one cell (the reference of its version arms)."""
    return [
        c for r in records if r.cell_id == cell_id and r.arm == BASELINE and (c := code_of(r.run)) is not None
    ]


def arm_env_effects(records: list) -> dict[str, str | None]:
    """Per run of an arm with its own environment (cell.json's arm_env): env_in_effect against the
    baseline's runs of its cell."""
    out = {}
    for r in records:
        arm_env = r.cell.arm_env if r.cell is not None else None
        if isinstance(arm_env, dict) and arm_env:
            out[r.run_id] = env_in_effect(arm_env, code_of(r.run), reference_codes(records, r.cell_id))
    return out
