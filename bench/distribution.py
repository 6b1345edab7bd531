"""The suite as a distribution: its version, whether it runs from a checkout, where the configs
it ships are (sweep configs, training configs, profiles), and where our trainer runs from.

``bench/shipped/`` holds two links in a checkout, ``configs -> ../../configs`` and ``specforge ->
../../specforge``; the wheel holds copies of both there (package data), laid out as a checkout
is. A checkout reads its top-level ``configs/`` (the link resolves there) and runs its own
``specforge/``; an installed copy reads and runs the shipped ones. ``bench/shipped`` is never on
``sys.path`` of the user's Python: only our trainer's runs get it (isolation.embedded_env), so
the shipped ``specforge`` cannot shadow the user's. Nothing here imports torch.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

DIST = "dflash-liger-bench"
# Our trainer: its plug's name (a cell.json without "trainer", recorded before a sweep could name
# another plug, reads as it) and the module its runs start (python -m specforge).
DEFAULT_TRAINER = "embedded"
OUR_TRAINER_MODULE = "specforge"
# The folder holding bench/ and specforge/. When the suite is installed rather than run from a
# checkout, this is the site-packages folder holding bench/: then there is no trainer of ours
# (and a specforge/ beside bench/ is the user's), which IS_CHECKOUT tells apart.
CHECKOUT = Path(__file__).resolve().parents[1]
IS_CHECKOUT = (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / "specforge" / "train.py").is_file()
SHIPPED = Path(__file__).resolve().parent / "shipped"
# A checkout reads its own folders (also when cloned without symlinks: then the links are not
# folders); an installed copy the shipped ones.
CONFIGS = CHECKOUT / "configs" if IS_CHECKOUT else SHIPPED / "configs"
PROFILES = CONFIGS / "profiles"
# The folder to put on PYTHONPATH for our trainer's runs (it holds specforge/), or None when
# there is none: an installed copy built without it.
TRAINER_ROOT = (
    CHECKOUT if IS_CHECKOUT else SHIPPED if (SHIPPED / "specforge" / "train.py").is_file() else None
)
TRAIN_EXTRA = "pip install '.[train]'"
TRAIN_PACKAGES = ("torch", "transformers", "safetensors", "psutil")  # what the train extra brings


def version() -> str:
    """The version of the code that runs: a checkout's pyproject.toml (an editable install's
    metadata may be older), else the installed distribution's metadata."""
    if IS_CHECKOUT:
        m = re.search(r'(?m)^version\s*=\s*"([^"]+)"', (CHECKOUT / "pyproject.toml").read_text())
        if m:
            return m.group(1)
    try:
        return importlib.metadata.version(DIST)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def version_line() -> str:
    """``bench --version``: the distribution and its version, and the checkout it runs from."""
    where = f" (checkout {CHECKOUT})" if IS_CHECKOUT else ""
    return f"{DIST} {version()}{where}"


def sweep_config(given: str) -> str:
    """A sweep config as given, or a shipped one named by its name (``cpu``, ``h200.yaml``) when
    ``given`` is no file here; unchanged otherwise (the loader then says it does not exist)."""
    if Path(given).exists() or "/" in given or not given:
        return given
    for name in (given, f"{given}.yaml"):
        if (CONFIGS / name).is_file():
            return str(CONFIGS / name)
    return given
