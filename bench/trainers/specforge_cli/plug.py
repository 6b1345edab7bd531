"""The SpecForge CLI as a trainer plug: the trainer users run (PyPI ``specforge``), measured by
the same run loop as ours.

Each run is ``specforge train -c CONFIG key=value ...`` started by the user's interpreter
(``trainer_python``, else ``$SPECFORGE_PYTHON``, else the one behind ``specforge`` on PATH),
as ``python -m specforge.cli`` under bench/trainers/specforge_cli/wrapper.py, which reads its step lines
into metrics.jsonl. The arm is ``model.use_liger_kernel=true|false`` (always passed), and a
sweep's own arm (user_arms) its SpecForge keys; the
cell gives the batch size, sequence length and steps; the rest of the config is the user's
own, untouched, or — for one of our training configs — the inputs this plug prepares offline
with random weights (bench/trainers/specforge_cli/inputs.py). The config is validated by SpecForge
itself (``--plan``) before anything is written. Keys it owns: bench/trainers/specforge_cli/facts.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

import bench.config.yamlio as yamlio
import bench.trainers.specforge_cli.inputs as inputs
import bench.trainers.specforge_cli.reasons as reasons
from bench.arms import as_written
from bench.config import Cell, Run, SweepConfig
from bench.errors import SweepError
from bench.fileio import read_json
from bench.procs.launcher import now
from bench.record import RunDoc, read_metrics, write_run
from bench.trainers.isolation import isolated_env, which_specforge
from bench.trainers.specforge_cli.data import check_data
from bench.trainers.specforge_cli.facts import LIGER_KEY, NAME
from bench.trainers.specforge_cli.wrapper import MODULES, OUTPUT

SPECFORGE_DEFAULT_LR = 1e-4  # specforge 0.2.0: config/schema.py, training.learning_rate

CHECK_TIMEOUT_S = 120.0
PYTHON_ENV = "SPECFORGE_PYTHON"


def find_python(cfg: SweepConfig, env=os.environ) -> str:
    """The user's SpecForge interpreter: trainer_python, $SPECFORGE_PYTHON, or the interpreter
    named by the ``specforge`` script's first line on PATH; SweepError when none is named."""
    if cfg.trainer_python:
        return os.path.expanduser(cfg.trainer_python)
    if env.get(PYTHON_ENV, "").strip():
        return env[PYTHON_ENV].strip()
    script = shutil.which("specforge", path=env.get("PATH"))
    try:
        head = Path(script).read_bytes()[:512] if script else b""
    except OSError:  # an unreadable script names no interpreter: the one-line error below
        head = b""
    if head:
        first = head.split(b"\n", 1)[0].decode(errors="replace")
        words = shlex.split(first[2:]) if first.startswith("#!") else []
        if words:  # "#!/venv/bin/python" or "#!/usr/bin/env python3"
            return words[1] if Path(words[0]).name == "env" and len(words) > 1 else words[0]
    raise SweepError(
        f"{cfg.path}: trainer_python: name your SpecForge environment's python "
        f"(trainer_python: /path/to/venv/bin/python, or {PYTHON_ENV}=...); no specforge command on PATH"
    )


def refusal(text: str) -> str:
    """SpecForge's one reason out of its traceback: the last exception's message; for a pydantic
    validation error, the field and its message."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        head, _, message = lines[i].partition(": ")
        if lines[i].startswith(" ") or not message or not head.endswith(("Error", "Exception")):
            continue
        if head.endswith("ValidationError") and i + 2 < len(lines):
            return f"{lines[i + 1].strip()}: {lines[i + 2].strip().split(' [type=')[0]}"
        return message
    return lines[-1] if lines else "no output"


@dataclass
class SpecForgeCliPlug:
    name: str = NAME
    info: dict = field(default_factory=dict)  # the machine (bench.probe.hardware.detect)
    python: str | None = None
    facts: dict | None = None  # what the user's environment holds (which_specforge)
    _checked: set = field(default_factory=set)
    # what SpecForge's Liger path imports (specforge/modeling/draft/dflash_kernels.py, 0.2.0), tried in
    # an arm's own environment before anything runs
    liger_imports: tuple[str, ...] = (
        "liger_kernel.transformers:LigerRMSNorm",
        "liger_kernel.transformers:LigerSwiGLUMLP",
    )

    # ------------------------------------------------------------ the user's environment

    def interpreter(self, cfg: SweepConfig) -> str:
        if self.python is None:
            self.python = find_python(cfg)
        return self.python

    def env_facts(self, cfg: SweepConfig) -> dict:
        if self.facts is None:
            self.facts = which_specforge(self.interpreter(cfg), os.environ)
        return self.facts

    def has_gpu(self) -> bool:
        """Whether the DETECTED machine has a GPU (the sweep's info, else detected once here)."""
        if "gpu_count" not in self.info:
            from bench.probe import hardware

            try:
                self.info.update(hardware.detect())
            except ValueError:
                self.info["gpu_count"] = 0
        return bool(self.info.get("gpu_count"))

    def missing_packages(self, cfg: SweepConfig) -> list[str]:
        """The user's environment is checked by check_cells, with SpecForge itself; the driver's own
        Python prepares SpecForge's inputs from our training configs (inputs.py: torch, safetensors)."""
        prepares = any(c.prepared for c in cfg.cells if c.trainer == NAME)
        return [m for m in inputs.PACKAGES if prepares and importlib.util.find_spec(m) is None]

    def preload(self, cfg: SweepConfig) -> list[str]:
        return []  # another interpreter: runs start afresh, never forked from the driver's server

    def compile_key(self, cfg: SweepConfig, kind: str) -> str:
        """The compile cache of the user's torch and Triton (never mixed with the driver's)."""
        f = self.env_facts(cfg)
        key = f"specforge-{f.get('version')}_torch-{f.get('torch')}_triton-{f.get('triton')}_{kind}"
        return "".join(c if c.isalnum() or c in "._-" else "-" for c in key)

    # ------------------------------------------------------------ commands

    def overrides(self, cfg: SweepConfig, run: Run, rdir: Path) -> list[str]:
        """``key=value`` for one run: the cell's `set:`, a user arm's keys, then the keys the driver owns."""
        cell, arm = run.cell, run.spec
        sets: dict = {**cell.overrides, **arm.sets}
        scale = arm.lr_scale
        if scale != 1.0:  # lr_off, the negative control: the run's own learning rate, 1% higher
            sets["training.learning_rate"] = repr(self.learning_rate(cell) * scale)
        if cfg.runs_on_cpu or not self.has_gpu():  # whatever the hardware list says
            sets.setdefault("training.fsdp_sharding", "NO_SHARD")  # FSDP needs an accelerator
            sets.setdefault("training.attention_backend", "sdpa")  # flex attention has no CPU backward
        sets.update(
            {
                LIGER_KEY: arm.liger,
                "training.batch_size": cell.batch_size,
                "data.max_length": cell.seq_len,
                "training.max_steps": cell.steps,
                "training.log_interval": 1,
                "training.save_interval": 0,
                "training.eval_interval": 0,
                "tracking.report_to": "none",
                "profiling.enabled": False,
                "deployment.trainer.nproc_per_node": cell.gpus,
                "run_id": run.run_id,
                "output_dir": str(rdir / OUTPUT),
            }
        )
        if cell.prepared:
            sets["data.hidden_states_path"] = str(rdir / "features")
        return [f"{k}={as_written(v)}" for k, v in sets.items()]

    def learning_rate(self, cell: Cell) -> float:
        """The learning rate the cell's runs train with: its `set:`, else the run config's (for
        prepared inputs, the one the suite writes from our training config), else SpecForge's
        default."""
        if "training.learning_rate" in cell.overrides:
            return float(cell.overrides["training.learning_rate"])
        doc = yaml.safe_load(Path(cell.train_config).read_text()) or {}
        if cell.prepared:
            return inputs.learning_rate(doc)
        return float((doc.get("training") or {}).get("learning_rate", SPECFORGE_DEFAULT_LR))

    def samples_needed(self, cell: Cell) -> int:
        return cell.steps * cell.batch_size * (cell.accumulation_steps or 1) * cell.gpus

    def spec_command(self, cfg: SweepConfig, run: Run, rdir: Path, config: Path) -> list[str]:
        env = run.spec.env
        return [
            env.python if env is not None and env.python else self.interpreter(cfg),
            "-m",
            "specforge.cli",
            "train",
            "-c",
            str(config),
            *self.overrides(cfg, run, rdir),
        ]

    def train_command(self, cfg: SweepConfig, run: Run, rdir: Path, cache_dir: Path | None) -> list[str]:
        cell = run.cell
        wrap = [sys.executable, "-m", "bench.trainers.specforge_cli.wrapper", "--run-dir", str(rdir)]
        wrap += ["--world", str(cell.gpus), "--seq-len", str(cell.seq_len)]
        if cfg.stop_after_last_step:
            wrap += ["--stop-after", str(cell.steps)]
        if cfg.trainer_python_fork and cell.gpus == 1:  # the warm server of the run's environment
            wrap += ["--warm", self.warm_socket(cfg, run)]
        if cfg.trainer_gc_freeze:
            wrap += ["--gc-freeze"]
        if run.spec.perturb:  # aa_eps: SpecForge has no key for it; instrument.py moves the weights
            # by one ulp of what the forward computes in: bfloat16 on a GPU (SpecForge's FSDP casts
            # its float32 weights to it), the weights' own float32 on the CPU
            wrap += ["--perturb-ulp", "bfloat16" if self.has_gpu() and not cfg.runs_on_cpu else "param"]
        if cell.prepared and cache_dir is not None:
            wrap += ["--features", str(cache_dir / "features"), "--samples", str(self.samples_needed(cell))]
            config = cache_dir / "run.yaml"
        else:
            config = Path(cell.train_config).resolve()
        return [*wrap, "--", *self.spec_command(cfg, run, rdir, config)]

    def open_turns(self, pair_dir: Path) -> None:
        """The two FIFOs turns.py's Lockstep passes the turn through: ``to0`` (role 0's inbox), ``to1``."""
        for role in range(2):
            os.mkfifo(pair_dir / f"to{role}")

    def close_turns(self, pair_dir: Path) -> None:
        for role in range(2):
            (pair_dir / f"to{role}").unlink(missing_ok=True)

    def lockstep_command(self, argv: list[str], pair_dir: Path, role: int, last: int) -> list[str]:
        """The wrapper's command with ``--lockstep`` (turns.py's Lockstep in SpecForge's process)."""
        cut = argv.index("--")
        return [*argv[:cut], "--lockstep", str(pair_dir), str(role), str(last), *argv[cut:]]

    def warm_socket(self, cfg: SweepConfig, run: Run) -> str:
        """Where this driver's warm server of the run's environment listens (the first run there
        starts it): one for the sweep's interpreter, one for each other environment an arm runs
        in (user_arms' python, path, env), since what a server imported is what every run forked
        from it runs. An arm whose environment is the sweep's own (its python the sweep's, no path,
        no variables) shares the sweep's server."""
        env = run.spec.env
        interpreter = self.interpreter(cfg)
        where = [env.python or interpreter, list(env.path), dict(env.vars)] if env is not None else []
        tag = ""
        if where and where != [interpreter, [], {}]:
            tag = "-" + hashlib.sha256(json.dumps(where, sort_keys=True).encode()).hexdigest()[:12]
        return str(Path(tempfile.gettempdir()) / f"bench-specforge-warm-{os.getpid()}{tag}.sock")

    def prepare_command(self, cfg: SweepConfig, cell: Cell, cache_dir: Path) -> list[str]:
        module = ["-m", "bench.trainers.specforge_cli.inputs", cell.train_config]
        return [sys.executable, *module, "--seq-len", str(cell.seq_len), "--output-dir", str(cache_dir)]

    def cache_problem(self, cfg: SweepConfig, cell: Cell, out_dir: Path, cdir: Path) -> str | None:
        return inputs.cache_problem(cdir, cell.seq_len)

    # ------------------------------------------------------------ checks

    def check_cells(self, cfg: SweepConfig, cells, out_dir: Path, cache_dir_for) -> None:
        """The user's interpreter runs their SpecForge (not ours) with Liger where a Liger arm
        runs; then SpecForge validates every cell and arm's config with every key a run gets
        (``--plan``: nothing starts), before anything is written."""
        facts = self.env_facts(cfg)
        if not cfg.runs_on_cpu and any(cfg.arm(a).liger for a in cfg.arms) and not facts.get("liger_kernel"):
            raise SweepError(
                f"{cfg.path}: arms: the Liger arm needs liger-kernel in {self.python} "
                "(pip install --no-deps liger-kernel)"
            )
        for cell in cells:
            if not cell.prepared:
                check_data(cfg, cell, self.samples_needed(cell))
        with tempfile.TemporaryDirectory(prefix="bench-specforge-check-") as tmp:
            for cell in cells:
                config = self._check_config(cell, Path(tmp))
                for arm in cfg.arms:
                    run = Run("check", cell, arm, 1, 0)
                    argv = [*self.spec_command(cfg, run, out_dir / "runs" / "check", config), "--plan"]
                    env = cfg.arm(arm).env  # an arm's own environment: checked in it
                    self._check_one(
                        cfg, cell, env.command(argv, isolated_env(os.environ)) if env else argv, arm
                    )

    def _check_config(self, cell: Cell, tmp: Path) -> Path:
        if not cell.prepared:
            return Path(cell.train_config).resolve()
        path = tmp / f"{cell.cell_id}.yaml"
        train = yamlio.load(Path(cell.train_config).read_text())
        try:
            path.write_text(yaml.safe_dump(inputs.run_config(train, cell.seq_len, tmp / "cache")))
        except (ValueError, KeyError) as e:
            raise SweepError(f"{cell.train_config}: cannot make SpecForge's inputs from it: {e}") from None
        return path

    def _check_one(self, cfg: SweepConfig, cell: Cell, argv: list[str], arm: str = "baseline") -> None:
        if tuple(argv) in self._checked:
            return
        self._checked.add(tuple(argv))
        mine = f", user arm {arm}" if cfg.arm(arm).user else ""  # a sweep's own arm: its keys are named
        where = f"{cfg.path}: cells[{cell.entry}] ({cell.cell_id}{mine})"
        try:
            r = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=CHECK_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
                env=isolated_env(os.environ),
            )
        except subprocess.TimeoutExpired:
            raise SweepError(f"{where}: SpecForge's --plan did not answer in {CHECK_TIMEOUT_S:g} s") from None
        if r.returncode != 0:
            raise SweepError(f"{where}: SpecForge refuses the config: {refusal(r.stderr or r.stdout)}")

    # ------------------------------------------------------------ reading the run back

    def reconcile(self, rdir: Path, run: Run, rc: int, timed_out: bool, started: str) -> RunDoc:
        """run.json for a SpecForge run (SpecForge writes none): ok when it exited 0 with every
        step logged; else the shared timeout / OOM / error classification."""
        shutil.rmtree(rdir / OUTPUT, ignore_errors=True)  # the wrapper's job, unless it was killed
        shutil.rmtree(rdir / "features", ignore_errors=True)
        rows = read_metrics(rdir)
        facts = self.facts or {}
        exit_doc = read_json(rdir / "specforge.json")
        exit_doc = exit_doc if isinstance(exit_doc, dict) else {}
        warm = exit_doc.get("start") == "warm-server" and not exit_doc.get("started_here")
        census = read_json(rdir / MODULES)  # the trained model's module classes (instrument.py)
        module_types = census.get("module_types") if isinstance(census, dict) else None
        resolved = census.get("resolved") if isinstance(census, dict) else None
        if isinstance(resolved, dict):  # the arm's own keys and the Liger switch: what SpecForge made of them
            resolved = {k: v for k, v in resolved.items() if k in run.spec.sets or k == LIGER_KEY}
        startup = None
        if rows and isinstance(rows[0].elapsed_s, float) and isinstance(rows[0].step_time_s, float):
            startup = round(rows[0].elapsed_s - rows[0].step_time_s, 3)
        doc = RunDoc.of(
            status="ok",
            reason=None,
            arm=run.arm,
            start_time=started,
            end_time=now(),
            world_size=run.cell.gpus,
            exit_code=rc,
            trainer={"name": self.name, "python": self.python, "specforge": facts.get("version")},
            config={"train_config": run.cell.train_config, "set": run.cell.overrides},
            liger={"enabled": run.spec.liger, "version": facts.get("liger_kernel")},
            draft_module_types=module_types if isinstance(module_types, list) else None,
            set_resolved=resolved if isinstance(resolved, dict) else None,
            code=census.get("code")
            if isinstance(census, dict) and isinstance(census.get("code"), dict)
            else None,
            startup_s=startup,
            startup={"imports_preloaded": warm},
            exit_s=exit_doc.get("exit_after_last_step_s"),
            accuracy_by_position_last=rows[-1].extra.get("accuracy_by_position") if rows else None,
            wall_s=exit_doc.get("wall_s"),
            exit=exit_doc or None,
            provenance={
                "hostname": socket.gethostname(),
                "gpu_names": self.info.get("gpu_names") or [],
                "gpu_count": self.info.get("gpu_count"),
                "driver_version": self.info.get("driver_version"),  # the driver's reading (preflight.detect)
                "power_limits_w": self.info.get("power_limits_w"),
                "git_commit": self.info.get("git_commit"),
                **{k: facts.get(k) for k in ("torch", "transformers", "triton", "liger_kernel", "python")},
            },
        )
        doc = doc.updated(**(reasons.failure(rdir, run, rc, timed_out, exit_doc) or {}))
        write_run(rdir, doc)
        return doc
