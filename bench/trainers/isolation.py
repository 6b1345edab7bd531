"""Which ``specforge`` a run imports. Our trainer (``specforge/`` in this checkout) and upstream
SpecForge (PyPI ``specforge``) share one import name, so neither may find the other's:

- runs of OUR trainer get its folder on PYTHONPATH (``embedded_env``): the checkout, or in an
  installed copy ``bench/shipped`` (bench.distribution.TRAINER_ROOT). Ours is never a top-level
  package of site-packages, and ``python -m specforge`` must find it from any working directory;
- runs of the USER's SpecForge get ``isolated_env``: PYTHONSAFEPATH=1 (Python >= 3.11: the
  working directory and the script's folder are not put on ``sys.path``, so a run started from
  this checkout's root cannot pick up ours; SpecForge's own worker processes inherit it) and a
  PYTHONPATH without our trainer's folder. ``which_specforge`` checks an interpreter under that
  environment before a sweep launches anything there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.distribution import TRAINER_ROOT
from bench.errors import SweepError

PROBE_TIMEOUT_S = 60.0

# Run by the user's interpreter: facts about its specforge, printed as one JSON object. It imports
# `specforge` (its __init__) but not specforge.cli, nor torch: versions come from the metadata.
PROBE = """
import importlib.metadata as md, importlib.util, json, sys

def version(*dists):
    for dist in dists:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            pass
    return None

facts = {"python": sys.version.split()[0], "executable": sys.executable, "file": None, "cli": False}
try:
    spec = importlib.util.find_spec("specforge")
    facts["file"] = spec and spec.origin
    facts["cli"] = bool(spec) and importlib.util.find_spec("specforge.cli") is not None
except Exception as e:  # a specforge that fails on import
    facts["error"] = f"{type(e).__name__}: {e}"
facts["version"] = version("specforge")
for name, dists in {"torch": ["torch"], "transformers": ["transformers"],
                    "triton": ["triton", "pytorch-triton-rocm"], "liger_kernel": ["liger-kernel"]}.items():
    facts[name] = version(*dists)
print(json.dumps(facts))
"""


def embedded_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a run of our trainer: its folder (the checkout, or an installed copy's
    bench/shipped) first on PYTHONPATH (once; empty entries, the run's working directory, dropped)."""
    out = dict(env)
    if TRAINER_ROOT is not None:  # an installed copy built without our trainer has none to add
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and _resolve(p) != TRAINER_ROOT]
        out["PYTHONPATH"] = os.pathsep.join([str(TRAINER_ROOT), *rest])
    return out


def isolated_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a run of the user's SpecForge: PYTHONSAFEPATH=1, and PYTHONPATH without any entry
    in this checkout (without PYTHONPATH when none is left). Empty entries go too: they stand for
    the run's working directory."""
    out = {**env, "PYTHONSAFEPATH": "1"}
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not _in_trainer_root(p)]
    out.pop("PYTHONPATH", None)
    if kept:
        out["PYTHONPATH"] = os.pathsep.join(kept)
    return out


def which_specforge(python: str, env: Mapping[str, str]) -> dict[str, Any]:
    """Facts about the ``specforge`` that ``python`` imports under ``isolated_env(env)``: ``file``
    (its module file), ``version``, the ``torch``, ``transformers``, ``triton`` and
    ``liger_kernel`` versions (None when absent), ``python`` (its version) and ``executable``.
    Raises SweepError (one line) unless that is upstream SpecForge (not this checkout's trainer)."""
    facts = _probe(_interpreter(python, env), isolated_env(env))
    where = f"{python} (Python {facts['python']})"
    if tuple(int(x) for x in facts["python"].split(".")[:2]) < (3, 11):
        raise SweepError(f"{where}: SpecForge runs on Python >= 3.11 (PYTHONSAFEPATH); name a newer one")
    if facts.get("error"):
        raise SweepError(f"{where} fails to import specforge: {facts['error']}; fix that environment first")
    if not facts["file"]:
        raise SweepError(
            f"{where} cannot import specforge: install SpecForge there (pip install specforge), "
            "or name the python of the environment that has it (`make specforge-env` builds one)"
        )
    if ours(facts["file"]):
        raise SweepError(
            f"{where} imports this checkout's specforge ({facts['file']}), not upstream SpecForge: "
            "install SpecForge in that environment, or name the python of one that has it"
        )
    if not facts["cli"]:
        raise SweepError(
            f"{where} imports a specforge without specforge.cli ({facts['file']}): not upstream "
            "SpecForge; install it there (pip install specforge) or name another python"
        )
    del facts["cli"]
    return facts


def _interpreter(python: str, env: Mapping[str, str]) -> str:
    """``python`` as a path to an executable (a bare name is looked up on env's PATH)."""
    found = shutil.which(python, path=env.get("PATH")) if os.sep not in python else python
    hint = "name the python of your SpecForge environment (e.g. /path/to/venv/bin/python)"
    if not found or not Path(found).exists():
        raise SweepError(f"no Python interpreter at {python}: {hint}")
    if Path(found).is_dir() or not os.access(found, os.X_OK):
        raise SweepError(f"{python} is not an executable file: {hint}")
    return found


def _probe(python: str, env: dict[str, str]) -> dict[str, Any]:
    """PROBE's facts from ``python``; a one-line SweepError when it does not answer them."""
    try:
        r = subprocess.run(
            [python, "-c", PROBE],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",  # output that is not UTF-8 must not raise UnicodeDecodeError
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise SweepError(f"{python} did not answer within {PROBE_TIMEOUT_S:g} s: is it a Python?") from None
    except OSError as e:
        raise SweepError(f"cannot run {python}: {e.strerror or e}; name a Python interpreter") from None
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        last = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        raise SweepError(f"{python} could not run the specforge probe ({last}): is it a Python?") from None


def _resolve(entry: str) -> Path:
    return Path(entry).expanduser().resolve()


def _in_trainer_root(entry: str) -> bool:
    """Whether a path (a PYTHONPATH entry, relative ones from here) is our trainer's folder or
    inside it: this checkout, or an installed copy's bench/shipped (never its site-packages,
    which may hold the user's specforge)."""
    return TRAINER_ROOT is not None and _resolve(entry).is_relative_to(TRAINER_ROOT)


def ours(file: str) -> bool:
    """Whether a module file is our trainer's (a cached upstream environment inside the checkout,
    such as .venv-specforge/, is not)."""
    return TRAINER_ROOT is not None and _resolve(file).is_relative_to(TRAINER_ROOT / "specforge")
