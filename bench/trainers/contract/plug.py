"""The run-contract plug: a trainer that honours docs/run-contract.md — ``python -m MODULE
train|prepare|check CONFIG --set k=v … [--use-liger-kernel] --output-dir DIR``, exit codes 0/2/3,
``run.json`` and ``metrics.jsonl`` written by rank 0. The sweep's ``trainer_module`` names the
module. The contract's own keys (CONTRACT_KEYS) are all the driver sets; an arm is Liger on or
off (``--use-liger-kernel``). Our trainer's plug (bench/trainers/embedded) extends it with the
keys through which our trainer expresses the other arms."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench.trainers.outcome as outcome
from bench.arms import Arm
from bench.config import Cell, Run, SweepConfig
from bench.errors import SweepError
from bench.procs.launcher import exit_text, now
from bench.record import RecordError, RunDoc, has_run, read_run, write_run
from bench.trainers.launch import module_launcher, set_args

NAME = "contract"  # the trainer's registered name (a sweep's `trainer: contract`)
CHECK_TIMEOUT_S = 120.0
OOM_EXIT = 3  # the contract's exit status for an out-of-memory run
# The run contract's keys, given as --set on every run (docs/run-contract.md): the cell's steps,
# batch size and sequence length, the offline cache the driver prepared, and Liger off (an explicit
# false, so that a training config of the user's cannot turn it on in the baseline).
STEPS, BATCH, SEQ_LEN, CACHE_DIR, LIGER = (
    "training.steps",
    "training.batch_size",
    "data.seq_len",
    "data.cache_dir",
    "model.use_liger_kernel",
)
CONTRACT_KEYS = {
    STEPS: "use steps",
    BATCH: "use the cell's batch_size",
    SEQ_LEN: "use the cell's seq_len",
    CACHE_DIR: "the driver prepares the cache",
    LIGER: "use arms",
}


def run_check(argv: list[str]) -> subprocess.CompletedProcess:
    """The trainer's check, its output as text (bytes that are not UTF-8 replaced, not a traceback)."""
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=CHECK_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


@dataclass(frozen=True)
class ContractPlug:
    module: str  # the trainer's module (python -m MODULE)
    packages: tuple[str, ...] = ()  # what the trainer imports, checked before anything is written
    # what the warm fork server imports: ``imports`` (default: the module), plus on a GPU ``gpu_preload``
    imports: tuple[str, ...] = ()
    gpu_preload: tuple[str, ...] = ()
    # what a Liger run imports from liger-kernel (MODULE:NAME), tried in an arm's own environment
    liger_imports: tuple[str, ...] = ()
    name: str = NAME

    def missing_packages(self, cfg: SweepConfig) -> list[str]:
        return [m for m in self.packages if importlib.util.find_spec(m) is None]

    def preload(self, cfg: SweepConfig) -> list[str]:
        """The trainer's module (its heavy imports); on a GPU also Liger's, so that both arms fork
        from the same process image (the baseline never patches), and TorchInductor's compiler,
        which step 1 would otherwise import in every run (1.6 s on a CPU here; it starts no
        compile workers on import). A CPU sweep neither runs Liger nor compiles."""
        return [*(self.imports or (self.module,)), *(() if cfg.runs_on_cpu else self.gpu_preload)]

    # ------------------------------------------------------------ commands

    def train_args(self, run: Run, rdir: Path, cache_dir: Path | None) -> list[str]:
        """``train CONFIG --set k=v ... [--use-liger-kernel] --output-dir DIR``: the cell's keys, then
        the arm's own keys (which a cell may not set), then a user arm's keys (user_arms)."""
        cell, arm = run.cell, run.spec
        sets: dict[str, Any] = {STEPS: cell.steps, BATCH: cell.batch_size, SEQ_LEN: cell.seq_len}
        if cache_dir is not None:
            sets[CACHE_DIR] = str(cache_dir)
        if not arm.liger:  # explicit: a training config of the user's may turn Liger on
            sets[LIGER] = False
        sets.update(cell.overrides)
        sets.update(self.arm_sets(arm))
        sets.update(arm.sets)
        flag = ["--use-liger-kernel"] if arm.liger else []  # the contract's CLI flag for the Liger arm
        return ["train", cell.train_config, *set_args(sets), *flag, "--output-dir", str(rdir)]

    def arm_sets(self, arm: Arm) -> dict[str, Any]:
        """The keys an arm sets beyond the contract's Liger switch: none (the contract's arms are
        Liger on or off; contract/facts.py refuses the others)."""
        return {}

    def train_command(self, cfg: SweepConfig, run: Run, rdir: Path, cache_dir: Path | None) -> list[str]:
        return [*module_launcher(cfg, run, rdir, self.module), *self.train_args(run, rdir, cache_dir)]

    def prepare_command(self, cfg: SweepConfig, cell: Cell, cache_dir: Path) -> list[str]:
        sets = {SEQ_LEN: cell.seq_len, **cell.overrides}
        args = ["prepare", cell.train_config, *set_args(sets), "--output-dir", str(cache_dir)]
        return [sys.executable, "-m", self.module, *args]

    def check_command(
        self, cfg: SweepConfig, cell: Cell, out_dir: Path, cache_dir: Path | None, arm: str = "baseline"
    ) -> list[str]:
        """The trainer's validate-only command for a cell: its training config with every --set the runs
        get. With an existing offline cache as ``cache_dir`` the trainer also verifies that cache."""
        run = Run("check", cell, arm, 1, 0)
        args = self.train_args(
            run, out_dir / "runs" / "check", cache_dir
        )  # train CONFIG ... --output-dir DIR
        env = run.spec.env  # an arm of its own environment: checked by the interpreter its runs start
        argv = [env.python if env is not None and env.python else sys.executable, "-m", self.module, "check"]
        argv += args[1:-2]
        return env.command(argv, os.environ) if env is not None else argv

    # ------------------------------------------------------------ checks

    def compile_key(self, cfg: SweepConfig, kind: str) -> str | None:
        return None  # the trainer runs in the driver's environment: the driver's compile cache

    def check_cells(self, cfg: SweepConfig, cells, out_dir: Path, cache_dir_for) -> None:
        """Ask the trainer to validate every cell's training config (unknown or mistyped `set:` keys, an
        unknown profile or trainer module) before anything is written; SweepError with its one line."""
        seen: set[tuple] = set()
        for cell, arm in ((c, a) for c in cells for a in cfg.arms):
            cache = cache_dir_for(out_dir, cell)  # a path only: the cache itself is verified when it is used
            planned = cache.with_name(cache.name + ".unprepared") if cache else None
            argv = self.check_command(cfg, cell, out_dir, planned, arm)
            if tuple(argv) not in seen:
                seen.add(tuple(argv))
                self._check_one(cfg, cell, argv, arm)

    def _check_one(self, cfg: SweepConfig, cell: Cell, argv: list[str], arm: str = "baseline") -> None:
        mine = f", user arm {arm}" if cfg.arm(arm).user else ""  # a sweep's own arm: its keys are named
        where = f"{cfg.path}: cells[{cell.entry}] ({cell.cell_id}{mine})"
        try:
            r = run_check(argv)
        except subprocess.TimeoutExpired:
            raise SweepError(
                f"{where}: the trainer's check did not answer in {CHECK_TIMEOUT_S:g} s"
            ) from None
        if r.returncode == 0:
            return
        lines = [ln.strip() for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit code {r.returncode}"
        if "No module named" in last and self.module.split(".")[0] in last:
            raise SweepError(f"{cfg.path}: trainer_module: {self.module!r} cannot be run here ({last})")
        raise SweepError(f"{where}: {last.removeprefix('error: ')}")

    def cache_problem(self, cfg: SweepConfig, cell: Cell, out_dir: Path, cdir: Path) -> str | None:
        """Why an existing offline cache of the sweep cannot be used (damaged, truncated, an older
        format: the trainer's check says), or None."""
        argv = self.check_command(cfg, cell, out_dir, cdir)
        try:
            r = run_check(argv)
        except subprocess.TimeoutExpired:
            return f"its check did not answer in {CHECK_TIMEOUT_S:g} s"
        if r.returncode == 0:
            return None
        lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
        return (lines[-1] if lines else exit_text(r.returncode)).removeprefix("error: ")

    # ------------------------------------------------------------ reading the run back

    def reconcile(self, rdir: Path, run: Run, rc: int, timed_out: bool, started: str) -> RunDoc:
        """The run's final run.json: the trainer's own when it recorded an end status, else the driver's."""
        note = None
        try:
            doc = read_run(rdir)
        except RecordError as e:  # a field of the wrong type: no record to keep, as a torn one
            doc, note = None, f"the trainer's run.json broke the run contract ({e}); replaced by the driver's"
        if doc is None and note is None and has_run(rdir):
            note = "the trainer's run.json was not valid JSON (a torn write); replaced by the driver's"
        doc = doc or RunDoc()
        if doc.status == "ok":
            short = outcome.short_metrics(rdir, run)
            if short:  # "ok" with steps missing is not a result: say what was found
                doc = doc.updated(
                    status="error", reason=short, driver_note="the trainer recorded ok; the driver did not"
                )
                write_run(rdir, doc)
                return doc
        if doc.status in outcome.TERMINAL:
            if timed_out:  # it finished, then hung on the way out: keep its result, say what happened
                doc = doc.updated(
                    driver_note=f"killed at the {run.cell.timeout_s:g} s timeout after recording its end status"
                )
                write_run(rdir, doc)
            return doc
        base = RunDoc.of(
            arm=run.arm, start_time=started, world_size=run.cell.gpus * run.cell.nodes, config=None
        )
        doc = base.updated(**doc.to_json()).updated(end_time=now(), exit_code=rc)
        doc = doc.updated(**outcome.failure(rdir, run, rc, timed_out, oom_exit=OOM_EXIT))
        if note is not None:
            doc = doc.updated(driver_note=note)
        write_run(rdir, doc)
        return doc
