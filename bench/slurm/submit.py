"""``python -m bench submit CONFIG``: the sweep as one Slurm batch job. Checks the config, the
sweep directory as ``bench sweep`` would, and the job's limits, setup lines and srun options
(bench/slurm/options.py; one line, exit 2), writes the batch script into the sweep directory
(bench/slurm/batch.py), submits it with sbatch, records the submission in slurm/jobs.jsonl and
says how to follow, cancel and resume it. Nothing of the sweep runs here: the driver starts on the allocation's first node.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from bench.errors import SweepError
from bench.fileio import append_jsonl, atomic_write_text
from bench.run.sweepdir import check_out_dir, check_out_path
from bench.slurm import options
from bench.slurm.batch import SLURM_DIR, JobSpec, script, script_path
from bench.trainers import load_config

SBATCH_TIMEOUT_S = 60.0


def submit(
    config: str | Path,
    out: str | Path | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    partition: str | None = None,
    time: str | None = None,
    account: str | None = None,
    extra: list[str] | None = None,
    requeue: bool = False,
    signal_s: int = 300,
    max_requeues: int | None = None,
    setup: str | None = None,
    setup_line: list[str] | None = None,
    srun_options: list[str] | None = None,
    rdzv_port: int | None = None,
    resume: bool = False,
    retry_failed: bool = False,
    dry_run: bool = False,
) -> int:
    """Submit (or with ``dry_run`` print) the sweep's batch job; returns the exit status."""
    cfg = load_config(config)
    out_dir = Path(out if out is not None else cfg.out).absolute()
    check_out_path(out_dir)
    if time is not None:
        options.time_seconds(time)  # absurd or unreadable limits: one line, before sbatch sees them
    spec = JobSpec(
        name=cfg.name,
        nodes=_nodes(cfg.nodes, nodes),
        gpus_per_node=_gpus(cfg, gpus_per_node),
        partition=partition,
        time=time,
        account=account,
        extra=tuple(_extra(extra or [])),
        requeue=requeue,
        signal_s=signal_s,
        max_requeues=options.check_requeue(time, requeue, signal_s, max_requeues),
        rdzv_port=_port(rdzv_port),
        setup=tuple(options.setup_lines(setup, setup_line)),
        srun_options=tuple(options.srun_options(srun_options, cfg.launcher_from)),
        retry_failed=retry_failed,
    )
    # an existing sweep needs --resume, as for `bench sweep` (there is no --force here)
    check_out_dir(cfg, out_dir, resume or retry_failed, False, can_force=False)
    text = script(spec, Path(cfg.path).absolute(), out_dir, Path.cwd(), sys.executable)
    path = script_path(out_dir)
    if dry_run:
        print(text, end="")
        print(
            f"# [dry run: nothing written or submitted] would write {path} and run: sbatch --parsable {path}"
        )
        return 0
    if shutil.which("sbatch") is None:
        raise SweepError(
            "sbatch is not on this machine's PATH: run bench submit where Slurm's commands are (a login node)"
        )
    atomic_write_text(path, text)
    os.chmod(path, 0o755)
    job = _sbatch(path)
    asked = {"setup": list(spec.setup), "srun_options": list(spec.srun_options), "retry_failed": retry_failed}
    append_jsonl(
        out_dir / SLURM_DIR / "jobs.jsonl", {"job_id": job, "script": str(path), "argv": sys.argv, **asked}
    )
    _say(job, spec, cfg.path, out_dir, path)
    return 0


def _nodes(configured: int, asked: int | None) -> int:
    if asked is None:
        return configured
    if asked < 1:
        raise SweepError(f"--nodes: expected at least 1, got {asked}")
    if asked != configured:
        raise SweepError(
            f"--nodes {asked}: the config's runs span nodes: {configured}; the allocation is what every run spans "
            "(set nodes: in the config, or drop --nodes)"
        )
    return asked


def _gpus(cfg, asked: int | None) -> int | None:
    """GPUs per node to ask for: --gpus-per-node (0: none, e.g. a site that wants --gres in
    --extra-sbatch), else the config's largest gpus_per_run, none for a CPU sweep."""
    if asked is None:
        return None if cfg.runs_on_cpu else cfg.max_gpus
    if asked < 0:
        raise SweepError(f"--gpus-per-node: expected 0 or more, got {asked}")
    if asked and asked < cfg.max_gpus and not cfg.runs_on_cpu:
        raise SweepError(f"--gpus-per-node {asked}: the config's runs use up to {cfg.max_gpus} GPUs per node")
    return asked or None


def _extra(options: list[str]) -> list[str]:
    for opt in options:
        if not opt.startswith("-") or "\n" in opt:
            raise SweepError(f"--extra-sbatch {opt!r}: expected one sbatch option, e.g. --qos=high")
    return options


def _port(port: int | None) -> int | None:
    if port is not None and not 0 < port < 65536:
        raise SweepError(f"--rdzv-port: expected a port number (1-65535), got {port}")
    return port


def _sbatch(path: Path) -> str:
    """sbatch's job id; its refusal (a bad partition, time or account) is one line."""
    try:
        r = subprocess.run(
            ["sbatch", "--parsable", str(path)],
            capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SweepError(f"sbatch {path}: {e}") from None
    job = r.stdout.strip().split(";")[0]
    if r.returncode != 0 or not job.isdigit():
        last = (r.stderr.strip().splitlines() or [r.stdout.strip() or f"exit code {r.returncode}"])[-1]
        raise SweepError(f"sbatch refused the job: {last.removeprefix('sbatch: error: ')}")
    return job


def _say(job: str, spec: JobSpec, config: Path, out_dir: Path, path: Path) -> None:
    log = out_dir / SLURM_DIR / f"slurm-{job}.out"
    print(
        f"submitted job {job}: sweep {spec.name} on {spec.nodes} node(s), one allocation; batch script {path}"
    )
    print(f"follow:  squeue --job {job}; tail -f {shlex.quote(str(log))}")
    print(f"cancel:  scancel {job}   (the run in flight is stopped; finished runs are kept)")
    print(
        f"resume:  sbatch {shlex.quote(str(path))}   (once it has ended unfinished; or bench submit ... --resume)"
    )
    if spec.requeue:
        print(f"requeue: Slurm signals the driver {spec.signal_s} s before the time limit; it stops cleanly and "
              f"requeues the job (at most {spec.max_requeues} times), whose next allocation resumes")  # fmt: skip
    if spec.retry_failed:
        print(
            "retry:   the job's first start re-runs every round that holds a failed run (error, timeout, oom)"
        )
    print(f"status:  python -m bench status {shlex.quote(str(out_dir))}")
    print(f"report:  python -m bench report {shlex.quote(str(out_dir))}   (written at the end of the sweep)")
