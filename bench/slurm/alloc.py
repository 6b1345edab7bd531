"""The Slurm allocation this process runs in (read from the environment Slurm gives a batch
step), the record of it each run's cell.json keeps, and a multi-node sweep's rendezvous on the
allocation's first node when its config names none."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from bench.config import SweepConfig
from bench.errors import SweepError

RDZV_PORT_ENV = "BENCH_RDZV_PORT"  # the rendezvous port on the first node (bench submit --rdzv-port)
DEFAULT_PORT = 29400  # torchrun's c10d default
SCONTROL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Allocation:
    job_id: str
    restart_count: int  # a requeued job starts again under the same id: another allocation
    nodelist: str  # Slurm's compact form, e.g. gpu[03-04]

    @property
    def key(self) -> str:
        """Which allocation: the job id, and ``+r<n>`` for its n-th requeued start."""
        return self.job_id + (f"+r{self.restart_count}" if self.restart_count else "")

    def record(self) -> dict:
        """cell.json's ``slurm``: where a run ran (bench/results/allocations.py reads ``allocation``)."""
        return {
            "job_id": self.job_id,
            "restart_count": self.restart_count,
            "nodelist": self.nodelist,
            "allocation": self.key,
        }


def current(env: Mapping[str, str] | None = None) -> Allocation | None:
    """The allocation of this process (None outside one)."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job:
        return None
    restarts = env.get("SLURM_RESTART_COUNT", "").strip()
    nodelist = env.get("SLURM_JOB_NODELIST", "") or env.get("SLURM_NODELIST", "")
    return Allocation(job, int(restarts) if restarts.isdigit() else 0, nodelist)


def scontrol(*args: str) -> str:
    """scontrol's output; an OSError or a non-zero exit is one line (SweepError)."""
    try:
        r = subprocess.run(
            ["scontrol", *args],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SweepError(f"scontrol {' '.join(args)}: {e}") from None
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
        raise SweepError(f"scontrol {' '.join(args)}: {last}")
    return r.stdout


def fields(kind: str, name: str) -> dict[str, str]:
    """``scontrol show <kind> --oneliner <name>`` as key=value pairs (a job's JobState, Reason,
    EndTime; a node's State); empty when scontrol does not know it or does not answer."""
    try:
        out = scontrol("show", kind, "--oneliner", name)
    except SweepError:
        return {}
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def first_node(alloc: Allocation) -> tuple[str, str]:
    """(name, address) of the allocation's first node: where the batch step, the driver and the
    rendezvous store live. The address is the node's NodeAddr, where the store listens (torchrun's
    workers then meet at rank 0's host name, which must resolve on every node: docs/multinode.md)."""
    names = scontrol("show", "hostnames", alloc.nodelist).split()
    if not names:
        raise SweepError(f"Slurm job {alloc.job_id}: its node list {alloc.nodelist!r} names no node")
    node = dict(f.split("=", 1) for f in scontrol("show", "node", "--oneliner", names[0]).split() if "=" in f)
    return names[0], node.get("NodeAddr") or names[0]


def bind(cfg: SweepConfig, dry_run: bool = False) -> SweepConfig:
    """``cfg`` with its rendezvous endpoint when its runs are Slurm job steps (nodes > 1, no
    launcher) and it names none: the allocation's first node, port $BENCH_RDZV_PORT (29400).
    Outside an allocation such a sweep is refused in one line (a dry run shows a placeholder)."""
    if cfg.launcher_from != "slurm" or cfg.rdzv_endpoint is not None:
        return cfg
    port = os.environ.get(RDZV_PORT_ENV, "").strip() or str(DEFAULT_PORT)
    if not port.isdigit():
        raise SweepError(f"${RDZV_PORT_ENV}: expected a port number, got {port!r}")
    alloc = current()
    if alloc is None:
        if dry_run:
            return dataclasses.replace(
                cfg, rdzv_endpoint=f"FIRST_NODE:{port}", rdzv_from="the allocation's first node"
            )
        raise SweepError(
            f"{cfg.path}: nodes: {cfg.nodes} and no launcher: every run is a Slurm job step, so the sweep runs inside "
            "a Slurm allocation: python -m bench submit CONFIG (docs/multinode.md); or set launcher: and rdzv_endpoint:"
        )
    name, addr = first_node(alloc)
    return dataclasses.replace(
        cfg, rdzv_endpoint=f"{addr}:{port}", rdzv_from=f"the allocation's first node, {name}"
    )
