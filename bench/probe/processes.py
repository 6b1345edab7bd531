"""Who holds memory on the polled cards: each process the management library lists, whether it
is the suite's own (the driver or a process it started) or another user's, and when it was seen.

On a shared machine another process on a card changes what a run measures (its memory is in
the card's "used"; its kernels compete for the SMs). The poller lists the cards' processes
before the run starts and once a second while it runs; a process that is not a descendant of
the driver is foreign. A pid that ``/proc`` does not show (another PID namespace: a container
beside ours) is foreign too, its owner "unknown".
"""

from __future__ import annotations

import os

from bench.probe.backends import GIB
from bench.procs import proctable


def owner(pid: int, root: int | None = None) -> str:
    """ "suite" for the driver (``root``, default this process) and its descendants, "foreign" for
    another process visible here, "unknown" for a pid this machine's process table does not show
    (another PID namespace)."""
    root = os.getpid() if root is None else root
    if pid == root:
        return "suite"
    above = proctable.ancestors(pid)
    if above is None:
        return "unknown"
    return "suite" if root in above else "foreign"


class ProcessLog:
    """Every (card, pid) seen, with its largest memory, when it was first seen and its owner."""

    def __init__(self, root: int | None = None) -> None:
        self.root = root
        self.rows: dict[tuple[int, int], dict] = {}

    def add(self, per_card: list[list[dict]], phase: str) -> None:
        for card, procs in enumerate(per_card or []):
            for p in procs or []:
                key = (card, int(p["pid"]))
                row = self.rows.get(key)
                if row is None:
                    row = {"card": card, "pid": key[1], "max_used_bytes": None, "first_seen": phase}
                    row["owner"] = owner(key[1], self.root)
                    self.rows[key] = row
                used = p.get("used_bytes")
                if used is not None and (row["max_used_bytes"] is None or used > row["max_used_bytes"]):
                    row["max_used_bytes"] = used

    def summary(self) -> list[dict]:
        out = []
        for row in sorted(self.rows.values(), key=lambda r: (r["card"], r["pid"])):
            used = row["max_used_bytes"]
            out.append(
                {
                    "card": row["card"],
                    "pid": row["pid"],
                    "owner": row["owner"],
                    "first_seen": row["first_seen"],
                    "max_used_gib": None if used is None else round(used / GIB, 3),
                }
            )
        return out
