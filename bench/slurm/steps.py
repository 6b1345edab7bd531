"""A run as a Slurm job step: finding the step by its name (the run's id, srun --job-name), ending
it with ``scancel --signal=TERM JOB.STEP`` and then KILL, never by signalling srun, and the record
of the step that launch.json keeps.

Measured on Slurm 22.05: SIGTERM sent to srun itself is not forwarded to the tasks (srun
"forces job termination": the tasks are SIGKILLed at once, their handlers never run, so the
per-node VRAM wrappers die without their summaries); ``scancel --signal=TERM JOB.STEP`` delivers
SIGTERM to every task of the step in ~20 ms. docs/multinode.md

A step that Slurm itself ended (a node failed, the time limit passed, someone cancelled it) is
told apart from the run's own failure by bench/slurm/lost.py: the engine's ``lost`` hook.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.config import Run, SweepConfig
from bench.fileio import atomic_write_json, read_json
from bench.probe import nodevram
from bench.procs import launcher
from bench.run.engine import Lost
from bench.slurm import lost as lost_steps
from bench.slurm.alloc import Allocation, current

CALL_TIMEOUT_S = 15.0
LOOKUP_EVERY_S = 1.0


@dataclass
class StepControl:
    """The job step of one run inside allocation ``job_id``, named ``name``."""

    job_id: str
    name: str
    step_id: str | None = None  # "JOB.STEP", once found
    nodelist: str | None = None  # the step's nodes, as squeue writes them (e.g. n[1-2])
    ended_by: list[str] = field(default_factory=list)  # what stopped it, in order
    on_lost: Callable[[Lost], None] | None = None  # told when Slurm, not the run, ended the step
    _next_lookup: float = 0.0

    def find(self) -> str | None:
        """The step's id (squeue's view of the job's steps; the newest of that name), or None."""
        try:
            r = subprocess.run(
                ["squeue", "--steps", f"--jobs={self.job_id}", "--noheader", "--format=%i|%j|%N"],
                capture_output=True, text=True, timeout=CALL_TIMEOUT_S, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return self.step_id
        rows = [ln.strip().split("|") for ln in r.stdout.splitlines()]
        mine = [(row[0], row[2]) for row in rows if len(row) == 3 and row[1] == self.name]
        mine = [
            (sid, nodes)
            for sid, nodes in mine
            if sid.startswith(f"{self.job_id}.") and sid[len(self.job_id) + 1 :].isdigit()
        ]
        if mine:
            self.step_id, self.nodelist = max(mine, key=lambda m: int(m[0].rpartition(".")[2]))
        return self.step_id

    def watch(self) -> None:
        """Called while the run goes (the launcher's tick): look the step up until it is found."""
        if self.step_id is None and time.monotonic() >= self._next_lookup:
            self._next_lookup = time.monotonic() + LOOKUP_EVERY_S
            self.find()

    def stop(self, pgid: int, proc: subprocess.Popen | None = None) -> None:
        """End the run (a timeout, an interrupt): SIGTERM to every task of the step through scancel,
        SIGKILL after the grace, then whatever is left of srun's process group. With no step found
        (srun still waiting for one) srun's group is signalled: nothing of the run has started."""
        step = self.find()
        if step is not None:
            for sig, wait_s in (("TERM", launcher.KILL_GRACE_S), ("KILL", 10.0)):
                self._scancel(sig, step)
                if _exited(proc, wait_s):
                    break
        else:
            self.ended_by.append("SIGTERM to srun (no job step of that name yet)")
        launcher.kill_group(pgid, proc)

    def _scancel(self, sig: str, step: str) -> None:
        argv = ["scancel", f"--signal={sig}", step]
        try:
            r = subprocess.run(
                argv, capture_output=True, text=True, timeout=CALL_TIMEOUT_S, stdin=subprocess.DEVNULL
            )
            note = "" if r.returncode == 0 else f" (failed: {(r.stderr.strip().splitlines() or ['?'])[-1]})"
        except (OSError, subprocess.TimeoutExpired) as e:
            note = f" (failed: {e})"
        self.ended_by.append(" ".join(argv) + note)

    def record(self, rdir: Path) -> None:
        """launch.json's ``slurm``: the run's job step (``summary``), kept beside its exit record."""
        rec = self.summary(nodevram.node_lines(rdir / "stdout.log"))
        doc = read_json(rdir / "launch.json")
        atomic_write_json(rdir / "launch.json", {**(doc if isinstance(doc, dict) else {}), "slurm": rec})

    def lost(self, rdir: Path, rc: int) -> Lost | None:
        """Whether Slurm ended this run's step (its node, the job's time limit, a scancel not by the
        driver): bench/slurm/lost.py reads srun's and slurmstepd's lines and asks scontrol."""
        found = lost_steps.classify(
            launcher.log_lines(rdir / "stdout.log"), self.job_id, rc, bool(self.ended_by)
        )
        if found is not None and self.on_lost is not None:
            self.on_lost(found)
        return found

    def summary(self, printed: dict[str, dict[str, dict]]) -> dict:
        """launch.json's ``slurm``: job, step, the node each wrapper ran on (its start line, from
        bench.probe.nodevram.node_lines) and what ended the step, when the driver did."""
        starts = [kinds["start"] for kinds in printed.values() if "start" in kinds]
        tasks = [s.get("slurm") or {} for s in starts]
        step = self.step_id or next(
            (f"{t['job_id']}.{t['step_id']}" for t in tasks if t.get("job_id") and t.get("step_id")), None
        )
        nodes = sorted(
            ((s.get("node"), (s.get("slurm") or {}).get("slurm_node") or s.get("hostname")) for s in starts),
            key=lambda n: (not isinstance(n[0], int), str(n[0]) if not isinstance(n[0], int) else n[0]),
        )
        rec = {"job_id": self.job_id, "step_id": step, "step_name": self.name, "nodes": [n for _, n in nodes]}
        rec |= {"step_nodelist": self.nodelist} if self.nodelist else {}
        return {**rec, "ended_by": self.ended_by} if self.ended_by else rec


def _exited(proc: subprocess.Popen | None, wait_s: float) -> bool:
    """Whether srun exited within ``wait_s`` (it does once every task of its step has ended)."""
    if proc is None:
        return False
    try:
        proc.wait(timeout=wait_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def control_for(
    cfg: SweepConfig,
    run: Run,
    env_alloc: Allocation | None = None,
    on_lost: Callable[[Lost], None] | None = None,
) -> StepControl | None:
    """The step control of a multi-node run launched by srun inside an allocation, else None (the
    launcher's process group is signalled, as for any other launcher)."""
    alloc = env_alloc or current()
    if run.cell.nodes <= 1 or not cfg.launcher or Path(cfg.launcher[0]).name != "srun" or alloc is None:
        return None
    return StepControl(alloc.job_id, run.run_id, on_lost=on_lost)
