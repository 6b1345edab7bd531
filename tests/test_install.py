"""The light install (issue 26.5): the wheel requires no torch, transformers or safetensors (the
``train`` extra does), and an installed copy in a fresh venv without them runs ``bench
--version``, ``bench report``, ``bench compare`` and a dry run of its own shipped configs, finds
its profiles, and refuses a real sweep in one line naming the extra.

The venv is cheap and honest: no pip download. It sees this interpreter's site-packages through
a folder of links to everything there but the training side (torch, transformers, safetensors,
triton, liger, nvidia, and our own suite), so torch cannot be imported in it; pip's resolver
(``--dry-run --no-index``) then shows that the wheel's requirements are all met without torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO, run_cli

TRAIN_SIDE = ("torch", "functorch", "transformers", "safetensors", "triton", "liger", "nvidia")
OURS = ("bench", "specforge", "dflash", "__editable__")
VERSION = re.search(r'(?m)^version = "([^"]+)"', (REPO / "pyproject.toml").read_text()).group(1)


def requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    return [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]


def test_the_wheel_requires_no_torch_and_the_train_extra_brings_it(wheel):
    reqs = requires(wheel)
    plain = [r for r in reqs if ";" not in r]
    names = {re.split(r"[<>=!~ ;\[]", r)[0].lower() for r in plain}
    assert {"pyyaml", "pandas", "matplotlib", "scipy", "tqdm"} <= names
    assert not names & {"torch", "transformers", "safetensors"}, plain
    train = [r.split(";")[0].strip() for r in reqs if r.endswith('extra == "train"')]
    assert sorted(re.split(r"[<>=]", r)[0] for r in train) == [
        "packaging",
        "psutil",
        "safetensors",
        "torch",
        "transformers",
    ]
    assert "torch<2.15,>=2.9" in train  # a range: GPU machines keep their torch, the CPU its 2.13.0
    assert "jsonschema" not in names  # the dev extra's: summary.json is written without it
    with zipfile.ZipFile(wheel) as z:
        assert "bench/results/summary.schema.json" in z.namelist()  # summary.json's schema ships


def light_view(dest: Path) -> Path:
    """A folder of links to this interpreter's installed packages, the training side and our
    suite left out (the first of a name on sys.path wins, as on sys.path)."""
    dest.mkdir()
    for entry in sys.path:
        if (
            not entry
            or Path(entry).name not in ("site-packages", "dist-packages")
            or not Path(entry).is_dir()
        ):
            continue
        for item in Path(entry).iterdir():
            key = item.name.lower().replace("-", "_")
            if key.endswith(".pth") or key.startswith(TRAIN_SIDE + OURS) or (dest / item.name).exists():
                continue
            (dest / item.name).symlink_to(item)
    return dest


@pytest.fixture(scope="module")
def light(wheel, tmp_path_factory) -> Path:
    """A fresh venv (no system site-packages) seeing the light view, before our wheel: its python."""
    tmp = tmp_path_factory.mktemp("light")
    venv = tmp / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "light-view.pth").write_text(f"{light_view(tmp / 'view')}\n")
    return py


def pip(py: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "--python", str(py), "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def run(*args: str | Path, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """A command of the installed copy, from a folder outside the checkout, without our PYTHONPATH."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def installed(light, wheel, tmp_path_factory) -> Path:
    """Our wheel installed (not editable) into the light venv: the venv's bin folder."""
    # pip's resolver over the venv (no index): every requirement of the wheel is met without torch
    r = pip(light, "install", "--dry-run", "--no-index", "--quiet", "--report", "-", str(wheel))
    assert r.returncode == 0, r.stderr
    assert [i["metadata"]["name"] for i in json.loads(r.stdout)["install"]] == ["dflash-liger-bench"]
    r = pip(light, "install", "--no-deps", "--no-index", "--quiet", str(wheel))
    assert r.returncode == 0, r.stderr
    return light.parent


@pytest.mark.slow
def test_an_installed_copy_without_torch_runs_its_own_configs(installed, tmp_path):
    py = installed / "python"
    probe = "import importlib.util as u, bench; print(u.find_spec('torch'), u.find_spec('specforge'), bench.__file__)"
    r = run(py, "-c", probe, cwd=tmp_path)
    torch, specforge, bench_file = r.stdout.split()
    assert (torch, specforge) == ("None", "None"), r.stdout  # no torch; our trainer not importable
    site = Path(bench_file).parents[1]
    assert site.name == "site-packages" and not (site / "specforge").exists()

    r = run(installed / "bench", "--version", cwd=tmp_path)
    assert (r.returncode, r.stdout) == (0, f"dflash-liger-bench {VERSION}\n"), r.stderr

    shipped = site / "bench" / "shipped" / "configs"
    r = run(installed / "bench", "sweep", "cpu", "--dry-run", "--out", str(tmp_path / "cpu"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"sweep cpu ({shipped / 'cpu.yaml'}) -> {tmp_path / 'cpu'}   [dry run")
    assert f"-m specforge prepare {shipped / 'train' / 'tiny-offline.yaml'} " in r.stdout
    assert not (tmp_path / "cpu").exists()
    # that dry run had our trainer check every arm (`python -m specforge check`, no torch needed):
    # the shipped one, on PYTHONPATH for our runs only, never for the user's SpecForge
    code = (
        "from bench.trainers.isolation import embedded_env, isolated_env\n"
        "print(embedded_env({})['PYTHONPATH'], isolated_env(embedded_env({})).get('PYTHONPATH'))"
    )
    r = run(py, "-c", code, cwd=tmp_path)
    assert r.stdout.split() == [str(site / "bench" / "shipped"), "None"], r.stderr

    # the SpecForge plug's inputs read the shipped profiles
    code = (
        "from bench.trainers.specforge_cli.inputs import load_profile\n"
        "print(load_profile({'profile': 'tiny'})['target']['hidden_size'])\n"
        "try: load_profile({'profile': 'nope'})\nexcept ValueError as e: print(e)"
    )
    r = run(py, "-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (
        r.stdout.splitlines()[1] == "unknown profile 'nope' (known: qwen3-8b-dflash, qwen3.5-4b-dflash, tiny)"
    )

    # a real sweep needs the train extra: one line, exit 2, nothing written
    r = run(
        installed / "bench", "sweep", str(shipped / "cpu.yaml"), "--out", str(tmp_path / "cpu"), cwd=tmp_path
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert (
        " lacks " in r.stderr and "torch, transformers, safetensors: pip install '.[train]'" in r.stderr
    )  # (psutil first where absent)
    assert not (tmp_path / "cpu").exists()


@pytest.mark.slow
def test_an_installed_copy_without_torch_reports_and_compares(installed, tmp_path):
    sweep = tmp_path / "h200"
    shutil.copytree(REPO / "results" / "h200", sweep)
    (sweep / "summary.csv").unlink()
    bench = installed / "bench"
    r = run(bench, "report", str(sweep), cwd=tmp_path, env={"BENCH_NO_PLOTS": "1"})
    assert r.returncode == 2 and "bench raw unpack" in r.stderr  # a committed sweep: its records packed
    assert run(bench, "raw", "unpack", str(sweep), cwd=tmp_path).returncode == 0
    r = run(bench, "report", str(sweep), cwd=tmp_path, env={"BENCH_NO_PLOTS": "1"})
    assert r.returncode == 0, r.stderr
    assert (sweep / "summary.csv").read_bytes() == (REPO / "results" / "h200" / "summary.csv").read_bytes()
    assert (sweep / "summary.json").read_bytes() == (REPO / "results" / "h200" / "summary.json").read_bytes()
    assert "liger vs baseline: +16.4% [+16.0, +16.9]" in r.stdout

    out = tmp_path / "cmp"  # drawn: matplotlib works without torch
    ref = str(REPO / "results" / "h200" / "summary.csv")
    args = ["compare", ref, str(sweep / "summary.csv"), "--out", str(out), "--fail-if-slower", "2"]
    r = run(bench, *args, cwd=tmp_path, env={"BENCH_NO_PLOTS": "0"})
    assert r.returncode == 0, r.stderr
    assert "gate: passed (4 rows within -2%)" in r.stdout
    assert (out / "compare.csv").is_file() and (out / "compare.png").stat().st_size > 0

    hist = tmp_path / "hist"  # the history of committed sweeps, drawn, on the light install
    r = run(bench, "history", *(str(REPO / "results" / n) for n in ("h200", "h200-options")), "--out", str(hist),
            cwd=tmp_path, env={"BENCH_NO_PLOTS": "0"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (
        "h200-options" in r.stdout
        and "h200 " in r.stdout
        and len(list(hist.glob("history_liger_*.png"))) == 1
    )


def test_version_from_a_checkout_is_its_pyproject_and_names_the_checkout():
    r = run_cli("bench", "--version")
    assert (r.returncode, r.stdout) == (0, f"dflash-liger-bench {VERSION} (checkout {REPO})\n"), r.stderr
