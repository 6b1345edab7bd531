"""Arms with an environment of their own (user_arms' python, path, env), checked before anything is
written: each arm's environment and the baseline's are asked what code they would run
(bench/trainers/specforge_cli/codefacts.py, run by path in the interpreter a run of that arm
starts, under that arm's variables and import path). One line refuses an interpreter that cannot
run it, an environment that cannot import the trainer (or would import this checkout's
``specforge`` where the user's SpecForge is meant), and versions that differ from the baseline's
without the arm declaring them (its ``differs``; ``version_drift: allow`` lets them through, and
the report names them). Nothing is installed anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.arms import BASELINE, ArmEnv
from bench.config import SweepConfig
from bench.errors import SweepError
from bench.results.versions import declared_packages, shown, undeclared
from bench.trainers.isolation import isolated_env, ours

CODEFACTS = Path(__file__).resolve().parent.parent / "trainers" / "specforge_cli" / "codefacts.py"
PROBE_TIMEOUT_S = 120.0


def _probe(
    python: str, env: ArmEnv | None, base_env: dict[str, str], where: str, tries: tuple[str, ...] = ()
) -> dict[str, Any]:
    argv = [python, str(CODEFACTS), *tries]
    argv = env.command(argv, base_env) if env is not None else argv
    try:
        r = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            env=base_env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise SweepError(f"{where}: {python} did not answer in {PROBE_TIMEOUT_S:g} s") from None
    except OSError as e:
        raise SweepError(f"{where}: cannot start {python}: {e.strerror}") from None
    lines = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
    try:
        facts = json.loads(r.stdout) if r.returncode == 0 else None
    except json.JSONDecodeError:
        facts = None
    if not isinstance(facts, dict):
        last = lines[-1] if lines else f"exit code {r.returncode}"
        raise SweepError(f"{where}: {python} cannot run the suite's probe of its packages: {last}")
    return facts


def _trainer_problem(facts: dict, user_env: bool) -> str | None:
    """Why the environment cannot run the cell's trainer: the user's SpecForge missing (or this
    checkout's in its place); for our trainer, torch or transformers missing."""
    pkgs = facts.get("packages") or {}
    spec = pkgs.get("specforge") or {}
    if user_env:
        if not spec:
            return "cannot import specforge: install SpecForge there, or put its checkout in the arm's path"
        if spec.get("file") and ours(spec["file"]):
            return f"would import this checkout's specforge ({spec.get('file')}), not upstream SpecForge"
        return None
    lacks = [p for p in ("torch", "transformers") if not pkgs.get(p)]
    return f"cannot import {' or '.join(lacks)} (our trainer needs them)" if lacks else None


def _liger_problem(facts: dict) -> str | None:
    """Why a Liger arm's environment cannot run Liger as the trainer does: the first of its entry
    points that does not import there (liger-kernel 0.6.4's apply_liger_kernel_to_qwen3 under
    transformers 5, say), with the version that failed."""
    for target, error in (facts.get("imports") or {}).items():
        if error:
            version = ((facts.get("packages") or {}).get("liger-kernel") or {}).get("version")
            lk = f"liger-kernel {version}" if version else "its liger-kernel"
            return f"cannot import {target.replace(':', '.')} from {lk} ({error}); a Liger run would fail at its start"
    return None


def check_arm_envs(cfg: SweepConfig, plugs: dict) -> list[str]:
    """Refuse (SweepError, one line) an arm environment that cannot run its cells' trainer, or whose
    versions differ from the baseline's undeclared (unless version_drift: allow); the lines to say
    what each arm's environment runs against the baseline's."""
    arms = {a: cfg.arm(a) for a in cfg.arms if cfg.arm(a).env is not None}
    if not arms:
        return []
    said = []
    for trainer, plug in plugs.items():
        if not any(c.trainer == trainer for c in cfg.cells):
            continue
        interpreter = getattr(plug, "interpreter", None)  # a plug whose runs start the user's Python
        user_env = callable(interpreter)
        base_env = isolated_env(os.environ) if user_env else dict(os.environ)
        default = interpreter(cfg) if user_env else sys.executable
        ref = _probe(default, None, base_env, f"{cfg.path}: arms: {BASELINE}")
        for name, arm in arms.items():
            where = f"{cfg.path}: user_arms.{name}"
            tries = () if cfg.runs_on_cpu or not arm.liger else tuple(getattr(plug, "liger_imports", ()))
            facts = _probe(arm.env.python or default, arm.env, base_env, where, tries)
            problem = _trainer_problem(facts, user_env) or _liger_problem(facts)
            if problem:
                raise SweepError(f"{where}: its environment {problem}")
            declared = arm.env.declared()
            drift = undeclared(declared, facts, ref)
            if drift and cfg.version_drift != "allow":
                raise SweepError(
                    f"{where}: its environment has {'; '.join(drift)}, which the arm does not declare "
                    "(differs); build the environments alike, add the package to the arm's differs, or set "
                    "version_drift: allow"
                )
            pkgs = declared_packages(declared, facts)
            mine = ", ".join(shown(p, (facts.get("packages") or {}).get(p) or {}) for p in pkgs)
            theirs = ", ".join(shown(p, (ref.get("packages") or {}).get(p) or {}) for p in pkgs)
            said.append(
                f"arm {name}: {mine} (baseline: {theirs})" + (f"; also {'; '.join(drift)}" if drift else "")
            )
    return said
