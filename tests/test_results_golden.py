"""The fixture sweeps rebuild byte for byte, and a committed sweep's raw archive gives back its records.

tests/data/sweeps/ holds four small sweeps measured on lent GPUs, chosen to cover the report's
branches: contrasts and many arms (h200-options), training parity and two trainers
(h200-specforge-parity), lockstep pairs of the SpecForge CLI with each run's own memory and energy
(h100-specforge-memory-lockstep), a capacity search with one-sided OOMs (h200-capacity). Each is
its raw records (raw.tar.xz, as `bench raw pack` writes them), its sweep.json and what `bench
report` wrote from them. Unpacking and rebuilding in a tmp directory must give the same bytes, so
a change to bench/results/ that moves a number, a column, a verdict or a line of report.md fails
here; `make golden` writes them again when the change is meant (about ten files). The committed
sweeps under results/ are published faces stamped with the commit that built them: `make
verify-results` rebuilds them from their archives and names the ones a later change moved.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from bench.errors import SweepError
from bench.results import plots, rawdata, report
from bench.results.report import build_report

REPO = Path(__file__).resolve().parent.parent
FIXTURES = sorted(p.parent for p in (REPO / "tests" / "data" / "sweeps").glob(f"*/{rawdata.RAW}"))
COMPARED = rawdata.FACE  # what build_report writes besides plots; compared wherever the fixture holds one


def test_the_fixtures_cover_the_reports_branches():
    names = {p.name for p in FIXTURES}
    assert names == {
        "h200-options",
        "h200-specforge-parity",
        "h100-specforge-memory-lockstep",
        "h200-capacity",
    }
    have = {name: {f for f in COMPARED if (REPO / "tests/data/sweeps" / name / f).exists()} for name in names}
    assert "contrasts.csv" in have["h200-options"] and "training_parity.csv" in have["h200-specforge-parity"]
    assert "trainers.csv" in have["h200-specforge-parity"] and "capacity.csv" in have["h200-capacity"]
    assert "OOM" in (REPO / "tests/data/sweeps/h200-capacity/report.md").read_text()
    assert (
        "over own turns"
        in (REPO / "tests/data/sweeps/h100-specforge-memory-lockstep/summary.csv").read_text()
    )


@pytest.fixture
def no_plots(no_plots, plots_on, monkeypatch):
    """conftest's no_plots, and the plots only some sweeps have."""
    for name in ("plot_scaling", "plot_capacity"):
        monkeypatch.setattr(plots, name, lambda *args, **kw: Path(args[-1]))
    monkeypatch.setattr(report, "plot_training_parity", lambda *args, **kw: Path(args[-1]))


def unpacked(fixture: Path, tmp_path: Path) -> Path:
    """A copy of the fixture with its raw records unpacked and nothing else the report writes."""
    return rawdata.unpacked_copy(fixture, tmp_path / fixture.name)


@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.name for p in FIXTURES])
def test_a_fixture_sweep_rebuilds_byte_for_byte(fixture: Path, tmp_path: Path, no_plots):
    rebuilt = unpacked(fixture, tmp_path)
    build_report(rebuilt)
    committed = [name for name in COMPARED if (fixture / name).exists()]
    assert {"runs.csv", "summary.csv"} <= set(committed)
    differ = [name for name in committed if (rebuilt / name).read_bytes() != (fixture / name).read_bytes()]
    assert not differ, f"{fixture.name}: rebuilt {', '.join(differ)} differ (`make golden` if meant)"
    extra = [name for name in COMPARED if (rebuilt / name).exists() and not (fixture / name).exists()]
    assert not extra, f"{fixture.name}: the rebuild wrote {', '.join(extra)}, which the fixture does not hold"


def test_packing_is_reproducible_and_unpacking_gives_the_records_back(tmp_path):
    first = unpacked(REPO / "tests/data/sweeps/h200-capacity", tmp_path)
    files = {p.relative_to(first): p.read_bytes() for p in sorted(first.rglob("*")) if p.is_file()}
    (first / "vram_per_card.png").write_bytes(b"drawn from the records")
    (first / rawdata.RAW).unlink()
    doc = rawdata.pack(first, "abc")
    again = (first / rawdata.RAW).read_bytes()
    assert hashlib.sha256(again).hexdigest() == doc["sha256"]
    # the same records give the same archive as the one committed (fixed order, times and owners)
    assert again == (REPO / "tests/data/sweeps/h200-capacity" / rawdata.RAW).read_bytes()
    assert not (first / "runs").exists() and not (first / "vram_per_card.png").exists()
    assert rawdata.unpack(first) == ["runs"]
    back = {p.relative_to(first): p.read_bytes() for p in sorted(first.rglob("*")) if p.is_file()}
    assert {k: v for k, v in back.items() if k.parts[0] == "runs"} == {
        k: v for k, v in files.items() if k.parts[0] == "runs"
    }


def test_a_damaged_archive_or_one_already_unpacked_is_refused_in_one_line(tmp_path):
    sweep = unpacked(REPO / "tests/data/sweeps/h200-capacity", tmp_path)
    with pytest.raises(SweepError, match=r"runs already there; nothing unpacked"):
        rawdata.unpack(sweep)
    shutil.rmtree(sweep / "runs")
    data = bytearray((sweep / rawdata.RAW).read_bytes())
    data[100] ^= 0xFF
    (sweep / rawdata.RAW).write_bytes(bytes(data))
    with pytest.raises(SweepError, match=r"not the archive raw.json describes"):
        rawdata.unpack(sweep)
    assert not (sweep / "runs").exists()


def test_every_committed_sweep_is_published_without_its_raw_records():
    """results/<sweep>/ holds its face and one archive, never runs/ itself (make verify-results
    rebuilds them)."""
    sweeps = sorted(p.parent for p in (REPO / "results").glob("*/sweep.json"))
    assert len(sweeps) > 30
    for sweep in sweeps:
        assert not (sweep / "runs").exists(), (
            f"{sweep.name}: runs/ committed; `python -m bench raw pack {sweep}`"
        )
        assert (sweep / rawdata.RAW).is_file() and (sweep / rawdata.RAW_JSON).is_file(), sweep.name
        assert not [f for f in rawdata.RECORD_FIGURES if (sweep / f).exists()], sweep.name
