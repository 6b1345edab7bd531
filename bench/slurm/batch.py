"""The batch script of ``bench submit``: one allocation of N nodes for the whole sweep, the driver
on the first node (the batch step) and every run a job step over all of them.

The script lives in the sweep directory (``slurm/batch.sh``) with Slurm's output beside it
(``slurm/slurm-<job>.out``, appended to across requeues); it always runs the sweep with
``--resume``, so ``sbatch`` of it again, or its requeue, resumes an unfinished sweep.

The user's setup lines (``--setup``, ``--setup-line``: module loads, an environment's activation,
NCCL variables) run in the batch shell before the driver, verbatim, after their checks
(bench/slurm/options.py); srun's environment carries what they export to every step. The srun
options of every step reach the driver as $BENCH_SRUN_OPTIONS, quoted.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from bench.errors import SweepError
from bench.slurm.alloc import RDZV_PORT_ENV
from bench.slurm.options import srun_env
from bench.slurm.stop import MAX_REQUEUES_ENV, REQUEUE_ENV, REQUEUE_SIGNAL

BATCH_SCRIPT_ENV = "BENCH_SLURM_SCRIPT"  # the batch script's own path, for the driver's resume hint
SRUN_OPTIONS_ENV = "BENCH_SRUN_OPTIONS"  # bench submit --srun-option, as shell words
SLURM_DIR = "slurm"  # under the sweep directory
_PLAIN_RE = re.compile(r"^[^\s\"'\\]+$")  # what an #SBATCH line can hold without quoting


@dataclass(frozen=True)
class JobSpec:
    """What ``bench submit`` asks Slurm for."""

    name: str
    nodes: int
    gpus_per_node: int | None  # None: no GPU request (a CPU sweep, or a site that uses --gres)
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    extra: tuple[str, ...] = ()  # further sbatch options, one per #SBATCH line
    requeue: bool = False
    signal_s: int = 300  # with requeue: seconds before the time limit that Slurm signals the driver
    rdzv_port: int | None = None
    max_requeues: int = 0  # with requeue: how often the driver may requeue its job
    setup: tuple[str, ...] = ()  # shell lines run before the driver
    srun_options: tuple[str, ...] = ()  # added to every run's srun
    retry_failed: bool = False  # the job's first start re-runs the failed rounds (sweep --retry-failed)


def script_path(out_dir: Path) -> Path:
    return out_dir / SLURM_DIR / "batch.sh"


def _directives(spec: JobSpec, out_dir: Path, cwd: Path) -> list[str]:
    opts = [f"--job-name=bench-{spec.name}", f"--nodes={spec.nodes}", "--ntasks-per-node=1", "--exclusive"]
    opts += [f"--gpus-per-node={spec.gpus_per_node}"] if spec.gpus_per_node else []
    opts += [
        f"--{k}={v}"
        for k, v in (("partition", spec.partition), ("account", spec.account), ("time", spec.time))
        if v
    ]
    opts += [f"--output={out_dir / SLURM_DIR / 'slurm-%j.out'}", "--open-mode=append", f"--chdir={cwd}"]
    if spec.requeue:
        opts += ["--requeue", f"--signal=B:{REQUEUE_SIGNAL.name.removeprefix('SIG')}@{spec.signal_s}"]
    opts += list(spec.extra)
    for opt in opts:
        if not _PLAIN_RE.match(opt):
            raise SweepError(
                f"an #SBATCH line cannot hold {opt!r} (spaces or quotes): use paths and values without them"
            )
    return [f"#SBATCH {opt}" for opt in opts]


def script(spec: JobSpec, config: Path, out_dir: Path, cwd: Path, python: str) -> str:
    """The batch script's text (paths absolute)."""
    exports = {
        # srun >= 22.05 does not take --cpus-per-task from the allocation: each node's task gets its node's CPUs
        "SRUN_CPUS_PER_TASK": '"${SLURM_CPUS_ON_NODE:-1}"',
        BATCH_SCRIPT_ENV: shlex.quote(str(script_path(out_dir))),
        **({REQUEUE_ENV: "1", MAX_REQUEUES_ENV: str(spec.max_requeues)} if spec.requeue else {}),
        **({RDZV_PORT_ENV: str(spec.rdzv_port)} if spec.rdzv_port else {}),
        **({SRUN_OPTIONS_ENV: shlex.quote(srun_env(list(spec.srun_options)))} if spec.srun_options else {}),
    }
    sweep = [python, "-m", "bench", "sweep", str(config), "--out", str(out_dir), "--resume"]
    retry = ' "${retry[@]}"' if spec.retry_failed else ""
    return "\n".join(
        [
            "#!/bin/bash",
            f"# The batch script of sweep {spec.name}, written by `python -m bench submit` (bench/slurm/batch.py).",
            "# One allocation for the whole sweep: the driver runs here, on the first node, and every run is",
            f"# a job step over all {spec.nodes} nodes. `sbatch` it again to resume an unfinished sweep.",
            *_directives(spec, out_dir, cwd),
            'echo "bench: job $SLURM_JOB_ID (start ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST at $(date -u +%FT%TZ)"',
            *_setup(spec.setup),
            "set -u",
            *(f"export {k}={v}" for k, v in exports.items()),
            *_retry(spec.retry_failed),
            "# exec: the driver is the batch shell, so Slurm's signals (scancel, --signal=B:...) reach it",
            f"exec {shlex.join(sweep)}{retry}",
            "",
        ]
    )


def _setup(lines: tuple[str, ...]) -> list[str]:
    if not lines:
        return []
    return ["# setup (bench submit --setup/--setup-line), before the driver:", *lines, "# end of setup"]


def _retry(retry_failed: bool) -> list[str]:
    """bench submit --retry-failed: the job's first start re-runs the failed rounds; a requeued
    start only resumes (its own failures are not retried in a loop)."""
    if not retry_failed:
        return []
    return ['retry=(); [ "${SLURM_RESTART_COUNT:-0}" = 0 ] && retry=(--retry-failed)']
