"""The trainer's side of the run contract (docs/run-contract.md): run.json and metrics.jsonl.

Only rank 0 writes. run.json is replaced atomically (temp file + rename); metrics.jsonl is
appended one flushed line per optimizer step, so a killed run leaves every finished step.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from pathlib import Path


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, obj: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    os.replace(tmp, path)


class RunFiles:
    def __init__(self, out_dir: Path, enabled: bool):
        self.dir, self.enabled = Path(out_dir), enabled
        self.record: dict = {}
        self._metrics = None

    def start(self, record: dict) -> None:
        self.record = {
            "status": "running",
            "reason": None,
            "start_time": now_iso(),
            "end_time": None,
            **record,
        }
        if self.enabled:
            self.dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.dir / "run.json", self.record)
            self._metrics = open(self.dir / "metrics.jsonl", "a")

    def update(self, **fields) -> None:
        self.record.update(fields)
        if self.enabled:
            write_json_atomic(self.dir / "run.json", self.record)

    def step(self, row: dict) -> None:
        if self._metrics is not None:
            self._metrics.write(json.dumps(row) + "\n")
            self._metrics.flush()

    def finish(self, status: str, reason: str | None = None, **fields) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        self.update(status=status, reason=reason, end_time=now_iso(), **fields)
