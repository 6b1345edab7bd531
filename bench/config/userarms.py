"""A sweep's own arms (its ``user_arms`` key): each checked against bench/arms.py's built-in arms
and made an :class:`~bench.arms.Arm` with the trainer's keys it sets, the built-in intent it keeps
(``base``) and the environment it runs in (``python``, ``path``, ``env``, ``differs``: an
:class:`~bench.arms.ArmEnv`); then every name in ``arms`` is a built-in arm or one of them. The
sweep's ``baseline_arm`` makes the baseline itself run as another built-in arm (Liger on, to A/B
two environments of it). Whether a cell's trainer may take the keys is asked of its reader, by
bench/config/loader.py (``refuse_arm_key``); whether an environment can run the trainer, by
bench/run/armenv.py before anything runs."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import bench.config.typed as typed
from bench.arms import ARM_NAMES, ARMS, BASELINE, BASES, USER_ARM_NAME, VERSIONED, Arm, ArmEnv, user_arm
from bench.config.schema import SweepKeys, UserArmKeys
from bench.config.typed import Fail

_USER_ARM_RE = re.compile(USER_ARM_NAME)


def user_arms(top: SweepKeys, fail: Fail) -> dict[str, Arm]:
    """The sweep's own arms (user_arms), each a name no built-in arm has, a one-line doc and
    something it changes (keys, an environment or a base); then every name in ``arms`` is a
    built-in arm or one of them. With ``baseline_arm``, the baseline under its name as well."""
    user: dict[str, Arm] = {}
    base_default = _baseline_base(top, fail)
    for name, raw in top.user_arms.items():
        where = f"user_arms.{typed.shown(name)}"
        if name in ARMS:
            raise fail(f"{where}: {name!r} is a built-in arm ({ARMS[name].doc}); give yours another name")
        if not _USER_ARM_RE.fullmatch(name):
            why = typed.name_problem(name)
            raise fail(
                f"{where}: {name!r} {f'{why}; expected' if why else 'should be'} letters and digits, a "
                "letter first (it ends each of its run directories' names)"
            )
        keys = typed.build(UserArmKeys, raw, f"{where}.", fail)
        if any((c < " " and c != "\t") or c == "\x7f" for c in keys.doc.strip()):
            raise fail(f"{where}.doc: expected one line (no control characters), got {keys.doc!r}")
        env = _arm_env(keys, where, fail)
        base = keys.base or base_default
        if base is not None and base not in BASES:
            raise fail(f"{where}.base: expected a built-in arm from {', '.join(BASES)}, got {base!r}")
        if not keys.set and env is None and keys.base is None:
            raise fail(
                f"{where}: changes nothing; expected set (the trainer's dotted keys), python, path or env"
            )
        user[name] = user_arm(name, keys.doc.strip(), keys.set, env, base)
    if base_default is not None:
        intent = ARMS[base_default]
        user[BASELINE] = replace(
            intent, name=BASELINE, doc=f"{intent.doc} (baseline_arm: {base_default})", base=base_default
        )
    for a in top.arms:
        if a not in ARMS and a not in user:
            declared = f", or user_arms ({', '.join(user)})" if user else ", or one declared in user_arms"
            raise fail(f"arms: unknown arm {a!r}; expected arms from {', '.join(ARM_NAMES)}{declared}")
        if base_default is not None and a in ARMS and a not in (BASELINE, "aa"):
            raise fail(
                f"arms: {a} beside baseline_arm: {base_default} (the baseline runs as {base_default} "
                "already); compare user arms against it"
            )
    return user


def _baseline_base(top: SweepKeys, fail: Fail) -> str | None:
    """The built-in arm the baseline runs as (baseline_arm), None for the stock baseline."""
    if top.baseline_arm == BASELINE:
        return None
    if top.baseline_arm not in BASES:
        raise fail(f"baseline_arm: expected a built-in arm from {', '.join(BASES)}, got {top.baseline_arm!r}")
    return top.baseline_arm


def _arm_env(keys: UserArmKeys, where: str, fail: Fail) -> ArmEnv | None:
    """The arm's environment, its folders and interpreter checked to exist (what they hold is
    bench/run/armenv.py's check, with the interpreter itself); None when it declares none."""
    if keys.python is None and not keys.path and not keys.env:
        if keys.differs:
            raise fail(f"{where}.differs: the arm declares no environment (python, path or env) to differ")
        return None
    if keys.python is not None:
        python = os.path.expanduser(keys.python.strip())
        found = Path(python)
        if not found.exists():
            raise fail(f"{where}.python: no interpreter at {python}; name your environment's python")
        if found.is_dir() or not os.access(found, os.X_OK):
            raise fail(f"{where}.python: {python} is not an executable file; name your environment's python")
    paths = []
    for i, p in enumerate(keys.path):
        folder = Path(os.path.expanduser(p.strip())).resolve()
        if not folder.is_dir():
            raise fail(f"{where}.path[{i}]: no folder at {p}; name a checkout or a pip --target folder")
        paths.append(str(folder))
    differs = [d.strip().lower().replace("_", "-") for d in keys.differs]
    unknown = [d for d in differs if d not in VERSIONED]
    if unknown:
        raise fail(f"{where}.differs: {unknown[0]!r} is not one of {', '.join(VERSIONED)}")
    return ArmEnv(
        python=os.path.expanduser(keys.python.strip()) if keys.python else None,
        path=tuple(paths),
        vars=dict(keys.env),
        differs=tuple(dict.fromkeys(differs)),
    )
