"""The README's lists of CSV columns and verdicts are the code's: a column added to (or renamed
in) bench/results/columns.py, or a verdict the code can write, that the README does not name
fails here (issue: the documented lists had drifted)."""

from __future__ import annotations

import re

import pytest

from bench.results.columns import LOSS_PARITY_COLUMNS, RUNS_COLUMNS, SUMMARY_COLUMNS
from tests.helpers import REPO

README = (REPO / "README.md").read_text()


def paragraph(title: str) -> str:
    """The README's ``**<title>**`` paragraph, up to the next bold title."""
    start = README.index(f"**{title}**")
    nxt = README.find("\n\n**", start + 1)
    return README[start : nxt if nxt > 0 else None]


def documented(name: str, text: str) -> bool:
    """A column is named as itself, as ``stem_{a,b,c}``, or as a ``(+ _ci95_low/_high)`` or
    ``(+ CI)`` variant of its base column."""
    if re.search(rf"(?<![\w{{]){re.escape(name)}(?![\w}}])", text):
        return True
    stem, _, last = name.rpartition("_")
    for group in re.findall(rf"{re.escape(stem)}_\{{([\w,]+)\}}", text):
        if last in group.split(","):
            return True
    for suffix in ("_ci95_low", "_ci95_high"):
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            if documented(base, text) and re.search(
                rf"{re.escape(base)}`?\s*\(\+\s*(`?_ci95_low/_high|CI)", text
            ):
                return True
    return False


@pytest.mark.parametrize(
    "title, columns",
    [("runs.csv", RUNS_COLUMNS), ("summary.csv", SUMMARY_COLUMNS), ("loss_parity.csv", LOSS_PARITY_COLUMNS)],
)
def test_every_column_of_the_code_is_in_the_readme(title, columns):
    text = paragraph(title)
    missing = [c for c in columns if not documented(c, text)]
    assert missing == [], f"README's {title} paragraph does not name: {missing}"


def test_the_verdicts_the_code_writes_are_documented():
    for verdict in (
        "faster",
        "slower",
        "within ±",
        "inconclusive",
        "too few pairs",
        "n/a (no ok runs)",
        "n/a (no VRAM data)",
    ):
        assert verdict in README, verdict
