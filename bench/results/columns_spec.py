"""The column registry's two types: a Column (one CSV column: name, type, unit, meaning, and for
summary.csv's plain aggregates the rule that computes it) and a Table (one CSV file: its columns in
order). The declarations are in bench/results/columns_runs.py, columns_summary.py and
columns_other.py; bench/results/columns.py gathers them (how to add a column: its docstring)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# A column's type, as docs/columns.md prints it. runs.csv parses every column of a numeric type as a
# number (blank: NaN) and keeps the others as text (RUNS_TEXT_COLUMNS); a boolean is written as
# true/false (runs.csv's) or True/False (the other tables').
TEXT, INT, FLOAT, BOOL = "text", "integer", "number", "boolean"
TYPES = (TEXT, INT, FLOAT, BOOL)
# How a summary.csv column aggregates its runs.csv column (``of``) over an arm's runs in the
# statistics (bench.results.records.in_statistics): the pandas method of that name, NaN skipped.
HOWS = ("mean", "median", "max")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Column:
    """One CSV column. ``unit``: "" when it has none (text, counts, ratios of like to like).
    ``of``/``how``: a summary.csv column that is ``how`` (HOWS) of runs.csv's column ``of`` over
    the arm's runs in the statistics; bench.results.tables.summary_table computes it from this
    declaration alone, and its meaning may then be empty (the rule is the meaning)."""

    name: str
    type: str
    unit: str
    meaning: str
    of: str | None = None
    how: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"column {self.name!r}: not a lower-case identifier")
        if self.type not in TYPES:
            raise ValueError(f"column {self.name}: type {self.type!r} is not one of {TYPES}")
        if (self.of is None) != (self.how is None) or (self.how is not None and self.how not in HOWS):
            raise ValueError(f"column {self.name}: `of` and `how` go together, how one of {HOWS}")
        if not (self.meaning.strip() or self.of):
            raise ValueError(f"column {self.name}: no meaning")

    @property
    def numeric(self) -> bool:
        return self.type in (INT, FLOAT)

    @property
    def text(self) -> str:
        """The meaning as docs/columns.md prints it: the aggregation rule first, where there is one."""
        if self.of is None:
            return self.meaning
        rule = f"{self.how} of runs.csv's `{self.of}` over the arm's runs in the statistics"
        return f"{rule}: {self.meaning}" if self.meaning else rule


@dataclass(frozen=True)
class Table:
    """One CSV file the suite writes: its name, what one row is (and when the file is written),
    its columns in the order they are written."""

    file: str
    rows: str
    columns: tuple[Column, ...]

    def __post_init__(self) -> None:
        names = self.names
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"{self.file}: columns declared twice: {dupes}")

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)
