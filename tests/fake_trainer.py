"""A fake trainer honouring the run contract (docs/run-contract.md), for fast driver tests.

    python -m tests.fake_trainer train CONFIG --output-dir DIR [--set k=v ...] [--use-liger-kernel]
    python -m tests.fake_trainer prepare CONFIG --output-dir DIR [--set k=v ...]
    python -m tests.fake_trainer check CONFIG [--set k=v ...]   # exit 2 on an unknown top-level key
                                                                # or a truncated cache shard

Behaviours are chosen with --set keys:
    fake.step_sleep=0.05     seconds per step
    fake.crash_at_step=N     raise an exception at step N (exit 1, run.json left "running")
    fake.crash_rank=R        only rank R crashes at crash_at_step (the other ranks go on, then hang)
    fake.hang_at_step=N      stop and sleep forever at step N (fake.hang=true: at step 1)
    fake.hang_at_exit=true   record status "ok", then sleep forever
    fake.oom=true            write run.json status "oom" at step 2 and exit 3
    fake.raw_oom=true        print a CUDA OOM traceback line and exit 1 without touching run.json
    fake.max_batch=N         OOM (exit 3, status "oom") at step 1 when training.batch_size > N
    fake.spawn_child=true    start a grandchild process that sleeps (tests process-group cleanup)
    fake.allreduce=true      join the torchrun world over gloo and all-reduce rank + 1 (run.json
                             records the sum and the agents' GROUP_RANKs: one per node)
    fake.step_time_s=0.1     report this step time instead of the measured one, times a per-run
                             factor exp(N(0, fake.run_sd)) seeded by the run directory's name and
                             divided by fake.liger_speedup in the Liger arm: throughput drawn from
                             a known distribution, the same on every replay of a run
    data.fail_prepare=true   make `prepare` fail
and from the environment (so that one sweep of a config can differ from another):
    FAKE_BLOCK_AFTER_RUNS=N  block forever before step 1 once N runs of the sweep have finished
                             (a test kills the driver there: a deterministic point mid-sweep)
    FAKE_BLOCK_FILE=PATH     with FAKE_BLOCK_AFTER_RUNS: block only while PATH exists (so that a
                             later sweep goes on once the test removes it), after creating
                             PATH.reached (so that the test knows a run is blocking)
    FAKE_FAIL_RUNS=a,b       runs whose output directory is named a or b crash before step 1
                             (exit 1): a transient failure that the next sweep need not repeat
    FAKE_ENOSPC_RUNS=a,b     runs whose output directory is named a or b fail as on a full disk
                             (OSError ENOSPC, exit 1) before step 1
    fake.record_effect=false record nothing of what the run trained (no draft_module_types, no
                             set_resolved): a trainer that does not say whether an arm took effect
    FAKE_RECORD_ENV=A,B      record these environment variables' values in run.json's "env" (what
                             reached the trainer: a Slurm step's setup exports, srun --export)
The loss depends only on the step and the seed, so both arms agree (loss parity).
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import random
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

from bench.fileio import append_jsonl, atomic_write_json

KNOWN_KEYS = {"profile", "mode", "data", "training", "model", "target", "fake"}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _parse_sets(items: list[str]) -> dict:
    sets = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"error: --set {item!r}: expected key=value", file=sys.stderr)
            sys.exit(2)
        sets[key] = yaml.safe_load(value)
    return sets


def _load(config: str, sets: dict) -> dict:
    try:
        cfg = yaml.safe_load(Path(config).read_text())
    except OSError:
        print(f"error: {config}: no such training config", file=sys.stderr)
        sys.exit(2)
    for key, value in sets.items():
        node = cfg
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return cfg


def _get(cfg: dict, dotted: str, default=None):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def prepare(cfg: dict, out: Path) -> int:
    if _get(cfg, "data.fail_prepare"):
        print("preparing ...")
        print("error: fake prepare failure (data.fail_prepare)", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    (out / "shard-0.bin").write_bytes(b"\0" * 64)
    atomic_write_json(
        out / "meta.json", {"seq_len": _get(cfg, "data.seq_len"), "profile": cfg.get("profile")}
    )
    return 0


def _allreduce(rank: int) -> dict:
    """Sum rank + 1 over the world (gloo) and gather each rank's GROUP_RANK (its agent's node rank)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        total = torch.tensor([rank + 1.0])
        dist.all_reduce(total)
        groups: list = [None] * dist.get_world_size()
        dist.all_gather_object(groups, int(os.environ.get("GROUP_RANK", "0")))
    finally:
        dist.destroy_process_group()
    return {"allreduce": total.item(), "group_ranks": groups}


def _block_after_runs(out: Path) -> None:
    """FAKE_BLOCK_AFTER_RUNS=N: once N sibling runs have a terminal run.json, sleep until killed."""
    limit = os.environ.get("FAKE_BLOCK_AFTER_RUNS")
    if not limit:
        return
    finished = 0
    for path in (
        p for p in out.parent.glob("*/run.json") if p.parent != out
    ):  # other runs (ranks race on this one)
        try:
            finished += json.loads(path.read_text()).get("status") not in (None, "running")
        except (OSError, ValueError):
            pass
    if finished >= int(limit):
        gate = os.environ.get("FAKE_BLOCK_FILE")
        if gate and not Path(gate).exists():
            return
        if gate:
            Path(gate + ".reached").touch()
        while not gate or Path(gate).exists():
            time.sleep(0.05 if gate else 3600)


def _effect(cfg: dict, liger: bool, sets: dict) -> dict:
    """What our trainer records of what it trained (run.json): the draft's module classes (Liger's
    RMSNorm and SwiGLU where the Liger switch is on and the kernel is not turned off) and the value
    each key set on the command line resolved to (the fake takes every key as given)."""
    if (cfg.get("fake") or {}).get("record_effect") is False:
        return {}
    rms = liger and _get(cfg, "model.liger_rms_norm", True) is not False
    swiglu = liger and _get(cfg, "model.liger_swiglu", True) is not False
    types = ["Draft", "LigerRMSNorm" if rms else "Qwen3RMSNorm", "LigerSwiGLUMLP" if swiglu else "Qwen3MLP"]
    resolved = {k: {"config": v} for k, v in sets.items() if not k.startswith("fake.")}
    return {"draft_module_types": sorted(types), "set_resolved": resolved}


def train(cfg: dict, out: Path, liger: bool, sets: dict | None = None) -> int:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    steps = int(_get(cfg, "training.steps", 10))
    batch = int(_get(cfg, "training.batch_size", 1))
    accum = int(_get(cfg, "training.accumulation_steps", 1))
    seq = int(_get(cfg, "data.seq_len", 128))
    fake = cfg.get("fake") or {}
    if cfg.get("mode") == "offline":
        cache = _get(cfg, "data.cache_dir")
        if not cache or not (Path(cache) / "meta.json").exists():
            print(f"error: offline mode needs data.cache_dir with meta.json, got {cache!r}", file=sys.stderr)
            return 2
    out.mkdir(parents=True, exist_ok=True)
    run = {
        "status": "running",
        "reason": None,
        "arm": "liger" if liger else "baseline",
        "start_time": _now(),
        "end_time": None,
        "world_size": world,
        "config": cfg,
        "liger": {"enabled": liger, "scope": "draft", "version": None},
        "objective": "fake",
        "provenance": {"hostname": os.uname().nodename, "gpu_names": [], "gpu_count": 0},
        **_effect(cfg, liger, sets or {}),
    }
    if os.environ.get("FAKE_RECORD_ENV"):
        run["env"] = {k: os.environ.get(k) for k in os.environ["FAKE_RECORD_ENV"].split(",")}
    if fake.get("allreduce"):
        run.update(_allreduce(rank))
    if rank == 0:
        atomic_write_json(out / "run.json", run)
    _block_after_runs(out)
    if out.name in os.environ.get("FAKE_FAIL_RUNS", "").split(","):
        raise RuntimeError(f"fake transient failure of {out.name} (FAKE_FAIL_RUNS)")
    if out.name in os.environ.get("FAKE_ENOSPC_RUNS", "").split(","):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "metrics.jsonl"))
    if fake.get("spawn_child"):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    hang_at = fake.get("hang_at_step") or (1 if fake.get("hang") else None)
    sleep = float(fake.get("step_sleep", 0.02))
    samples = batch * accum * world
    reported = None
    if fake.get("step_time_s"):
        rng = random.Random(out.name)
        reported = float(fake["step_time_s"]) * math.exp(rng.gauss(0.0, float(fake.get("run_sd", 0.0))))
        reported /= float(fake.get("liger_speedup", 1.0)) if liger else 1.0
    for step in range(1, steps + 1):
        if step == fake.get("crash_at_step") and fake.get("crash_rank", rank) == rank:
            raise RuntimeError(f"fake crash at step {step} on rank {rank}")
        if step == fake.get("crash_at_step"):  # a surviving rank waits on its dead peer, as in a collective
            time.sleep(3600)
        if step == hang_at:
            print(f"hanging at step {step}", flush=True)
            time.sleep(3600)
        if fake.get("max_batch") is not None and batch > int(fake["max_batch"]) and step == 1:
            print(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 ...",
                flush=True,
            )
            if rank == 0:
                atomic_write_json(
                    out / "run.json",
                    {
                        **run,
                        "status": "oom",
                        "reason": "CUDA out of memory. Tried to allocate 2.00 GiB",
                        "end_time": _now(),
                    },
                )
            return 3
        if fake.get("oom") and step == 2:
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
            if rank == 0:
                atomic_write_json(
                    out / "run.json",
                    {**run, "status": "oom", "reason": "CUDA out of memory", "end_time": _now()},
                )
            return 3
        if fake.get("raw_oom") and step == 2:
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
            print("fatal: giving up", flush=True)
            return 1
        t0 = time.perf_counter()
        time.sleep(sleep)
        dt = time.perf_counter() - t0 if reported is None else reported
        if rank == 0:
            append_jsonl(
                out / "metrics.jsonl",
                {
                    "step": step,
                    "loss": 10.0 * math.exp(-step / 20) + 1.0,
                    "accuracy": min(0.9, 0.01 * step),
                    "step_time_s": dt,
                    "samples": samples,
                    "tokens": samples * seq,
                    "samples_per_s": samples / dt,
                    "tokens_per_s": samples * seq / dt,
                    "lr": 1e-4,
                    "grad_norm": 1.0,
                    "torch_peak_allocated_gib": 0.0,
                    "torch_peak_reserved_gib": 0.0,
                    "mfu": None,
                },
            )
        print(f"step {step}/{steps} loss {10.0 * math.exp(-step / 20) + 1.0:.4f}", flush=True)
    if rank == 0:
        atomic_write_json(out / "run.json", {**run, "status": "ok", "end_time": _now()})
    if fake.get("hang_at_exit"):
        time.sleep(3600)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fake_trainer")
    p.add_argument("command", choices=["train", "prepare", "check"])
    p.add_argument("config")
    p.add_argument("--set", action="append", default=[], dest="sets")
    p.add_argument("--use-liger-kernel", action="store_true")
    p.add_argument("--output-dir")
    args = p.parse_args(argv)
    sets = _parse_sets(args.sets)
    cfg = _load(args.config, sets)
    if args.command == "check":
        cache = _get(cfg, "data.cache_dir")
        if cache and Path(cache).is_dir() and (Path(cache) / "shard-0.bin").stat().st_size != 64:
            print(f"error: data.cache_dir: {cache}/shard-0.bin is truncated", file=sys.stderr)
            return 2
        unknown = sorted(set(cfg) - KNOWN_KEYS)
        if unknown:
            print(
                f"error: {unknown[0]}: unknown key; expected one of {', '.join(sorted(KNOWN_KEYS))}",
                file=sys.stderr,
            )
            return 2
        return 0
    if not args.output_dir:
        print("error: --output-dir is required", file=sys.stderr)
        return 2
    if args.command == "prepare":
        return prepare(cfg, Path(args.output_dir))
    return train(cfg, Path(args.output_dir), args.use_liger_kernel, sets)


if __name__ == "__main__":
    print(json.dumps(sys.argv[1:]), flush=True)
    sys.exit(main())
