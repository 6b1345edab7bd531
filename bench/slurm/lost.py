"""Whether Slurm, not the run, ended a run's job step: a node that failed, the job's time limit, a
step cancelled by someone other than the driver. Read from srun's and slurmstepd's own lines in
the run's stdout.log, and scontrol's view of the job and its nodes (sacct is not needed: a site
without accounting answers too).

Measured on Slurm 22.05 (tests/test_slurm.py):

- a node whose slurmd died: ``srun: error: Task launch for StepId=J.S failed on node n2:
  Communication connection failure`` (srun exits 233), or, for a step already running when
  slurmctld gives the node up, ``srun: error: Node failure on n2`` and slurmstepd's
  ``*** STEP J.S ON n1 CANCELLED AT ... DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***``;
- the time limit: slurmstepd's ``... CANCELLED AT ... DUE TO TIME LIMIT ***``; and once the
  job's end time has passed, before slurmctld's periodic check (every 30 s) ends it, every new
  step is refused: ``srun: error: Unable to create step for job J: Job/step already completing
  or completed`` (exit 1);
- ``scancel JOB.STEP``: ``srun: Job step aborted: Waiting up to 12 seconds for job step to
  finish.`` and ``*** STEP J.S ON n1 CANCELLED AT ... ***`` with no cause; a task that fails
  under ``--kill-on-bad-exit`` makes srun end the step, with the same CANCELLED line but no
  "Job step aborted": the run's own error, not a loss.
"""

from __future__ import annotations

import re
from datetime import datetime

from bench.run.engine import Lost
from bench.slurm.alloc import fields

_LAUNCH_FAILED = re.compile(r"srun: error: Task launch for StepId=\S+ failed on node (\S+?): (.+)$")
_NODE_FAILURE = re.compile(r"srun: error: Node failure on (\S+)")
_CANCELLED = re.compile(r"\*\*\* (STEP|JOB) (\S+) ON (\S+) CANCELLED AT \S+(?: DUE TO ([A-Z][A-Z ]*[A-Z]))?")
_NO_STEP = re.compile(r"srun: error: Unable to create step for job \S+: (.+)$")
# srun's line when slurmctld cancels its step; absent when srun itself ended the step because a
# task failed (--kill-on-bad-exit: "_step_signal: Terminating StepId=..." and the same CANCELLED)
_ABORTED = "srun: Job step aborted"


def classify(lines: list[str], job_id: str, rc: int, driver_ended: bool) -> Lost | None:
    """The Slurm-level end of a step whose run did not finish ok, from its log's ``lines`` and
    scontrol; None when the run failed on its own (or the driver ended it: a timeout)."""
    if driver_ended:
        return None
    srun = f"srun's exit code {rc}"
    for line in lines:
        m = _LAUNCH_FAILED.search(line)
        if m:
            return Lost("node", f"Slurm: node {m[1]} failed (task launch: {m[2]}; {srun}){node_state(m[1])}")
        m = _NODE_FAILURE.search(line)
        if m:
            return Lost("node", f"Slurm: node {m[1]} failed while the step ran ({srun}){node_state(m[1])}")
    cancelled = [m for line in lines if (m := _CANCELLED.search(line))]
    causes = {m[4] for m in cancelled if m[4]}
    if "NODE FAILURE" in causes:
        return Lost("node", f"Slurm: the step was cancelled due to a node failure ({srun})")
    if "TIME LIMIT" in causes:
        return Lost("time", f"Slurm: the job reached its time limit; the step was cancelled ({srun})")
    if causes:
        return Lost("ended", f"Slurm: the step was cancelled due to {sorted(causes)[0].lower()} ({srun})")
    refused = next((m[1] for line in lines if (m := _NO_STEP.search(line))), None)
    if refused is not None:
        return _refused(refused, job_id, srun)
    if cancelled and any(_ABORTED in line for line in lines):  # from outside: not --kill-on-bad-exit
        what = "the job was cancelled" if any(m[1] == "JOB" for m in cancelled) else "the step was cancelled"
        return Lost("cancelled", f"Slurm: {what} (scancel, not by the driver; {srun})")
    return None


def _refused(why: str, job_id: str, srun: str) -> Lost | None:
    """srun could not create the step: Slurm's loss when the job is over or past its end time (its
    time limit), else the run's own error (e.g. a request the allocation cannot hold)."""
    job = fields("job", job_id)
    state, end = job.get("JobState", ""), _time(job.get("EndTime"))
    past_end = end is not None and end <= datetime.now()
    if past_end or job.get("Reason") == "TimeLimit" or state.startswith("TIMEOUT"):
        when = f" (EndTime {job['EndTime']})" if end is not None else ""
        return Lost(
            "time", f"Slurm: the job's time limit has passed{when}; srun could not create the step: {why}"
        )
    if state and state != "RUNNING" or "already completing or completed" in why:
        return Lost(
            "ended",
            f"Slurm: job {job_id} is ending ({state or 'gone'}); srun could not create the step: {why}",
        )
    return None


def node_state(name: str) -> str:
    """`` (Slurm: n2 State=IDLE+NOT_RESPONDING)``, or nothing when scontrol does not answer."""
    state = fields("node", name).get("State")
    return f" (Slurm: {name} State={state})" if state else ""


def _time(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:  # Unknown, None
        return None
