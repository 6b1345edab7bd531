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
