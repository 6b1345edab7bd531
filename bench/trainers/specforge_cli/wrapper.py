"""One run of the SpecForge CLI, as the run contract needs it: ``python -m bench.trainers.specforge_cli.wrapper
--run-dir DIR --world W --seq-len S [--features SRC --samples N] -- PYTHON -m specforge.cli train ...``.

It runs in the driver's process group (a timeout's group kill reaches SpecForge too) and:

1. links the N feature files the run trains on into ``DIR/features`` (from a prepared cache's
   SRC; exactly the samples of its steps, so that no epoch ends inside the measured steps);
2. starts SpecForge with the user's interpreter in an environment that cannot import our
   ``specforge`` (bench/trainers/isolation.py), its stdout and stderr passed through;
3. turns each step's lines into a metrics.jsonl row as they arrive, stamped with the time
   (bench/trainers/specforge_cli/log.py), so the progress bar, the measured window and a run cut
   by its timeout see every finished step;
4. at the end removes what SpecForge wrote into its output directory (it always saves a final
   checkpoint, several GB for a 4B draft; after the last step, so never inside a measured one)
   and the links, and records in ``DIR/specforge.json`` how long the exit took and what was removed.

A SIGTERM or SIGINT (the driver's timeout, Ctrl-C) reaches SpecForge from the process group;
this wrapper keeps reading until SpecForge has gone, then exits with its status.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.fileio import atomic_write_json
from bench.trainers.isolation import isolated_env
from bench.trainers.specforge_cli.log import StepCollector, parse_step_line

OUTPUT = "specforge-out"  # SpecForge's output_dir inside the run directory


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


def stream(proc: subprocess.Popen, metrics: Path, collector: StepCollector, t0: float) -> float | None:
    """Pass SpecForge's output through, writing each finished step; the time of the last step."""
    last = None
    with metrics.open("a") as out:

        def write(rows: list[dict]) -> None:
            for row in rows:
                out.write(json.dumps(row) + "\n")
            out.flush()

        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            parsed = parse_step_line(line)
            if parsed is not None:
                now = time.time()
                last = now
                write(collector.add(*parsed, elapsed_s=time.monotonic() - t0, t=now))
        write(collector.flush(elapsed_s=time.monotonic() - t0, t=time.time()))
    return last


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("error: expected -- before the SpecForge command", file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m bench.trainers.specforge_cli.wrapper")
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--features", type=Path)
    ap.add_argument("--samples", type=int, default=0)
    args, command = ap.parse_args(argv[:cut]), argv[cut + 1 :]
    t0 = time.monotonic()
    rdir: Path = args.run_dir
    signals: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: signals.append(s))  # SpecForge got it too: wait for it
    if args.features is not None:
        link_features(args.features, rdir / "features", args.samples)
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env=isolated_env(os.environ),
    )
    last = stream(proc, rdir / "metrics.jsonl", StepCollector(args.world, args.seq_len), t0)
    rc = proc.wait()
    ended = time.time()
    removed = tree_bytes(rdir / OUTPUT) if (rdir / OUTPUT).exists() else 0
    shutil.rmtree(rdir / OUTPUT, ignore_errors=True)
    shutil.rmtree(rdir / "features", ignore_errors=True)
    atomic_write_json(
        rdir / "specforge.json",
        {
            "exit_code": rc,
            "signals_received": signals,
            "exit_after_last_step_s": round(ended - last, 3) if last is not None else None,
            "output_bytes_removed": removed,
            "wall_s": round(time.monotonic() - t0, 3),
        },
    )
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    raise SystemExit(main())
