"""The suite beside the user's upstream SpecForge (PyPI ``specforge``, the same import name as our
trainer): the installed distribution holds ``bench`` only, installing it leaves upstream's files
as they were, ``isolated_env`` keeps a run started from this checkout on upstream's package,
``embedded_env`` keeps ours on ours, and ``which_specforge`` names what an interpreter imports.
Real interpreters and real installs; upstream's environment is built once (tests/upstream_env.py)."""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bench.distribution import CHECKOUT, IS_CHECKOUT
from bench.errors import SweepError
from bench.trainers.isolation import embedded_env, isolated_env, which_specforge
from tests.helpers import REPO
from tests.upstream_env import upstream_python

# Prints where `specforge` and `bench` come from (None when not importable).
WHERE = (
    "import importlib.util as u, json; "
    "print(json.dumps({m: (s.origin if (s := u.find_spec(m)) else None) for m in ('specforge', 'bench')}))"
)


def where(python: Path | str, env: dict[str, str], cwd: Path) -> dict[str, str | None]:
    r = subprocess.run(
        [str(python), "-c", WHERE], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def clean_env() -> dict[str, str]:
    """This process's environment without PYTHONPATH / PYTHONSAFEPATH (the tests set their own)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}


def site_packages(python: Path) -> Path:
    r = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return Path(r.stdout.strip())


def changed_files(site: Path, dist_info: str) -> list[str]:
    """The files of an installed distribution whose sha256 differs from its RECORD (or are gone)."""
    bad = []
    with (site / dist_info / "RECORD").open() as f:
        for path, digest, _size in csv.reader(f):
            if not digest.startswith("sha256=") or not path.startswith("specforge/"):
                continue
            file = site / path
            raw = hashlib.sha256(file.read_bytes()).digest() if file.is_file() else b""
            if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != digest.removeprefix("sha256="):
                bad.append(path)
    return bad


@pytest.fixture(scope="session")
def target(wheel, tmp_path_factory) -> Path:
    """Our wheel installed with ``pip install --target`` (a folder to put on PYTHONPATH)."""
    out = tmp_path_factory.mktemp("target")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(out)]
    subprocess.run([*pip, str(wheel)], check=True, capture_output=True, timeout=300)
    return out


# -- the installed distribution -------------------------------------------------------------


def test_the_distribution_installs_bench_and_not_our_trainer(wheel, target):
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert "bench" in tops and "specforge" not in tops, sorted(tops)
    assert (target / "bench" / "trainers" / "isolation.py").is_file()
    assert not (target / "specforge").exists()
    # our trainer ships only inside bench's own folder, which no Python puts on sys.path by itself
    assert (target / "bench" / "shipped" / "specforge" / "train.py").is_file()
    assert tops == {"bench", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}


@pytest.mark.slow
def test_our_suite_on_pythonpath_beside_upstream_imports_each_its_own(target, tmp_path):
    py = upstream_python()
    site = site_packages(py)
    got = where(py, {**clean_env(), "PYTHONPATH": str(target)}, cwd=tmp_path)
    assert got == {
        "specforge": str(site / "specforge" / "__init__.py"),
        "bench": str(target / "bench" / "__init__.py"),
    }
    assert (site / "specforge" / "cli.py").is_file() and not (site / "specforge" / "train.py").exists()
    assert changed_files(site, "specforge-0.2.0.dist-info") == []


@pytest.mark.slow
def test_installing_our_suite_into_a_specforge_environment_leaves_upstream_as_it_was(wheel, tmp_path):
    # The user's case: one environment, upstream SpecForge installed, then the suite (a regular install).
    venv = tmp_path / "user-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps"]
    for what in ("specforge==0.2.0", str(wheel)):
        r = subprocess.run([*pip, what], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    site = site_packages(py)
    assert changed_files(site, "specforge-0.2.0.dist-info") == []
    assert not (site / "specforge" / "train.py").exists()
    got = where(py, clean_env(), cwd=tmp_path)
    assert got == {
        "specforge": str(site / "specforge" / "__init__.py"),
        "bench": str(site / "bench" / "__init__.py"),
    }


# -- runs started from this checkout ------------------------------------------------------


@pytest.mark.slow
def test_from_the_checkout_root_isolated_env_imports_upstream_and_embedded_env_ours():
    py = upstream_python()
    upstream = str(site_packages(py) / "specforge" / "__init__.py")
    ours = str(CHECKOUT / "specforge" / "__init__.py")
    # Without the isolation the checkout root (the working directory) shadows upstream's package.
    assert where(py, clean_env(), cwd=REPO)["specforge"] == ours
    assert (
        where(py, isolated_env({**clean_env(), "PYTHONPATH": str(REPO)}), cwd=REPO)["specforge"] == upstream
    )
    assert where(sys.executable, embedded_env(clean_env()), cwd=REPO)["specforge"] == ours


def test_embedded_env_finds_our_trainer_from_any_directory(tmp_path):
    assert where(sys.executable, clean_env(), cwd=tmp_path)["specforge"] is None  # not installed
    r = subprocess.run(
        [sys.executable, "-m", "specforge", "--help"],
        cwd=tmp_path,
        env=embedded_env(clean_env()),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "{train,prepare,check}" in r.stdout, r.stderr


@pytest.mark.slow
def test_upstream_cli_runs_from_the_checkout_root_under_isolated_env():
    r = subprocess.run(
        [str(upstream_python()), "-m", "specforge.cli", "--help"],
        cwd=REPO,
        env=isolated_env(clean_env()),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "train a draft model from a typed config" in r.stdout, r.stderr


# -- the environments, as data ---------------------------------------------------------------


def test_isolated_env_drops_the_checkout_from_pythonpath(tmp_path, monkeypatch):
    assert IS_CHECKOUT
    monkeypatch.chdir(REPO)  # relative entries resolve from here
    other = str(tmp_path)
    given = {
        "PYTHONPATH": os.pathsep.join(["", str(REPO), other, "specforge/..", str(REPO / "bench")]),
        "X": "1",
    }
    out = isolated_env(given)
    assert out == {"PYTHONPATH": other, "PYTHONSAFEPATH": "1", "X": "1"}
    assert given["PYTHONPATH"].startswith(os.pathsep)  # the caller's mapping is left alone
    assert isolated_env({"PYTHONPATH": str(REPO)}) == {"PYTHONSAFEPATH": "1"}
    assert isolated_env({}) == {"PYTHONSAFEPATH": "1"}


def test_embedded_env_puts_the_checkout_first_once(tmp_path):
    assert embedded_env({}) == {"PYTHONPATH": str(CHECKOUT)}
    both = os.pathsep.join([str(CHECKOUT), str(tmp_path)])
    assert embedded_env({"PYTHONPATH": str(tmp_path)})["PYTHONPATH"] == both
    assert embedded_env({"PYTHONPATH": os.pathsep.join([str(tmp_path), str(CHECKOUT)])})["PYTHONPATH"] == both


# -- which_specforge -------------------------------------------------------------------------


def one_line_error(python: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(SweepError) as e:
        which_specforge(python, env if env is not None else clean_env())
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.slow
def test_which_specforge_reports_upstream():
    py = upstream_python()
    facts = which_specforge(str(py), clean_env())
    assert facts["version"] == "0.2.0"
    assert facts["file"] == str(site_packages(py) / "specforge" / "__init__.py")
    assert facts["python"] == ".".join(map(str, sys.version_info[:3]))
    assert Path(facts["executable"]).parent == py.parent
    assert {"torch", "transformers", "triton", "liger_kernel"} <= set(facts)
    assert facts["torch"]  # reused from this interpreter's site-packages


def test_which_specforge_refuses_a_missing_interpreter(tmp_path):
    assert one_line_error(str(tmp_path / "nope" / "python")).startswith(
        f"no Python interpreter at {tmp_path}"
    )
    assert "not an executable" in one_line_error(str(tmp_path))


def test_which_specforge_refuses_an_interpreter_without_specforge(monkeypatch):
    monkeypatch.chdir(REPO)  # our specforge/ is right here, and must not count
    msg = one_line_error(sys.executable, {**clean_env(), "PYTHONPATH": str(REPO)})
    assert "cannot import specforge" in msg and "make specforge-env" in msg


def wrapper(tmp_path: Path, pythonpath: Path) -> str:
    """An interpreter that puts ``pythonpath`` on its own path (as a user's wrapper script might)."""
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH={pythonpath} exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    return str(py)


def test_which_specforge_refuses_our_checkouts_specforge(tmp_path):
    msg = one_line_error(wrapper(tmp_path, REPO))
    assert "imports this checkout's specforge" in msg and str(CHECKOUT / "specforge") in msg


def test_which_specforge_refuses_a_specforge_without_its_cli(tmp_path):
    (tmp_path / "site" / "specforge").mkdir(parents=True)
    (tmp_path / "site" / "specforge" / "__init__.py").write_text("")
    assert "without specforge.cli" in one_line_error(wrapper(tmp_path, tmp_path / "site"))


# -- make specforge-env ----------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_specforge_env_steps(tmp_path):
    v, py = tmp_path / "up", "/opt/py/bin/python"
    env = {k: v for k, v in clean_env().items() if not k.startswith(("MAKE", "MFLAGS", "SPECFORGE_"))}
    cmd = [
        "make",
        "--no-print-directory",
        "-n",
        "specforge-env",
        "INSTALL=",
        f"PYTHON={py}",
        f"SPECFORGE_VENV={v}",
    ]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    purelib = "-c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'"
    assert r.stdout.splitlines() == [
        f"test -x {v}/bin/python || {py} -m venv --system-site-packages {v}",
        f'{py} {purelib} > "$({v}/bin/python {purelib})/zz-bench-venv.pth"',
        f"{v}/bin/pip install -q --no-deps 'specforge==0.2.0' yunchang",
        f"{v}/bin/pip install -q --no-warn-conflicts pydantic accelerate safetensors pyyaml tokenizers",
        f"touch {v}/.installed-specforge-0.2.0",
    ]
    (v).mkdir()
    (v / ".installed-specforge-0.2.0").touch()  # built: nothing to do
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "pip" not in r.stdout, r.stdout
