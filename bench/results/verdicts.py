"""Verdicts as values: what each verdict the statistics reach says, as an enum member, and the
one place that reads a verdict's words back into it.

The producers write words into summary.csv, contrasts.csv, loss_parity.csv and
training_parity.csv (bench/results/stats.py, deltas.py, parity.py, training_parity.py), and
compare reads those files back; everything that acts on a verdict (the gates, the forest's
colours, the report's flags, the PR Summary) asks :func:`speed_kind` or :func:`parity_kind` here
and compares members, never prefixes of its own. A new verdict word is one member and its
prefix below, beside the producer that writes it.
"""

from __future__ import annotations

from enum import Enum
from typing import Any


class Speed(Enum):
    """What a Δ's verdict says (speed, memory or a contrast's), by the words it starts with."""

    FASTER = "faster"
    SLOWER = "slower"
    HEAVIER = "heavier"
    LEANER = "leaner"
    WITHIN = "within ±"
    INCONCLUSIVE = "inconclusive"
    TOO_FEW = "too few pairs"
    NOT_AVAILABLE = "n/a"
    AA_PASSED = "A/A check passed"
    AA_TOO_NOISY = "A/A check not passed: this machine is too noisy"
    AA_NOT_PASSED = "A/A check not passed"
    AA_FAILED = "A/A check FAILED"
    OOM = "OOM"  # one arm or both ran out of memory (deltas._one_sided): "liger fits, baseline OOM"
    NOT_IN_EFFECT = "arm not in effect"  # a run's model lacked its arm's kernels (deltas.not_in_effect)
    # a run of the arm or of its reference recorded nothing of whether the arm took effect
    # (deltas.not_proven): the Δ is shown, no verdict is drawn from it
    NOT_PROVEN = "effect not recorded"


# Checked in this order: the longer of two prefixes first.
_SPEED_ORDER = [Speed.AA_TOO_NOISY, *(k for k in Speed if k not in (Speed.AA_TOO_NOISY, Speed.OOM))]
DECIDED = frozenset({Speed.FASTER, Speed.SLOWER, Speed.WITHIN})  # a Δ whose CI carries a verdict


def speed_kind(text: Any) -> Speed | None:
    """The kind of a written speed or memory verdict; None for none (blank, NaN) or words no
    producer writes."""
    if not isinstance(text, str) or not text:
        return None
    for kind in _SPEED_ORDER:
        if text.startswith(kind.value):
            return kind
    return Speed.OOM if "OOM" in text else None


class Parity(Enum):
    """What a parity verdict says: loss parity (parity.parity_verdict), training parity
    (training_parity.judge) and a compare side's (parity_gate.side_verdict)."""

    PASS = "pass"
    FAIL = "FAIL"
    FLOOR = "floor, not judged"  # aa_eps: the floor itself
    CONTROL = "negative control"  # lr_off: wrong on purpose (training parity says whether it was caught)
    EQUIVALENT = "equivalent"
    NOT_EQUIVALENT = "not equivalent"
    NO_VERDICT = "no verdict"


def parity_kind(text: Any) -> Parity | None:
    """The kind of a written parity verdict; None for none (blank, NaN)."""
    if not isinstance(text, str) or not text:
        return None
    return next((kind for kind in Parity if text.startswith(kind.value)), None)


def parity_failed(text: Any) -> bool:
    """Whether a parity verdict says the arm computes something else (loss parity FAIL, training
    parity not equivalent, a compare side's FAIL)."""
    return parity_kind(text) in (Parity.FAIL, Parity.NOT_EQUIVALENT)
