"""docs/columns.md, generated from the column registry (bench/results/columns.py): one table per CSV
(column, type, unit, meaning). ``python -m bench.results.columns_doc [PATH]`` writes it (default
docs/columns.md, from the checkout's root; `make golden` runs it); tests/test_docs_match.py fails
while the committed file differs from ``render()``."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.results.columns import TABLES
from bench.results.columns_spec import TYPES, Column, Table

DEFAULT_PATH = Path("docs") / "columns.md"
_TYPES = ", ".join(f"`{t}`" for t in TYPES)
_INDEX = " · ".join(f"[{name}](#{name.replace('.', '')})" for name in TABLES)
_INTRO = f"""\
# CSV columns

<!-- Generated from the column registry (bench/results/columns.py) by `python -m bench.results.columns_doc`
(`make golden` runs it); edit the registry, not this file. tests/test_docs_match.py checks it. -->

Every column of every CSV the suite writes, in the order it is written (what else a sweep directory
holds: [reference.md](reference.md#results-and-csv-columns)). A blank cell is a value the row does
not have; numbers are written to 6 significant digits.

Types: {_TYPES} (`true`/`false` in runs.csv, `True`/`False` elsewhere). Units are in the names too:
`_s` seconds, `_ms` milliseconds, `_gib` GiB (2³⁰ bytes), `_pct` percent, `per_s` per second, `_mhz`,
`_c` (°C), `_w` (W), `_j` (J).

{_INDEX}
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(c: Column) -> str:
    return f"| `{c.name}` | {c.type} | {_cell(c.unit)} | {_cell(c.text)} |"


def _table(t: Table) -> list[str]:
    rows = t.rows[0].upper() + t.rows[1:] + "."
    return [f"## {t.file}", "", rows, "", "| column | type | unit | meaning |", "|---|---|---|---|"] + [
        _row(c) for c in t.columns
    ]


def render() -> str:
    """docs/columns.md's text."""
    lines = [_INTRO]
    for t in TABLES.values():
        lines += [*_table(t), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT_PATH
    path.write_text(render())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
