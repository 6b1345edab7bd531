"""The make targets, checked with ``make -n``: exact install and sweep commands per target,
with and without ``INSTALL= PYTHON=python3`` (which must install nothing), the GPU stack
detection that picks the extras, and ROCm's amdsmi / liger-kernel install steps."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")

# Variables a caller's environment (or a parent `make test`) could pass down to these makes.
SCRUB = {
    "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "GNUMAKEFLAGS",
    "PY", "VENV", "PYTHON", "INSTALL", "HARDWARE", "BENCH_HARDWARE", "GPU_STACK", "ROCM_PATH",
    "ROCM_VERSION", "EXTRAS", "TORCH_CPU", "LIGER_REQ", "AMDSMI_DIR", "AMDSMI_PYPI", "DETECT_PY",
    "SWEEP_FLAGS", "OUT", "A", "B",
}  # fmt: skip

SWEEPS = {
    "bench-cpu": "configs/cpu.yaml",
    "bench-a100": "configs/a100.yaml",
    "bench-h200": "configs/h200.yaml",
    "bench-mi355x": "configs/mi355x.yaml",
}


def make(*args: str, dry: bool = True, env: dict | None = None) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in SCRUB}
    cmd = ["make", "--no-print-directory", *(["-n"] if dry else []), *args]
    r = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=120, env={**clean, **(env or {})}
    )
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return [line.rstrip() for line in r.stdout.splitlines() if line.strip()]


@pytest.fixture
def venv(tmp_path):
    """A venv path with no stamp yet, so `make -n` shows the whole install."""
    return str(tmp_path / "venv")


def logged(v: str) -> str:
    """What follows a pip command: its output to the install log, shown only on failure."""
    return (
        f' >>{v}/install.log 2>&1 || {{ echo "install failed; the last lines of {v}/install.log:" >&2; '
        f"tail -n 40 {v}/install.log >&2; exit 1; }}"
    )


def announce(v: str, side: str = "the suite") -> str:
    return f'echo "installing {side} into {v} (pip\'s output: {v}/install.log) ..."'


def nvidia_install(v: str) -> list[str]:
    return [
        f"test -x {v}/bin/python || python3 -m venv --system-site-packages {v}",
        announce(v),
        f"{v}/bin/python -c \"import torch\" 2>/dev/null || {v}/bin/pip install -q 'torch==2.13.0'"
        + logged(v),
        f"{v}/bin/pip install -q -e '.[train,dev,liger,nvidia]'" + logged(v),
        f"touch {v}/.installed-dev-liger-nvidia",
    ]


def rocm_install(v: str, amdsmi_step: str) -> list[str]:
    return [
        f"test -x {v}/bin/python || python3 -m venv --system-site-packages {v}",
        announce(v),
        f'{v}/bin/python -c "import torch" 2>/dev/null || {{ echo "no torch in {v}: install a ROCm build of '
        'torch first (docs/rocm.md), or run with INSTALL= PYTHON=python3" >&2; exit 1; }',
        amdsmi_step,
        f"{v}/bin/pip install -q -e '.[train,dev,rocm]'" + logged(v),
        f"{v}/bin/pip install -q --no-deps 'liger-kernel>=0.6.0'",
        f"touch {v}/.installed-dev-rocm",
    ]


@pytest.fixture
def rocm(tmp_path):
    """A ROCm tree with ROCm's own amdsmi package (amd-smi-lib layout: buildable)."""
    root = tmp_path / "rocm"
    (root / "share" / "amd_smi" / "amdsmi").mkdir(parents=True)
    (root / "share" / "amd_smi" / "pyproject.toml").write_text("[project]\nname = 'amdsmi'\n")
    (root / ".info").mkdir()
    (root / ".info" / "version").write_text("6.2.0-66\n")
    return root


def pip_rocm_amdsmi(v: str, root) -> str:
    return (
        f"rm -rf {v}/amd_smi && cp -r {root}/share/amd_smi {v}/amd_smi && "
        f"{v}/bin/pip install -q --no-deps {v}/amd_smi"
    )


# -- every target, installing --------------------------------------------------------------


def test_bench_cpu_and_test_install_then_run(venv):
    for target, *last in (
        ("bench-cpu", f"{venv}/bin/python -m bench sweep configs/cpu.yaml --resume"),
        (
            "test",
            f"{venv}/bin/pip install -q -e '.[trackers]' 'tensorboard>=2.15'" + logged(venv),
            f"touch {venv}/.installed-trackers",
            f"{venv}/bin/python -m pytest -q -p no:benchmark $({venv}/bin/python -c 'import xdist' 2>/dev/null && echo \"-n 2 --dist worksteal\") tests",
        ),
        (
            "bench",
            f"config=$({venv}/bin/python -m bench detect) && {venv}/bin/python -m bench sweep $config --resume",
        ),
    ):
        assert make(target, f"VENV={venv}", "GPU_STACK=nvidia") == [*nvidia_install(venv), *last]


@pytest.mark.parametrize("target", ["bench-a100", "bench-h200"])
def test_nvidia_targets_install_nvidia_extras(venv, target):
    # Whatever this machine looks like: even with a ROCm tree, these install NVIDIA's extras.
    assert make(target, f"VENV={venv}", "ROCM_PATH=/") == [
        "make --no-print-directory install GPU_STACK=nvidia",
        *nvidia_install(venv),
        f"{venv}/bin/python -m bench sweep {SWEEPS[target]} --resume",
    ]


def test_bench_mi355x_installs_rocm_extras_liger_and_amdsmi(venv, rocm):
    # Issue 6.1: the old recipe was split at its commas (`make install EXTRAS=dev`).
    assert make("bench-mi355x", f"VENV={venv}", f"ROCM_PATH={rocm}") == [
        "make --no-print-directory install GPU_STACK=rocm",
        *rocm_install(venv, pip_rocm_amdsmi(venv, rocm)),
        f"{venv}/bin/python -m bench sweep configs/mi355x.yaml --resume",
    ]


def test_bench_on_amd_installs_rocm_extras(venv, rocm):
    # Issue 6.2: `make bench` on an AMD machine (auto-detected) gets the ROCm install.
    assert make("bench", f"VENV={venv}", f"ROCM_PATH={rocm}", "PY=/bin/false") == [
        *[
            line.replace("python3 -m venv", "/bin/false -m venv")
            for line in rocm_install(venv, pip_rocm_amdsmi(venv, rocm))
        ],
        f"config=$({venv}/bin/python -m bench detect) && {venv}/bin/python -m bench sweep $config --resume",
    ]


COMPARE_USAGE = (
    'test -n "$A" -a -n "$B" || { echo "usage: make compare A=path/to/summary.csv '
    'B=path/to/summary.csv [OUT=dir] [FAIL_IF_SLOWER=PCT] [FAIL_IF_GAIN_DROPS=POINTS] [FORMAT=md|json]" '
    ">&2; exit 2; }"
)


def test_compare_installs_only_the_light_side(venv):
    # Issue 26.5: `make compare` reads CSVs; it installed the whole training environment.
    lines = make("compare", "A=x/summary.csv", "B=y/summary.csv", f"VENV={venv}", "GPU_STACK=nvidia")
    assert lines == [
        f"test -x {venv}/bin/python || python3 -m venv --system-site-packages {venv}",
        announce(venv, "the suite's analysis side"),
        f"{venv}/bin/pip install -q -e ." + logged(venv),
        f"touch {venv}/.installed-light",
        COMPARE_USAGE,
        f'{venv}/bin/python -m bench compare "$A" "$B"',
    ]
    assert not any("torch" in line or "[" in line.split("bench compare")[0] for line in lines[:3])


def test_compare_uses_a_venv_that_has_the_training_side_as_it_is(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed-dev-liger-nvidia").touch()  # `make install` done, newer than pyproject.toml
    lines = make("compare", "A=x/summary.csv", "B=y/summary.csv", f"VENV={venv}", "GPU_STACK=nvidia")
    assert lines == [COMPARE_USAGE, f'{venv}/bin/python -m bench compare "$A" "$B"']
    assert make("compare", "A=x/summary.csv", "B=y/summary.csv", "INSTALL=", "PYTHON=python3") == [
        COMPARE_USAGE,
        'python3 -m bench compare "$A" "$B"',
    ]


def test_out_and_sweep_flags(venv):
    lines = make("bench-h200", f"VENV={venv}", "OUT=/tmp/x", "SWEEP_FLAGS=--force")
    assert lines[-1] == f'{venv}/bin/python -m bench sweep configs/h200.yaml --force --out "$OUT"'


def _argv_logger(tmp_path):
    """A fake python that writes each argument it gets on a line of its own."""
    log = tmp_path / "argv.log"
    fake = tmp_path / "python3"
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done >> {log}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return fake, log


@pytest.mark.parametrize("target", ["bench-cpu", "bench-h200"])
def test_a_quote_in_out_is_part_of_the_path(tmp_path, target):
    """Issue 27: `make bench-cpu OUT="…it's…"` broke the recipe ('…' quoting)."""
    fake, log = _argv_logger(tmp_path)
    out = str(tmp_path / 'it\'s "a" `x` (dir)')
    make(target, "INSTALL=", f"PYTHON={fake}", f"OUT={out}", dry=False)
    assert log.read_text().splitlines()[-2:] == ["--out", out]


def test_compare_passes_its_values_as_values_never_as_shell(tmp_path):
    """Issue 27: a quote in FAIL_IF_SLOWER ran an injected command."""
    fake, log = _argv_logger(tmp_path)
    pwned = tmp_path / "pwned"
    injected = f"5'; touch {pwned}; echo '"
    make(
        "compare", "INSTALL=", f"PYTHON={fake}", "A=a's.csv", "B=b.csv", f"OUT={tmp_path}/o'ut",
        f"FAIL_IF_SLOWER={injected}", "FAIL_IF_GAIN_DROPS=2", "FORMAT=md", dry=False,
    )  # fmt: skip
    assert not pwned.exists()
    assert log.read_text().splitlines() == [
        "-m", "bench", "compare", "a's.csv", "b.csv", "--out", f"{tmp_path}/o'ut", "--fail-if-slower", injected,
        "--fail-if-gain-drops", "2", "--format", "md",
    ]  # fmt: skip


# -- INSTALL= PYTHON=python3: nothing installed --------------------------------------------


@pytest.mark.parametrize("target", ["bench", "bench-cpu", "bench-a100", "bench-h200", "bench-mi355x", "test"])
def test_no_install_runs_only_the_command(target):
    lines = make(target, "INSTALL=", "PYTHON=python3")
    expected = {
        "bench": "config=$(python3 -m bench detect) && python3 -m bench sweep $config --resume",
        "test": """python3 -m pytest -q -p no:benchmark $(python3 -c 'import xdist' 2>/dev/null && echo "-n 2 --dist worksteal") tests""",
    }.get(target) or f"python3 -m bench sweep {SWEEPS[target]} --resume"
    assert lines == [expected]


@pytest.mark.parametrize("target", ["bench-a100", "bench-h200", "bench-mi355x"])
def test_no_install_really_runs_without_installing(tmp_path, target):
    # Issue 6.1: `make bench-mi355x INSTALL= PYTHON=python3` ran `liger,rocm` as a command (127).
    log = tmp_path / "calls.log"
    fake = tmp_path / "python3"
    fake.write_text(f'#!/bin/sh\necho "$BENCH_HARDWARE|$*" >> {log}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    venv = tmp_path / "venv"
    make(target, "INSTALL=", f"PYTHON={fake}", f"VENV={venv}", "HARDWARE=mi300x", dry=False)
    assert log.read_text().splitlines() == [f"mi300x|-m bench sweep {SWEEPS[target]} --resume"]
    assert not venv.exists()


def test_hardware_variable_sets_bench_hardware():
    assert make("bench", "INSTALL=", "PYTHON=python3", "HARDWARE=mi300x") == [
        "config=$(BENCH_HARDWARE=mi300x python3 -m bench detect) && "
        "BENCH_HARDWARE=mi300x python3 -m bench sweep $config --resume"
    ]
    assert make("bench-mi355x", "INSTALL=", "PYTHON=python3", "HARDWARE=mi355x") == [
        "BENCH_HARDWARE=mi355x python3 -m bench sweep configs/mi355x.yaml --resume"
    ]


# -- GPU stack detection --------------------------------------------------------------------


def fake_python_with_torch(tmp_path, hip: str | None, cuda: str | None) -> str:
    """A python3 whose `torch` is a package with only version.py (as torch wheels write it)."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('detection must not import torch')\n")
    (site / "torch" / "version.py").write_text(
        "from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'xpu']\n"
        f"__version__ = '2.9.1'\ndebug = False\ncuda: Optional[str] = {cuda!r}\n"
        f"git_version = '0'\nhip: Optional[str] = {hip!r}\nxpu: Optional[str] = None\n"
    )
    py = tmp_path / "py"
    py.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return str(py)


def install_line(lines: list[str]) -> str:
    return next(line for line in lines if " install -q -e " in line)


@pytest.mark.parametrize(
    "hip, cuda, rocm_tree, extras",
    [
        ("7.2.26015", None, False, "dev,rocm"),  # ROCm torch (torch.version.hip)
        (None, "12.8", True, "dev,liger,nvidia"),  # CUDA torch wins over a stray ROCm tree
        (None, None, True, "dev,rocm"),  # CPU torch, ROCm installed: the ROCm stack
        (None, None, False, "dev,liger,nvidia"),  # CPU machine: as before
    ],
)
def test_gpu_stack_detection(tmp_path, venv, rocm, hip, cuda, rocm_tree, extras):
    py = fake_python_with_torch(tmp_path, hip, cuda)
    root = rocm if rocm_tree else tmp_path / "no-rocm"
    assert install_line(make("install", f"VENV={venv}", f"PY={py}", f"ROCM_PATH={root}")) == (
        f"{venv}/bin/pip install -q -e '.[train,{extras}]'" + logged(venv)
    )


def test_gpu_stack_override(venv, tmp_path):
    lines = make("install", f"VENV={venv}", "GPU_STACK=rocm", f"ROCM_PATH={tmp_path}/none")
    assert install_line(lines) == f"{venv}/bin/pip install -q -e '.[train,dev,rocm]'" + logged(venv)


# -- ROCm: which amdsmi, liger-kernel without triton -----------------------------------------


def amdsmi_line(lines: list[str]) -> str:
    """The amdsmi step: after the venv and torch steps, before the project's install."""
    assert " install -q -e " in lines[4], lines  # after the venv, the announcement and torch
    return lines[3]


def test_rocm_amdsmi_from_rocm_package(venv, rocm):
    lines = make("install", f"VENV={venv}", "GPU_STACK=rocm", f"ROCM_PATH={rocm}")
    assert amdsmi_line(lines) == pip_rocm_amdsmi(venv, rocm)
    assert f"{venv}/bin/pip install -q --no-deps 'liger-kernel>=0.6.0'" in lines
    assert not any("liger" in line and "--no-deps" not in line for line in lines)


def test_rocm_amdsmi_core_sdk_layout_goes_on_sys_path(venv, rocm):
    (rocm / "share" / "amd_smi" / "pyproject.toml").unlink()
    (rocm / "share" / "amd_smi" / "amdsmi" / "__init__.py").write_text("")
    line = amdsmi_line(make("install", f"VENV={venv}", "GPU_STACK=rocm", f"ROCM_PATH={rocm}"))
    assert line.startswith(f"{{ {venv}/bin/pip uninstall -q -y amdsmi 2>/dev/null || true; }} && ")
    assert f"echo {rocm}/share/amd_smi > " in line and line.endswith('/rocm-amdsmi.pth"')


def test_rocm_amdsmi_falls_back_to_pypi_of_the_same_rocm_version(venv, rocm):
    shutil.rmtree(rocm / "share")
    line = amdsmi_line(make("install", f"VENV={venv}", "GPU_STACK=rocm", f"ROCM_PATH={rocm}"))
    assert line.startswith(f"{venv}/bin/pip install -q 'amdsmi==6.2.*' || echo \"warning: could not install")
    (rocm / ".info" / "version").unlink()
    line = amdsmi_line(make("install", f"VENV={venv}", "GPU_STACK=rocm", f"ROCM_PATH={rocm}"))
    assert line.startswith(f"{venv}/bin/pip install -q 'amdsmi' ||")


def test_rocm_extra_does_not_pull_pypi_amdsmi():
    # Issue 6.3: `amdsmi>=6.2` admitted the 7.0.2 wheel, which cannot load a ROCm 6.x library.
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["rocm"] == []
    assert extras["liger"] == ["liger-kernel>=0.6.0"]


def test_rocm_amdsmi_found_in_core_sdk_tree(venv, tmp_path):
    root = tmp_path / "rocm"
    (root / "core-7.12" / "share" / "amd_smi" / "amdsmi").mkdir(parents=True)
    (root / "core-7.12" / "share" / "amd_smi" / "amdsmi" / "__init__.py").write_text("")
    line = amdsmi_line(make("install", f"VENV={venv}", "GPU_STACK=rocm", f"ROCM_PATH={root}"))
    assert f"echo {root}/core-7.12/share/amd_smi > " in line


def test_bench_stops_when_detect_finds_no_config(tmp_path):
    log = tmp_path / "calls.log"
    fake = tmp_path / "python3"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$BENCH_HARDWARE|$*" >> {log}\n'
        'if [ "$3" = detect ]; then [ "$BENCH_HARDWARE" = bogus ] && exit 2; echo configs/h200.yaml; fi\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    make("bench", "INSTALL=", f"PYTHON={fake}", dry=False)
    assert log.read_text().splitlines() == ["|-m bench detect", "|-m bench sweep configs/h200.yaml --resume"]

    log.unlink()
    clean = {k: v for k, v in os.environ.items() if k not in SCRUB}
    r = subprocess.run(
        ["make", "--no-print-directory", "bench", "INSTALL=", f"PYTHON={fake}", "HARDWARE=bogus"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=clean,
        timeout=60,
    )
    assert r.returncode != 0
    assert log.read_text().splitlines() == ["bogus|-m bench detect"]  # no sweep without a config


def test_an_out_directory_with_a_space_reaches_the_driver_whole(tmp_path):
    out = tmp_path / "dir with space"
    r = subprocess.run(
        ["make", "--no-print-directory", "bench-cpu", "INSTALL=", f"PYTHON={sys.executable}", f"OUT={out}",
         "SWEEP_FLAGS=--dry-run"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"-> {out}   [dry run" in r.stdout


def test_the_published_results_targets_take_only_the_sweep_named():
    """SWEEP was also the Makefile's own `python -m bench sweep` command: `make verify-results`
    without SWEEP= verified a sweep called "python3" and failed."""
    assert make("verify-results", "INSTALL=", "PYTHON=python3") == ["python3 scripts/published.py verify"]
    named = make("verify-results", "INSTALL=", "PYTHON=python3", "SWEEP=results/h200")
    assert named == ["python3 scripts/published.py verify results/h200"]
    r = subprocess.run(
        ["make", "-n", "raw", "INSTALL="], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode != 0 and "name the sweep: make raw SWEEP=results/<name>" in r.stderr
