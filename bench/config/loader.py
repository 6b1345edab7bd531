"""Sweep configs: load and validate one, expand its cells, into a SweepConfig.

A sweep config (YAML, parsed by bench/config/yamlio.py: YAML 1.2 floats, no duplicate keys) names the hardware it is meant for, the
trainer to launch, the A/B arms, and a list of cells. Each cell entry expands to
``batch_size x seq_len x gpus_per_run`` cells, and each cell to ``arms x repeats`` runs
(bench/config/plan.py orders them). The keys are declared in bench/config/schema.py and
checked by the typed engine (bench/config/typed.py); what spans several keys is checked here.
Bad input raises :class:`SweepError` with one line naming the file, the key and what is
expected. Nothing here touches the filesystem beyond reading the sweep config and the
training configs it points to (their top-level ``profile``/``mode`` and a few keys that
describe the cell, as each cell's trainer reads them: bench/config/cellfacts.py; no trainer is imported); the environment is read only for a
multi-node sweep's rendezvous endpoint when the config names none.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

import bench.config.typed as typed
import bench.config.yamlio as yamlio
from bench.arms import AA, ARMS, Arm, arm_named
from bench.config.capabilities import check_lockstep, check_trainer_keys
from bench.config.cellfacts import CellReader, Readers
from bench.config.model import Capacity, Cell, Precision, SweepConfig, cell_id_for, prime_run_id, run_id
from bench.config.schema import (
    MAX_CAPACITY,
    MAX_PAIRS,
    MAX_POLL_INTERVAL_S,
    MAX_PRIME_RUNS,
    MAX_RUNS,
    MAX_STEPS,
    NAME_MAX,
    CapacityKeys,
    CellKeys,
    ParityKeys,
    PrecisionKeys,
    SweepKeys,
)
from bench.config.typed import Fail
from bench.config.userarms import user_arms
from bench.errors import SweepError

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MODULE_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_ENDPOINT_RE = re.compile(r"^[A-Za-z0-9._\-\[\]:]+:\d+$")
# Multi-node runs meet at a c10d rendezvous: the config's rdzv_endpoint, else this variable, else
# $MASTER_ADDR:$MASTER_PORT (torchrun's c10d port when MASTER_PORT is unset). docs/multinode.md
RDZV_ENV = "BENCH_RDZV_ENDPOINT"
DEFAULT_RDZV_PORT = 29400
# A multi-node sweep without a launcher runs each run as a Slurm job step (srun --nodes=N and
# these; bench/slurm ends a step with scancel, and the step's name is its run's id):
# one wrapper per node, the other nodes' tasks ended when one exits non-zero, output labelled.
SLURM_STEP = ("--ntasks-per-node=1", "--kill-on-bad-exit=1", "--label")


def load_config(path: str | Path, readers: Readers) -> SweepConfig:
    """Parse and validate a sweep config file; raises SweepError with one line on bad input.
    ``readers``: the registered trainers' cell readers, the default trainer first
    (bench.trainers.load_config hands them in)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SweepError(f"{path}: no such sweep config file") from None
    except OSError as e:
        raise SweepError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise SweepError(f"{path}: not a text file; expected a YAML sweep config") from None
    try:
        raw = yamlio.load(text)
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: not valid YAML: {_yaml_problem(e)}") from None
    return validate(raw, path, readers)


def validate(raw: Any, path: Path, readers: Readers) -> SweepConfig:
    def fail(msg: str) -> SweepError:
        return SweepError(f"{path}: {msg}")

    if not isinstance(raw, dict):
        raise fail("expected a mapping of sweep settings at the top level")
    top = _check_top(typed.build(SweepKeys, raw, "", fail), readers, fail)
    user = user_arms(top, fail)
    rdzv = _rdzv_endpoint(top, os.environ, fail)
    _check_runs(top, raw, user, fail)
    _check_contrasts(top.contrasts, top.arms, fail)
    precision = _precision(top.precision, {}, "precision", fail)
    capacity = _capacity(top.capacity, fail)
    _check_parity(top, fail)
    cells: list[Cell] = []
    resolved_cells: list[dict[str, Any]] = []
    for i, entry in enumerate(top.cells):
        resolved_cell, entry_cells = _expand_entry(top, user, i, entry, path, readers, fail)
        resolved_cells.append(resolved_cell)
        cells += entry_cells
    _check_unique(cells, fail)
    _check_sizes(top, cells, fail)
    check_lockstep(top, cells, readers, fail)
    check_trainer_keys(top, cells, readers, fail)
    resolved = {**typed.as_dict(top), "cells": resolved_cells}
    if not user:  # a sweep without arms of its own resolves (and its sweep.json reads) as before the key
        del resolved["user_arms"]
    for k, default in (("baseline_arm", "baseline"), ("version_drift", "refuse")):  # the same for these
        if resolved[k] == default:
            del resolved[k]
    return _sweep_config(path, top, rdzv, tuple(cells), precision, capacity, resolved, user)


def _check_trainer(name: str, where: str, readers: Readers, fail: Fail) -> None:
    if name not in readers:
        raise fail(f"{where}trainer: expected one of {', '.join(readers)}, got {name!r}")


def _check_name(value: str, key: str, fail: Fail) -> None:
    """A sweep's name or a cell's label (each part of directories' names): letters, digits, '.',
    '_' or '-', nothing else (a newline at its end included)."""
    why = typed.name_problem(value)
    if why:
        raise fail(f"{key}: {value!r} {why}; expected letters, digits, '.', '_' or '-'")
    if not _NAME_RE.fullmatch(value):
        raise fail(f"{key}: {value!r} should be letters, digits, '.', '_' or '-'")


def _check_top(top: SweepKeys, readers: Readers, fail: Fail) -> SweepKeys:
    """The top-level checks of single keys and of steps, in the order they are reported; ``out``
    and ``trainer`` (the first registered) filled in."""
    _check_name(top.name, "name", fail)
    if top.out is None:
        top = replace(top, out=f"results/{top.name}")
    if top.trainer is None:
        top = replace(top, trainer=next(iter(readers)))
    _check_trainer(top.trainer, "", readers, fail)
    if top.trainer_module is None:
        top = replace(top, trainer_module=readers[top.trainer].module)
    if top.trainer_module is not None and not _MODULE_RE.fullmatch(top.trainer_module):
        raise fail(
            f"trainer_module: expected a Python module name like 'my_trainer', got {top.trainer_module!r}"
        )
    typed.check_choice(top, "order", "", fail)
    typed.check_choice(top, "pairing", "", fail)
    typed.check_choice(top, "foreign_processes", "", fail)
    if top.repeats > MAX_PAIRS:
        raise fail(f"repeats: expected at most {MAX_PAIRS} pairs per cell, got {top.repeats}")
    if top.steps > MAX_STEPS:
        raise fail(f"steps: expected at most {MAX_STEPS} optimizer steps per run, got {top.steps}")
    if top.warmup_steps >= top.steps:
        raise fail(
            f"warmup_steps: {top.warmup_steps} leaves no steady-state steps; expected less than steps ({top.steps})"
        )
    if top.prime_runs > MAX_PRIME_RUNS:
        raise fail(
            f"prime_runs: expected 0 to {MAX_PRIME_RUNS} (discarded runs per cell and arm), got {top.prime_runs}"
        )
    if top.poll_interval_s > MAX_POLL_INTERVAL_S:
        raise fail(f"poll_interval_s: expected at most {MAX_POLL_INTERVAL_S} s, got {top.poll_interval_s}")
    return top


def _check_runs(top: SweepKeys, raw: dict, user: dict[str, Arm], fail: Fail) -> None:
    """Multi-node launcher, cells, arms against the hardware, precision against repeats."""
    if top.nodes == 1 and top.launcher is not None:
        raise fail(
            "launcher: only for nodes > 1 (single-node runs start on this machine); remove it or set nodes"
        )
    if not top.cells:
        raise fail("cells: expected a non-empty list of cells")
    gpu_only = [a for a in top.arms if arm_named(a, user).gpu_only]
    if gpu_only and "cpu" in top.hardware:
        arm = gpu_only[0]
        raise fail(
            f"arms: {arm} needs a GPU ({ARMS[arm].doc}: Triton kernels); this sweep's hardware is cpu: "
            "remove it from arms, or run it in a GPU sweep config (configs/h200.yaml)"
        )
    if top.precision is not None and "repeats" in raw:
        raise fail(
            "repeats: not used with precision (pairs run from precision.min_pairs up to max_pairs); remove one"
        )


def _check_contrasts(contrasts: list[list[str]], arms: list[str], fail: Fail) -> None:
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


def _rdzv_endpoint(top: SweepKeys, env: Mapping[str, str], fail: Fail) -> tuple[str | None, str | None]:
    """(host:port, where it came from) of the c10d rendezvous: the config's rdzv_endpoint, else
    $BENCH_RDZV_ENDPOINT, else $MASTER_ADDR:$MASTER_PORT (port 29400 when unset); (None, None)
    for a single-node sweep that names none. Not stored in the resolved config, so a sweep
    resumes in a new allocation whose first node differs."""
    if top.rdzv_endpoint is not None:
        source, value = "rdzv_endpoint", top.rdzv_endpoint
    elif top.nodes == 1:
        return None, None
    elif env.get(RDZV_ENV, "").strip():
        source, value = RDZV_ENV, env[RDZV_ENV].strip()
    elif env.get("MASTER_ADDR", "").strip():
        port = env.get("MASTER_PORT", "").strip() or str(DEFAULT_RDZV_PORT)
        source, value = "MASTER_ADDR/MASTER_PORT", f"{env['MASTER_ADDR'].strip()}:{port}"
    elif top.launcher is None:
        return None, None  # Slurm job steps: the allocation's first node, once it runs (bench/slurm)
    else:
        raise fail(
            f"rdzv_endpoint: required when nodes > 1: host:port of the c10d rendezvous on the first node, "
            f"here or in ${RDZV_ENV} or $MASTER_ADDR (+ $MASTER_PORT)"
        )
    if not _ENDPOINT_RE.fullmatch(value):
        raise fail(f"{source}: expected host:port, got {value!r}")
    return value, source


def _precision(top: dict | None, override: dict, where: str, fail: Fail) -> Precision | None:
    """The precision target of the sweep (override = {}) or of one cell (its keys over the sweep's)."""
    if top is None:
        return None
    p = typed.build(PrecisionKeys, {**top, **override}, f"{where}.", fail)
    if p.max_pairs < p.min_pairs:
        raise fail(f"{where}.max_pairs: {p.max_pairs} is below min_pairs ({p.min_pairs}); expected >= it")
    if p.max_pairs > MAX_PAIRS:
        raise fail(f"{where}.max_pairs: expected at most {MAX_PAIRS}, got {p.max_pairs}")
    return Precision(float(p.ci_halfwidth_pct), p.min_pairs, p.max_pairs)


def _check_parity(top: SweepKeys, fail: Fail) -> None:
    """A parity section needs the A/A arm (its floor) and steps that reach the table's steps."""
    if top.parity is None:
        return
    p = typed.build(ParityKeys, top.parity, "parity.", fail)
    if p.compute_dtype is not None:
        typed.check_choice(p, "compute_dtype", "parity.", fail)
    if AA not in top.arms:
        raise fail(f"parity: needs the {AA} arm (the baseline again: the A/A floor); add it to arms")
    if max(p.at_steps) > top.steps:
        raise fail(f"parity.at_steps: {max(p.at_steps)} is beyond steps ({top.steps})")


def _capacity(raw: dict | None, fail: Fail) -> Capacity | None:
    if raw is None:
        return None
    c = typed.build(CapacityKeys, raw, "capacity.", fail)
    typed.check_choice(c, "axis", "capacity.", fail)
    if c.max < c.start:
        raise fail(f"capacity.max: {c.max} is below start ({c.start}); expected >= it")
    gran = c.granularity or (1 if c.axis == "batch_size" else 128)
    if c.start % gran or c.max % gran:
        raise fail(f"capacity.start and capacity.max: expected multiples of granularity ({gran})")
    if c.max > MAX_CAPACITY:
        raise fail(f"capacity.max: expected at most {MAX_CAPACITY}, got {c.max}")
    return Capacity(c.axis, c.start, c.max, gran, c.steps)


def _expand_entry(
    top: SweepKeys, user: dict[str, Arm], i: int, entry: Any, path: Path, readers: Readers, fail: Fail
) -> tuple[dict, list[Cell]]:
    """One `cells:` entry: (its resolved keys, the cells it expands to)."""
    where = f"cells[{i}]"
    if not isinstance(entry, dict):
        raise fail(f"{where}: expected a mapping with {', '.join(typed.required(CellKeys))}")
    c = typed.build(CellKeys, entry, f"{where}.", fail)
    if c.trainer is not None:
        _check_trainer(c.trainer, f"{where}.", readers, fail)
    trainer = c.trainer or top.trainer
    cfg_path = _find_train_config(c.config, path, fail, where)
    train = _read_train_config(cfg_path, fail, where)
    facts = _cell_facts(top, user, readers[trainer], train, cfg_path, c.set, where, fail)
    steps = c.steps if c.steps is not None else top.steps
    warmup = c.warmup_steps if c.warmup_steps is not None else top.warmup_steps
    if warmup >= steps:
        raise fail(
            f"{where}.warmup_steps: {warmup} leaves no steady-state steps; expected less than steps ({steps})"
        )
    if c.label is not None:
        _check_name(c.label, f"{where}.label", fail)
    gpus_list = c.gpus_per_run if c.gpus_per_run is not None else top.gpus_per_run
    if c.precision is not None and top.precision is None:
        raise fail(f"{where}.precision: needs a top-level precision (ci_halfwidth_pct, ...) to override")
    cell_precision = _precision(top.precision, c.precision or {}, f"{where}.precision", fail)
    sha = hashlib.sha256(cfg_path.read_bytes()).hexdigest()
    entry_cell = Cell(
        cell_id="",
        entry=i,
        train_config=str(cfg_path),
        profile=facts["profile"],
        mode=facts["mode"],
        batch_size=0,
        seq_len=0,
        gpus=0,
        nodes=top.nodes,
        steps=steps,
        warmup_steps=warmup,
        timeout_s=float(c.timeout_s if c.timeout_s is not None else top.timeout_s),
        overrides=c.set,
        accumulation_steps=facts["accumulation_steps"],
        num_anchors=facts["num_anchors"],
        attention_backend=facts["attention_backend"],
        config_sha256=sha,
        precision=cell_precision,
        trainer=trainer,
        trainer_tag="" if trainer == next(iter(readers)) else trainer,
        inputs=facts["inputs"],
        user_arms=MappingProxyType(dict(user)),
    )
    for arm in (arm_named(a, user) for a in top.arms):
        if arm.attention is not None and arm.attention == entry_cell.attention_backend:
            raise fail(
                f"arms: {arm.name} on {where}, whose attention is {arm.attention} already: "
                "the arm would be the baseline"
            )
    cells = []
    for gpus, batch, seq in itertools.product(gpus_list, c.batch_size, c.seq_len):
        cell = replace(entry_cell, batch_size=batch, seq_len=seq, gpus=gpus)
        cells.append(replace(cell, cell_id=cell_id_for(cell, c.label)))
    # per-cell keys stay as written (null = the top-level value), so a diff names the key changed
    return {**typed.as_dict(c), "config_sha256": sha}, cells


def _check_unique(cells: list[Cell], fail: Fail) -> None:
    seen: dict[str, int] = {}
    for cell in cells:
        if cell.cell_id in seen:
            raise fail(
                f"cells[{cell.entry}]: expands to cell {cell.cell_id!r} like cells[{seen[cell.cell_id]}]; "
                "give one of them a distinct label"
            )
        seen[cell.cell_id] = cell.entry


def _check_sizes(top: SweepKeys, cells: list[Cell], fail: Fail) -> None:
    """Refuse, before anything is written, a plan too large to run or to name: more than MAX_RUNS
    runs, or a run directory's name longer than the file system allows."""
    pairs = max(c.precision.max_pairs if c.precision else top.repeats for c in cells)
    runs = len(cells) * len(top.arms) * pairs
    if runs > MAX_RUNS:
        raise fail(
            f"cells: {len(cells)} cells x {len(top.arms)} arms x {pairs} pairs = {runs} runs; at most {MAX_RUNS}"
        )
    for c in cells:
        if c.steps > MAX_STEPS:
            raise fail(f"cells[{c.entry}].steps: expected at most {MAX_STEPS}, got {c.steps}")
        names = [
            f(c.cell_id, arm, n)
            for arm in top.arms
            for f, n in ((run_id, pairs), (prime_run_id, top.prime_runs))
        ]
        longest = max(len(name.encode()) for name in names)  # runs/ and prime/ directories
        if longest > NAME_MAX:
            raise fail(
                f"cells[{c.entry}]: its run directories' names would be {longest} bytes, over the "
                f"file system's {NAME_MAX}; shorten the label or the profile name"
            )


def _launcher(top: SweepKeys) -> tuple[str, ...]:
    """The command that starts a multi-node run once on every node: the config's ``launcher``,
    else (nodes > 1) each run a Slurm job step over the allocation's nodes (SLURM_STEP)."""
    if top.launcher:
        return tuple(top.launcher)
    return ("srun", f"--nodes={top.nodes}", *SLURM_STEP) if top.nodes > 1 else ()


def _sweep_config(
    path: Path,
    top: SweepKeys,
    rdzv: tuple[str | None, str | None],
    cells: tuple[Cell, ...],
    precision: Precision | None,
    capacity: Capacity | None,
    resolved: dict[str, Any],
    user: dict[str, Arm],
) -> SweepConfig:
    return SweepConfig(
        keys=top,
        path=path,
        out=top.out,
        rdzv_endpoint=rdzv[0],
        rdzv_from=rdzv[1],
        launcher=_launcher(top),
        launcher_from=None if top.nodes == 1 else "launcher" if top.launcher else "slurm",
        cells=cells,
        precision=precision,
        capacity=capacity,
        resolved=resolved,
        user_arms=MappingProxyType(dict(user)),
    )


def _cell_facts(
    top: SweepKeys,
    user: dict[str, Arm],
    reader: CellReader,
    train: Any,
    cfg_path: Path,
    sets: dict,
    where: str,
    fail: Fail,
) -> dict[str, Any]:
    """What the cell's trainer reads in its training config (profile, mode, who prepares the
    inputs, the shape keys as the runs will see them), the `set:` keys the driver owns for that
    trainer refused, the sweep's arms it cannot express refused, and the keys of the sweep's own
    arms that the driver owns for that trainer refused."""
    facts = reader.read_cell(train, cfg_path, sets, top.nodes, where)
    if isinstance(facts, str):
        raise fail(facts)
    for key in sets:
        why = reader.refuse_set(key, facts)
        if why:
            raise fail(f"{where}.set.{key}: {why}")
    refused = reader.refuse_arms([arm_named(a, user) for a in top.arms], where)
    if refused:
        raise fail(refused)
    for name in (a for a in top.arms if a in user):
        for key in user[name].sets:
            why = reader.refuse_arm_key(key, facts)
            if why:
                raise fail(f"user_arms.{name}.set.{key}: {why} ({where})")
    return facts


def _find_train_config(given: str, sweep_path: Path, fail: Fail, where: str) -> Path:
    """Relative paths: the current directory first, then the sweep config's folder and its parent."""
    p = Path(given)
    bases = [Path()] if p.is_absolute() else [Path(), sweep_path.parent, sweep_path.parent.parent]
    for base in bases:
        cand = base / p
        if cand.is_file():
            return cand if base == Path() else cand.resolve()
    raise fail(f"{where}.config: no such training config file {given!r}")


def _read_train_config(cfg_path: Path, fail: Fail, where: str) -> dict:
    """The training config as a mapping (what a trainer reads in it: its CellReader)."""
    try:
        train = yamlio.load(cfg_path.read_text())
    except UnicodeDecodeError:
        raise fail(
            f"{where}.config: {str(cfg_path)!r} is not a text file; expected a YAML training config"
        ) from None
    except (OSError, yaml.YAMLError) as e:
        problem = _yaml_problem(e) if isinstance(e, yaml.YAMLError) else e.strerror
        raise fail(f"{where}.config: cannot read training config {str(cfg_path)!r}: {problem}") from None
    if not isinstance(train, dict):
        raise fail(f"{where}.config: {str(cfg_path)!r} is not a mapping of training settings")
    return train


def _yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{problem} (line {mark.line + 1})" if mark is not None else problem
