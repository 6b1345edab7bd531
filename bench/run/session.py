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

SECOND_EXIT = "second_exit.json"  # the pair launcher's record of the second run's exit (bench/procs/pair.py)


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
        skips = preflight.arm_skip_reasons(cfg)
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

    def run(self, run: Run, rdir: Path | None = None, show: bool = True, prime: bool = True) -> str:
        """Execute one run: a unit of one (Session.run_unit)."""
        return self.run_unit([run], [rdir] if rdir is not None else None, show, prime)[0]

    def run_unit(
        self, runs: list[Run], rdirs: list[Path] | None = None, show: bool = True, prime: bool = True
    ) -> list[str]:
        """Execute a unit (Session.execute: one run, or a lockstep pair) on the progress display —
        with ``prime``, its priming units first, the first time its cell and arms run here; its
        first run's line ticks while it runs, and each run's outcome is shown."""
        if not any(self.skipped(r) for r in runs):
            if self.server is not None:
                self.server.start(self.say)
            due = [self.priming.due(r) if prime and self.priming is not None else [] for r in runs]
            for unit in zip(*due):
                self._prime(list(unit))
        progress = self.progress if show else None
        if progress is not None:
            progress.start(runs[0])
        tick = progress.ticker(runs[0], self.out_dir) if progress is not None else None
        lines, seconds = execute.timed(lambda: self.execute(runs, tick, rdirs))
        if progress is not None:
            for run, line in zip(runs, lines):
                progress.done(run, line, seconds)
        return lines

    def execute(
        self, runs: list[Run], tick: Callable[[], None] | None = None, rdirs: list[Path | None] | None = None
    ) -> list[str]:
        """One unit in fresh directories (default the runs' runs/ directories): one run, or the two
        runs of a lockstep pair (``pairing: lockstep``: started at once as one process tree,
        bench/procs/pair.py, taking turns on the card one optimizer step each through the plug's
        turn protocol, TakesTurns). Each run's cell.json, then — unless an arm is skipped here, its
        cache failed or another process holds the cards (a run of a pair that cannot start makes
        its partner's outcome the same) — the polled process tree and the plug's reading-back of
        what each run left (run.json fixed when the trainer died, hung or never wrote an end
        status). Returns each run's one-line outcome."""
        cell, pdir = runs[0].cell, self._open_pair(runs) if len(runs) > 1 else None
        rdirs = rdirs or [None] * len(runs)
        planned = [
            self.plan(run, rd, lockstep=(pdir, role) if pdir else None)
            for role, (run, rd) in enumerate(zip(runs, rdirs))
        ]
        refused = [self.refusal(run, rdir) for run, (rdir, _) in zip(runs, planned)]
        if any(refused):
            why = next(r for r in refused if r)
            return [
                r or outcome.record(rd, run, "error", f"its lockstep partner did not start: {why}")
                for r, run, (rd, _) in zip(refused, runs, planned)
            ]
        (rdir, argv), others = planned[0], planned[1:]
        if pdir is not None:  # the pair's launcher runs the second run beside the first
            second = {
                "argv": others[0][1],
                "log": str(others[0][0] / "stdout.log"),
                "exit": str(pdir / SECOND_EXIT),
            }
            atomic_write_json(pdir / "second.json", second)
            argv = [sys.executable, "-m", "bench.procs.pair", str(pdir / "second.json"), "--", *argv]
        started = now()
        step = self.engine.step(self.cfg, runs[0]) if pdir is None else None  # a pair runs here, whole
        env = execute.compile_env(self.compile_dir(cell))
        try:
            rc, timed_out = execute.launch_polled(
                self.cfg, runs[0], rdir, argv, tick, env, fork=pdir is None and self.forks(cell)
                and runs[0].spec.env is None, step=step,
                pair=(pdir, [d for d, _ in others]) if pdir is not None else None,
            )  # fmt: skip
        finally:  # the turn protocol's files: nothing to keep (a copied or archived sweep holds no pipes)
            if pdir is not None:
                self.plug(cell).close_turns(pdir)
        codes = [rc, *(self._second_exit(pdir, rdir, d, runs[0], rc, timed_out) for d, _ in others)]
        return [
            self.read_back(run, d, code, timed_out, started, step if i == 0 else None)
            for i, (run, (d, _), code) in enumerate(zip(runs, planned, codes))
        ]

    def _open_pair(self, runs: list[Run]) -> Path:
        """A lockstep pair's fresh directory (pairs/<first run>/), with the plug's turn protocol open in it."""
        pdir = pair_dir(self.out_dir, runs[0])
        with writing(pdir):
            shutil.rmtree(pdir, ignore_errors=True)
            pdir.mkdir(parents=True)
            self.plug(runs[0].cell).open_turns(pdir)
        return pdir

    def _second_exit(self, pdir: Path, first: Path, rdir: Path, run: Run, rc: int, timed_out: bool) -> int:
        """The second run of a pair: its launch.json (the pair's, naming its partner) and its exit
        status (the pair launcher's record; killed with the pair when it has none)."""
        launch = read_json(first / "launch.json")
        atomic_write_json(
            rdir / "launch.json", {**(launch if isinstance(launch, dict) else {}), "pair_of": run.run_id}
        )
        second = read_json(pdir / SECOND_EXIT)
        code = second.get("exit_code") if isinstance(second, dict) else None
        code = code if isinstance(code, int) else (rc if timed_out else -9)
        return code if code >= 0 else 128 - code

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
        if run.spec.env is not None:  # an arm's own variables and import path, each run its own
            argv = run.spec.env.command(argv, os.environ)
        warm = compile_dir is not None and any(p.is_file() for p in compile_dir.rglob("*"))  # not empty dirs
        arm_sets = getattr(plug, "arm_sets", None)  # the plugs that translate an arm into their own keys
        arm_keys = arm_sets(run.spec) if callable(arm_sets) else None
        record = execute.cell_record(cfg, run, argv, cache_dir, self.engine.placement(), arm_keys)
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

    def _prime(self, unit: list[Run]) -> None:
        """A priming unit under prime/ (not runs/: no table, pair or verdict reads it): one
        discarded run of the cell and arm, or with ``pairing: lockstep`` one of each arm taking
        turns as a measured pair does, so that the caches and the machine's first minutes are spent
        before the first measured unit; outcomes printed and kept, never read, and they do not stop
        the sweep (bench/run/warmup.py's Priming)."""
        if self.progress is not None:
            self.progress.start(unit[0])
        rdirs = [prime_dir(self.out_dir, p) for p in unit]
        lines, seconds = execute.timed(lambda: self.execute(unit, None, rdirs))
        how = " as a pair" if len(unit) > 1 else ""
        for p, line in zip(unit, lines):
            self.say(f"{p.run_id}: {line} ({seconds:.0f} s{how}, discarded: it primes the caches)")
