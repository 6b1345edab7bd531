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


def f(x: Any, spec: str) -> str:
    """A number formatted with ``spec``, or an em dash when missing."""
    return DASH if isnan(x) else format(float(x), spec)


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
