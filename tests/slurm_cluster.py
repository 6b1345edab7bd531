"""A real Slurm cluster on this machine, for tests/test_slurm.py: munged, slurmctld and two slurmd
(nodes n1 and n2, both on 127.0.0.1, one port each: Debian's build runs several slurmd per host),
configured in a temporary directory without cgroups or systemd, and stopped by the pids this
module started (nothing else is signalled).

Slurm comes from Debian's packages (``slurmctld slurmd slurm-client munge``): installed with
apt-get when missing and this process is root (CI: .ci/run installs them first), else the tests
are skipped with the reason (``unavailable``). The configuration follows what was measured on
Slurm 22.05 here (issue 21): proctrack/linuxproc, task/none, no accounting; munged's socket in a
directory with o+x and named by AuthInfo=socket=; MinJobAge=5 and a scheduler without delays so
that jobs start and leave the queue at once; cred_expire=5 and sched_interval=1 so that a
requeued job starts again ~6 s later (not 121 s: Slurm holds it for cred_expire + 1 s, and
starting it earlier fails with "Job credential revoked"); EnforcePartLimits=ALL so that an impossible request
is refused, not left pending; MessageTimeout=5 so that a step launched onto a node whose slurmd was
killed fails in ~5 s (``kill_slurmd``/``start_slurmd``: a node lost and back); ports checked free
first, and every wait against a deadline (a port held by a silent listener makes scontrol hang
~10 s per try).

Two clusters on one machine (two test sessions, two worktrees) never meet: every port is a free
one picked at start (``free_ports``), every file (munge's socket and key, state, spool, logs)
lives in the cluster's own temporary directory, and the ClusterName carries this process's id.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scancel", "scontrol", "squeue", "sinfo")
NODES = ("n1", "n2")
CPUS_PER_NODE = 2
KILL_WAIT_S = 10  # Slurm's SIGTERM -> SIGKILL grace for a cancelled job (the default is 30)
MESSAGE_TIMEOUT_S = 5  # a launch onto a node whose slurmd is gone fails after this (the default is 10)
INSTALL_TIMEOUT_S = 300


def _which(cmd: str) -> str | None:
    return shutil.which(cmd) or shutil.which(cmd, path="/usr/sbin:/sbin")


def unavailable() -> str | None:
    """Why a local Slurm cannot run here (None: it can): its commands are missing and cannot be
    installed (not root, no apt-get, apt-get failed)."""
    missing = [c for c in COMMANDS if _which(c) is None]
    if not missing:
        return None
    how = f"apt-get install -y --no-install-recommends {' '.join(PACKAGES)}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"Slurm is not installed ({', '.join(missing)} missing) and this is no root Debian to install it: {how}"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    for attempt in (argv, ["apt-get", "update"], argv):
        try:
            r = subprocess.run(attempt, capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{how} failed: {e}"
        if attempt is argv and r.returncode == 0:
            break
    still = [c for c in COMMANDS if _which(c) is None]
    return f"{how} failed ({r.stderr.strip()[-300:]}); still missing: {', '.join(still)}" if still else None


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports on 127.0.0.1 that nothing listens on now."""
    socks = []
    try:
        while len(socks) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        ports = [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
    for port in ports:
        with socket.socket() as probe:
            probe.settimeout(0.2)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                raise OSError(f"port {port} was taken meanwhile")
    return ports


def _conf(root: Path, ports: list[int]) -> str:
    host = socket.gethostname().split(".")[0]
    lines = [
        f"ClusterName=bench{os.getpid()}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge' / 'munge.socket'},cred_expire=5",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool' / '%n'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "MpiDefault=none",
        "ReturnToService=2",
        "MinJobAge=5",
        f"MessageTimeout={MESSAGE_TIMEOUT_S}",
        "SlurmctldDebug=debug2",  # its log says when it checks time limits (Cluster.expire)
        f"KillWait={KILL_WAIT_S}",
        "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=1",
        "EnforcePartLimits=ALL",
        *(
            f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} CPUs={CPUS_PER_NODE}"
            for n, p in zip(NODES, ports[1:], strict=True)
        ),
        f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


class Cluster:
    """``start()`` brings the cluster up (``env``: what a client needs, SLURM_CONF); ``stop()``
    cancels its jobs and stops the daemons it started, by pid."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
        os.chmod(self.root, 0o755)  # munged refuses a socket directory without o+x on the way
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: dict[str, subprocess.Popen] = {}
        self.up_s: float | None = None

    def _daemon(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")
        try:
            self.procs[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                start_new_session=True,
            )  # fmt: skip
        finally:
            log.close()

    def start(self, timeout_s: float = 30.0) -> Cluster:
        t0 = time.monotonic()
        for d in ("munge", "state", "log", *(f"spool/{n}" for n in NODES)):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o755)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf.write_text(_conf(self.root, free_ports(1 + len(NODES))))
        m = self.root / "munge"
        self._daemon("munged", [_which("munged"), "--foreground", f"--socket={m / 'munge.socket'}",
                                f"--key-file={key}", f"--pid-file={m / 'munged.pid'}",
                                f"--seed-file={m / 'munged.seed'}", f"--log-file={m / 'munged.log'}"])  # fmt: skip
        self._wait(lambda: (m / "munge.socket").exists(), timeout_s, "munged's socket")
        self._daemon("slurmctld", [_which("slurmctld"), "-D", "-f", str(self.conf)])
        for n in NODES:
            self._daemon(f"slurmd-{n}", [_which("slurmd"), "-D", "-N", n, "-f", str(self.conf)])
        self._wait(lambda: self.call("scontrol", "ping", timeout_s=3).returncode == 0, timeout_s, "slurmctld")
        self._wait(self._idle, timeout_s, "both nodes idle")
        self.up_s = time.monotonic() - t0
        return self

    def kill_slurmd(self, node: str) -> None:
        """Kill node's slurmd (SIGKILL, by its pid), as a node that dies: its running steps' slurmstepd
        go on; Slurm cannot launch anything there until ``start_slurmd``."""
        proc = self.procs[f"slurmd-{node}"]
        proc.kill()
        proc.wait(timeout=10)

    def start_slurmd(self, node: str, timeout_s: float = 30.0) -> None:
        """Start node's slurmd again and wait until slurmctld has heard from it (its SlurmdStartTime
        changed) and the node is up again (ReturnToService=2)."""
        before = self.node(node).get("SlurmdStartTime")
        self._daemon(f"slurmd-{node}", [_which("slurmd"), "-D", "-N", node, "-f", str(self.conf)])

        def back() -> bool:
            now = self.node(node)
            state = now.get("State", "")
            return now.get("SlurmdStartTime") not in (None, before) and not any(
                s in state for s in ("DOWN", "NOT_RESPONDING")
            )

        self._wait(back, timeout_s, f"{node} back")

    def expire(self, job: str, margin_s: float = 10.0) -> None:
        """Make the job's time limit pass now (TimeLimit=0: its end time becomes now), at least
        ``margin_s`` before slurmctld's next time-limit check (every 30 s; debug2 logs each) ends it:
        until then the job runs on, and srun is refused new steps, as after a real time limit."""
        log = self.root / "log" / "slurmctld.log"
        end = time.monotonic() + 40
        while time.monotonic() < end:
            lines = log.read_text().splitlines()  # no check yet: the first comes 30 s after the start
            checks = [ln for ln in lines if "Testing job time limits" in ln] or lines[:1]
            last = datetime.fromisoformat(checks[-1][1:24]) if checks else None
            if last is not None and (datetime.now() - last).total_seconds() < 30 - margin_s:
                break
            time.sleep(0.2)
        r = self.call("scontrol", "update", f"JobId={job}", "TimeLimit=0")
        assert r.returncode == 0, r.stderr

    def node(self, name: str) -> dict[str, str]:
        """``scontrol show node`` of one node, as key=value pairs."""
        out = self.call("scontrol", "show", "node", "--oneliner", name, timeout_s=5).stdout
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def _idle(self) -> bool:
        states = self.call("sinfo", "--noheader", "--Node", "--format=%N %t", timeout_s=3).stdout.split()
        return states.count("idle") == len(NODES)

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        end = time.monotonic() + timeout_s
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > end:
                logs = "; ".join(
                    f"{p.name}: {p.read_text()[-400:]}" for p in sorted((self.root / "log").glob("*"))
                )
                raise RuntimeError(
                    f"local Slurm: no {what} ({'exited: ' + ', '.join(dead) if dead else 'timeout'}); {logs}"
                )
            time.sleep(0.05)

    def call(self, *argv: str, timeout_s: float = 15.0) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster (a timeout reads as exit status 124)."""
        try:
            return subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]}: timed out")

    def job_state(self, job: str) -> str | None:
        """The job's state while Slurm knows it (PENDING, RUNNING, COMPLETED, ...), else None."""
        out = self.call("scontrol", "show", "job", "--oneliner", job).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return fields.get("JobState")

    def wait_job(self, job: str, timeout_s: float, until: tuple[str, ...] = ("COMPLETED", "FAILED", "CANCELLED",
                 "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")) -> str:  # fmt: skip
        """Wait until the job is in one of ``until`` with none of its steps left (its batch step
        included: a cancelled or requeued job's processes take a moment to end); its state."""
        end = time.monotonic() + timeout_s
        while (state := self.job_state(job)) not in until or self.steps(job):
            if state is None or time.monotonic() > end:
                raise AssertionError(f"job {job}: state {state} after {timeout_s} s, expected one of {until}")
            time.sleep(0.1)
        return state

    def steps(self, job: str) -> list[str]:
        """The job's steps that Slurm still lists (JOB.batch, JOB.0, ...)."""
        out = self.call("squeue", "--steps", f"--jobs={job}", "--noheader", "--format=%i", timeout_s=5).stdout
        return out.split()

    def stop(self) -> None:
        """Cancel every job of this cluster, wait for them to leave, then stop the daemons this
        module started (SIGTERM, SIGKILL after 10 s), by their pids."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.call("scancel", "--full", f"--user={os.geteuid()}", timeout_s=5)
            end = time.monotonic() + 15
            while self.call("squeue", "--noheader", timeout_s=3).stdout.strip() and time.monotonic() < end:
                time.sleep(0.1)
        for name in [*(f"slurmd-{n}" for n in NODES), "slurmctld", "munged"]:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
