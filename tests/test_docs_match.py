"""The docs say what the code does. docs/columns.md, the reference of every CSV column, is generated
from the column registry (bench/results/columns.py): a column added to (or renamed in) the registry
without `make golden` (or `python -m bench.results.columns_doc`) fails here, and so does a verdict
the code can write that it does not name (issue: the documented lists had drifted, when they were
written by hand in docs/reference.md, which now links to columns.md). So is the sweep directory's
layout in docs/reference.md and docs/run-contract.md: the files the report writes (columns.py's
REPORT_FILES and OPTIONAL_REPORT_FILES) and the sweep's own (bench/run/sweepdir.py's SWEEP_ENTRIES)."""

from __future__ import annotations

import re

import pytest

from bench.results.columns import OPTIONAL_REPORT_FILES, REPORT_FILES, TABLES
from bench.results.columns_doc import render
from bench.run.sweepdir import AGGREGATE_OUTPUTS, SWEEP_ENTRIES
from tests.helpers import REPO

README = (REPO / "docs" / "reference.md").read_text()  # the README's reference part
COLUMNS_MD = REPO / "docs" / "columns.md"


def test_docs_columns_md_is_generated_from_the_registry():
    assert COLUMNS_MD.read_text() == render(), (
        "docs/columns.md is not the registry's: run `python -m bench.results.columns_doc` (or `make golden`)"
    )


def test_docs_columns_md_has_every_csv_and_the_reference_links_it():
    text = COLUMNS_MD.read_text()
    assert [line[3:] for line in text.splitlines() if line.startswith("## ")] == list(TABLES)
    results = README[README.index("## Results and CSV columns") :]
    assert "](columns.md)" in results[: results.index("\n## ")]
    # the column lists are no longer written by hand there
    assert "**runs.csv** (one row per run)" not in README and "`source_saved_ms_per_step`" not in README


def test_the_verdicts_the_code_writes_are_documented():
    text = COLUMNS_MD.read_text()
    for verdict in (
        "faster",
        "slower",
        "within ±",
        "inconclusive",
        "too few pairs",
        "n/a (no ok runs)",
        "n/a (no VRAM data)",
    ):
        assert verdict in text, verdict


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
