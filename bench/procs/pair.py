"""Both runs of a lockstep pair as one process tree: ``python -m bench.procs.pair SECOND.json --
ARGV...`` starts ARGV (the first run, its output on this process's stdout: the driver's
``stdout.log`` of the first run) and the second run described in SECOND.json (``argv``, ``log``:
its own stdout.log, ``exit``: where its exit status goes), waits for both, writes the second's
status and exits with the first's.

Both children stay in this process's group, which the driver leads: its timeout, an interrupt or a
--resume after a dead driver end both runs with one group kill (bench/procs/launcher.py), and each
gets SIGTERM if this process dies. The two runs take turns on the card between themselves
(bench/trainers/specforge_cli/turns.py's Lockstep); this process only starts and waits.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from bench.fileio import atomic_write_json
from bench.procs.lifeline import die_with_parent_fn

USAGE = "usage: python -m bench.procs.pair SECOND.json -- ARGV..."


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    second = json.loads(Path(argv[0]).read_text())
    procs: list[subprocess.Popen] = []

    def passed_on(sig: int, _frame) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, passed_on)
    common = {"stdin": subprocess.DEVNULL, "preexec_fn": die_with_parent_fn()}
    try:
        procs.append(subprocess.Popen(argv[2:], **common))
        with open(second["log"], "ab") as log:
            procs.append(subprocess.Popen(second["argv"], stdout=log, stderr=subprocess.STDOUT, **common))
    except OSError as e:
        print(f"pair: could not launch a run of the pair: {e}", file=sys.stderr)
        passed_on(signal.SIGTERM, None)
        for p in procs:
            p.wait()
        atomic_write_json(Path(second["exit"]), {"exit_code": 127, "error": str(e)})
        return 127
    first_rc = procs[0].wait()
    second_rc = procs[1].wait()
    atomic_write_json(Path(second["exit"]), {"exit_code": second_rc})
    return first_rc if first_rc >= 0 else 128 - first_rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
