"""The special value kinds of a sweep config, as validators the typed engine dispatches to.

Each is a small :class:`~bench.config.typed.Kind` used in a type hint as
``Annotated[<Python type>, <kind>]`` (the aliases at the bottom): hardware names (lowercased),
the arms (baseline first; ``[baseline, baseline]`` is the A/A sweep ``[baseline, aa]``),
``[arm, reference]`` contrasts, an integer or a list of them, a ``set:`` mapping of training
keys to scalars, a command's argv, a string or null, and mappings or lists checked later
against a section of their own.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import bench.config.typed as typed
from bench.arms import AA, ARM_NAMES, BASELINE, VERSIONED
from bench.config.typed import Bound, Fail, Kind

_SET_KEY_RE = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*$")


def _words(value: Any) -> bool:
    """A non-empty list of non-blank strings."""
    return isinstance(value, list) and bool(value) and all(isinstance(a, str) and a.strip() for a in value)


class HardwareNames(Kind):
    expect = "a hardware name or a list of them (e.g. [h100, h200], cpu, any)"

    def check(self, value: Any, name: str, fail: Fail, bound: Bound) -> list[str]:
        names = [value] if isinstance(value, str) else value
        if not _words(names):
            raise self.bad(value, name, fail)
        return [n.strip().lower() for n in names]


class Argv(Kind):
    expect = (
        "a list of strings, the command's words (e.g. [srun, --nodes=2, --ntasks-per-node=1]; quote numbers)"
    )

    def check(self, value: Any, name: str, fail: Fail, bound: Bound) -> list[str]:
        if not _words(value):
            raise self.bad(value, name, fail)
        return list(value)


class OptionalText(Kind):
    expect = "a string or null"

    def check(self, value: Any, name: str, fail: Fail, bound: Bound) -> str | None:
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise self.bad(value, name, fail)
        return value


class ArmNames(Kind):
    """Only the shape and the baseline: the loader checks the names against bench/arms.py and the
    sweep's user_arms."""

    expect = f"a list of arms from {', '.join(ARM_NAMES)} or user_arms"

    def check(self, value: Any, name: str, fail: Fail, bound: Bound) -> list[str]:
        if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
            raise self.bad(value, name, fail)
        arms = list(value)
        if arms[:2] == [BASELINE, BASELINE]:  # A/A: the second baseline is the arm "aa"
            arms[1] = AA
        if len(set(arms)) != len(arms):
            raise fail(f"{name}: each arm once, got {value!r}")
        if BASELINE not in arms:
            raise fail(f"{name}: the baseline arm is missing; expected e.g. [baseline, liger]")
        return [BASELINE, *(a for a in arms if a != BASELINE)]  # baseline first


class Contrasts(Kind):
    """Only the shape: the sweep checks the pairs against its arms (bench.config.loader)."""

    expect = "a list of [arm, reference] pairs of the sweep's arms (e.g. [[liger_flce, liger]])"

    def check(self, value: Any, name: str, fail: Fail, bound: Bound) -> list[list[str]]:
        if not isinstance(value, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(a, str) for a in p) for p in value
        ):
            raise self.bad(value, name, fail)
        return [list(p) for p in value]


class IntOrList(Kind):
    """An integer or a list of distinct ones, each within the key's bound."""

    expect = "a positive integer or a list of them"

    def check(self, value: Any, name: str, fail: Fail, bound: Bound) -> list[int]:
        items = value if isinstance(value, list) else [value]
        if not items or any(isinstance(v, bool) or not isinstance(v, int) for v in items):
            raise self.bad(value, name, fail)
        if len(set(items)) != len(items):
            raise fail(f"{name}: each value once, got {value!r}")
        for v in items:
            typed.check_bound(v, bound, name, fail)
        return items


class SetMapping(Kind):
    """Training config overrides: dotted keys to scalars (the driver's own keys are refused by
    the cell check, which knows them: bench.arms.DRIVER_KEYS)."""

    expect = "a mapping of training config keys to scalar values (e.g. {training.num_anchors: 512})"

    def check(self, value: Any, name: str, fail: Fail, bound: Bound) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.bad(value, name, fail)
        for k, v in value.items():
            if not isinstance(k, str) or not _SET_KEY_RE.fullmatch(k):
                raise fail(f"{name}: key {k!r} should be a dotted config key like training.num_anchors")
            if isinstance(v, dict | list):
                raise fail(f"{name}.{k}: expected a scalar (string, number, bool or null), got {v!r}")
        return dict(value)


_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Words(Kind):
    """A string or a list of non-blank strings (folders, package names), as a list."""

    def __init__(self, what: str) -> None:
        self.expect = f"{what}, or a list of them"

    def check(self, value: Any, name: str, fail: Fail, bound: Bound) -> list[str]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(a, str) and a.strip() for a in items):
            raise self.bad(value, name, fail)
        bad = next((a for a in items if any(not c.isprintable() and c != " " for c in a)), None)
        if bad is not None:
            raise fail(f"{name}: {bad!r} holds a control character")
        return list(items)


class EnvVars(Kind):
    """Environment variables an arm's runs get: names to string values (numbers as written)."""

    expect = "a mapping of environment variable names to values (e.g. {PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True})"

    def check(self, value: Any, name: str, fail: Fail, bound: Bound) -> dict[str, str]:
        if not isinstance(value, dict):
            raise self.bad(value, name, fail)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not _ENV_NAME_RE.fullmatch(k):
                raise fail(f"{name}: {k!r} is no environment variable name (letters, digits, '_')")
            if k == "PYTHONPATH":
                raise fail(f"{name}.PYTHONPATH: give the folders as the arm's path (they go first on it)")
            if isinstance(v, dict | list) or v is None:
                raise fail(f"{name}.{k}: expected a string or number, got {v!r}")
            out[k] = str(v).lower() if isinstance(v, bool) else str(v)
        return out


class SectionMapping(Kind):
    """A mapping checked later against its own section (a cell's precision merges with the
    sweep's first), kept as written in the resolved config."""

    def __init__(self, section: type) -> None:
        self.expect = f"a mapping with {', '.join(typed.labels(section))}"

    def check(self, value: Any, name: str, fail: Fail, bound: Bound) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.bad(value, name, fail)
        return dict(value)


class UserArms(Kind):
    """A mapping of arm names to mappings, each checked later against its own section (the loader
    knows the built-in arms the names may not take)."""

    def __init__(self, section: type) -> None:
        self.fields = ", ".join(typed.labels(section))
        self.expect = f"a mapping of arm names to mappings with {self.fields}"

    def check(self, value: Any, name: str, fail: Fail, bound: Bound) -> dict[str, Any]:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise self.bad(value, name, fail)
        for k, v in value.items():
            if not isinstance(v, dict):
                raise fail(f"{name}.{typed.shown(k)}: expected a mapping with {self.fields}, got {v!r}")
        return dict(value)


class SectionList(Kind):
    """A list of mappings, each checked later against its own section (the cells)."""

    def __init__(self, what: str, section: type) -> None:
        self.expect = f"a list of {what} ({', '.join(typed.required(section))})"

    def check(self, value: Any, name: str, fail: Fail, bound: Bound) -> list:
        if not isinstance(value, list):
            raise self.bad(value, name, fail)
        return value


Hardware = Annotated[list[str], HardwareNames()]
Command = Annotated[list[str], Argv()]
Endpoint = Annotated[str | None, OptionalText()]
Arms = Annotated[list[str], ArmNames()]
Pairs = Annotated[list[list[str]], Contrasts()]
Ints = Annotated[list[int], IntOrList()]
Sets = Annotated[dict[str, Any], SetMapping()]
Folders = Annotated[list[str], Words("a folder")]
Packages = Annotated[list[str], Words(f"a package name ({', '.join(VERSIONED)})")]
Variables = Annotated[dict[str, str], EnvVars()]
