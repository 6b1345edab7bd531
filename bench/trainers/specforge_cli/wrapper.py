"""One run of the SpecForge CLI, as the run contract needs it: ``python -m bench.trainers.specforge_cli.wrapper
--run-dir DIR --world W --seq-len S [--features SRC --samples N] [--stop-after N] [--warm SOCKET]
-- PYTHON -m specforge.cli train ...``.

It runs in the driver's process group (a timeout's group kill reaches SpecForge too) and:

1. links the N feature files the run trains on into ``DIR/features`` (from a prepared cache's
   SRC; exactly the samples of its steps, so that no epoch ends inside the measured steps);
2. starts SpecForge with the user's interpreter in an environment that cannot import our
   ``specforge`` (bench/trainers/isolation.py), its stdout and stderr passed through; with
   ``--warm``, forked from the warm server of that interpreter (warmserver.py) instead (the run
   that starts the server keeps its output: ``DIR/warm-server.log``);
3. turns each step's lines into a metrics.jsonl row as they arrive, stamped with the time
   (bench/trainers/specforge_cli/log.py), so the progress bar, the measured window and a run cut
   by its timeout see every finished step;
4. with ``--stop-after N``, once step N (the last measured one) is logged, SIGKILLs SpecForge's
   whole process tree (its torchrun ranks and data workers included, stopped first so that none
   respawns) instead of waiting for the final checkpoint it always writes: nothing after the last
   measured step is part of the measurement. (SIGTERM, tried first, made SpecForge 0.2.0 save that
   checkpoint before it exits: 14 s on the H200.)
5. has instrument.py list, after SpecForge's first optimizer step, the module classes of the model
   it trains (``DIR/modules.json``: whether the arm's kernels are in it; a single-process run);
   with ``--gc-freeze`` (the sweep's ``trainer_gc_freeze``), has instrument.py call gc.freeze() in
   SpecForge's process after its first optimizer step (``DIR/gc_freeze.json``); with
   ``--perturb-ulp DTYPE`` (the aa_eps arm), move every weight by one ulp of DTYPE (``param``: its
   own) before step 1's update (``DIR/perturb.json``); with $BENCH_SPECFORGE_PROBE, its probe (below);
6. with ``--lockstep PAIR_DIR ROLE LAST`` (a sweep's ``pairing: lockstep``), has instrument.py take
   turns on the card with the pair's other run, one optimizer step each, and writes each step's
   own time (the turn's, without the wait: ``DIR/lockstep.jsonl``) into its metrics row in place of
   SpecForge's window, which holds the partner's step too;
7. at the end removes what SpecForge wrote into its output directory and the links, ends any
   process of the run left behind (SpecForge's own workers), and records in ``DIR/specforge.json``
   how the run started and ended, how long the exit took and what was removed.

A SIGTERM, SIGINT or SIGHUP to this wrapper (the driver's timeout, or the driver's death:
PR_SET_PDEATHSIG) is passed on to SpecForge; this wrapper keeps reading until SpecForge has gone
(SIGKILL after STOP_GRACE_S), then exits with its status (0 when it stopped SpecForge itself after
the last step).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.fileio import atomic_write_json, read_jsonl
from bench.procs import proctable
from bench.procs.launcher import kill_tree
from bench.record import LOCKSTEP_JSONL, MetricsWriter
from bench.trainers.isolation import isolated_env
from bench.trainers.specforge_cli.log import StepCollector, metric_records, parse_step_lines

OUTPUT = "specforge-out"  # SpecForge's output_dir inside the run directory
STOP_GRACE_S = 30.0  # after a signal passed on from the driver, SIGKILL if SpecForge is still there
STOP_LEVER = "SIGKILL of SpecForge's process tree once the last measured step was logged"
HEAD_LINES = 5  # the first lines of SpecForge's output, kept for a run without a step line
WARM_SERVER = Path(__file__).with_name("warmserver.py")  # run by path in the user's interpreter
# torch and specforge.cli, then (optional, "?") what SpecForge's `train` imports only once it runs
# (specforge.cli._train): its distributed and application layers, accelerate, transformers' Qwen3,
# TorchDynamo and TorchInductor. None of them initialises CUDA on import.
WARM_PRELOAD = (
    "torch",
    "specforge.cli",
    "accelerate.utils?",
    "specforge.distributed?",
    "specforge.application?",
    "specforge.training.assembly?",
    "specforge.algorithms.builtin?",
    "transformers.models.qwen3.modeling_qwen3?",
    "torch._dynamo?",
    "torch._inductor.compile_fx?",
    "torch.distributed.fsdp?",
)
# Imports in the server must leave the CUDA driver uninitialised (forks make their own context);
# TorchInductor must not start compile workers there (as bench/procs/forkstart.py).
WARM_SERVER_ENV = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1", "TORCH_WARM_POOL": "0"}
WARM_READY_S = 300.0
INSTRUMENT = Path(__file__).with_name("instrument.py")  # run by path in the user's interpreter
# Diagnostics (docs/method.md, "Where a SpecForge run's spread comes from"), off unless set:
#   BENCH_SPECFORGE_PROBE=FIRST:COUNT   instrument.py profiles optimizer steps FIRST..FIRST+COUNT into
#                                       DIR/probe.json (a fresh start or a fork of the warm server)
#   BENCH_PYSPY=PATH:AFTER:SECONDS      py-spy (PATH) samples SpecForge's threads for SECONDS once
#                                       step AFTER is logged, into DIR/pyspy.txt (collapsed stacks)
PROBE_ENV = "BENCH_SPECFORGE_PROBE"
PYSPY_ENV = "BENCH_PYSPY"
PERTURB = "perturb.json"  # what the aa_eps arm moved (instrument.py's PerturbUlp)
GC_FREEZE = "gc_freeze.json"  # what gc.freeze() after step 1 froze (instrument.py's GcFreeze)
MODULES = "modules.json"  # the trained model's module classes after step 1 (instrument.py's ModuleCensus)
WARM_LOG = "warm-server.log"  # the warm server's output, in the run that started it (--warm)
LOCKSTEP = LOCKSTEP_JSONL  # each step's own time and wait in a lockstep pair (turns.py's Lockstep)
STARTUP_LINES = 80  # the lines before step 1 kept with their arrival times (where the start goes)


def link_features(src: Path, dst: Path, samples: int) -> int:
    """``samples`` links in ``dst`` to the feature files of ``src``, cycling through them in order."""
    files = sorted(p for p in src.iterdir() if p.name.endswith(".ckpt"))
    if not files:
        raise FileNotFoundError(f"no .ckpt feature files in {src}")
    dst.mkdir(parents=True, exist_ok=True)
    for i in range(samples):
        (dst / f"{i:06d}.ckpt").symlink_to(files[i % len(files)].resolve())
    return len(files)


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


class WarmRun:
    """SpecForge forked by the warm server (warmserver.py), with the part of Popen's interface used
    here. Its output comes through a pipe; the lifeline pipe's write end stays open in this process
    until it exits, so that the run ends with it whatever kills it."""

    def __init__(
        self, sock_path: str, command: list[str], env: dict[str, str], instrument: dict | None = None
    ):
        out_r, out_w = os.pipe()
        life_r, self._life_w = os.pipe()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(sock_path)
        request = {"argv": command[2:], "env": env, "cwd": os.getcwd()}  # past "PYTHON -m"
        if instrument:
            request["instrument"] = instrument
        socket.send_fds(self._conn, [json.dumps(request).encode()], [out_w, life_r])
        os.close(out_w)
        os.close(life_r)
        self._replies = self._conn.makefile("r")
        self.pid = int(json.loads(self._replies.readline())["pid"])
        self.stdout = os.fdopen(out_r, "r", errors="replace")
        self.returncode: int | None = None

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self) -> int:
        if self.returncode is None:
            line = self._replies.readline()
            self.returncode = int(json.loads(line)["status"]) if line else -signal.SIGKILL
            self.signal(signal.SIGKILL)  # its workers, if any outlived it
        return self.returncode


class Stopper:
    """Signals SpecForge (passed on from the driver, then SIGKILL after STOP_GRACE_S if it has not
    gone), or kills its process tree after the last measured step."""

    def __init__(self, proc) -> None:
        self.proc = proc
        self.stopped_at: float | None = None
        self.killed = 0  # processes killed by stop()
        self.timer: threading.Timer | None = None

    def send(self, sig: int) -> None:
        if isinstance(self.proc, WarmRun):
            self.proc.signal(sig)
        else:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
        if self.timer is None and sig != signal.SIGKILL:
            self.timer = threading.Timer(STOP_GRACE_S, self.send, args=(signal.SIGKILL,))
            self.timer.daemon = True
            self.timer.start()

    def stop(self) -> None:
        if self.stopped_at is None:
            self.stopped_at = time.time()
            self.killed = kill_tree(self.proc.pid)
            if isinstance(self.proc, WarmRun):
                self.proc.signal(signal.SIGKILL)  # its session's group: anything that left the tree


def lockstep_records(path: Path) -> dict[int, dict]:
    """turns.py's Lockstep records by step ({} before the first, or for a run not in a pair; a line
    cut short is skipped)."""
    return {rec["step"]: rec for rec in read_jsonl(path) if isinstance(rec.get("step"), int)}


def own_step_time(row: dict, rec: dict | None) -> dict:
    """A metrics row of a lockstep run: from step 2 on its step time is the turn's own (``own_s``),
    not SpecForge's window (which holds the partner's step and the wait); the rates follow. Step 1,
    which both runs take at once (no turn yet), keeps SpecForge's window, so that the run's start
    (first row's elapsed time less step 1) means what it does in a sequential run. The allocator's
    peaks come from inside the process (the card is shared, so the poller's are the pair's)."""
    if rec is None and row["step"] > 1:  # no turn recorded: no time to give it
        return {**row, "step_time_s": None, "samples_per_s": None, "tokens_per_s": None}
    out = dict(row)
    if row["step"] > 1:
        own = float(rec["own_s"])
        out["step_time_s"] = own
        if row.get("samples") is not None and own > 0:
            out["samples_per_s"] = row["samples"] / own
            out["tokens_per_s"] = row["tokens"] / own if row.get("tokens") is not None else None
    for key in ("reserved", "allocated") if rec is not None else ():
        peak = rec.get(f"peak_{key}_bytes")
        out[f"torch_peak_{key}_gib"] = peak / 2**30 if isinstance(peak, int) else None
    return out


def lockstep_summary(path: Path) -> dict:
    """specforge.json's account of a lockstep run: steps timed, the waits, whether it went on alone."""
    recs = lockstep_records(path)
    alone = [s for s, r in sorted(recs.items()) if r.get("alone")]
    return {
        "steps": len(recs),
        "wait_s": round(sum(float(r.get("wait_s") or 0) for r in recs.values()), 3),
        "alone_from_step": alone[0] if alone else None,
    }


def stream(
    proc,
    rdir: Path,
    collector: StepCollector,
    t0: float,
    stop_after: int,
    stopper: Stopper,
    lockstep: Path | None = None,
) -> dict:
    """Pass SpecForge's output through, writing each finished step into ``rdir``'s metrics.jsonl;
    stop SpecForge once step ``stop_after`` is written (0: never). ``lockstep``: the run's Lockstep
    records, whose own step times replace SpecForge's. Returns what was seen: the time of the first
    and last step, the last step, how many lines, the first lines."""
    seen = {"first": None, "last": None, "last_step": None, "lines": 0, "head": [], "startup": []}
    pyspy = _pyspy_spec()
    with MetricsWriter(rdir) as out:

        def write(rows: list[dict]) -> None:
            if lockstep is not None and rows:
                recs = lockstep_records(lockstep)
                rows = [own_step_time(row, recs.get(row["step"])) for row in rows]
            out.write(metric_records(rows))
            for row in rows:
                seen["last_step"] = row["step"]
                if stop_after and row["step"] >= stop_after:
                    stopper.stop()

        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            seen["lines"] += 1
            if len(seen["head"]) < HEAD_LINES and line.strip():
                seen["head"].append(line.strip()[:160])
            if seen["first"] is None and len(seen["startup"]) < STARTUP_LINES and line.strip():
                seen["startup"].append([round(time.monotonic() - t0, 3), line.strip()[:120]])
            for parsed in parse_step_lines(line):  # two ranks' lines may arrive joined
                now = time.time()
                seen["first"] = seen["first"] or now
                seen["last"] = now
                write(collector.add(*parsed, elapsed_s=time.monotonic() - t0, t=now))
                if pyspy and seen["last_step"] is not None and seen["last_step"] >= pyspy[1]:
                    seen["pyspy"] = _start_pyspy(pyspy, proc.pid, rdir / "pyspy.txt")
                    pyspy = None
        write(collector.flush(elapsed_s=time.monotonic() - t0, t=time.time()))
    return seen


def _pyspy_spec() -> tuple[str, int, float] | None:
    spec = os.environ.get(PYSPY_ENV, "")
    if not spec:
        return None
    try:
        path, after, seconds = spec.rsplit(":", 2)
        return path, int(after), float(seconds)
    except ValueError:
        print(f"bench: {PYSPY_ENV}={spec!r} is not PATH:AFTER:SECONDS; no py-spy", file=sys.stderr)
        return None


def _start_pyspy(spec: tuple[str, int, float], pid: int, out: Path) -> dict:
    """py-spy sampling SpecForge's threads (idle ones too: a wait is where the time goes)."""
    path, after, seconds = spec
    argv = [path, "record", "--pid", str(pid), "--rate", "100", "--duration", str(int(seconds))]
    argv += ["--nonblocking", "--threads", "--idle", "--format", "raw", "--output", str(out)]
    try:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as e:
        return {"after_step": after, "error": str(e)}
    return {"after_step": after, "seconds": seconds, "output": out.name}


def end_leftovers() -> None:
    """SIGKILL every other live process of this process group (SpecForge's workers that outlived it)."""
    me, group = os.getpid(), os.getpgrp()
    for f in proctable.table():
        if f.pid != me and f.pgid == group and not f.zombie:
            try:
                os.kill(f.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def warm_server(sock: str, python: str, driver: int, log_path: Path) -> dict:
    """Start the warm server of ``python`` at ``sock`` unless it runs already; what was done. Its
    output (what its imports printed: a forked run's stdout.log has none of it) goes to
    ``log_path``, in the directory of the run that starts it (the socket is in the temporary
    directory, a short path; a log there would outlive the sweep)."""
    if os.path.exists(sock):
        return {"started_here": False}
    log = open(log_path, "ab")  # noqa: SIM115 (the server's own output, for as long as it runs)
    env = {**isolated_env(os.environ), **WARM_SERVER_ENV}
    t0 = time.monotonic()
    server = subprocess.Popen(
        [python, str(WARM_SERVER), sock, str(driver), *WARM_PRELOAD],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=env,
        start_new_session=True,  # not this run's group: it serves the sweep's later runs
    )
    while not os.path.exists(sock) and server.poll() is None and time.monotonic() - t0 < WARM_READY_S:
        time.sleep(0.05)
    if not os.path.exists(sock):
        raise OSError(f"the warm server did not start (exit status {server.poll()}; see {log_path})")
    return {"started_here": True, "ready_s": round(time.monotonic() - t0, 3), "log": log_path.name}


def instrument(args) -> tuple[dict, dict]:
    """The hooks instrument.py installs in SpecForge's process, and what specforge.json says of
    them: the probe ($BENCH_SPECFORGE_PROBE), gc.freeze() after step 1 (--gc-freeze), every weight
    moved by one ulp before step 1's update (--perturb-ulp: the aa_eps arm); always, the module
    census after step 1 (whether the arm's kernels are in the model SpecForge built)."""
    hooks = {"modules": str(args.run_dir / MODULES)}
    how = {"modules": {"after_step": 1, "output": MODULES}}
    probe = os.environ.get(PROBE_ENV, "")
    try:
        first, count = (int(x) for x in probe.split(":")) if probe else (0, 0)
    except ValueError:
        print(f"bench: {PROBE_ENV}={probe!r} is not FIRST:COUNT (e.g. 13:2); no probe", file=sys.stderr)
        first = count = 0
    if count > 0:
        hooks["probe"] = [str(args.run_dir / "probe.json"), first, count]
        how["probe"] = {"first": first, "count": count, "output": "probe.json"}
    if args.gc_freeze:
        hooks["gc_freeze"] = str(args.run_dir / GC_FREEZE)
        how["gc_freeze"] = {"after_step": 1, "output": GC_FREEZE}
    if args.perturb_ulp:
        hooks["perturb_ulp"] = f"{args.run_dir / PERTURB}:{args.perturb_ulp}"
        how["perturb_ulp"] = {"before_step": 1, "ulp_of": args.perturb_ulp, "output": PERTURB}
    if args.lockstep:
        pair_dir, role, last = args.lockstep
        hooks["lockstep"] = [pair_dir, role, last, str(args.run_dir / LOCKSTEP)]
        how["lockstep"] = {"pair_dir": pair_dir, "role": int(role), "last": int(last), "output": LOCKSTEP}
    return hooks, how


def start(args, command: list[str]) -> tuple[object, dict]:
    """SpecForge started: forked from the warm server (``--warm``) when it can be, else afresh."""
    env = isolated_env(os.environ)
    hooks, how_hooks = instrument(args)
    if args.warm:
        try:
            warm = warm_server(args.warm, command[0], os.getppid(), args.run_dir / WARM_LOG)
            return WarmRun(args.warm, command, env, hooks), {"start": "warm-server", **warm, **how_hooks}
        except (OSError, ValueError, KeyError) as e:
            how = {"start": "exec", "warm_server_error": str(e)}
            print(f"bench: warm server unusable ({e}); SpecForge starts afresh", file=sys.stderr, flush=True)
    else:
        how = {"start": "exec"}
    if hooks and command[1:2] == ["-m"]:
        flags = ["--modules", hooks["modules"]]
        flags += ["--probe", *map(str, hooks["probe"])] if "probe" in hooks else []
        flags += ["--lockstep", *map(str, hooks["lockstep"])] if "lockstep" in hooks else []
        for key in ("gc_freeze", "perturb_ulp"):
            flags += [f"--{key.replace('_', '-')}", hooks[key]] if key in hooks else []
        command = [command[0], str(INSTRUMENT), *flags, *command[1:]]
        how.update(how_hooks)
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env=env,
    ), how


def parse(argv: list[str]):
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m bench.trainers.specforge_cli.wrapper")
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--features", type=Path)
    ap.add_argument("--samples", type=int, default=0)
    ap.add_argument("--stop-after", type=int, default=0, help="stop SpecForge once this step is logged")
    ap.add_argument("--warm", help="the warm server's socket: fork SpecForge from it")
    ap.add_argument("--gc-freeze", action="store_true", help="gc.freeze() in SpecForge after its first step")
    ap.add_argument(
        "--perturb-ulp",
        choices=("param", "bfloat16", "float16"),
        help="every weight moved by one ulp (of this dtype, or its own) before step 1's update",
    )
    ap.add_argument(
        "--lockstep",
        nargs=3,
        metavar=("PAIR_DIR", "ROLE", "LAST"),
        help="take turns on the card with the pair's other run (its FIFOs in PAIR_DIR), one step each",
    )
    return ap.parse_args(argv[:cut]), argv[cut + 1 :]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("error: expected -- before the SpecForge command", file=sys.stderr)
        return 2
    args, command = parse(argv)
    proctable.table()  # psutil imported and read once now: the stop after the last step waits for neither
    t0, started = time.monotonic(), time.time()
    rdir: Path = args.run_dir
    signals: list[int] = []
    holder: dict = {}

    def passed_on(sig: int, _frame) -> None:
        signals.append(sig)
        if "stopper" in holder:
            holder["stopper"].send(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, passed_on)
    if args.features is not None:
        link_features(args.features, rdir / "features", args.samples)
    proc, how = start(args, command)
    stopper = holder["stopper"] = Stopper(proc)
    seen = stream(
        proc,
        rdir,
        StepCollector(args.world, args.seq_len),
        t0,
        args.stop_after,
        stopper,
        rdir / LOCKSTEP if args.lockstep else None,
    )
    rc = proc.wait()
    ended = time.time()
    if stopper.timer is not None:
        stopper.timer.cancel()
    if not isinstance(proc, WarmRun) and os.getpgrp() == os.getpid():  # we lead the run's group
        end_leftovers()
    removed = tree_bytes(rdir / OUTPUT) if (rdir / OUTPUT).exists() else 0
    shutil.rmtree(rdir / OUTPUT, ignore_errors=True)
    shutil.rmtree(rdir / "features", ignore_errors=True)
    stopped = stopper.stopped_at is not None and not signals
    atomic_write_json(
        rdir / "specforge.json",
        {
            "exit_code": rc,
            **how,
            "stop": {
                "lever": STOP_LEVER if args.stop_after else None,
                "after_step": args.stop_after or None,
                "stopped": stopped,
                "processes_killed": stopper.killed if stopped else None,
                "exit_after_stop_s": round(ended - stopper.stopped_at, 3) if stopped else None,
                # SpecForge exited 0 by itself before the kill landed (a tiny CPU run's final
                # checkpoint can take less than the wrapper takes to read the last step's line)
                "ended_before_stop": stopped and rc == 0,
            },
            "signals_received": signals,
            "first_step_after_s": round(seen["first"] - started, 3) if seen["first"] else None,
            "last_step": seen["last_step"],
            "exit_after_last_step_s": round(ended - seen["last"], 3) if seen["last"] is not None else None,
            "output_bytes_removed": removed,
            "output_lines": seen["lines"],
            "first_lines": seen["head"],
            "startup_lines": seen["startup"],
            **({"pyspy": seen["pyspy"]} if "pyspy" in seen else {}),
            **({"lockstep_summary": lockstep_summary(rdir / LOCKSTEP)} if args.lockstep else {}),
            "wall_s": round(time.monotonic() - t0, 3),
        },
    )
    if stopped:
        return 0  # stopped by us after its last measured step: SpecForge's own status is recorded
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    raise SystemExit(main())
