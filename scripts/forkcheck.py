"""How each run of the given sweep directories started, and what it imported (the `forkcheck`
stage of scripts/h200_sweeps.sh): the driver's fork server (sweep.json's fork_server), each run's
start (launch.json; specforge.json for the SpecForge CLI's warm servers), whether its imports were
preloaded, the specforge it imported, and what warm servers left in the temporary directory.

    python3 scripts/forkcheck.py SWEEP_DIR [SWEEP_DIR ...]
"""

from __future__ import annotations

import glob
import json
import sys
import tempfile
import time
from pathlib import Path


def read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def main(dirs: list[str]) -> int:
    for d in map(Path, dirs):
        print(f"{d.name}: fork_server {read(d / 'sweep.json').get('fork_server')}")
        for rdir in sorted((d / "runs").glob("*")):
            run, sf = read(rdir / "run.json"), read(rdir / "specforge.json")
            start = sf.get("start") or read(rdir / "launch.json").get("start")
            code = ((run.get("code") or {}).get("packages") or {}).get("specforge", {}).get("file")
            print(
                f"  {rdir.name}: {run.get('status')}, start {start}"
                + (f" (server started here: {sf['started_here']})" if "started_here" in sf else "")
                + (f", its log {sf['log']}" if sf.get("log") else "")
                + f", imports preloaded {(run.get('startup') or {}).get('imports_preloaded')}"
                + (f", specforge from {code}" if code else "")
            )
            if run.get("status") != "ok":
                print(f"    reason: {run.get('reason')}")
                log = (
                    (rdir / "stdout.log").read_text(errors="replace").splitlines()
                    if (rdir / "stdout.log").exists()
                    else []
                )
                print("\n".join(f"    | {line}" for line in log[-12:]))
    pattern = str(Path(tempfile.gettempdir()) / "bench-specforge-warm-*")
    end = time.monotonic() + 5  # a warm server looks for its driver once a second
    while glob.glob(pattern) and time.monotonic() < end:
        time.sleep(0.2)
    left = sorted(glob.glob(pattern))
    print(f"left in {tempfile.gettempdir()}: {left or 'nothing'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
