"""A stand-in for ``srun --nodes=N --ntasks-per-node=1`` on one machine, for the multi-node tests:

    python -m tests.local_nodes N COMMAND...

starts COMMAND N times at once, copy k with SLURM_NODEID=k (as srun sets it on node k), waits for
all of them and exits with the first non-zero exit status in node order (128 + the signal for a
copy killed by one), or 0.
"""

from __future__ import annotations

import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    nodes, cmd = int(argv[0]), argv[1:]
    procs = [subprocess.Popen(cmd, env={**os.environ, "SLURM_NODEID": str(k)}) for k in range(nodes)]
    codes = [p.wait() for p in procs]
    return next((c if c > 0 else 128 - c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
