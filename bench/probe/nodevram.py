"""Per-node VRAM of multi-node runs: a wrapper that polls one node's cards beside its torchrun
agent, and the gathering of every node's summary into the run's vram.json.

The driver launches a multi-node run as ``<launcher> python -m bench.probe.nodevram --run-dir DIR
--interval-s S -- python -m torch.distributed.run ...``. The launcher (e.g. srun) starts the
wrapper once per node; the wrapper takes that node's idle baseline, starts the agent, polls
every card of the node (bench/probe/poller.py's VramPoller, through its Backend protocol) until the
agent exits, and writes ``vram_node_<node>.json`` (+ ``.jsonl``) into DIR. No shared filesystem
is assumed: the wrapper also prints a start line and its summary on stdout (``say``: lines of at
most ~850 bytes, as srun --label cuts longer ones at 1024), which the launcher passes on to the
driver's stdout.log; where DIR is not on the node, it polls into a temporary directory and only
the lines carry the summary. ``<node>`` is the node's index from $BENCH_NODE_RANK,
$SLURM_NODEID or $NODE_RANK, else its host name (a second agent with the same name gets
``<name>-2``). Signals are forwarded to the agent, and the wrapper ends as the agent did (its
exit status, or the same signal). After the run the driver merges the nodes' summaries
(``gather``: each node's file, else its lines): every card of every node, tagged with its node.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from bench.fileio import atomic_write_json, read_json

PREFIX = "vram_node_"
NODE_ENV = ("BENCH_NODE_RANK", "SLURM_NODEID", "NODE_RANK")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
LINE_PART = 800  # characters of JSON per stdout line (say)
LINE_RE = re.compile(
    r"^(?:\s*\d+: )?bench\.nodevram\[(?P<label>[A-Za-z0-9._-]+)\] (?P<kind>start|summary) "
    r"(?P<k>\d+)/(?P<n>\d+) (?P<part>.*)$"
)


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
        "into RUN_DIR/vram_node_<node>.json, and print the summary on stdout too.",
    )
    p.add_argument("--run-dir", required=True, type=Path, help="the run directory (shared or not)")
    p.add_argument("--interval-s", type=float, default=0.05, help="seconds between samples")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        p.error("no command after --")
    # a signal before the agent runs (a step ended while its wrappers start) still leaves a summary
    early: list[int] = []
    previous = {sig: signal.signal(sig, lambda sig, _f: early.append(sig)) for sig in FORWARDED}
    try:
        label, where = _claim_or_temp(args.run_dir)
        node = {"node": node_id(label), "hostname": socket.gethostname()}
        say(label, "start", {**node, **_slurm_task()})
        from bench.probe.vram import VramPoller

        poller = VramPoller(where, interval_s=args.interval_s, name=f"{PREFIX}{label}")
        poller.start()
        rc: int | None = None
        try:
            rc = -early[0] if early else run_forwarding(cmd)  # stopped already: the agent never starts
            return rc
        finally:
            _finish(args.run_dir, where, label, {**node, **poller.stop(), "agent_exit": rc})
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _finish(run_dir: Path, where: Path, label: str, summary: dict) -> None:
    """The node's summary on stdout (the driver's copy when the file does not reach it), and in its
    file in the run directory, or the temporary directory removed."""
    say(label, "summary", summary)
    if where != run_dir:
        shutil.rmtree(where, ignore_errors=True)
        return
    try:
        atomic_write_json(run_dir / f"{PREFIX}{label}.json", summary)
    except OSError as e:  # the agent's exit status matters more than this file
        print(f"bench.probe.nodevram: cannot write {PREFIX}{label}.json: {e}", file=sys.stderr, flush=True)


def _claim_or_temp(run_dir: Path) -> tuple[str, Path]:
    """(this node's label, where its poller writes): the run directory, where this node's file is
    claimed; else (the directory is not on this node: no shared filesystem) a temporary directory,
    removed at the end, and the summary reaches the driver only as lines on stdout."""
    try:
        return claim(run_dir, node_label()), run_dir
    except OSError as e:
        why = (
            "does not exist" if isinstance(e, FileNotFoundError) else f"cannot be written ({e.strerror or e})"
        )
        print(
            f"bench.probe.nodevram: {run_dir} {why} on {socket.gethostname()}; this node's VRAM summary "
            "reaches the driver as lines on stdout (its samples are not kept)",
            file=sys.stderr,
            flush=True,
        )
        return node_label(), Path(tempfile.mkdtemp(prefix="bench-nodevram-"))


def _slurm_task() -> dict:
    """The Slurm job step this wrapper is a task of (job, step, node name), when srun started it."""
    env = os.environ
    keys = {"job_id": "SLURM_JOB_ID", "step_id": "SLURM_STEP_ID", "slurm_node": "SLURMD_NODENAME"}
    found = {k: env[v] for k, v in keys.items() if env.get(v)}
    return {"slurm": found} if found else {}


def say(label: str, kind: str, doc: dict) -> None:
    """Print ``doc`` on stdout as ``bench.nodevram[<label>] <kind> <k>/<n> <part>`` lines, parts of its
    JSON of at most LINE_PART characters: srun (--label) cuts longer lines at 1024 bytes, and the
    parts of one line could interleave with another node's output. node_lines reads them back."""
    text = json.dumps(doc, separators=(",", ":"), default=str)
    parts = [text[i : i + LINE_PART] for i in range(0, len(text), LINE_PART)] or [""]
    lines = [f"bench.nodevram[{label}] {kind} {k}/{len(parts)} {part}" for k, part in enumerate(parts, 1)]
    try:
        print("\n".join(lines), flush=True)
    except OSError:  # stdout gone (the launcher died): the file, if any, still holds the summary
        pass


def node_lines(log: Path) -> dict[str, dict[str, dict]]:
    """label -> kind ("start", "summary") -> the object the wrapper of that node printed (say),
    from a run's stdout.log (srun's ``N: `` labels allowed); incomplete or unreadable ones left out."""
    parts: dict[tuple[str, str], dict[int, str]] = {}
    counts: dict[tuple[str, str], int] = {}
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            for line in f:
                if "bench.nodevram[" not in line:
                    continue
                m = LINE_RE.match(line.rstrip("\r\n"))
                if m:
                    key = (m["label"], m["kind"])
                    if counts.get(key) != int(m["n"]):  # a new print of that kind: start over
                        parts[key], counts[key] = {}, int(m["n"])
                    parts[key][int(m["k"])] = m["part"]
    except OSError:
        return {}
    out: dict[str, dict[str, dict]] = {}
    for (label, kind), got in parts.items():
        if sorted(got) != list(range(1, counts[(label, kind)] + 1)):
            continue
        try:
            doc = json.loads("".join(got[k] for k in sorted(got)))
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.setdefault(label, {})[kind] = doc
    return out


def _order(path: Path) -> tuple:
    label = path.stem[len(PREFIX) :]
    return (0, int(label), "") if label.isdigit() else (1, 0, label)


def _node_docs(run_dir: Path, printed: dict[str, dict[str, dict]]) -> list[dict]:
    """Each node's summary, in node order: its file, else (no file, or one its poller never
    finished) the summary it printed on stdout (``printed``: node_lines), marked ``via: stdout``."""
    docs: dict[str, dict] = {}
    for path in run_dir.glob(f"{PREFIX}*.json"):
        doc = read_json(path)
        docs[path.stem[len(PREFIX) :]] = doc if isinstance(doc, dict) else {"status": "unreadable"}
    for label, kinds in printed.items():
        line = kinds.get("summary")
        if line is not None and docs.get(label, {}).get("status") in (None, "running", "unreadable"):
            docs[label] = {**line, "via": "stdout"}
    ordered = sorted(docs, key=lambda label: _order(Path(f"{PREFIX}{label}.json")))
    return [{**docs[lb], "node": docs[lb].get("node", node_id(lb))} for lb in ordered]


def gather(run_dir: Path, nodes: int, log: Path | None = None) -> dict:
    """Merge every node's summary into ``run_dir/vram.json`` and return it: the cards of every node,
    each with its ``node``; ``nodes`` (per node: node, hostname, status, reason, n_samples, how its
    agent exited, ``via`` stdout when its file did not arrive and ``log``'s lines gave it); status
    ``ok`` when all ``nodes`` nodes polled, ``partial`` when some did, else ``unavailable``."""
    docs = _node_docs(run_dir, node_lines(log) if log is not None else {})
    problems = []
    for doc in docs:
        if doc.get("status") == "running":
            problems.append(f"node {doc['node']}: its poller never finished (killed before the agent ended?)")
        elif doc.get("status") != "ok":
            problems.append(f"node {doc['node']}: {doc.get('reason') or doc.get('status')}")
    if len(docs) < nodes:
        problems.append(
            f"{nodes - len(docs)} of {nodes} nodes sent no summary (no {PREFIX}<node>.json, and none printed "
            "on the run's stdout: the wrapper was killed, or never started)"
        )
    polled = [d for d in docs if d.get("status") == "ok"]
    status = "ok" if not problems else "partial" if polled else "unavailable"
    backends = sorted({str(d.get("backend")) for d in docs if d.get("backend")})
    merged = {
        "backend": "+".join(b for b in backends if b != "none") or "none",
        "status": status,
        "reason": "; ".join(problems)[:600] or None,
        "interval_s": next((d["interval_s"] for d in docs if "interval_s" in d), None),
        "power_interval_s": next((d["power_interval_s"] for d in docs if "power_interval_s" in d), None),
        "n_samples": sum(int(d.get("n_samples") or 0) for d in docs),
        "errors": sum(int(d.get("errors") or 0) for d in docs),
        "driver_version": next((d["driver_version"] for d in docs if d.get("driver_version")), None),
        "partitioned": any(d.get("partitioned") for d in docs),
        "nodes": [
            {k: d.get(k) for k in ("node", "hostname", "status", "reason", "n_samples", "agent_exit")}
            | ({"via": "stdout"} if d.get("via") else {})
            for d in docs
        ],
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
