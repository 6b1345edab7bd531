"""``python -m bench status OUT``: a sweep's state for a sweep run with ``bench submit`` or plain
``bench sweep``. The sweep directory's part comes from its files (bench/run/sweepstate.py); the Slurm
job's (its id from slurm/jobs.jsonl, else from the runs' cell.json) from squeue while Slurm
lists it, else scontrol (for MinJobAge after its end), else sacct where the site keeps
accounting; a Slurm that does not answer is said in one line, never a traceback."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from bench.errors import SweepError
from bench.fileio import read_jsonl
from bench.run import sweepstate as sweep_status
from bench.slurm.alloc import fields
from bench.slurm.batch import SLURM_DIR

CALL_TIMEOUT_S = 15.0


def show_status(out_dir: Path, tail: int = 5) -> int:
    submitted = [
        str(j.get("job_id")) for j in read_jsonl(out_dir / SLURM_DIR / "jobs.jsonl") if j.get("job_id")
    ]
    try:
        state = sweep_status.read_state(out_dir)
    except SweepError:
        if not submitted:
            raise
        print(f"job:     {job_line(submitted[-1])}")  # submitted, its driver not started yet
        print(f"sweep:   not started yet in {out_dir} (its driver writes sweep.json when the job starts)")
        return 0
    text = sweep_status.lines(state, tail)
    jobs = list(dict.fromkeys([*state.job_ids, *submitted]))  # run order, then submissions
    if jobs:
        earlier = f" (earlier: {', '.join(jobs[-4:-1])})" if len(jobs) > 1 else ""
        text.insert(1, f"job:     {job_line(jobs[-1])}{earlier}")
    print("\n".join(text))
    return 0


def job_line(job: str) -> str:
    """``12 RUNNING for 0:42 of 10:00 on n[1-2] (start 1)``, or what is known of an ended job."""
    if shutil.which("squeue") is None:
        return f"{job} (no squeue on this machine: run bench status where Slurm's commands are)"
    row = _call("squeue", "--noheader", f"--jobs={job}", "--format=%T|%r|%M|%l|%N")
    parts = row.split("|") if row else []
    if len(parts) == 5:
        state, reason, used, limit, nodes = parts
        why = f" ({reason})" if reason not in ("None", "") else ""
        where = f" on {nodes}" if nodes else ""
        restarts = fields("job", job).get("Restarts", "0")
        again = f", start {restarts}" if restarts not in ("0", "") else ""
        return f"{job} {state}{why}, for {used} of {limit}{where}{again}"
    job_fields = fields("job", job)
    if job_fields.get("JobState"):
        return f"{job} {job_fields['JobState']} (Reason={job_fields.get('Reason')}, exit {job_fields.get('ExitCode')})"
    acct = _call(
        "sacct", "--noheader", "--allocations", "--parsable2", f"--jobs={job}", "--format=State,ExitCode"
    )
    if acct:
        state, _, code = acct.partition("|")
        return f"{job} {state} (exit {code}; from sacct)"
    return f"{job}: no longer known to Slurm (it ended; its log: {SLURM_DIR}/slurm-{job}.out)"


def _call(*argv: str) -> str:
    """The first line of a Slurm command's output; empty when it fails or does not answer."""
    try:
        r = subprocess.run(
            argv, capture_output=True, text=True, timeout=CALL_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    first = r.stdout.strip().splitlines()
    return first[0].strip() if r.returncode == 0 and first else ""
