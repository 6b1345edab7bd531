"""Hardware detection, config choice and config/hardware checks (fake pynvml/amdsmi/torch)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from bench.probe import hardware
from bench.probe.hardware import (
    HardwareError,
    check_hardware,
    classify,
    classify_arch,
    config_for,
    detect,
    main_detect,
)
from tests.test_vram import Script, fake_amdsmi, fake_pynvml

GIB = 2**30
REPO = Path(__file__).resolve().parent.parent


def fake_nvml(names: list) -> types.ModuleType:
    """pynvml with the given card names (str, as nvidia-ml-py >= 12.535 returns them)."""
    return fake_pynvml(Script([[GIB]] * len(names)), names=names)


def fake_smi(names: list[str], archs=None, version="7.0", **kwargs) -> types.ModuleType:
    """amdsmi with the given market names and target_graphics_version (7.0.2 wheel's keys)."""
    archs = archs or ["gfx942" if "MI300" in n else "gfx950" for n in names]
    return fake_amdsmi(Script([[GIB]] * len(names)), names=names, archs=archs, version=version, **kwargs)


def fake_torch(names: list[str], hip: str | None = None, archs=None) -> types.ModuleType:
    mod = types.ModuleType("torch")
    archs = archs or [None] * len(names)

    def props(i):
        if hip is None:
            return types.SimpleNamespace(name=names[i], major=9, minor=0)
        return types.SimpleNamespace(name=names[i], gcnArchName=archs[i])

    mod.cuda = types.SimpleNamespace(
        is_available=lambda: bool(names),
        device_count=lambda: len(names),
        get_device_name=lambda i: names[i],
        get_device_properties=props,
    )
    mod.version = types.SimpleNamespace(hip=hip, cuda=None if hip else "12.8")
    return mod


@pytest.fixture
def machine(monkeypatch):
    """Set what this 'machine' exposes: management libraries and/or torch's view."""

    monkeypatch.delenv("BENCH_HARDWARE", raising=False)

    def setup(pynvml=None, amdsmi=None, torch_names=(), hip=None, torch_archs=None):
        monkeypatch.setitem(sys.modules, "pynvml", pynvml)
        monkeypatch.setitem(sys.modules, "amdsmi", amdsmi)
        monkeypatch.setitem(sys.modules, "torch", fake_torch(list(torch_names), hip, torch_archs))

    return setup


DETECTED = {"kind_source": "detected", "partitioned": False}


@pytest.mark.parametrize(
    "name, kind",
    [
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("AMD Instinct MI355X", "mi355x"),
        ("AMD Instinct MI350X", "mi355x"),
        ("AMD Instinct MI300X", "mi300x"),
        ("MI300X-O", "mi300x"),
        ("amd instinct mi300x vf", "mi300x"),
        ("0x74a5", "unknown"),  # a device id, as some amdsmi versions report market_name
        ("N/A", "unknown"),
        (None, "unknown"),
        ("Tesla V100-SXM2-32GB", "unknown"),
        ("Tesla V100", "unknown"),
    ],
)
def test_classify_real_names(name, kind):
    assert classify(name) == kind


@pytest.mark.parametrize(
    "arch, kind",
    [
        ("gfx942", "mi300x"),
        ("gfx950", "mi355x"),
        ("gfx942:sramecc+:xnack-", "mi300x"),  # torch's gcnArchName
        ("gfx2370", "mi300x"),  # 0x942 printed in decimal by a mismatched wrapper
        ("gfx3ae", "mi300x"),  # 942 printed in hex by a mismatched wrapper
        ("gfx90a", "unknown"),  # MI200: no config
        ("gfxffffffffffffffff", "unknown"),  # not supported
        (None, "unknown"),
    ],
)
def test_classify_arch(arch, kind):
    assert classify_arch(arch) == kind


def test_detect_nvidia_via_nvml(machine):
    machine(pynvml=fake_nvml(["NVIDIA H100 80GB HBM3"] * 8))
    assert detect() == {
        "vendor": "nvidia",
        "gpu_names": ["NVIDIA H100 80GB HBM3"] * 8,
        "gpu_count": 8,
        "kind": "h100",
        "detected_kind": "h100",
        **DETECTED,
    }


def test_detect_amd_via_amdsmi(machine):
    machine(amdsmi=fake_smi(["AMD Instinct MI355X"] * 8))
    info = detect()
    assert (info["vendor"], info["kind"], info["gpu_count"]) == ("amd", "mi355x", 8)


@pytest.mark.parametrize(
    "name, arch, kind, shown",
    [
        ("0x74a5", "gfx942", "mi300x", "0x74a5 (gfx942)"),
        ("N/A", "gfx950", "mi355x", "N/A (gfx950)"),
        ("MI300X-O", "gfx942", "mi300x", "MI300X-O"),
        ("AMD Instinct MI350X", "gfx950", "mi355x", "AMD Instinct MI350X"),
    ],
)
def test_detect_amd_falls_back_to_target_graphics_version(machine, name, arch, kind, shown):
    machine(amdsmi=fake_smi([name] * 8, archs=[arch] * 8))
    info = detect()
    assert (info["vendor"], info["kind"], info["detected_kind"]) == ("amd", kind, kind)
    assert info["gpu_names"] == [shown] * 8


def test_detect_amd_falls_back_to_torch_arch(machine):
    # ROCm 6.2's asic info has no target_graphics_version; torch's gcnArchName decides.
    machine(
        amdsmi=fake_smi(["0x74a1"] * 2, version="6.2"),
        torch_names=["AMD Radeon Graphics"] * 2,
        hip="6.2.41133",
        torch_archs=["gfx942:sramecc+:xnack-"] * 2,
    )
    info = detect()
    assert (info["vendor"], info["kind"], info["gpu_names"]) == ("amd", "mi300x", ["0x74a1"] * 2)
    machine(amdsmi=fake_smi(["0x74a1"] * 2, version="6.2"))  # and without torch's view: unknown
    assert detect()["kind"] == "unknown"


def test_detect_partitioned_card(machine):
    smi = fake_smi(["AMD Instinct MI300X"] * 8, partition="CPX", serials=["0x00000000DEADBEEF"] * 8)
    machine(amdsmi=smi)
    info = detect()
    assert (info["kind"], info["gpu_count"], info["partitioned"]) == ("mi300x", 8, True)
    assert hardware.describe(info) == "AMD Instinct MI300X x8 (partitioned: one entry per partition)"


def test_detect_falls_back_to_torch(machine):
    machine(torch_names=["NVIDIA A100-SXM4-80GB"] * 2)
    assert detect() == {
        "vendor": "nvidia",
        "gpu_names": ["NVIDIA A100-SXM4-80GB"] * 2,
        "gpu_count": 2,
        "kind": "a100",
        "detected_kind": "a100",
        **DETECTED,
    }
    machine(torch_names=["AMD Instinct MI300X"], hip="6.4.0")
    info = detect()
    assert (info["vendor"], info["kind"]) == ("amd", "mi300x")
    machine(torch_names=[""], hip="6.4.0", torch_archs=["gfx950:sramecc+:xnack-"])
    assert detect()["kind"] == "mi355x"


def test_detect_cpu_and_unknown(machine):
    machine()
    assert detect() == {
        "vendor": "none",
        "gpu_names": [],
        "gpu_count": 0,
        "kind": "cpu",
        "detected_kind": "cpu",
        **DETECTED,
    }
    machine(pynvml=fake_nvml(["Tesla V100-SXM2-32GB"]))
    assert detect()["kind"] == "unknown"
    machine(pynvml=fake_nvml(["NVIDIA H200", "NVIDIA A100-SXM4-80GB"]))
    assert detect()["kind"] == "unknown"  # mixed machines fit no single config


def test_bench_hardware_overrides_detection(machine, monkeypatch):
    machine(amdsmi=fake_smi(["N/A"] * 8, archs=["gfx90a"] * 8))
    assert detect()["kind"] == "unknown"
    monkeypatch.setenv("BENCH_HARDWARE", " MI355X ")
    info = detect()
    assert info["kind"] == "mi355x" and info["detected_kind"] == "unknown"
    assert info["kind_source"] == "BENCH_HARDWARE"
    assert check_hardware(["mi300x", "mi355x"], info) is None
    monkeypatch.setenv("BENCH_HARDWARE", "")
    assert detect()["kind_source"] == "detected"


def test_bad_bench_hardware_is_one_line(machine, monkeypatch, capsys):
    machine()
    monkeypatch.setenv("BENCH_HARDWARE", "mi250")
    with pytest.raises(HardwareError) as exc:
        detect()
    msg = str(exc.value)
    assert (
        msg
        == "BENCH_HARDWARE='mi250' is not a hardware kind; use one of a100, h100, h200, mi300x, mi355x, cpu"
    )
    with pytest.raises(SystemExit) as exit_:
        main_detect()
    assert exit_.value.code == 2 and capsys.readouterr().err.strip() == f"error: {msg}"


@pytest.mark.parametrize(
    "kind, file",
    [
        ("a100", "a100.yaml"),
        ("h100", "h200.yaml"),
        ("h200", "h200.yaml"),
        ("mi300x", "mi355x.yaml"),
        ("mi355x", "mi355x.yaml"),
        ("cpu", "cpu.yaml"),
    ],
)
def test_config_for(kind, file):
    assert Path(config_for(kind)) == REPO / "configs" / file


def test_config_for_unknown_raises_one_clear_line():
    with pytest.raises(HardwareError) as exc:
        config_for("unknown", "Tesla V100-SXM2-32GB x8")
    msg = str(exc.value)
    assert isinstance(exc.value, ValueError)
    assert "\n" not in msg
    assert "Tesla V100-SXM2-32GB x8" in msg
    assert "make bench-a100|bench-h200|bench-mi355x" in msg and "python -m bench sweep CONFIG" in msg
    assert "BENCH_HARDWARE=<a100|h100|h200|mi300x|mi355x> (make HARDWARE=...)" in msg


A100_X8 = {"vendor": "nvidia", "gpu_names": ["NVIDIA A100-SXM4-80GB"] * 8, "gpu_count": 8, "kind": "a100"}
H200_X8 = {"vendor": "nvidia", "gpu_names": ["NVIDIA H200"] * 8, "gpu_count": 8, "kind": "h200"}
CPU = {"vendor": "none", "gpu_names": [], "gpu_count": 0, "kind": "cpu"}


def test_check_hardware_matches():
    assert check_hardware("h200", H200_X8) is None
    assert check_hardware(["h100", "h200"], H200_X8) is None
    assert check_hardware("A100", A100_X8) is None
    assert check_hardware("cpu", H200_X8) is None
    assert check_hardware("any", CPU) is None


def test_check_hardware_messages():
    msg = check_hardware(["h100", "h200"], CPU, config="configs/h200.yaml")
    assert msg == "configs/h200.yaml is for h100/h200 GPUs but this machine has no GPU"
    msg = check_hardware(["h100", "h200"], A100_X8, config="configs/h200.yaml")
    assert msg == "configs/h200.yaml is for h100/h200 GPUs but this machine has NVIDIA A100-SXM4-80GB x8"
    msg = check_hardware("mi355x", H200_X8)
    assert msg == "this sweep config is for mi355x GPUs but this machine has NVIDIA H200 x8"


def test_check_hardware_rejects_unknown_names():
    with pytest.raises(HardwareError, match="h20"):
        check_hardware("h20", H200_X8)


def test_check_hardware_detects_when_no_info(machine):
    machine()
    assert "no GPU" in check_hardware("a100")


def test_main_detect(machine, capsys):
    machine(pynvml=fake_nvml(["NVIDIA H200"] * 8))
    assert main_detect() == 0
    assert Path(capsys.readouterr().out.strip()) == hardware.CONFIG_DIR / "h200.yaml"

    machine(torch_names=["Tesla V100"])
    with pytest.raises(SystemExit) as exc:
        main_detect()
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Tesla V100 x1" in captured.err
