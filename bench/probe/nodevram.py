"""Per-node VRAM of multi-node runs: a wrapper that polls one node's cards beside its torchrun
agent, and the gathering of every node's file into the run's vram.json.

The driver launches a multi-node run as ``<launcher> python -m bench.probe.nodevram --run-dir DIR
--interval-s S -- python -m torch.distributed.run ...``. The launcher (e.g. srun) starts the
wrapper once per node; the wrapper takes that node's idle baseline, starts the agent, polls
every card of the node (bench/probe/poller.py's VramPoller, through its Backend protocol) until the
agent exits, and writes ``vram_node_<node>.json`` (+ ``.jsonl``) into DIR, which must be on a
filesystem every node shares. ``<node>`` is the node's index from $BENCH_NODE_RANK,
$SLURM_NODEID or $NODE_RANK, else its host name (a second agent with the same name gets
``<name>-2``). Signals are forwarded to the agent, and the wrapper ends as the agent did (its
exit status, or the same signal). After the run the driver merges the files (``gather``):
every card of every node, each tagged with its node.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from bench.fileio import atomic_write_json, read_json

PREFIX = "vram_node_"
NODE_ENV = ("BENCH_NODE_RANK", "SLURM_NODEID", "NODE_RANK")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def node_label(env: Mapping[str, str] | None = None) -> str:
    """This node's index from the first of NODE_ENV that holds one, else its host name."""
    env = os.environ if env is None else env
    for var in NODE_ENV:
        value = env.get(var, "").strip()
        if value.isdigit():
            return str(int(value))
    return re.sub(r"[^A-Za-z0-9._-]+", "-", socket.gethostname()).strip("-") or "host"


def node_id(label: str) -> int | str:
    """A node as recorded in vram.json and vram_per_card.csv: its index, or its name."""
    return int(label) if label.isdigit() else label


def claim(run_dir: Path, label: str) -> str:
    """Create this node's file exclusively (status "running" until the poller's summary replaces
    it); returns the label it got: ``label``, else ``label-2``, ``label-3``, ..."""
    for k in range(1, 1000):
        name = label if k == 1 else f"{label}-{k}"
        try:
            fd = os.open(run_dir / f"{PREFIX}{name}.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({"node": node_id(name), "hostname": socket.gethostname(), "status": "running"}, f)
        return name
    raise FileExistsError(f"{run_dir}: no free {PREFIX}{label}-<k>.json")


def run_forwarding(cmd: list[str]) -> int:
    """Run cmd in this process group, forwarding SIGTERM, SIGINT and SIGHUP to it; its exit status
    (negative: the signal that killed it; 127: it could not be started). It stays in this group
    so that whatever kills the group (the driver's timeout, the end of a Slurm step) kills the
    agent and its workers too; a group-wide signal thus reaches the agent twice, which torchrun
    survives (it shuts its workers down on the first)."""
    proc: subprocess.Popen | None = None
    pending: list[int] = []

    def forward(sig: int, _frame: object) -> None:
        if proc is None:
            pending.append(sig)
        else:
            proc.send_signal(sig)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        try:
            proc = subprocess.Popen(cmd)
        except OSError as e:
            print(
                f"bench.probe.nodevram: cannot start {cmd[0]!r}: {e.strerror or e}",
                file=sys.stderr,
                flush=True,
            )
            return 127
        for sig in pending:
            proc.send_signal(sig)
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.probe.nodevram",
        description="Run a command (one node's torchrun agent) while polling this node's GPU memory "
        "into RUN_DIR/vram_node_<node>.json.",
    )
    p.add_argument("--run-dir", required=True, type=Path, help="the run directory, on a shared filesystem")
    p.add_argument("--interval-s", type=float, default=0.05, help="seconds between samples")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        p.error("no command after --")
    try:
        label = claim(args.run_dir, node_label())
    except OSError as e:  # e.g. no shared filesystem here: the agent runs unpolled; the driver names the gap
        why = (
            "does not exist" if isinstance(e, FileNotFoundError) else f"cannot be written ({e.strerror or e})"
        )
        print(
            f"bench.probe.nodevram: {args.run_dir} {why} on {socket.gethostname()}; this node's VRAM is not "
            "recorded (the run directory must be on a filesystem every node shares)",
            file=sys.stderr,
            flush=True,
        )
        return run_forwarding(cmd)
    from bench.probe.vram import VramPoller

    poller = VramPoller(args.run_dir, interval_s=args.interval_s, name=f"{PREFIX}{label}")
    poller.start()
    try:
        return run_forwarding(cmd)
    finally:
        summary = poller.stop()  # never raises; writes the summary without the node's name
        node = {"node": node_id(label), "hostname": socket.gethostname()}
        try:
            atomic_write_json(args.run_dir / f"{PREFIX}{label}.json", {**node, **summary})
        except OSError as e:  # the agent's exit status matters more than this file
            print(
                f"bench.probe.nodevram: cannot write {PREFIX}{label}.json: {e}", file=sys.stderr, flush=True
            )


def _order(path: Path) -> tuple:
    label = path.stem[len(PREFIX) :]
    return (0, int(label), "") if label.isdigit() else (1, 0, label)


def gather(run_dir: Path, nodes: int) -> dict:
    """Merge every node's file into ``run_dir/vram.json`` and return it: the cards of every node,
    each with its ``node``; ``nodes`` (per node: node, hostname, status, reason, n_samples);
    status ``ok`` when all ``nodes`` nodes polled, ``partial`` when some did, else ``unavailable``."""
    docs = []
    for path in sorted(run_dir.glob(f"{PREFIX}*.json"), key=_order):
        doc = read_json(path)
        doc = doc if isinstance(doc, dict) else {"status": "unreadable"}
        docs.append({**doc, "node": doc.get("node", node_id(path.stem[len(PREFIX) :]))})
    problems = []
    for doc in docs:
        if doc.get("status") == "running":
            problems.append(f"node {doc['node']}: its poller never finished (killed before the agent ended?)")
        elif doc.get("status") != "ok":
            problems.append(f"node {doc['node']}: {doc.get('reason') or doc.get('status')}")
    if len(docs) < nodes:
        problems.append(
            f"{nodes - len(docs)} of {nodes} nodes wrote no {PREFIX}<node>.json (is the run directory on a "
            "filesystem every node shares?)"
        )
    polled = [d for d in docs if d.get("status") == "ok"]
    status = "ok" if not problems else "partial" if polled else "unavailable"
    backends = sorted({str(d.get("backend")) for d in docs if d.get("backend")})
    merged = {
        "backend": "+".join(b for b in backends if b != "none") or "none",
        "status": status,
        "reason": "; ".join(problems)[:600] or None,
        "interval_s": next((d["interval_s"] for d in docs if "interval_s" in d), None),
        "n_samples": sum(int(d.get("n_samples") or 0) for d in docs),
        "errors": sum(int(d.get("errors") or 0) for d in docs),
        "driver_version": next((d["driver_version"] for d in docs if d.get("driver_version")), None),
        "partitioned": any(d.get("partitioned") for d in docs),
        "nodes": [{k: d.get(k) for k in ("node", "hostname", "status", "reason", "n_samples")} for d in docs],
        "devices": [
            {**dev, "node": d["node"]}
            for d in docs
            for dev in d.get("devices") or []
            if isinstance(dev, dict)
        ],
    }
    atomic_write_json(run_dir / "vram.json", merged)
    return merged


def exit_like(rc: int) -> None:
    """End this process as the agent ended: its exit status, or killed by the same signal."""
    if rc < 0:
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    sys.exit(rc if rc >= 0 else 128 - rc)


if __name__ == "__main__":
    exit_like(main())
