"""What code a Python process runs, read from inside it: for each package whose version decides the
work (bench.arms.VERSIONED) the folder it is imported from, the version of the distribution
installed there (None for a plain checkout on the import path) and, for a folder tracked by git,
the checkout's commit and whether it is dirty (a digest of its diff, so two different local
changes read apart); the interpreter; and the environment variables an arm declared
(``BENCH_ARM_VARS``, set by bench.arms.ArmEnv.command).

Standard library only, nothing imported but metadata: it runs in the user's interpreter, loaded by
path (instrument.py's ModuleCensus, inside each SpecForge run) or as a script
(``python codefacts.py``: one JSON object on stdout, bench/run/armenv.py's check of an arm's
environment before anything runs). As a script it also takes ``MODULE:NAME`` targets to import (what a
Liger run will import, bench/run/armenv.py) and says for each the error, or None where it imports.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import subprocess
import sys

# package (as an arm's `differs` names it) -> (import name, distribution names)
PACKAGES = {
    "specforge": ("specforge", ("specforge",)),
    "liger-kernel": ("liger_kernel", ("liger-kernel", "liger_kernel")),
    "torch": ("torch", ("torch",)),
    "triton": ("triton", ("triton", "pytorch-triton-rocm")),
    "transformers": ("transformers", ("transformers",)),
}
VARS = "BENCH_ARM_VARS"
GIT_TIMEOUT_S = 10.0


def _folder(module: str) -> str | None:
    """The folder a package is imported from, without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    places = list(spec.submodule_search_locations or [])
    where = places[0] if places else spec.origin
    return os.path.realpath(where) if where else None


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _version(dists: tuple[str, ...], folder: str) -> str | None:
    """The version of the distribution that put ``folder`` there: one installed in the same import
    path entry, or an editable install pointing at it; None for a checkout nothing installed."""
    root = os.path.dirname(folder)
    wanted = {_canonical(d) for d in dists}
    for dist in md.distributions(path=[root]):
        if _canonical(dist.metadata["Name"] or "") in wanted:
            return dist.version
    for name in dists:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
        if url.startswith("file://") and folder.startswith(os.path.realpath(url[len("file://") :])):
            return dist.version  # an editable install (pip install -e) of this checkout
    return None


def _git(folder: str) -> dict:
    """The checkout holding ``folder`` when git tracks the folder's files: its commit and dirty state
    (False, or 12 hex digits of ``git diff HEAD`` over the folder's checkout); {} otherwise (an
    installed copy, even inside some other checkout)."""

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(
                ["git", "-C", folder, *args],
                capture_output=True,
                timeout=GIT_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.decode(errors="replace") if r.returncode == 0 else None

    if not (git("ls-files", "--", ".") or "").strip():  # not a tracked folder
        return {}
    commit = (git("rev-parse", "HEAD") or "").strip()
    if not commit:
        return {}
    diff = git("diff", "HEAD", "--", ".")
    dirty = hashlib.sha256(diff.encode()).hexdigest()[:12] if diff else False
    return {"commit": commit[:12], "dirty": dirty}


def package(name: str) -> dict | None:
    """One package's facts (``file``, ``version``, and ``commit``/``dirty`` for a checkout); None
    when this interpreter cannot find it."""
    module, dists = PACKAGES[name]
    folder = _folder(module)
    if folder is None:
        return None
    return {"file": folder, "version": _version(dists, folder), **_git(folder)}


def collect() -> dict:
    """Every package's facts, the interpreter and the declared variables, as one JSON object."""
    names = [n for n in os.environ.get(VARS, "").split(",") if n]
    return {
        "packages": {name: package(name) for name in PACKAGES},
        "python": {"executable": os.path.realpath(sys.executable), "version": sys.version.split()[0]},
        "vars": {n: os.environ.get(n) for n in names},
    }


def tried(targets: list[str]) -> dict:
    """``MODULE:NAME`` -> None where ``from MODULE import NAME`` works in this process, else the error
    in one line (an entry point of a kernel library built for another transformers, say)."""
    out = {}
    for target in targets:
        module, _, name = target.partition(":")
        try:
            getattr(__import__(module, fromlist=[name]), name)
            out[target] = None
        except Exception as e:  # noqa: BLE001 - any failure of a user's package is the answer
            out[target] = " ".join(f"{type(e).__name__}: {e}".split())
    return out


if __name__ == "__main__":
    facts = collect()
    if sys.argv[1:]:
        facts["imports"] = tried(sys.argv[1:])
    print(json.dumps(facts))
