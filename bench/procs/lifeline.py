"""A run's lifeline to the driver: a child process that dies when the driver dies (Linux
``prctl(PR_SET_PDEATHSIG)``), whether it was started as a new interpreter or forked from the
warm fork server."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(parent: int, prctl=None) -> None:
    """In a child: get SIGTERM when the parent dies (Linux prctl PR_SET_PDEATHSIG); SIGKILL
    itself now if the parent is already gone (it died before prctl took effect)."""
    prctl = prctl or _prctl()
    if prctl is not None:
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)


def die_with_parent_fn() -> Callable[[], None] | None:
    """A preexec_fn making the child get SIGTERM when the driver dies."""
    prctl = _prctl()  # resolved here: the preexec_fn runs in the forked child, no imports, no locks
    if prctl is None:
        return None
    parent = os.getpid()
    return lambda: die_with_parent(parent, prctl)
