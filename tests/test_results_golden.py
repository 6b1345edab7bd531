"""The committed sweeps rebuild byte for byte: every results/*/ with a runs/ folder.

Their CSVs and report.md were written by ``bench report`` (bench.results.report.build_report);
rebuilding them here from the committed run directories must give the same bytes, so a change to
bench/results/ that moves a number, a column, a verdict or a line of report.md fails here. The
rebuild runs in-process into a tmp directory (runs/ is a symlink to the committed one, which
build_report only reads; the plots are stubbed out: slow, and not byte-stable across matplotlib
versions); nothing is written into results/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.results import plots, report
from bench.results.report import build_report

REPO = Path(__file__).resolve().parent.parent
SWEEPS = sorted(p.parent for p in (REPO / "results").glob("*/runs") if p.is_dir())
# What build_report writes besides plots; compared wherever the sweep committed one.
COMPARED = [
    "runs.csv",
    "summary.csv",
    "summary.json",
    "loss_parity.csv",
    "vram_per_card.csv",
    "contrasts.csv",
    "scaling.csv",
    "capacity.csv",
    "trainers.csv",
    "training_parity.csv",
    "manifest.json",
    "report.md",
]


def test_the_committed_sweeps_are_all_here():
    names = {p.name for p in SWEEPS}
    assert {"h200", "h200-arms", "h200-capacity", "h200-capacity-seq", "h200-compile", "h200-noise"} <= names
    assert {"h200-options", "h200-specforge", "h200x2-2node", "h200x2-scaling"} <= names


@pytest.fixture
def no_plots(no_plots, plots_on, monkeypatch):
    """conftest's no_plots, and the plots only some sweeps have."""
    for name in ("plot_scaling", "plot_capacity"):
        monkeypatch.setattr(plots, name, lambda *args, **kw: Path(args[-1]))
    monkeypatch.setattr(report, "plot_training_parity", lambda *args, **kw: Path(args[-1]))


@pytest.mark.parametrize("sweep", SWEEPS, ids=[p.name for p in SWEEPS])
def test_a_committed_sweep_rebuilds_byte_for_byte(sweep: Path, tmp_path: Path, no_plots):
    rebuilt = tmp_path / sweep.name
    rebuilt.mkdir()
    (rebuilt / "runs").symlink_to(sweep / "runs", target_is_directory=True)
    if (sweep / "sweep.json").exists():
        shutil.copyfile(sweep / "sweep.json", rebuilt / "sweep.json")
    build_report(rebuilt)
    committed = [name for name in COMPARED if (sweep / name).exists()]
    assert {"runs.csv", "summary.csv"} <= set(committed)
    differ = [name for name in committed if (rebuilt / name).read_bytes() != (sweep / name).read_bytes()]
    assert not differ, f"{sweep.name}: rebuilt {', '.join(differ)} differ from the committed files"
    extra = [name for name in COMPARED if (rebuilt / name).exists() and not (sweep / name).exists()]
    assert not extra, f"{sweep.name}: the rebuild wrote {', '.join(extra)}, which the sweep did not commit"
