from pathlib import Path

import pytest

from tests.helpers import CONFIGS, run_cli


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> Path:
    """An offline cache for the tiny profile, prepared once per test session."""
    out = tmp_path_factory.mktemp("cache") / "tiny"
    r = run_cli("specforge", "prepare", str(CONFIGS / "train/tiny-offline.yaml"), "--output-dir", str(out))
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture
def no_plots(monkeypatch):
    """build_report without drawing: every PNG the report draws becomes a no-op returning its path
    (tests of the tables run faster; tests of the figures draw them)."""
    from bench.results import plots, report, runplots

    def skip(*args, **kw):
        return Path(args[1] if len(args) > 1 else kw["path"])

    for module, name in ((plots, "plot_throughput"), (plots, "plot_vram_per_card"), (runplots, "plot_loss_curves"),
                         (runplots, "plot_step_time_dist"), (report, "plot_forest")):  # fmt: skip
        monkeypatch.setattr(module, name, skip)
