"""A sweep's own arms (its ``user_arms`` key): each checked against bench/arms.py's built-in arms
and made an :class:`~bench.arms.Arm` with the trainer's keys it sets; then every name in ``arms``
is a built-in arm or one of them. Whether a cell's trainer may take the keys is asked of its
reader, by bench/config/loader.py (``refuse_arm_key``)."""

from __future__ import annotations

import re

import bench.config.typed as typed
from bench.arms import ARM_NAMES, ARMS, USER_ARM_NAME, Arm, user_arm
from bench.config.schema import SweepKeys, UserArmKeys
from bench.config.typed import Fail

_USER_ARM_RE = re.compile(USER_ARM_NAME)


def user_arms(top: SweepKeys, fail: Fail) -> dict[str, Arm]:
    """The sweep's own arms (user_arms), each a name no built-in arm has, a one-line doc and a
    non-empty ``set:``; then every name in ``arms`` is a built-in arm or one of them."""
    user: dict[str, Arm] = {}
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
        if not keys.set:
            raise fail(f"{where}.set: empty; expected the trainer's dotted keys the arm sets")
        user[name] = user_arm(name, keys.doc.strip(), keys.set)
    for a in top.arms:
        if a not in ARMS and a not in user:
            declared = f", or user_arms ({', '.join(user)})" if user else ", or one declared in user_arms"
            raise fail(f"arms: unknown arm {a!r}; expected arms from {', '.join(ARM_NAMES)}{declared}")
    return user
