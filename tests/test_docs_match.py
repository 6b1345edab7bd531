"""The reference's lists of CSV columns and verdicts are the code's (docs/reference.md, which the
README links for them): a column added to (or renamed in) bench/results/columns.py, or a verdict
the code can write, that the reference does not name fails here (issue: the documented lists had
drifted). So is the sweep directory's layout in docs/reference.md and docs/run-contract.md: the files the report writes (columns.py's REPORT_FILES and
OPTIONAL_REPORT_FILES) and the sweep's own (bench/run/sweepdir.py's SWEEP_ENTRIES)."""

from __future__ import annotations

import re

import pytest

from bench.results.columns import (
    LOSS_PARITY_COLUMNS,
    OPTIONAL_REPORT_FILES,
    REPORT_FILES,
    RUNS_COLUMNS,
    SUMMARY_COLUMNS,
)
from bench.run.sweepdir import AGGREGATE_OUTPUTS, SWEEP_ENTRIES
from tests.helpers import REPO

README = (REPO / "docs" / "reference.md").read_text()  # the README's reference part


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


# ---------------------------------------------------------------- the sweep directory's layout

CONTRACT = (REPO / "docs" / "run-contract.md").read_text()
SWEEP_FILES = [*REPORT_FILES, *OPTIONAL_REPORT_FILES, *SWEEP_ENTRIES]
NAMED_FILE = re.compile(r"(?<![\w./<>-])\.?[\w-]+\.(?:csv|png|md|json|lock)\b")


def layouts() -> dict[str, str]:
    """The README's paragraph on `results/<sweep>/` and run-contract.md's Sweep directory block."""
    readme = README[README.index("`results/<sweep>/`:") :]
    contract = CONTRACT[CONTRACT.index("## Sweep directory") :]
    return {
        "docs/reference.md": readme[: readme.index("\n\n")],
        "docs/run-contract.md": contract[: contract.index("\n\n", contract.index("<out>/"))],
    }


def named(entry: str, text: str) -> bool:
    """A file by its name; a directory as ``dir/`` or ``dir/<...>/``."""
    if entry.endswith("/"):
        return re.search(rf"(?<![\w.-]){re.escape(entry)}", text) is not None
    return re.search(rf"(?<![\w./<>-]){re.escape(entry)}(?![\w])", text) is not None


@pytest.mark.parametrize("doc", ["docs/reference.md", "docs/run-contract.md"])
def test_the_documented_layout_is_what_a_sweep_writes(doc):
    """Every file and directory a sweep or its report writes at the top of its directory is in
    the documented layout, and every top-level file named there is one the code writes."""
    text = layouts()[doc]
    missing = [e for e in SWEEP_FILES if not named(e, text)]
    assert missing == [], f"{doc}'s sweep layout does not name: {missing}"
    top_level = {e for e in SWEEP_FILES if not e.endswith("/")}
    run_files = {"cell.json", "run.json", "metrics.jsonl", "stdout.log", "launch.json", "vram.json"}
    extra = sorted(set(NAMED_FILE.findall(text)) - top_level - run_files)
    assert extra == [], f"{doc}'s sweep layout names files the code does not write at the top: {extra}"


def test_the_report_writes_its_declared_files(tmp_path, no_plots, plots_on):
    """bench report writes exactly REPORT_FILES for a sweep without contrasts, scaling, capacity
    or a second trainer; its clean-up of an earlier build's optional files is the same list."""
    from bench.results import report
    from tests.test_aggregate import write_run

    for arm in ("baseline", "liger"):
        write_run(tmp_path, arm, 0, [1.0] * 4)
    written = report.build_report(tmp_path)["paths"]
    assert sorted(written) == sorted(REPORT_FILES)
    assert sorted(report.OPTIONAL_FILES) == sorted(OPTIONAL_REPORT_FILES)
    assert sorted(AGGREGATE_OUTPUTS) == sorted(REPORT_FILES + OPTIONAL_REPORT_FILES)  # what --force deletes
