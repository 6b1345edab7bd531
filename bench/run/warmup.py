"""What a session does once before its runs, each a small object that remembers what it did: the
warm fork server (bench/procs/forkstart.py) and the priming runs (sweep key prime_runs)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.config import Run, prime_run_id
from bench.procs import forkstart
from bench.run.sweepdir import update_sweep_json


@dataclass
class ForkServer:
    """The warm fork server: started once, before the first run that launches, when a cell forks
    its runs (``preload``: what it imports; empty when no cell forks), in the compile-cache
    environment ``env`` of the first such cell; sweep.json records what it imported and how long
    that took. A server that does not start leaves the runs to start as new interpreters."""

    preload: list[str]
    env: dict[str, str]
    gpus: int
    out_dir: Path
    tried: bool = False

    def start(self, say: Callable[[str], None]) -> None:
        if self.tried:
            return
        self.tried = True
        if not self.preload:
            return
        try:
            ready_s = forkstart.start_server(self.preload, self.env, self.gpus)
        except (OSError, EOFError, ValueError, forkstart.ForkServerUnusable) as e:  # runs start afresh
            print(
                f"warning: fork server did not start ({e}); runs start as new interpreters", file=sys.stderr
            )
            return
        if ready_s:
            say(f"fork server ready in {ready_s:.1f}s ({', '.join(self.preload)} imported once for all runs)")
            update_sweep_json(
                self.out_dir, fork_server={"preload": self.preload, "ready_s": round(ready_s, 2)}
            )


@dataclass
class Priming:
    """The discarded runs before a cell and arm's first measured run in this invocation (sweep key
    prime_runs: ``count`` of them), under prime/: they fill the compile and autotune caches, so
    that no measured run compiles a kernel inside its measured steps."""

    count: int
    done: set[tuple[str, str]] = field(default_factory=set)  # (cell, arm) primed by this invocation

    def due(self, run: Run) -> list[Run]:
        """The priming runs to run before ``run`` now: none once its cell and arm are primed."""
        key = (run.cell.cell_id, run.arm)
        if not self.count or key in self.done:
            return []
        self.done.add(key)
        return prime_runs(self.count, run)


def prime_runs(count: int, run: Run) -> list[Run]:
    """The ``count`` discarded runs that precede ``run``'s cell and arm."""
    cid, arm = run.cell.cell_id, run.arm
    return [Run(prime_run_id(cid, arm, i), run.cell, arm, 0, -1) for i in range(1, count + 1)]
