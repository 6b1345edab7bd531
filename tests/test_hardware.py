"""Hardware detection, config choice and config/hardware checks (fake pynvml/amdsmi/torch)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from bench import hardware
from bench.hardware import HardwareError, check_hardware, classify, config_for, detect, main_detect

GIB = 2**30
REPO = Path(__file__).resolve().parent.parent


def fake_pynvml(names: list) -> types.ModuleType:
    mod = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    mod.NVMLError = NVMLError
    mod.nvmlInit = lambda: None
    mod.nvmlDeviceGetCount = lambda: len(names)
    mod.nvmlDeviceGetHandleByIndex = lambda i: i
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=GIB, total=80 * GIB)
    mod.nvmlDeviceGetName = lambda h: names[h]
    mod.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    mod.nvmlShutdown = lambda: None
    return mod


def fake_amdsmi(names: list[str]) -> types.ModuleType:
    mod = types.ModuleType("amdsmi")

    class AmdSmiException(Exception):
        pass

    class AmdSmiMemoryType:
        VRAM = 0

    mod.AmdSmiException = AmdSmiException
    mod.AmdSmiMemoryType = AmdSmiMemoryType
    mod.amdsmi_init = lambda: None
    mod.amdsmi_get_processor_handles = lambda: list(range(len(names)))
    mod.amdsmi_get_gpu_vram_usage = lambda h: {"vram_total": 288 * 1024, "vram_used": 10}
    mod.amdsmi_get_gpu_memory_usage = lambda h, t: 10 * 2**20
    mod.amdsmi_get_gpu_asic_info = lambda h: {"market_name": names[h]}
    mod.amdsmi_shut_down = lambda: None
    return mod


def fake_torch(names: list[str], hip: str | None = None) -> types.ModuleType:
    mod = types.ModuleType("torch")
    mod.cuda = types.SimpleNamespace(
        is_available=lambda: bool(names),
        device_count=lambda: len(names),
        get_device_name=lambda i: names[i],
    )
    mod.version = types.SimpleNamespace(hip=hip, cuda=None if hip else "12.8")
    return mod


@pytest.fixture
def machine(monkeypatch):
    """Set what this 'machine' exposes: management libraries and/or torch's view."""

    def setup(pynvml=None, amdsmi=None, torch_names=(), hip=None):
        monkeypatch.setitem(sys.modules, "pynvml", pynvml)
        monkeypatch.setitem(sys.modules, "amdsmi", amdsmi)
        monkeypatch.setitem(sys.modules, "torch", fake_torch(list(torch_names), hip))

    return setup


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
        ("amd instinct mi300x vf", "mi300x"),
        ("Tesla V100-SXM2-32GB", "unknown"),
        ("Tesla V100", "unknown"),
    ],
)
def test_classify_real_names(name, kind):
    assert classify(name) == kind


def test_detect_nvidia_via_nvml(machine):
    machine(pynvml=fake_pynvml([b"NVIDIA H100 80GB HBM3"] * 8))
    assert detect() == {
        "vendor": "nvidia",
        "gpu_names": ["NVIDIA H100 80GB HBM3"] * 8,
        "gpu_count": 8,
        "kind": "h100",
    }


def test_detect_amd_via_amdsmi(machine):
    machine(amdsmi=fake_amdsmi(["AMD Instinct MI355X"] * 8))
    info = detect()
    assert (info["vendor"], info["kind"], info["gpu_count"]) == ("amd", "mi355x", 8)


def test_detect_falls_back_to_torch(machine):
    machine(torch_names=["NVIDIA A100-SXM4-80GB"] * 2)
    assert detect() == {
        "vendor": "nvidia",
        "gpu_names": ["NVIDIA A100-SXM4-80GB"] * 2,
        "gpu_count": 2,
        "kind": "a100",
    }
    machine(torch_names=["AMD Instinct MI300X"], hip="6.4.0")
    info = detect()
    assert (info["vendor"], info["kind"]) == ("amd", "mi300x")


def test_detect_cpu_and_unknown(machine):
    machine()
    assert detect() == {"vendor": "none", "gpu_names": [], "gpu_count": 0, "kind": "cpu"}
    machine(pynvml=fake_pynvml(["Tesla V100-SXM2-32GB"]))
    assert detect()["kind"] == "unknown"
    machine(pynvml=fake_pynvml(["NVIDIA H200", "NVIDIA A100-SXM4-80GB"]))
    assert detect()["kind"] == "unknown"  # mixed machines fit no single config


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
    machine(pynvml=fake_pynvml(["NVIDIA H200"] * 8))
    assert main_detect() == 0
    assert Path(capsys.readouterr().out.strip()) == hardware.CONFIG_DIR / "h200.yaml"

    machine(torch_names=["Tesla V100"])
    with pytest.raises(SystemExit) as exc:
        main_detect()
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Tesla V100 x1" in captured.err
