"""Formatting numbers and Markdown for reports and console output: the one place that
turns a value (possibly missing, NaN or not numeric) into text."""

from __future__ import annotations

import math
from typing import Any

DASH = "—"  # what a missing value reads as


def num(x: Any, default: float = math.nan) -> float:
    """``float(x)``, or ``default`` (NaN) when x is missing or not a number."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return default


def isnan(x: Any) -> bool:
    return math.isnan(num(x))


# A fixed-point number this large (13 digits and more: no measurement of the suite), or a signed
# one (a Δ: "+.1f") this large (a Δ of a million percent), is printed in scientific notation, never
# as hundreds of digits (the ratio of a damaged record).
HUGE, HUGE_DELTA = 1e12, 1e6


def f(x: Any, spec: str) -> str:
    """A number formatted with ``spec``, or an em dash when missing; a fixed-point spec (``f``,
    ``%``) whose number reaches HUGE (HUGE_DELTA where the spec shows a sign) gives scientific
    notation with the same sign and precision: ``f(5e101, "+.1f")`` is ``+5.0e+101``,
    ``f(3e12, ".0%")`` is ``3e+14%``."""
    if isnan(x):
        return DASH
    v, kind = float(x), spec[-1:]
    huge = HUGE_DELTA if spec.startswith("+") else HUGE
    if kind in ("f", "F", "%") and math.isfinite(v) and abs(v * (100 if kind == "%" else 1)) >= huge:
        sci = spec[:-1].replace(",", "").replace("_", "") + "e"
        return format(v * 100, sci) + "%" if kind == "%" else format(v, sci)
    return format(v, spec)


def integer(x: Any) -> str:
    return DASH if isnan(x) else str(int(float(x)))


def pct(x: Any) -> str:
    """A fraction as a whole percentage (0.42 -> 42%), or an em dash."""
    return f(x, ".0%")


def md(x: Any) -> str:
    """Text safe inside a Markdown table cell."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return DASH
    return str(x).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines."""
    head = "| " + " | ".join(h.replace("|", "\\|") for h in header) + " |"
    return [head, "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]
