"""The typed engine behind sweep configs: a section is a dataclass, one generic check validates it.

Each field of a section declares its type hint, its default (none: the key is required), its
lower bound and a one-line doc through :func:`key`. :func:`build` checks a raw YAML mapping
against the section from the type hints alone: an unknown key gets a did-you-mean, a missing
required key says what is expected, ``null`` means the default, and every value is checked by
:func:`check_value`, which dispatches on the hint (``bool``, ``int``, ``float``, ``str``,
``X | None``, and ``Annotated[T, kind]`` for the special kinds: a :class:`Kind` instance).
Values are kept as written (an integer for a float key stays an integer), so the resolved
config stored in sweep.json says what the file says. Every failure is one line, made
by the caller's ``fail`` (which puts the file's name in front).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any, get_args, get_origin

from bench.errors import SweepError

Fail = Callable[[str], SweepError]
# A lower bound: (value, whether it is excluded); None when the key has none.
Bound = tuple[float, bool] | None


class Kind:
    """A value no plain type hint describes (hardware names, arms, ...): what it expects, for the
    messages, and its check. Used as ``Annotated[<the Python type>, <a Kind instance>]``."""

    expect = ""

    def check(self, value: Any, name: str, fail: Fail, bound: Bound) -> Any:
        raise NotImplementedError

    def bad(self, value: Any, name: str, fail: Fail, extra: str = "") -> SweepError:
        return fail(f"{name}: expected {self.expect}{extra}, got {value!r}")


def key(
    default: Any = dataclasses.MISSING,
    *,
    doc: str,
    ge: float | None = None,
    gt: float | None = None,
    choices: Sequence[str] = (),
) -> Any:
    """A section's field: no default means required; ``ge``/``gt``: the lower bound (inclusive /
    exclusive); ``choices``: the allowed strings (checked by the section's caller, with
    :func:`check_choice`, where it checks the others)."""
    bound = (gt, True) if gt is not None else (ge, False) if ge is not None else None
    metadata = {"doc": doc, "bound": bound, "choices": tuple(choices)}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=functools.partial(copy.deepcopy, default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def default_of(f: dataclasses.Field) -> Any:
    """A fresh copy of a field's default."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return copy.deepcopy(f.default)


def defaults(cls: type) -> dict[str, Any]:
    """The section's keys that have a default, each with a fresh copy of it."""
    return {f.name: default_of(f) for f in dataclasses.fields(cls) if has_default(f)}


def required(cls: type) -> list[str]:
    """The section's required keys, in order."""
    return [f.name for f in dataclasses.fields(cls) if not has_default(f)]


def docs(cls: type) -> dict[str, str]:
    """Each key of the section with its one-line doc."""
    return {f.name: f.metadata["doc"] for f in dataclasses.fields(cls)}


def as_dict(section: Any) -> dict[str, Any]:
    """A built section as a mapping, in declaration order (values not copied)."""
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}


def name_problem(name: str) -> str | None:
    """Why a name the user gave (a sweep's, a label, an arm's: each ends up in a directory's name
    and on one line of a message) cannot be one: a control character (a newline, a tab, ...) or
    whitespace before or after it; None when it has neither."""
    bad = next((c for c in name if not c.isprintable() and c != " "), None)
    if bad is not None:
        return f"holds a control character ({bad!r})"
    if name != name.strip():
        return "has whitespace before or after it"
    return None


def shown(name: Any) -> str:
    """A name as a one-line message prints it: as written, or quoted with its escapes where it
    holds a control character or whitespace around it (never a second line)."""
    return name if isinstance(name, str) and name and name_problem(name) is None else repr(name)


def build(cls: type, raw: dict, where: str, fail: Fail) -> Any:
    """Check a raw mapping against the section ``cls``; ``where`` prefixes every key named
    (``""`` or e.g. ``"cells[0]."``). Returns the section with every key filled."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in raw:
        if name not in fields:
            close = difflib.get_close_matches(str(name), list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; expected one of: {', '.join(fields)}"
            raise fail(f"{where}{shown(name)}: unknown key{hint}")
    hints = typing.get_type_hints(cls, include_extras=True)
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in raw or (raw[name] is None and has_default(f)):  # null means the default
            if not has_default(f):
                raise fail(f"{where}{name}: missing; expected {expect(hints[name])}")
            values[name] = default_of(f)
            continue
        values[name] = check_value(hints[name], raw[name], f"{where}{name}", fail, f.metadata["bound"])
    return cls(**values)


def expect(tp: Any) -> str:
    """What a type hint expects, as the messages say it."""
    if get_origin(tp) is Annotated:
        return _kind(tp).expect
    if get_origin(tp) in (typing.Union, types.UnionType):
        return expect(_inner(tp))
    return _EXPECT[tp]


_EXPECT = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def check_value(tp: Any, value: Any, name: str, fail: Fail, bound: Bound = None) -> Any:
    """``value`` checked against the type hint ``tp`` (and ``bound``, for numbers)."""
    if get_origin(tp) is Annotated:
        return _kind(tp).check(value, name, fail, bound)
    if get_origin(tp) in (typing.Union, types.UnionType):
        return None if value is None else check_value(_inner(tp), value, name, fail, bound)

    def bad(extra: str = "") -> SweepError:
        return fail(f"{name}: expected {_EXPECT[tp]}{extra}, got {value!r}")

    if tp is int:  # a float (2.5, even 60.0) or a bool is a type error, not rounded
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return check_bound(value, bound, name, fail)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise bad(" (finite)")
        return check_bound(value, bound, name, fail)
    if tp is str:
        if not isinstance(value, str) or not value.strip():
            raise bad()
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise bad()
        return value
    raise TypeError(f"unsupported sweep config type {tp} for {name}")


def check_bound(value: Any, bound: Bound, name: str, fail: Fail) -> Any:
    if bound is not None and bound[0] is not None:
        low, exclusive = bound
        if value < low or (exclusive and value == low):
            raise fail(f"{name}: expected a value {'>' if exclusive else '>='} {low}, got {value!r}")
    return value


def check_choice(section: Any, name: str, where: str, fail: Fail) -> None:
    """The key's value is one of its declared ``choices``."""
    choices = _field(type(section), name).metadata["choices"]
    value = getattr(section, name)
    if value not in choices:
        raise fail(f"{where}{name}: expected one of {', '.join(choices)}, got {value!r}")


def labels(cls: type) -> list[str]:
    """The section's keys as a message lists them: ``axis (batch_size or seq_len)`` for a key
    with choices."""
    return [
        f"{f.name} ({' or '.join(f.metadata['choices'])})" if f.metadata["choices"] else f.name
        for f in dataclasses.fields(cls)
    ]


def _field(cls: type, name: str) -> dataclasses.Field:
    return {f.name: f for f in dataclasses.fields(cls)}[name]


def _kind(tp: Any) -> Kind:
    (kind,) = [m for m in tp.__metadata__ if isinstance(m, Kind)]
    return kind


def _inner(tp: Any) -> Any:
    (inner,) = [a for a in get_args(tp) if a is not type(None)]
    return inner
