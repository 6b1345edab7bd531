"""The pieces of one run (put together by ``Session.execute``): ``cell.json`` (with where the
engine placed it: a Slurm allocation), the compile-cache environment, the VRAM poller around the
process tree the plug's command starts (watched and ended through the engine's step hooks when it
has them: bench/run/engine.py), the record of a run the engine lost (a failed node, a time limit),
and whether a failure was the machine's (a full disk, a read-only filesystem) rather than the
run's."""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench.config import Run, SweepConfig
from bench.fileio import atomic_write_json
from bench.probe import nodevram, pairvram, vram
from bench.procs.launcher import run_process
from bench.record import CellDoc, RunDoc, write_run
from bench.run.engine import LOST, Lost, StepHooks


def launch_polled(
    cfg: SweepConfig,
    run: Run,
    rdir: Path,
    argv: list[str],
    tick,
    env: dict,
    fork: bool = False,
    step: StepHooks | None = None,
    pair: tuple[Path, list[Path]] | None = None,
) -> tuple[int, bool]:
    """The process tree, with this machine's cards polled around it (multi-node: each node
    polls its own beside its agent, bench/probe/nodevram.py, gathered here afterwards); ``step``:
    the engine's hooks on it (a Slurm job step: found, ended with scancel, recorded).
    ``pair``: the pair directory and the other run directories of a lockstep pair whose tree this
    is: the card is shared, so the poll goes to the pair directory with each process's memory read
    at every sample, and each run's own vram.json is drawn from it afterwards
    (bench/probe/pairvram.py); energy is read every LOCKSTEP_POWER_INTERVAL_S (each run's share is
    its own turns'); the limit is twice a run's."""
    poller = None
    multinode = run.cell.nodes > 1
    if not cfg.polls(run.arm):
        why = "poll_vram: false" if not cfg.poll_vram else f"arm {run.arm} runs without the poller"
        for d in [rdir, *(pair[1] if pair else [])]:
            atomic_write_json(d / "vram.json", {"backend": "none", "status": "disabled", "reason": why})
    elif pair is not None:
        poller = quietly(
            "VRAM poller",
            lambda: vram.VramPoller(
                pair[0],
                interval_s=cfg.poll_interval_s,
                power_interval_s=LOCKSTEP_POWER_INTERVAL_S,
                per_process=True,
            ),
        )
    elif not multinode:
        poller = quietly("VRAM poller", lambda: vram.VramPoller(rdir, interval_s=cfg.poll_interval_s))
    if poller is not None:
        quietly("VRAM poller", poller.start)
    try:
        result = run_process(
            argv,
            rdir / "stdout.log",
            rdir / "launch.json",
            run.cell.timeout_s * (2 if pair is not None else 1),
            tick if step is None else _both(step.watch, tick),
            env,
            fork=fork,
            stop=step.stop if step is not None else None,
        )
    finally:
        if poller is not None:
            quietly("VRAM poller", poller.stop)
            if pair is not None:
                quietly("VRAM of the pair's runs", lambda: pairvram.split(pair[0], [rdir, *pair[1]]))
        if step is not None:  # also when the driver was stopped (it ended the step)
            quietly("step record", lambda: step.record(rdir))
    if multinode and cfg.polls(run.arm):
        quietly("VRAM gather", lambda: nodevram.gather(rdir, run.cell.nodes, rdir / "stdout.log"))
    return result


# A lockstep turn lasts about a second (the 4B cell: 0.8-1.2 s) and its energy is the counter's
# value at the turn's end minus at its start, each interpolated between the readings around it. On
# the H200 (driver 580.159.04) the counter moves about every 0.1 s, so reading it more often adds
# nothing, and reading it every 0.25 s (a sequential run's rate) would leave a turn's ends that
# much further from a reading.
LOCKSTEP_POWER_INTERVAL_S = 0.1


def record_lost(rdir: Path, doc: RunDoc, lost: Lost) -> RunDoc:
    """run.json of a run the engine lost: status ``lost`` (never final: --resume redoes it), the
    engine's reason, and what the run's own reading-back said (``run_status``, ``run_reason``)."""
    rec = doc.updated(
        status=LOST, reason=lost.reason, lost_cause=lost.cause, run_status=doc.status, run_reason=doc.reason
    )
    write_run(rdir, rec)
    return rec


def _both(first: Callable[[], None], then: Callable[[], None] | None) -> Callable[[], None]:
    def tick() -> None:
        first()
        if then is not None:
            then()

    return tick


def compile_env(compile_dir: Path | None, env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Environment pointing TorchInductor (FX graph, AOTAutograd, autotune) and Triton at the
    sweep's shared compile cache; empty when the sweep does not share one. Where the environment
    writes no Python bytecode (PYTHONDONTWRITEBYTECODE, as on the lent H200s, whose torch ships
    without any), Python's own compile cache goes there too (PYTHONPYCACHEPREFIX): otherwise every
    run compiles every module it imports again (bytecode_dir)."""
    if compile_dir is None:
        return {}
    out = {
        "TORCHINDUCTOR_CACHE_DIR": str(compile_dir / "inductor"),
        "TRITON_CACHE_DIR": str(compile_dir / "triton"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    }
    pyc = bytecode_dir(compile_dir, env)
    if pyc is not None:
        out |= {"PYTHONPYCACHEPREFIX": str(pyc), "PYTHONDONTWRITEBYTECODE": ""}  # "" = unset, for Python
    return out


def bytecode_dir(compile_dir: Path | None, env: Mapping[str, str] = os.environ) -> Path | None:
    """Where the runs share Python's bytecode: under the compile cache, when the environment
    would write none (PYTHONDONTWRITEBYTECODE non-empty) and names no PYTHONPYCACHEPREFIX of its own."""
    if compile_dir is None or not env.get("PYTHONDONTWRITEBYTECODE") or env.get("PYTHONPYCACHEPREFIX"):
        return None
    return compile_dir / "pycache"


def cell_record(
    cfg: SweepConfig,
    run: Run,
    argv: list[str],
    cache_dir: Path | None,
    placement: dict | None = None,
    arm_keys: dict | None = None,
) -> CellDoc:
    """cell.json: what the driver planned for this run (its identity, the cell, the command), and
    where the engine placed it (``placement``: a Slurm allocation's ``slurm``); ``arm_keys``: the
    keys the plug set for a built-in arm's intent (its ``arm_sets``), recorded where there are any."""
    c = run.cell
    return CellDoc.of(
        run_id=run.run_id,
        cell_id=c.cell_id,
        sweep=cfg.name,
        profile=c.profile,
        mode=c.mode,
        batch_size=c.batch_size,
        seq_len=c.seq_len,
        accumulation_steps=c.accumulation_steps,
        num_anchors=c.num_anchors,
        gpus=c.gpus,
        nodes=c.nodes,
        arm=run.arm,
        trainer=c.trainer,
        repeat=run.repeat,
        order_index=run.order_index,
        steps=c.steps,
        warmup_steps=c.warmup_steps,
        loss_tolerance=cfg.loss_tolerance,
        attention_backend=c.attention_backend,
        train_config=c.train_config,
        config_sha256=c.config_sha256,
        set=c.overrides,
        **({"arm_set": dict(run.spec.sets)} if run.spec.user else {}),
        **({"arm_env": run.spec.env.declared()} if run.spec.env is not None else {}),
        **({"arm_base": run.spec.base} if run.spec.base else {}),
        **({"arm_keys": dict(arm_keys)} if arm_keys and not run.spec.user else {}),
        cache_dir=str(cache_dir) if cache_dir is not None else None,
        timeout_s=c.timeout_s,
        command=argv,
        **(placement or {}),
    )


# A run or cache preparation that failed with one of these failed for the machine, not for its
# arm: the sweep stops (exit 1) with it unfinished, and --resume redoes it once the disk has room.
ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def environment_fault(reason: object) -> int | None:
    """The errno of a full disk, an exceeded quota or a read-only filesystem that a failed run's
    (or preparation's) reason names — the C library's text, as a trainer's OSError prints it —
    or None."""
    if not isinstance(reason, str):
        return None
    return next((code for code in ENVIRONMENT_ERRNOS if os.strerror(code) in reason), None)


def timed(fn: Callable[[], str]) -> tuple[str, float]:
    t0 = time.monotonic()
    line = fn()
    return line, time.monotonic() - t0


def quietly(what: str, fn: Callable[[], Any]) -> Any:
    """Call fn; a failure of the poller or the progress display must never stop a run."""
    try:
        return fn()
    except Exception as e:
        print(f"warning: {what} failed: {e!r}", file=sys.stderr)
        return None
