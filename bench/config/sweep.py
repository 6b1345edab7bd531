"""Sweep configs: schema, validation, grid expansion and run order.

A sweep config (YAML, parsed with ``yaml.safe_load``) names the hardware it is meant for, the
trainer to launch, the A/B arms, and a list of cells. Each cell entry expands to
``batch_size x seq_len x gpus_per_run`` cells, and each cell to ``arms x repeats`` runs.
Bad input raises :class:`SweepError` with one line naming the file, the key and what is
expected. Nothing here touches the filesystem beyond reading the sweep config and the
training configs it points to (their top-level ``profile``/``mode`` and a few keys that
describe the cell; ``specforge`` is never imported); the environment is read only for a
multi-node sweep's rendezvous endpoint when the config names none.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import itertools
import json
import math
import os
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from bench.errors import SweepError

# An arm is a name for a set of trainer/driver options; the first arm is always the baseline.
#   aa:     the baseline again (an A/A comparison: the suite's own noise floor)
#   nopoll: the baseline with the VRAM poller off (what polling costs)
#   rmsnorm / swiglu: one Liger kernel alone (which of the two buys the gain)
#   compile / liger_compile: torch.compile of each draft layer, without / with Liger (GPU only)
#   liger_flce: Liger, and Liger's fused linear cross-entropy for the LM head + loss (GPU only)
#   sdpa: the baseline with SDPA attention instead of flex attention
#   adamw_foreach: the baseline with foreach AdamW instead of the fused kernel (what fusing buys,
#     with the sign flipped: the trainer's default is fused)
# ``set``: the training config keys the arm sets (the driver's: a cell may not override them).
# ``gpu``: the arm cannot run on the CPU (refused in a CPU sweep; Liger's arms are recorded as
# skipped there instead, so the CPU sweep shows why).
ARM_OPTIONS: dict[str, dict] = {
    "baseline": {"liger": False, "poll_vram": True, "set": {}},
    "liger": {"liger": True, "poll_vram": True, "set": {}},
    "rmsnorm": {"liger": True, "poll_vram": True, "set": {"model.liger_swiglu": False}},
    "swiglu": {"liger": True, "poll_vram": True, "set": {"model.liger_rms_norm": False}},
    "aa": {"liger": False, "poll_vram": True, "set": {}},
    "nopoll": {"liger": False, "poll_vram": False, "set": {}},
    "compile": {"liger": False, "poll_vram": True, "set": {"model.compile_layers": True}, "gpu": True},
    "liger_compile": {"liger": True, "poll_vram": True, "set": {"model.compile_layers": True}, "gpu": True},
    "liger_flce": {
        "liger": True,
        "poll_vram": True,
        "set": {"model.liger_fused_linear_ce": True},
        "gpu": True,
    },
    "sdpa": {"liger": False, "poll_vram": True, "set": {"model.attention_backend": "sdpa"}},
    "adamw_foreach": {"liger": False, "poll_vram": True, "set": {"training.fused_adamw": False}},
}
ARMS = tuple(ARM_OPTIONS)
ORDERS = ("interleaved", "shuffled")
MODES = ("offline", "online")
# On a machine without GPUs, gpus_per_run > 1 means that many gloo processes on the CPU.
CPU_MAX_PROCS = 2
# --set keys the driver sets itself from the sweep config; a cell may not override them.
DRIVER_KEYS = {
    "profile": "use another training config",
    "mode": "use another training config",
    "data.seq_len": "use the cell's seq_len",
    "data.cache_dir": "the driver prepares the cache",
    "training.steps": "use steps",
    "training.batch_size": "use the cell's batch_size",
    "model.use_liger_kernel": "use arms",
    "model.liger_rms_norm": "use arms (rmsnorm, swiglu, liger)",
    "model.liger_swiglu": "use arms (rmsnorm, swiglu, liger)",
    "model.compile_layers": "use arms (compile, liger_compile)",
    "model.liger_fused_linear_ce": "use arms (liger_flce)",
    "training.fused_adamw": "use arms (adamw_foreach)",
    "training.profile_steps": "profiled steps are not for timing; use python -m bench kernels --profile",
}
# The precision target (Stein's two-stage rule, bench/stats.py): keys, defaults and bounds.
PRECISION_KEYS = ("ci_halfwidth_pct", "min_pairs", "max_pairs")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MODULE_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_SET_KEY_RE = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*$")
_ENDPOINT_RE = re.compile(r"^[A-Za-z0-9._\-\[\]:]+:\d+$")
# Multi-node runs meet at a c10d rendezvous: the config's rdzv_endpoint, else this variable, else
# $MASTER_ADDR:$MASTER_PORT (torchrun's c10d port when MASTER_PORT is unset). docs/multinode.md
RDZV_ENV = "BENCH_RDZV_ENDPOINT"
DEFAULT_RDZV_PORT = 29400


@dataclass(frozen=True)
class Precision:
    """Run pairs until the 95% CI of Δ samples/s has this half-width (percentage points)."""

    ci_halfwidth_pct: float
    min_pairs: int  # Stein's pilot (n0)
    max_pairs: int  # cap


@dataclass(frozen=True)
class Capacity:
    """Find per arm the largest batch size (or sequence length) that trains without OOM."""

    axis: str  # batch_size | seq_len
    start: int
    max: int
    granularity: int  # probed values are multiples of this
    steps: int  # optimizer steps per probe (the first is dropped as warm-up)


@dataclass(frozen=True)
class Cell:
    """One point of the grid: a training config at one batch size, sequence length and GPU count."""

    cell_id: str
    entry: int  # index of the `cells:` entry it came from
    train_config: str  # path handed to the trainer
    profile: str
    mode: str
    batch_size: int
    seq_len: int
    gpus: int
    nodes: int
    steps: int
    warmup_steps: int
    timeout_s: float
    overrides: dict[str, Any]  # the entry's `set:`
    accumulation_steps: int | None
    num_anchors: int | None
    attention_backend: str | None
    config_sha256: str  # of the training config file
    precision: Precision | None = None  # None: a fixed number of repeats

    def cache_key(self) -> str:
        """Offline caches are shared by the cells (arms, batch sizes, repeats) with the same training
        config, seq_len and `set` overrides: everything `prepare` is given."""
        blob = json.dumps([self.config_sha256, self.seq_len, self.overrides], sort_keys=True, default=str)
        return f"{_slug(self.profile)}_s{self.seq_len}_{hashlib.sha256(blob.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class Run:
    run_id: str
    cell: Cell
    arm: str
    repeat: int  # 1-based: the pair (round) this run belongs to
    order_index: int  # 0-based position in the run order

    @property
    def liger(self) -> bool:
        return ARM_OPTIONS[self.arm]["liger"]


@dataclass(frozen=True)
class SweepConfig:
    path: Path
    name: str
    hardware: tuple[str, ...]
    out: str
    trainer_module: str
    arms: tuple[str, ...]
    contrasts: tuple[tuple[str, str], ...]  # (arm, reference): arm-vs-arm comparisons
    repeats: int
    order: str
    order_seed: int
    steps: int
    warmup_steps: int
    timeout_s: float
    prepare_timeout_s: float
    poll_interval_s: float
    poll_vram: bool
    loss_tolerance: float
    gpus_per_run: tuple[int, ...]
    nodes: int
    rdzv_endpoint: str | None  # as resolved: the config's, else from the environment
    rdzv_from: str | None  # where rdzv_endpoint came from: the key or the environment variable(s)
    # the command that starts a multi-node run once on every node (e.g. srun ...); () when nodes == 1
    launcher: tuple[str, ...]
    cells: tuple[Cell, ...]
    equivalence_pct: float
    compile_cache: bool
    fork_server: bool
    prime_runs: int  # discarded runs per (cell, arm) before the measured ones (hyperfine's --warmup)
    precision: Precision | None
    capacity: Capacity | None
    resolved: dict[str, Any]  # every key with its default filled in; stored in sweep.json

    @property
    def runs_on_cpu(self) -> bool:
        return "cpu" in self.hardware

    @property
    def max_gpus(self) -> int:
        return max(c.gpus for c in self.cells)

    def polls(self, arm: str) -> bool:
        """Whether runs of this arm are polled for VRAM."""
        return self.poll_vram and ARM_OPTIONS[arm]["poll_vram"]

    @property
    def precision_targets(self) -> dict[str, dict]:
        """Per cell with a precision target: its ci_halfwidth_pct, min_pairs, max_pairs."""
        return {c.cell_id: vars(c.precision) for c in self.cells if c.precision is not None}

    @property
    def preload(self) -> list[str]:
        """What the fork server imports: the trainer's training module (its heavy imports);
        Liger's, so that both arms fork from the same process image (the baseline never
        patches); TorchInductor's compiler, which step 1 would otherwise import in every run
        (1.6 s on a CPU here; it starts no compile workers on import). A CPU sweep skips the
        last two: it neither runs Liger nor compiles."""
        if self.trainer_module == "specforge":
            if self.runs_on_cpu:
                return ["specforge.train"]
            return ["specforge.train", "liger_kernel.transformers", "torch._inductor.compile_fx"]
        return [self.trainer_module]

    def forks(self, cell: Cell) -> bool:
        """Whether a cell's runs are forked from the warm server (single-process runs only)."""
        return self.fork_server and cell.gpus == 1 and cell.nodes == 1

    def pilot_pairs(self, cell: Cell) -> int:
        """Pairs every cell runs before any decision: the fixed repeats, or Stein's pilot."""
        return cell.precision.min_pairs if cell.precision else self.repeats


# ---------------------------------------------------------------- schema

_INT, _NUM, _STR = "int", "number", "str"

# key: (kind, default, lower bound, whether the bound is exclusive); REQUIRED marks no default.
REQUIRED = object()
MAX_PRIME_RUNS = 3
TOP_KEYS: dict[str, tuple] = {
    "name": (_STR, REQUIRED),
    "hardware": ("names", REQUIRED),
    "out": (_STR, None),
    "trainer_module": (_STR, "specforge"),
    "arms": ("arms", ["baseline", "liger"]),
    # arm-vs-arm comparisons beside each arm-vs-baseline one: [[arm, reference], ...]
    "contrasts": ("contrasts", []),
    "repeats": (_INT, 3, 1),
    "order": (_STR, "interleaved"),
    "order_seed": (_INT, 0, None),
    "steps": (_INT, REQUIRED, 1),
    "warmup_steps": (_INT, REQUIRED, 0),
    "timeout_s": (_NUM, 600.0, 0, True),
    "prepare_timeout_s": (_NUM, 600.0, 0, True),
    "poll_interval_s": (_NUM, 0.05, 0, True),
    "poll_vram": ("bool", True),  # false: no poller at all (to measure the poller's overhead)
    "loss_tolerance": (_NUM, 0.01, 0),
    "gpus_per_run": ("ints", [1], 1),
    "nodes": (_INT, 1, 1),
    "rdzv_endpoint": ("optstr", None),
    "launcher": ("argv", None),  # multi-node: the command placed before each node's torchrun agent
    "precision": ("precision", None),
    "equivalence_pct": (_NUM, 1.0, 0, True),
    "compile_cache": ("bool", True),
    "fork_server": ("bool", True),  # single-process runs fork from a server with the trainer imported
    # discarded runs per (cell, arm) before the measured ones, to fill the compile/autotune caches
    "prime_runs": (_INT, 0, 0),
    "capacity": ("capacity", None),
    "cells": ("cells", REQUIRED),
}
CELL_KEYS: dict[str, tuple] = {
    "config": (_STR, REQUIRED),
    "batch_size": ("ints", REQUIRED, 1),
    "seq_len": ("ints", REQUIRED, 1),
    "set": ("set", {}),
    "label": (_STR, None),
    "steps": (_INT, None, 1),
    "warmup_steps": (_INT, None, 0),
    "timeout_s": (_NUM, None, 0, True),
    "gpus_per_run": ("ints", None, 1),
    "precision": ("precision", None),
}
CAPACITY_AXES = ("batch_size", "seq_len")
CAPACITY_SCHEMA: dict[str, tuple] = {
    "axis": (_STR, REQUIRED),
    "start": (_INT, REQUIRED, 1),
    "max": (_INT, REQUIRED, 1),
    "granularity": (_INT, None, 1),
    "steps": (_INT, 4, 2),
}
PRECISION_SCHEMA: dict[str, tuple] = {
    "ci_halfwidth_pct": (_NUM, REQUIRED, 0, True),
    "min_pairs": (_INT, 5, 3),
    "max_pairs": (_INT, 12, 3),
}


def load_config(path: str | Path) -> SweepConfig:
    """Parse and validate a sweep config file; raises SweepError with one line on bad input."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SweepError(f"{path}: no such sweep config file") from None
    except OSError as e:
        raise SweepError(f"{path}: cannot read: {e.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: not valid YAML: {_yaml_problem(e)}") from None
    return validate(raw, path)


def validate(raw: Any, path: Path) -> SweepConfig:
    def fail(msg: str) -> SweepError:
        return SweepError(f"{path}: {msg}")

    if not isinstance(raw, dict):
        raise fail("expected a mapping of sweep settings at the top level")
    top = _check_keys(raw, TOP_KEYS, "", fail)
    if not _NAME_RE.match(top["name"]):
        raise fail(f"name: {top['name']!r} should be letters, digits, '.', '_' or '-'")
    if top["out"] is None:
        top["out"] = f"results/{top['name']}"
    if not _MODULE_RE.match(top["trainer_module"]):
        raise fail(
            f"trainer_module: expected a Python module name like 'specforge', got {top['trainer_module']!r}"
        )
    if top["order"] not in ORDERS:
        raise fail(f"order: expected one of {', '.join(ORDERS)}, got {top['order']!r}")
    if top["warmup_steps"] >= top["steps"]:
        raise fail(
            f"warmup_steps: {top['warmup_steps']} leaves no steady-state steps; expected less than steps ({top['steps']})"
        )
    if top["prime_runs"] > MAX_PRIME_RUNS:
        raise fail(
            f"prime_runs: expected 0 to {MAX_PRIME_RUNS} (discarded runs per cell and arm), got {top['prime_runs']}"
        )
    if top["poll_interval_s"] > 1.0:
        raise fail(f"poll_interval_s: expected at most 1.0 s, got {top['poll_interval_s']}")
    rdzv_endpoint, rdzv_from = _rdzv_endpoint(top, os.environ, fail)
    if top["nodes"] > 1 and top["launcher"] is None:
        raise fail(
            "launcher: required when nodes > 1: the command that starts the run once on every node, "
            "e.g. [srun, --nodes=2, --ntasks-per-node=1] (docs/multinode.md)"
        )
    if top["nodes"] == 1 and top["launcher"] is not None:
        raise fail(
            "launcher: only for nodes > 1 (single-node runs start on this machine); remove it or set nodes"
        )
    if not top["cells"]:
        raise fail("cells: expected a non-empty list of cells")
    gpu_only = [a for a in top["arms"] if ARM_OPTIONS[a].get("gpu")]
    if gpu_only and "cpu" in top["hardware"]:
        raise fail(
            f"arms: {gpu_only[0]} needs a GPU (TorchInductor's Triton kernels); this sweep's hardware is cpu"
        )
    if top["precision"] is not None and "repeats" in raw:
        raise fail(
            "repeats: not used with precision (pairs run from precision.min_pairs up to max_pairs); remove one"
        )
    _check_contrasts(top["contrasts"], top["arms"], fail)
    top_precision = _precision(top["precision"], {}, "precision", fail)
    capacity = _capacity(top["capacity"], fail)

    cells: list[Cell] = []
    resolved_cells = []
    for i, entry in enumerate(top["cells"]):
        where = f"cells[{i}]"
        if not isinstance(entry, dict):
            raise fail(f"{where}: expected a mapping with config, batch_size, seq_len")
        c = _check_keys(entry, CELL_KEYS, f"{where}.", fail)
        cfg_path = _find_train_config(c["config"], path, fail, where)
        train = _read_train_config(cfg_path, fail, where)
        for key in c["set"]:
            if key in DRIVER_KEYS:
                raise fail(f"{where}.set.{key}: set by the driver; {DRIVER_KEYS[key]}")
        steps = c["steps"] if c["steps"] is not None else top["steps"]
        warmup = c["warmup_steps"] if c["warmup_steps"] is not None else top["warmup_steps"]
        if warmup >= steps:
            raise fail(
                f"{where}.warmup_steps: {warmup} leaves no steady-state steps; expected less than steps ({steps})"
            )
        if c["label"] is not None and not _NAME_RE.match(c["label"]):
            raise fail(f"{where}.label: {c['label']!r} should be letters, digits, '.', '_' or '-'")
        gpus_list = c["gpus_per_run"] if c["gpus_per_run"] is not None else top["gpus_per_run"]
        if c["precision"] is not None and top["precision"] is None:
            raise fail(f"{where}.precision: needs a top-level precision (ci_halfwidth_pct, ...) to override")
        cell_precision = _precision(top["precision"], c["precision"] or {}, f"{where}.precision", fail)
        sha = hashlib.sha256(cfg_path.read_bytes()).hexdigest()
        # per-cell keys stay as written (null = the top-level value), so a diff names the key changed
        resolved_cells.append({**c, "config_sha256": sha})
        entry_cell = Cell(
            cell_id="",
            entry=i,
            train_config=str(cfg_path),
            profile=train["profile"],
            mode=train["mode"],
            batch_size=0,
            seq_len=0,
            gpus=0,
            nodes=top["nodes"],
            steps=steps,
            warmup_steps=warmup,
            timeout_s=float(c["timeout_s"] if c["timeout_s"] is not None else top["timeout_s"]),
            overrides=c["set"],
            accumulation_steps=_pick(c["set"], train, "training.accumulation_steps"),
            num_anchors=_pick(c["set"], train, "training.num_anchors"),
            attention_backend=_pick(c["set"], train, "model.attention_backend"),
            config_sha256=sha,
            precision=cell_precision,
        )
        if "sdpa" in top["arms"] and entry_cell.attention_backend == "sdpa":
            raise fail(
                f"arms: sdpa on {where}, whose attention is sdpa already: the arm would be the baseline"
            )
        for gpus, batch, seq in itertools.product(gpus_list, c["batch_size"], c["seq_len"]):
            cell = replace(entry_cell, batch_size=batch, seq_len=seq, gpus=gpus)
            cells.append(replace(cell, cell_id=_cell_id(cell, c["label"])))

    seen: dict[str, int] = {}
    for cell in cells:
        if cell.cell_id in seen:
            raise fail(
                f"cells[{cell.entry}]: expands to cell {cell.cell_id!r} like cells[{seen[cell.cell_id]}]; "
                "give one of them a distinct label"
            )
        seen[cell.cell_id] = cell.entry

    resolved = {**top, "cells": resolved_cells}
    return SweepConfig(
        path=path,
        name=top["name"],
        hardware=tuple(top["hardware"]),
        out=top["out"],
        trainer_module=top["trainer_module"],
        arms=tuple(top["arms"]),
        contrasts=tuple((a, r) for a, r in top["contrasts"]),
        repeats=top["repeats"],
        order=top["order"],
        order_seed=top["order_seed"],
        steps=top["steps"],
        warmup_steps=top["warmup_steps"],
        timeout_s=float(top["timeout_s"]),
        prepare_timeout_s=float(top["prepare_timeout_s"]),
        poll_interval_s=float(top["poll_interval_s"]),
        poll_vram=top["poll_vram"],
        loss_tolerance=float(top["loss_tolerance"]),
        gpus_per_run=tuple(top["gpus_per_run"]),
        nodes=top["nodes"],
        rdzv_endpoint=rdzv_endpoint,
        rdzv_from=rdzv_from,
        launcher=tuple(top["launcher"] or ()),
        cells=tuple(cells),
        equivalence_pct=float(top["equivalence_pct"]),
        compile_cache=top["compile_cache"],
        fork_server=top["fork_server"],
        prime_runs=top["prime_runs"],
        precision=top_precision,
        capacity=capacity,
        resolved=resolved,
    )


def _check_contrasts(contrasts: list[list[str]], arms: list[str], fail) -> None:
    """Each [arm, reference] names two different arms of the sweep, neither the baseline's
    comparison again, each pair once."""
    seen = set()
    for i, (arm, ref) in enumerate(contrasts):
        where = f"contrasts[{i}]"
        for a in (arm, ref):
            if a not in arms:
                raise fail(f"{where}: {a!r} is not one of this sweep's arms ({', '.join(arms)})")
        if arm == ref:
            raise fail(f"{where}: compares {arm!r} with itself; name two different arms")
        if "baseline" in (arm, ref):
            raise fail(
                f"{where}: every arm is already compared with the baseline (summary.csv); name two others"
            )
        if frozenset((arm, ref)) in seen:
            raise fail(f"{where}: {arm} and {ref} are compared twice")
        seen.add(frozenset((arm, ref)))


def round_runs(cfg: SweepConfig, cell: Cell, repeat: int) -> list[tuple[str, str]]:
    """(run_id, arm) of one pair (round) of a cell, in the order they run.

    ``interleaved``: the arms in config order (baseline first); ``shuffled``: an order drawn
    from ``random.Random("<order_seed>/<cell_id>/<repeat>")``, so every round's order is
    recorded by the seed and the same on --resume, however many rounds the precision rule adds.
    """
    arms = list(cfg.arms)
    if cfg.order == "shuffled":
        random.Random(f"{cfg.order_seed}/{cell.cell_id}/{repeat}").shuffle(arms)
    return [(f"{cell.cell_id}_{arm}_r{repeat}", arm) for arm in arms]


def plan_rounds(cfg: SweepConfig, rounds: dict[str, int]) -> list[Run]:
    """The run order for ``rounds[cell_id]`` pairs per cell: round-major (round 1 of every cell,
    then round 2, ...), so arms and cells are interleaved and drift cannot look like a speed-up."""
    runs: list[Run] = []
    for repeat in range(1, max(rounds.values(), default=0) + 1):
        for cell in cfg.cells:
            if repeat <= rounds.get(cell.cell_id, 0):
                for run_id, arm in round_runs(cfg, cell, repeat):
                    runs.append(Run(run_id, cell, arm, repeat, len(runs)))
    return runs


def plan(cfg: SweepConfig) -> list[Run]:
    """The runs every sweep of this config makes: ``repeats`` pairs per cell, or Stein's pilot
    (``precision.min_pairs``) when a precision target adds pairs after it (bench/driver.py)."""
    return plan_rounds(cfg, {c.cell_id: cfg.pilot_pairs(c) for c in cfg.cells})


def diff_resolved(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two resolved configs (``out`` and ``contrasts``,
    which change no run, are ignored: a resumed sweep takes the new ones). A key the old config
    lacks because it was added to the schema later counts as its default, so a sweep started by
    an older version resumes unless the key was changed."""
    keys: list[str] = []
    schema = (
        TOP_KEYS
        if not prefix
        else CELL_KEYS
        if prefix.startswith("cells[") and prefix.count(".") == 1
        else {}
    )
    for key in sorted(set(old) | set(new), key=str):
        if not prefix and key in ("out", "contrasts"):
            continue
        a, b = old.get(key, "<missing>"), new.get(key, "<missing>")
        if key not in old and key in schema and schema[key][1] is not REQUIRED:
            a = copy.deepcopy(schema[key][1])
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            keys += diff_resolved(a, b, f"{name}.")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and key == "cells":
            for i, (x, y) in enumerate(zip(a, b)):
                keys += diff_resolved(x, y, f"{name}[{i}].") if isinstance(x, dict) else []
        elif _jsonish(a) != _jsonish(b):
            keys.append(name)
    return keys


def format_set_value(value: Any) -> str:
    """A `--set key=value` value as YAML would read it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"}[repr(value)]
        text = repr(value)  # YAML 1.1 reads 1e-05 as a string: write 1.0e-05
        mantissa, e, exponent = text.partition("e")
        return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    return str(value)


# ---------------------------------------------------------------- helpers


def _cell_id(cell: Cell, label: str | None) -> str:
    """`<profile>_<mode>_bs<batch>_s<seq_len>`, plus `_g<gpus>`, `_n<nodes>` and `_<label>` when set."""
    cell_id = f"{_slug(cell.profile)}_{cell.mode}_bs{cell.batch_size}_s{cell.seq_len}"
    if cell.gpus > 1:
        cell_id += f"_g{cell.gpus}"
    if cell.nodes > 1:
        cell_id += f"_n{cell.nodes}"
    return f"{cell_id}_{label}" if label else cell_id


def _pick(overrides: dict, train: dict, dotted: str) -> Any:
    """A training setting as the run will see it: the cell's override, else the training config's value."""
    if dotted in overrides:
        return overrides[dotted]
    node: Any = train
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _check_keys(raw: dict, schema: dict, where: str, fail) -> dict:
    out: dict[str, Any] = {}
    for key in raw:
        if key not in schema:
            close = difflib.get_close_matches(str(key), list(schema), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; expected one of: {', '.join(schema)}"
            raise fail(f"{where}{key}: unknown key{hint}")
    for key, (kind, default, *bound) in schema.items():
        name = f"{where}{key}"
        if key not in raw or (raw[key] is None and default is not REQUIRED and kind != "optstr"):
            if default is REQUIRED:
                raise fail(f"{name}: missing; expected {_EXPECT.get(kind, kind)}")
            out[key] = copy.deepcopy(default)
            continue
        out[key] = _check_value(raw[key], kind, bound, name, fail)
    return out


_EXPECT = {
    _INT: "an integer",
    _NUM: "a number",
    _STR: "a string",
    "bool": "true or false",
    "optstr": "a string or null",
    "argv": "a list of strings, the command's words (e.g. [srun, --nodes=2, --ntasks-per-node=1]; quote numbers)",
    "names": "a hardware name or a list of them (e.g. [h100, h200], cpu, any)",
    "arms": f"a list of arms from {', '.join(ARMS)}",
    "contrasts": "a list of [arm, reference] pairs of the sweep's arms (e.g. [[liger_flce, liger]])",
    "ints": "a positive integer or a list of them",
    "set": "a mapping of training config keys to scalar values (e.g. {training.num_anchors: 512})",
    "cells": "a list of cells (config, batch_size, seq_len)",
    "precision": "a mapping with ci_halfwidth_pct, min_pairs, max_pairs",
    "capacity": "a mapping with axis (batch_size or seq_len), start, max, granularity, steps",
}


def _check_value(value: Any, kind: str, bound: list, name: str, fail) -> Any:
    def bad(extra: str = "") -> SweepError:
        return fail(f"{name}: expected {_EXPECT[kind]}{extra}, got {value!r}")

    if kind == _INT:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return _check_bound(value, bound, name, fail)
    if kind == _NUM:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise bad(" (finite)")
        return _check_bound(value, bound, name, fail)
    if kind == _STR:
        if not isinstance(value, str) or not value.strip():
            raise bad()
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad()
        return value
    if kind == "optstr":
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise bad()
        return value
    if kind == "argv":
        words = value if isinstance(value, list) else []
        if not words or not all(isinstance(a, str) and a.strip() for a in words):
            raise bad()
        return list(words)
    if kind == "names":
        names = [value] if isinstance(value, str) else value
        if (
            not isinstance(names, list)
            or not names
            or not all(isinstance(n, str) and n.strip() for n in names)
        ):
            raise bad()
        return [n.strip().lower() for n in names]
    if kind == "arms":
        if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
            raise bad()
        arms = list(value)
        if arms[:2] == ["baseline", "baseline"]:  # A/A: the second baseline is the arm "aa"
            arms[1] = "aa"
        unknown = [a for a in arms if a not in ARM_OPTIONS]
        if unknown:
            raise fail(f"{name}: unknown arm {unknown[0]!r}; expected arms from {', '.join(ARMS)}")
        if len(set(arms)) != len(arms):
            raise fail(f"{name}: each arm once, got {value!r}")
        if "baseline" not in arms:
            raise fail(f"{name}: the baseline arm is missing; expected e.g. [baseline, liger]")
        return ["baseline", *(a for a in arms if a != "baseline")]  # baseline first
    if kind == "contrasts":  # checked against the arms by the caller
        if not isinstance(value, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(a, str) for a in p) for p in value
        ):
            raise bad()
        return [list(p) for p in value]
    if kind in ("precision", "capacity"):  # mappings, checked against their schemas by the caller
        if not isinstance(value, dict):
            raise bad()
        return dict(value)
    if kind == "ints":
        items = value if isinstance(value, list) else [value]
        if not items or any(isinstance(v, bool) or not isinstance(v, int) for v in items):
            raise bad()
        if len(set(items)) != len(items):
            raise fail(f"{name}: each value once, got {value!r}")
        for v in items:
            _check_bound(v, bound, name, fail)
        return items
    if kind == "set":
        if not isinstance(value, dict):
            raise bad()
        for k, v in value.items():
            if not isinstance(k, str) or not _SET_KEY_RE.match(k):
                raise fail(f"{name}: key {k!r} should be a dotted config key like training.num_anchors")
            if isinstance(v, dict | list):
                raise fail(f"{name}.{k}: expected a scalar (string, number, bool or null), got {v!r}")
        return dict(value)
    if kind == "cells":
        if not isinstance(value, list):
            raise bad()
        return value
    raise AssertionError(kind)


def _rdzv_endpoint(top: dict, env: Mapping[str, str], fail) -> tuple[str | None, str | None]:
    """(host:port, where it came from) of the c10d rendezvous: the config's rdzv_endpoint, else
    $BENCH_RDZV_ENDPOINT, else $MASTER_ADDR:$MASTER_PORT (port 29400 when unset); (None, None)
    for a single-node sweep that names none. Not stored in the resolved config, so a sweep
    resumes in a new allocation whose first node differs."""
    if top["rdzv_endpoint"] is not None:
        source, value = "rdzv_endpoint", top["rdzv_endpoint"]
    elif top["nodes"] == 1:
        return None, None
    elif env.get(RDZV_ENV, "").strip():
        source, value = RDZV_ENV, env[RDZV_ENV].strip()
    elif env.get("MASTER_ADDR", "").strip():
        port = env.get("MASTER_PORT", "").strip() or str(DEFAULT_RDZV_PORT)
        source, value = "MASTER_ADDR/MASTER_PORT", f"{env['MASTER_ADDR'].strip()}:{port}"
    else:
        raise fail(
            f"rdzv_endpoint: required when nodes > 1: host:port of the c10d rendezvous on the first node, "
            f"here or in ${RDZV_ENV} or $MASTER_ADDR (+ $MASTER_PORT)"
        )
    if not _ENDPOINT_RE.match(value):
        raise fail(f"{source}: expected host:port, got {value!r}")
    return value, source


def _precision(top: dict | None, override: dict, where: str, fail) -> Precision | None:
    """The precision target of the sweep (override = {}) or of one cell (its keys over the sweep's)."""
    if top is None:
        return None
    merged = _check_keys({**top, **override}, PRECISION_SCHEMA, f"{where}.", fail)
    if merged["max_pairs"] < merged["min_pairs"]:
        raise fail(
            f"{where}.max_pairs: {merged['max_pairs']} is below min_pairs ({merged['min_pairs']}); expected >= it"
        )
    if merged["max_pairs"] > 100:
        raise fail(f"{where}.max_pairs: expected at most 100, got {merged['max_pairs']}")
    return Precision(float(merged["ci_halfwidth_pct"]), merged["min_pairs"], merged["max_pairs"])


def _capacity(raw: dict | None, fail) -> Capacity | None:
    if raw is None:
        return None
    c = _check_keys(raw, CAPACITY_SCHEMA, "capacity.", fail)
    if c["axis"] not in CAPACITY_AXES:
        raise fail(f"capacity.axis: expected one of {', '.join(CAPACITY_AXES)}, got {c['axis']!r}")
    if c["max"] < c["start"]:
        raise fail(f"capacity.max: {c['max']} is below start ({c['start']}); expected >= it")
    gran = c["granularity"] or (1 if c["axis"] == "batch_size" else 128)
    if c["start"] % gran or c["max"] % gran:
        raise fail(f"capacity.start and capacity.max: expected multiples of granularity ({gran})")
    if c["max"] > 2**20:
        raise fail(f"capacity.max: expected at most {2**20}, got {c['max']}")
    return Capacity(c["axis"], c["start"], c["max"], gran, c["steps"])


def _check_bound(value, bound: list, name: str, fail):
    if bound and bound[0] is not None:
        low, exclusive = bound[0], len(bound) > 1 and bound[1]
        if value < low or (exclusive and value == low):
            raise fail(f"{name}: expected a value {'>' if exclusive else '>='} {low}, got {value!r}")
    return value


def _find_train_config(given: str, sweep_path: Path, fail, where: str) -> Path:
    """Relative paths: the current directory first, then the sweep config's folder and its parent."""
    p = Path(given)
    bases = [Path()] if p.is_absolute() else [Path(), sweep_path.parent, sweep_path.parent.parent]
    for base in bases:
        cand = base / p
        if cand.is_file():
            return cand if base == Path() else cand.resolve()
    raise fail(f"{where}.config: no such training config file {given!r}")


def _read_train_config(cfg_path: Path, fail, where: str) -> dict:
    try:
        train = yaml.safe_load(cfg_path.read_text())
    except (OSError, yaml.YAMLError) as e:
        problem = _yaml_problem(e) if isinstance(e, yaml.YAMLError) else e.strerror
        raise fail(f"{where}.config: cannot read training config {str(cfg_path)!r}: {problem}") from None
    if not isinstance(train, dict):
        raise fail(f"{where}.config: {str(cfg_path)!r} is not a mapping of training settings")
    if not isinstance(train.get("profile"), str) or not train["profile"].strip():
        raise fail(f"{where}.config: {str(cfg_path)!r} has no top-level 'profile' string")
    if train.get("mode") not in MODES:
        raise fail(f"{where}.config: {str(cfg_path)!r} needs a top-level 'mode' of offline or online")
    return train


def _yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{problem} (line {mark.line + 1})" if mark is not None else problem


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def _jsonish(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)
