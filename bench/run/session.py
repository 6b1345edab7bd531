"""A Session: everything one invocation's runs share — the config, the output directory, the
machine, the engine the runs go through (bench/run/engine.py: local, or Slurm's), the trainer plug, which arms are skipped here and why, the prepared caches, the compile
cache, the progress display, the fork server and the priming done (bench/run/warmup.py). The
three loops (sweep, capacity search, profile runs) are thin users of it."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import bench.trainers.outcome as outcome
from bench.config import Cell, Run, SweepConfig
from bench.fileio import WriteError, atomic_write_json, read_json, writing
from bench.probe import vram
from bench.procs.launcher import mark_exit, now
from bench.record import write_cell
from bench.run import caches, console, execute, preflight
from bench.run.engine import LOCAL, Engine, RunLost
from bench.run.sweepdir import (
    cache_dir_for,
    compile_cache_dir,
    git_commit,
    pair_dir,
    prime_dir,
    run_dir,
)
from bench.run.warmup import ForkServer, Priming
from bench.trainers import TrainerPlug, plugs_for


@dataclass
class Session:
    cfg: SweepConfig
    out_dir: Path
    info: dict
    plugs: dict[str, TrainerPlug]  # trainer name -> its plug (bench/trainers)
    skips: dict[str, str] = field(default_factory=dict)  # arm -> why its runs are skipped here
    progress: console.Progress | None = None
    cache_errors: dict[str, str | None] = field(default_factory=dict)  # cache key -> error or None
    server: ForkServer | None = None  # the warm fork server (Session.open makes it)
    priming: Priming | None = None  # the priming runs done (sweep key prime_runs)
    order: int = 0  # runs planned on the fly (capacity probes) are numbered in the order they come
    engine: Engine = LOCAL  # where and how the process trees run (handed in by the command line)

    @classmethod
    def open(cls, cfg: SweepConfig, out_dir: Path, info: dict, engine: Engine = LOCAL) -> Session:
        """A session for runs of ``cfg``; says which arms are skipped on this machine and why
        (preflight.arm_skip_reasons) before any run. The caller gives it a progress display when
        its runs start."""
        skips = preflight.arm_skip_reasons(cfg.arms)
        for line in preflight.skip_lines(skips):
            print(line, flush=True)
        session = cls(
            cfg=cfg,
            out_dir=out_dir,
            info=info,
            plugs=plugs_for(cfg, {**info, "git_commit": git_commit()}),
            skips=skips,
            engine=engine,
            priming=Priming(cfg.prime_runs),
        )
        session.server = session.fork_server()
        return session

    def plug(self, cell: Cell) -> TrainerPlug:
        return self.plugs[cell.trainer]

    def forks(self, cell: Cell) -> bool:
        """Whether a cell's runs fork from the warm server: single-process runs of a trainer whose
        plug preloads modules into it (a trainer in another interpreter preloads none)."""
        cfg = self.cfg
        return cfg.fork_server and cell.gpus == 1 and cell.nodes == 1 and bool(self.plug(cell).preload(cfg))

    def compile_dir(self, cell: Cell) -> Path | None:
        """The compile cache (TorchInductor, Triton) the runs of ``cell`` share: one per trainer
        environment's versions and the GPU kind, under cache/compile/ (--force keeps it)."""
        if not self.cfg.compile_cache:
            return None
        key = self.plug(cell).compile_key(self.cfg, self.info.get("kind") or "cpu")
        return self.out_dir / "cache" / "compile" / key if key else compile_cache_dir(self.out_dir, self.info)

    def next_order(self) -> int:
        self.order += 1
        return self.order - 1

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()

    def say(self, line: str) -> None:
        (self.progress.write if self.progress is not None else print)(line)

    def skipped(self, run: Run) -> bool:
        return run.arm in self.skips

    def prepare(self, runs: list[Run]) -> None:
        """Prepare (or verify) once each offline cache these runs need. A preparation that failed
        for the machine (a full disk, a read-only filesystem), not for its cell, stops the sweep
        (WriteError) before any run of the cell is recorded as failed; --resume prepares it again."""
        for trainer, plug in self.plugs.items():
            wanted = [r for r in runs if not self.skipped(r) and r.cell.trainer == trainer]
            self.cache_errors = caches.prepare_caches(self.cfg, plug, self.out_dir, wanted, self.cache_errors)
            for key, error in self.cache_errors.items():
                fault = execute.environment_fault(error)
                if fault:
                    raise WriteError(fault, error, str(self.out_dir / "cache" / key))

    def fork_server(self) -> ForkServer:
        """The session's warm fork server: what it preloads when any cell forks its runs (the first
        such cell's plug's modules, in that cell's compile-cache environment), started by the first
        run that launches."""
        cfg = self.cfg
        forking = [c for c in cfg.cells if self.forks(c)]  # cells whose runs fork
        preload = self.plug(forking[0]).preload(cfg) if forking else []
        env = execute.compile_env(self.compile_dir(forking[0])) if forking else {}
        gpus = 0 if cfg.runs_on_cpu else int(self.info.get("gpu_count") or 0)
        return ForkServer(preload, env, gpus, self.out_dir)

    def run_pair(self, runs: list[Run]) -> list[str]:
        """Execute a lockstep pair (Session.execute_pair) on the progress display: its first run's line
        ticks while both run; each run's outcome is shown."""
        if not any(self.skipped(r) for r in runs):
            if self.server is not None:
                self.server.start(self.say)
            due = [self.priming.due(r) if self.priming is not None else [] for r in runs]
            for pair in zip(*due):
                self._prime_pair(list(pair))
        progress = self.progress
        if progress is not None:
            progress.start(runs[0])
        tick = progress.ticker(runs[0], self.out_dir) if progress is not None else None
        lines, seconds = execute.timed(lambda: self.execute_pair(runs, tick))
        if progress is not None:
            for run, line in zip(runs, lines):
                progress.done(run, line, seconds)
        return lines

    def run(self, run: Run, rdir: Path | None = None, show: bool = True, prime: bool = True) -> str:
        """Execute one run (with ``prime``, its priming runs first, the first time its cell and
        arm run here); ``show``: on the progress display."""
        if not self.skipped(run):
            if self.server is not None:
                self.server.start(self.say)
            for p in self.priming.due(run) if prime and self.priming is not None else []:
                self._prime(p)
        progress = self.progress
        if progress is not None and show:
            progress.start(run)
        tick = progress.ticker(run, self.out_dir) if progress is not None and show else None
        line, seconds = execute.timed(lambda: self.execute(run, tick, rdir))
        if progress is not None and show:
            progress.done(run, line, seconds)
        return line

    def execute(self, run: Run, tick: Callable[[], None] | None = None, rdir: Path | None = None) -> str:
        """One run in a fresh directory (default its runs/ directory): cell.json, then (unless the
        arm is skipped here or its cache failed) the polled process tree and the plug's reading-back
        of what the run left (run.json fixed when the trainer died, hung or never wrote an end
        status). Returns the run's one-line outcome."""
        rdir, argv = self.plan(run, rdir)
        refused = self.refusal(run, rdir)
        if refused:
            return refused
        started, step = now(), self.engine.step(self.cfg, run)
        env = execute.compile_env(self.compile_dir(run.cell))
        rc, timed_out = execute.launch_polled(
            self.cfg, run, rdir, argv, tick, env, fork=self.forks(run.cell), step=step
        )
        return self.read_back(run, rdir, rc, timed_out, started, step)

    def plan(
        self, run: Run, rdir: Path | None = None, lockstep: tuple[Path, int] | None = None
    ) -> tuple[Path, list[str]]:
        """The run's fresh directory with its cell.json, and the plug's command (``lockstep``: the
        pair's directory and this run's role in it)."""
        cfg, out_dir = self.cfg, self.out_dir
        rdir = rdir if rdir is not None else run_dir(out_dir, run)
        with writing(rdir):
            if rdir.exists():
                shutil.rmtree(rdir)
            rdir.mkdir(parents=True)
        cache_dir = cache_dir_for(out_dir, run.cell)
        plug, compile_dir = self.plug(run.cell), self.compile_dir(run.cell)
        argv = plug.train_command(cfg, run, rdir, cache_dir)
        if lockstep is not None:
            argv = plug.lockstep_command(argv, *lockstep, last=run.cell.steps)
        warm = compile_dir is not None and any(p.is_file() for p in compile_dir.rglob("*"))  # not empty dirs
        record = execute.cell_record(cfg, run, argv, cache_dir, self.engine.placement())
        compile_cache: dict = {"dir": str(compile_dir) if compile_dir else None, "warm": warm}
        pyc = execute.bytecode_dir(compile_dir)
        if pyc is not None:  # Python's bytecode shared too (PYTHONDONTWRITEBYTECODE in the environment)
            compile_cache["bytecode"] = {"dir": str(pyc), "warm": pyc.is_dir() and any(pyc.iterdir())}
        record = record.updated(compile_cache=compile_cache)
        if lockstep is not None:
            record = record.updated(
                pairing={"mode": "lockstep", "pair_dir": str(lockstep[0]), "role": lockstep[1]}
            )
        write_cell(rdir, record)
        return rdir, argv

    def refusal(self, run: Run, rdir: Path) -> str | None:
        """The outcome of a run that does not start (its arm skipped here, its cache failed, another
        process on the cards under ``foreign_processes: refuse``), recorded; None when it starts."""
        if self.skipped(run):
            return outcome.record(rdir, run, "skipped", self.skips[run.arm])
        cache_error = self.cache_errors.get(run.cell.cache_key())
        if cache_error:
            return outcome.record(rdir, run, "error", cache_error)
        refused = self._foreign(run)
        if refused:
            return outcome.record(rdir, run, "error", refused)
        return None

    def read_back(self, run: Run, rdir: Path, rc: int, timed_out: bool, started: str, step=None) -> str:
        """The plug's reading-back of what the run left (run.json), the engine's loss or the
        machine's fault raised, launch.json marked finished; the run's one-line outcome."""
        doc = self.plug(run.cell).reconcile(rdir, run, rc, timed_out, started)
        lost = step.lost(rdir, rc) if step is not None and not timed_out and doc.status != "ok" else None
        if lost is not None:  # the engine's loss (a node, a time limit), not the run's: stop, never final
            execute.record_lost(rdir, doc, lost)
            mark_exit(rdir / "launch.json", rc, timed_out)
            raise RunLost(run.run_id, lost)
        fault = execute.environment_fault(doc.reason) if doc.status == "error" else None
        if fault:  # the machine failed the run, not its arm: stop, launch.json unmarked (unfinished)
            raise WriteError(fault, f"{os.strerror(fault)} (the run stopped: {doc.reason})", str(rdir))
        mark_exit(rdir / "launch.json", rc, timed_out)
        return console.outcome_line(rdir)

    def execute_pair(
        self, runs: list[Run], tick: Callable[[], None] | None = None, rdirs: list[Path] | None = None
    ) -> list[str]:
        """A lockstep pair (``pairing: lockstep``): both runs started at once as one process tree
        (bench/procs/pair.py), taking turns on the card one optimizer step each, in ``rdirs``
        (default their runs/ directories). A run that cannot start makes its partner's outcome the
        same (a lockstep pair runs whole or not at all)."""
        pdir = pair_dir(self.out_dir, runs[0])
        with writing(pdir):
            shutil.rmtree(pdir, ignore_errors=True)
            pdir.mkdir(parents=True)
            for role in range(2):
                os.mkfifo(pdir / f"to{role}")
        rdirs = rdirs or [None] * len(runs)
        planned = [
            self.plan(run, rd, lockstep=(pdir, role)) for role, (run, rd) in enumerate(zip(runs, rdirs))
        ]
        refused = [self.refusal(run, rdir) for run, (rdir, _) in zip(runs, planned)]
        if any(refused):
            why = next(r for r in refused if r)
            return [
                r or outcome.record(rd, run, "error", f"its lockstep partner did not start: {why}")
                for r, run, (rd, _) in zip(refused, runs, planned)
            ]
        (rdir_a, argv_a), (rdir_b, argv_b) = planned
        second = {"argv": argv_b, "log": str(rdir_b / "stdout.log"), "exit": str(pdir / "second_exit.json")}
        atomic_write_json(pdir / "second.json", second)
        argv = [sys.executable, "-m", "bench.procs.pair", str(pdir / "second.json"), "--", *argv_a]
        started = now()
        env = execute.compile_env(self.compile_dir(runs[0].cell))
        try:
            rc, timed_out = execute.launch_polled(
                self.cfg, runs[0], rdir_a, argv, tick, env, pair=(pdir, [rdir_b])
            )
        finally:  # the FIFOs: nothing to keep (a copied or archived sweep holds no pipes)
            for role in range(2):
                (pdir / f"to{role}").unlink(missing_ok=True)
        launch = read_json(rdir_a / "launch.json")
        atomic_write_json(
            rdir_b / "launch.json",
            {**(launch if isinstance(launch, dict) else {}), "pair_of": runs[0].run_id},
        )
        second_exit = read_json(pdir / "second_exit.json")
        rc_b = second_exit.get("exit_code") if isinstance(second_exit, dict) else None
        rc_b = rc_b if isinstance(rc_b, int) else (rc if timed_out else -9)
        rc_b = rc_b if rc_b >= 0 else 128 - rc_b
        return [
            self.read_back(runs[0], rdir_a, rc, timed_out, started),
            self.read_back(runs[1], rdir_b, rc_b, timed_out, started),
        ]

    def _foreign(self, run: Run) -> str | None:
        """With ``foreign_processes: refuse``, why the run does not start: another process holds
        memory on this machine's cards (--retry-failed re-runs its round once they are free)."""
        if self.cfg.foreign_processes != "refuse" or not self.cfg.polls(run.arm) or run.cell.nodes > 1:
            return None
        procs = execute.quietly("process check", vram.foreign_processes) or []
        if not procs:
            return None
        seen = ", ".join(f"pid {p['pid']} on card {p['card']} ({p['owner']})" for p in procs[:3])
        return f"refused: another process holds memory on the cards ({seen}); foreign_processes: refuse"

    def _prime(self, p: Run) -> None:
        """One priming run under prime/ (not runs/: no table, pair or verdict reads it); its outcome
        is printed and kept, and does not stop the sweep (bench/run/warmup.py's Priming)."""
        if self.progress is not None:
            self.progress.start(p)
        line, seconds = execute.timed(lambda: self.execute(p, None, prime_dir(self.out_dir, p)))
        self.say(f"{p.run_id}: {line} ({seconds:.0f} s, discarded: it primes the caches)")

    def _prime_pair(self, pair: list[Run]) -> None:
        """A priming pair under prime/ (``pairing: lockstep``): one discarded run of each arm of
        the cell, taking turns as a measured pair does, so that the caches and the machine's
        first minutes are spent before the first measured pair; outcomes printed, never read."""
        if self.progress is not None:
            self.progress.start(pair[0])
        rdirs = [prime_dir(self.out_dir, p) for p in pair]
        lines, seconds = execute.timed(lambda: self.execute_pair(pair, None, rdirs))
        for p, line in zip(pair, lines):
            self.say(f"{p.run_id}: {line} ({seconds:.0f} s as a pair, discarded: it primes the caches)")
