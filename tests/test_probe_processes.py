"""What "used" counts (NVML's v2 memory call, the driver's reserve apart) and who holds memory on
the polled cards (NVML and AMD SMI process lists; the suite's own processes told from others'),
against fakes with the real libraries' call signatures and return shapes (pynvml 12.x's
nvmlDeviceGetMemoryInfo(handle, version=None) and process structs; amdsmi 6.4+'s list of dicts
and 6.0-6.3's process handles)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types

from bench.probe.amd import AmdSmiBackend
from bench.probe.backends import GIB
from bench.probe.nvml import NvmlBackend
from bench.probe.poller import VramPoller
from bench.probe.processes import ProcessLog, owner

RESERVE = int(0.6 * GIB)


class NVMLError(Exception):
    pass


def fake_pynvml(v2: bool = True, procs=None) -> types.ModuleType:
    """NVML's memory and process calls as pynvml exposes them: v1 ``used`` includes the driver's
    reserve, v2 reports it apart (``nvmlMemory_v2`` is the version constant pynvml passes)."""
    nv = types.ModuleType("pynvml")
    nv.nvmlMemory_v2 = 0x02000028
    used = [4 * GIB, 1 * GIB]

    def mem(h, version=None):
        if version is None:
            return types.SimpleNamespace(total=80 * GIB, free=0, used=used[h] + RESERVE)
        if not v2:
            raise NVMLError("Function Not Found")
        return types.SimpleNamespace(version=version, total=80 * GIB, reserved=RESERVE, free=0, used=used[h])

    def running(h):
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=u) for pid, u in (procs or {}).get(h, [])]

    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetMemoryInfo = mem
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    nv.nvmlSystemGetDriverVersion = lambda: "580.159.04"
    nv.nvmlDeviceGetComputeRunningProcesses = running
    nv.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    return nv


def test_used_is_nvml_v2_without_the_driver_reserve(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(v2=True))
    b = NvmlBackend()
    assert b.memory_api == "nvml_v2"
    assert b.used_bytes() == [4 * GIB, 1 * GIB] and b.reserved_bytes() == [RESERVE, RESERVE]


def test_an_older_driver_falls_back_to_v1_and_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(v2=False))
    b = NvmlBackend()
    assert b.memory_api == "nvml_v1"
    assert b.used_bytes() == [4 * GIB + RESERVE, 1 * GIB + RESERVE] and b.reserved_bytes() == [None, None]


def test_nvml_processes_per_card_with_unavailable_memory_as_none(monkeypatch):
    procs = {0: [(4242, 3 * GIB), (4242, 2 * GIB), (77, None)], 1: []}
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(procs=procs))
    assert NvmlBackend().processes() == [
        [{"pid": 4242, "used_bytes": 3 * GIB}, {"pid": 77, "used_bytes": None}],
        [],
    ]


class FakeAmdSmi(types.ModuleType):
    """amdsmi's process calls: 6.4+ returns dicts, 6.0-6.3 handles resolved by get_process_info."""

    def __init__(self, handles: bool):
        super().__init__("amdsmi")
        self.handles = handles
        self.AmdSmiMemoryType = types.SimpleNamespace(VRAM=0)

    def amdsmi_init(self):
        pass

    def amdsmi_shut_down(self):
        pass

    def amdsmi_get_processor_handles(self):
        return ["gpu0"]

    def amdsmi_get_gpu_process_list(self, h):
        info = [
            {
                "name": "python3",
                "pid": 31337,
                "mem": 0,
                "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": 5 * GIB},
            }
        ]
        return ["proc-handle-0"] if self.handles else info

    def amdsmi_get_gpu_process_info(self, h, p):
        assert p == "proc-handle-0"
        return {
            "name": "python3",
            "pid": 31337,
            "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": 5 * GIB},
        }


def test_amd_smi_processes_in_both_library_shapes(monkeypatch):
    for handles in (False, True):
        monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi(handles))
        b = AmdSmiBackend()
        assert b.processes() == [[{"pid": 31337, "used_bytes": 5 * GIB}]]
        assert b.memory_api == "amdsmi" and b.reserved_bytes() == [None]


def test_owner_tells_the_suite_s_processes_from_others():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert owner(os.getpid()) == "suite" and owner(child.pid) == "suite"
        assert owner(1) == "foreign"  # init: visible here, not ours
        assert owner(2**22 + 12345) == "unknown"  # no such pid here: another PID namespace
    finally:
        child.kill()
        child.wait()


def test_the_log_keeps_each_process_s_largest_memory_and_when_it_came():
    log = ProcessLog(root=os.getpid())
    log.add([[{"pid": 1, "used_bytes": GIB}], []], "before")
    log.add([[{"pid": 1, "used_bytes": 3 * GIB}], [{"pid": os.getpid(), "used_bytes": None}]], "during")
    assert log.summary() == [
        {"card": 0, "pid": 1, "owner": "foreign", "first_seen": "before", "max_used_gib": 3.0},
        {"card": 1, "pid": os.getpid(), "owner": "suite", "first_seen": "during", "max_used_gib": None},
    ]


def test_vram_json_says_what_used_counts_and_who_held_the_cards(tmp_path, monkeypatch):
    monkeypatch.setitem(
        sys.modules, "pynvml", fake_pynvml(procs={0: [(1, 2 * GIB)], 1: [(os.getpid(), GIB)]})
    )
    poller = VramPoller(tmp_path, interval_s=0.01, state_interval_s=0.02).start()
    time.sleep(0.1)
    summary = poller.stop()
    assert summary["memory_api"] == "nvml_v2" and summary["status"] == "ok"
    assert [d["reserved_gib"] for d in summary["devices"]] == [0.6, 0.6]
    assert [d["peak_used_gib"] for d in summary["devices"]] == [4.0, 1.0]  # without the reserve
    owners = {(p["card"], p["owner"], p["first_seen"]) for p in summary["processes"]}
    assert owners == {(0, "foreign", "before"), (1, "suite", "before")}


def test_foreign_processes_lists_only_the_others(monkeypatch):
    from bench.probe import vram

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(procs={0: [(1, 2 * GIB), (os.getpid(), GIB)]}))
    assert vram.foreign_processes() == [
        {"card": 0, "pid": 1, "owner": "foreign", "first_seen": "before", "max_used_gib": 2.0}
    ]


def test_refuse_makes_a_run_an_error_while_another_process_holds_the_cards(tmp_path, monkeypatch):
    """foreign_processes: refuse, through the real run loop with the test suite's fake trainer."""
    from bench.probe import vram
    from bench.run.sweep import run_sweep
    from tests.test_driver import statuses, sweep_file, train_configs

    tc = train_configs(tmp_path)
    cells = [{"config": tc["online"], "batch_size": 1, "seq_len": 64}]
    held = [{"card": 0, "pid": 4242, "owner": "foreign", "first_seen": "before", "max_used_gib": 12.0}]
    monkeypatch.setattr(vram, "foreign_processes", lambda *a, **k: held)
    # (warn, the default, is every other sweep of the test suite: runs go ahead, flagged in runs.csv)
    out = tmp_path / "refuse"
    run_sweep(str(sweep_file(tmp_path, cells, foreign_processes="refuse")), out=str(out), argv=["test"])
    (refused,) = statuses(out).values()
    assert refused["status"] == "error" and refused["reason"] == (
        "refused: another process holds memory on the cards (pid 4242 on card 0 (foreign)); foreign_processes: refuse"
    )
