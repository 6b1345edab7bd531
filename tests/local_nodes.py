"""A stand-in for ``srun --nodes=N --ntasks-per-node=1`` on one machine, for the multi-node tests
and for a two-"node" run on one GPU machine:

    python -m tests.local_nodes N [--gpus-per-node G] COMMAND...

starts COMMAND N times at once, copy k with SLURM_NODEID=k (as srun sets it on node k), waits for
all of them and exits with the first non-zero exit status in node order (128 + the signal for a
copy killed by one), or 0. With ``--gpus-per-node G`` copy k sees only GPUs kG .. kG+G-1
(CUDA_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES), as a node of its own would.
"""

from __future__ import annotations

import os
import subprocess
import sys


def node_env(k: int, gpus_per_node: int | None) -> dict[str, str]:
    env = {**os.environ, "SLURM_NODEID": str(k)}
    if gpus_per_node:
        cards = ",".join(str(k * gpus_per_node + i) for i in range(gpus_per_node))
        env["CUDA_VISIBLE_DEVICES"] = env["HIP_VISIBLE_DEVICES"] = cards
    return env


def main(argv: list[str]) -> int:
    nodes, cmd = int(argv[0]), argv[1:]
    gpus_per_node = None
    if cmd[:1] == ["--gpus-per-node"]:
        gpus_per_node, cmd = int(cmd[1]), cmd[2:]
    procs = [subprocess.Popen(cmd, env=node_env(k, gpus_per_node)) for k in range(nodes)]
    codes = [p.wait() for p in procs]
    return next((c if c > 0 else 128 - c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
