"""The real trainer, end to end on the CPU with the tiny profile."""

import json
import subprocess
import sys

import pytest
import torch

from tests.helpers import CONFIGS, REPO, run_cli

OFFLINE = str(CONFIGS / "train/tiny-offline.yaml")
ONLINE = str(CONFIGS / "train/tiny-online.yaml")
METRIC_KEYS = {
    "step",
    "loss",
    "accuracy",
    "step_time_s",
    "samples",
    "tokens",
    "samples_per_s",
    "tokens_per_s",
    "lr",
    "grad_norm",
    "torch_peak_allocated_gib",
    "torch_peak_reserved_gib",
    "mfu",
}


def train_args(out, sets, config, cache) -> list[str]:
    """``train CONFIG --output-dir OUT [--set data.cache_dir=CACHE] [--set KEY=VALUE ...]``."""
    args = ["train", config, "--output-dir", str(out)]
    if cache is not None:
        args += ["--set", f"data.cache_dir={cache}"]
    for s in sets:
        args += ["--set", s]
    return args


def train(out, *sets, config=OFFLINE, cache=None):
    return run_cli("specforge", *train_args(out, sets, config, cache))


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_offline_trains_and_loss_falls(tmp_path, tiny_cache):
    r = train(tmp_path / "a", cache=tiny_cache)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = metrics(tmp_path / "a")
    assert [row["step"] for row in rows] == list(range(1, 31))
    assert METRIC_KEYS <= set(rows[0])
    first = sum(row["loss"] for row in rows[:5]) / 5
    last = sum(row["loss"] for row in rows[-5:]) / 5
    assert last < first - 0.5, (first, last)
    assert rows[0]["samples"] == 4 and rows[0]["tokens"] == 4 * 128
    run = json.loads((tmp_path / "a" / "run.json").read_text())
    assert run["status"] == "ok" and run["reason"] is None and run["arm"] == "baseline"
    assert run["config"]["training"]["steps"] == 30 and run["world_size"] == 1
    liger_record = {
        "enabled": False,
        "scope": "draft",
        "kernels": [],
        "version": run["provenance"]["liger_kernel"],
    }
    assert run["liger"] == liger_record
    assert run["provenance"]["torch"] == torch.__version__ and "hostname" in run["provenance"]
    assert "fused linear-CE" in run["objective"] and run["model_flops_per_step"] > 0
    assert run["optimizer"] == "AdamW, foreach"  # fused AdamW is a GPU kernel; the CPU always runs foreach
    assert "step 30/30 | loss" in r.stdout


def train_here(out, *sets, config=OFFLINE, cache=None) -> int:
    """``specforge train`` in this process (the trainer's main; test_offline_trains_and_loss_falls
    runs the command line itself): a second run here starts from whatever the first left behind."""
    from specforge.__main__ import main

    return main(train_args(out, sets, config, cache))


def test_same_seed_same_losses_different_seed_differs(tmp_path, tiny_cache, capsys):
    for name, seed in (("a", 42), ("b", 42), ("c", 7)):
        assert train_here(tmp_path / name, "training.steps=6", f"training.seed={seed}", cache=tiny_cache) == 0
    a, b, c = (metrics(tmp_path / n) for n in "abc")
    assert [x["loss"] for x in a] == [x["loss"] for x in b]
    assert [x["loss"] for x in a] != [x["loss"] for x in c]
    ra, rb = (json.loads((tmp_path / n / "run.json").read_text()) for n in "ab")
    assert ra["param_checksum"] == rb["param_checksum"]


def test_online_with_target_in_the_loop(tmp_path, tiny_cache, monkeypatch, capsys):
    """Online, the draft reads the target's capture layers, computed in the loop: its first
    step equals the offline one on a cache prepared from the same (seeded) target, and the
    target runs once per micro-batch over that micro-batch's tokens."""
    from specforge import target as target_mod
    from specforge.__main__ import main
    from specforge.config import load_profile

    calls = []
    real = target_mod.capture_hidden

    def spy(model, ids, layer_ids):
        out = real(model, ids, layer_ids)
        calls.append((tuple(ids.shape), list(layer_ids), tuple(out.shape)))
        return out

    monkeypatch.setattr(target_mod, "capture_hidden", spy)
    on, off = tmp_path / "on", tmp_path / "off"
    assert main(["train", ONLINE, "--output-dir", str(on), "--set", "training.steps=2"]) == 0
    n_online = len(calls)
    sets = ["--set", "training.steps=2", "--set", f"data.cache_dir={tiny_cache}"]
    assert main(["train", OFFLINE, "--output-dir", str(off), *sets]) == 0
    capsys.readouterr()
    capture = load_profile("tiny").target.capture_layer_ids
    assert n_online == 2 * 2 and len(calls) == n_online  # steps x accumulation; offline: none
    assert all(c == ((2, 128), capture, (2, 128, 64 * len(capture))) for c in calls)
    a, b = metrics(on), metrics(off)
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], rel=1e-5)
    assert a[0]["grad_norm"] == pytest.approx(b[0]["grad_norm"], rel=1e-5)
    for out in (on, off):
        assert_run_records(out)


def assert_run_records(out):
    """Our trainer's files are the driver's records (bench/record.py; the trainer imports nothing
    of the driver, so this ties the two): the names, run.json with no key the record does not
    type, every metrics row a MetricRow (untyped there: the trainer's alloc_ooms and model_tflops)."""
    from bench.record import METRICS_JSONL, RUN_JSON, RunDoc, read_metrics_counted
    from specforge.runfiles import RUN_FILES

    assert RUN_FILES == (RUN_JSON, METRICS_JSONL)
    obj = json.loads((out / RUN_JSON).read_text())
    doc = RunDoc.from_json(obj, out / RUN_JSON)
    assert doc.extra == {} and doc.to_json() == obj and doc.status == "ok"
    rows, bad = read_metrics_counted(out)
    assert bad == 0 and [r.step for r in rows] == list(range(1, len(metrics(out)) + 1))
    assert {k for r in rows for k in r.extra} <= {"alloc_ooms", "model_tflops", "profiled"}


def test_existing_run_not_overwritten(tmp_path, tiny_cache, capsys):
    out = tmp_path / "run"
    assert train_here(out, "training.steps=2", cache=tiny_cache) == 0
    before = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert train_here(out, "training.steps=2", cache=tiny_cache) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == before


@pytest.mark.slow
def test_fsdp2_two_processes_on_gloo(tmp_path, tiny_cache):
    out = tmp_path / "fsdp"
    r = run_cli(
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        "29531",
        "-m",
        "specforge",
        "train",
        OFFLINE,
        "--output-dir",
        str(out),
        "--set",
        f"data.cache_dir={tiny_cache}",
        "--set",
        "training.steps=4",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = metrics(out)
    assert len(rows) == 4 and rows[0]["samples"] == 2 * 2 * 2  # batch x accumulation x world
    run = json.loads((out / "run.json").read_text())
    assert run["world_size"] == 2 and run["status"] == "ok"


_GLOO_EXIT = """
import atexit, os, sys
import torch.distributed as dist
from specforge import teardown
atexit.register(lambda: print("interpreter shutdown ran", flush=True))
if sys.argv[1] == "gloo":
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29532", rank=0, world_size=1)
teardown.destroy_process_group()
print("destroyed:", dist.is_initialized(), flush=True)
teardown.exit_process(3)
"""


@pytest.mark.parametrize("backend", ["gloo", "none"])
def test_gloo_process_leaves_without_interpreter_shutdown(backend):
    """After a gloo group, the process exits with its code and skips the interpreter's shutdown,
    where a gloo worker thread freeing a finished collective aborts the rank (specforge/teardown.py);
    without one, the exit is the usual one."""
    r = subprocess.run(
        [sys.executable, "-c", _GLOO_EXIT, backend], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 3, r.stderr[-2000:]
    assert "destroyed: False" in r.stdout
    assert ("interpreter shutdown ran" in r.stdout) == (backend == "none")


def test_jsonl_token_records(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    rec = {"input_ids": [(7 * i) % 500 for i in range(100)], "loss_mask": [0] * 20 + [1] * 80}
    data.write_text("\n".join(json.dumps(rec) for _ in range(4)) + "\n")
    assert (
        train_here(
            tmp_path / "j", "training.steps=2", "data.source=jsonl", f"data.path={data}", config=ONLINE
        )
        == 0
    )
    assert len(metrics(tmp_path / "j")) == 2
    data.write_text(json.dumps({"input_ids": [1, 2, 99999]}) + "\n")
    capsys.readouterr()
    assert train_here(tmp_path / "bad", "data.source=jsonl", f"data.path={data}", config=ONLINE) == 2
    assert "outside [0, 512)" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_oom_reason_in_run_json_is_the_allocators_first_sentence():
    from specforge.runfiles import oom_reason

    e = RuntimeError(
        "CUDA out of memory. Tried to allocate 9.27 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
        "5.27 GiB is free. Process 1 has 134.53 GiB memory in use. See PYTORCH_CUDA_ALLOC_CONF"
    )
    assert oom_reason(e) == "CUDA out of memory. Tried to allocate 9.27 GiB"
    assert (
        oom_reason(RuntimeError("out of memory somewhere\nmore"))
        == "RuntimeError: out of memory somewhere more"
    )
