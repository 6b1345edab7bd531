"""A run directory's records, typed: ``cell.json`` (CellDoc: what the driver planned, written
before launch), ``run.json`` (RunDoc: the trainer's record, which the driver completes when the
trainer could not) and ``metrics.jsonl`` (one MetricRow per optimizer step). The one module of
bench/ that names these files: every writer and reader of them goes through the functions here
(schemas: docs/run-contract.md).

``from_json(obj, path)`` checks the type of every field the object holds and raises one
RecordError naming the file and the field (``runs/x/cell.json: field 'repeat' is a string,
expected an integer``); a field the object lacks reads as None. Keys a class does not type (a
trainer's own) are kept in ``extra``, and ``to_json()`` gives back the object read: its keys, in
their order, nulls included. Standard library only: nothing here imports pandas or torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from bench.errors import SweepError
from bench.fileio import atomic_write_json, read_json, read_jsonl, writing

CELL_JSON = "cell.json"
RUN_JSON = "run.json"
METRICS_JSONL = "metrics.jsonl"
# A lockstep run's turns (pairing: lockstep): one line per optimizer step with its own turn's
# wall-clock ``started`` and ``ended`` (bench/trainers/specforge_cli/turns.py writes it, in the
# user's interpreter; the wrapper and the results name it through here).
LOCKSTEP_JSONL = "lockstep.jsonl"

R = TypeVar("R", bound="_Record")


class RecordError(SweepError, ValueError):
    """A run record holding a field of the wrong type; the message is one line naming the file
    and the field. A SweepError (``error: <line>``, exit 2) and a ValueError (bad input to the report)."""


def _what(value: Any) -> str:
    """How JSON calls a value's type (an integer is "a number", as JSON has no other)."""
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string")):
        if isinstance(value, kind):
            return name
    return "an array" if isinstance(value, list) else "an object" if isinstance(value, dict) else "not JSON"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# A field's annotation -> (the check of a non-null value, what it expects). Every field may be null
# or absent (a record written before the field existed): None.
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str | None": (lambda v: isinstance(v, str), "a string"),
    "int | None": (_is_int, "an integer"),
    "float | None": (_is_number, "a number"),
    "dict[str, Any] | None": (lambda v: isinstance(v, dict), "an object"),
    "list[Any] | None": (lambda v: isinstance(v, list), "an array"),
    "list[str] | None": (
        lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "an array of strings",
    ),
}


@dataclass(kw_only=True)
class _Record:
    """The typed fields (the subclass's), the keys it does not type (``extra``), and the keys of the
    object it was read from, in order (so that to_json writes back what it read, nulls included)."""

    FILE: ClassVar[str]
    extra: dict[str, Any] = field(default_factory=dict)
    _keys: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_json(cls: type[R], obj: Any, path: str | Path) -> R:
        """The record of a parsed JSON object; RecordError (naming ``path`` and the field) when a
        field has the wrong type or ``obj`` is no object."""
        if not isinstance(obj, dict):
            raise RecordError(f"{path} is {_what(obj)}, not an object")
        kinds = _kinds(cls)
        for key, (check, expected) in kinds.items():
            value = obj.get(key)
            if value is not None and not check(value):
                raise RecordError(f"{path}: field {key!r} is {_what(value)}, expected {expected}")
        extra = {k: v for k, v in obj.items() if k not in kinds}
        return cls(**{k: obj[k] for k in kinds if k in obj}, extra=extra, _keys=tuple(obj))

    @classmethod
    def of(cls: type[R], /, **values: Any) -> R:
        """A new record holding exactly these keys (None ones written as null), checked as read."""
        return cls.from_json(values, f"a new {cls.FILE}")

    def updated(self: R, /, **values: Any) -> R:
        """A copy with these keys set (new ones after the others, as dict.update), checked as read."""
        return type(self).from_json({**self.to_json(), **values}, self.FILE)

    def to_json(self) -> dict[str, Any]:
        """The JSON object: the keys read (or given to ``of``) in their order, then any typed field
        set since, then the other extra keys."""
        typed = {k: getattr(self, k) for k in _kinds(type(self))}
        out = {
            k: typed[k] if k in typed else self.extra[k] for k in self._keys if k in typed or k in self.extra
        }
        out |= {k: v for k, v in typed.items() if v is not None and k not in out}
        return out | {k: v for k, v in self.extra.items() if k not in out}

    def has(self, key: str) -> bool:
        """Whether the record holds ``key`` (null counts: a key written as null is held)."""
        return key in self.to_json()


@cache
def _kinds(cls: type) -> dict[str, tuple[Callable[[Any], bool], str]]:
    return {f.name: _KINDS[str(f.type)] for f in fields(cls) if f.name not in ("extra", "_keys")}


@dataclass(kw_only=True)
class CellDoc(_Record):
    """cell.json: the run's identity, its cell and the command the driver launched (bench/run/execute.py)."""

    FILE: ClassVar[str] = CELL_JSON
    run_id: str | None = None
    cell_id: str | None = None
    sweep: str | None = None
    profile: str | None = None
    mode: str | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    accumulation_steps: int | None = None
    num_anchors: int | None = None
    gpus: int | None = None
    nodes: int | None = None
    arm: str | None = None
    trainer: str | None = None  # the plug that ran it (absent before there were plugs: ours)
    repeat: int | None = None
    order_index: int | None = None
    steps: int | None = None
    warmup_steps: int | None = None
    loss_tolerance: float | None = None
    attention_backend: str | None = None
    train_config: str | None = None
    config_sha256: str | None = None
    set: dict[str, Any] | None = None  # the cells entry's `set:` overrides
    arm_set: dict[str, Any] | None = None  # a sweep's own arm's keys (user_arms; absent for a built-in arm)
    # the trainer keys a plug set for a built-in arm's intent beyond the Liger switch (compile,
    # attention, optimizer, ...): checked against what the run resolved, as a user arm's keys are
    arm_keys: dict[str, Any] | None = None
    # a declared arm's environment (python, path, env, differs: bench.arms.ArmEnv.declared) and the
    # built-in arm whose intent it keeps (absent: the baseline's, or the arm's own for a built-in arm)
    arm_env: dict[str, Any] | None = None
    arm_base: str | None = None
    cache_dir: str | None = None
    timeout_s: float | None = None
    command: list[str] | None = None
    compile_cache: dict[str, Any] | None = None  # {dir, warm[, bytecode: {dir, warm}]}
    pairing: dict[str, Any] | None = None  # pairing: lockstep: {mode, pair_dir, role}
    slurm: dict[str, Any] | None = None  # where Slurm placed it (bench/slurm/alloc.py)


@dataclass(kw_only=True)
class RunDoc(_Record):
    """run.json: the trainer's record of the run (ours: specforge/runfiles.py; the plugs' for
    trainers that write none), its status fixed by the driver when the trainer could not."""

    FILE: ClassVar[str] = RUN_JSON
    status: str | None = None  # running | ok | oom | error | timeout | skipped | lost
    reason: str | None = None
    arm: str | None = None
    start_time: str | None = None
    end_time: str | None = None
    world_size: int | None = None
    config: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None
    liger: dict[str, Any] | None = None
    objective: str | None = None
    precision: str | None = None
    optimizer: str | None = None
    model_flops_per_step: float | None = None
    peak_tflops: float | None = None
    param_checksum: str | None = None
    draft_module_types: list[str] | None = None
    # each key a user arm set (and the Liger switch) -> what the trainer made of it: {"config": its
    # validated config's value, "model": {"Class.attribute": value}} (read from inside its process)
    set_resolved: dict[str, Any] | None = None
    startup_s: float | None = None
    startup: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None
    # the code the run imported, read from inside it: {packages: {name: {file, version[, commit,
    # dirty]}}, python: {executable, version}, vars: {declared variable: value}} (codefacts.py; ours:
    # provenance's "code")
    code: dict[str, Any] | None = None
    # the driver's, when it set the status (bench/trainers/contract/plug.py, bench/run/execute.py)
    exit_code: int | None = None
    driver_note: str | None = None
    lost_cause: str | None = None
    run_status: str | None = None
    run_reason: str | None = None
    # a plug's own record of a trainer that writes none (bench/trainers/specforge_cli/plug.py)
    trainer: dict[str, Any] | None = None
    exit: dict[str, Any] | None = None
    exit_s: float | None = None
    wall_s: float | None = None
    accuracy_by_position_last: list[Any] | None = None


@dataclass(kw_only=True)
class MetricRow(_Record):
    """One optimizer step of metrics.jsonl: the fields the results read (METRIC_FIELDS); the rest
    (alloc_ooms, profiled, a plug's own) in ``extra``."""

    FILE: ClassVar[str] = METRICS_JSONL
    step: int | None = None
    loss: float | None = None
    accuracy: float | None = None
    step_time_s: float | None = None
    samples: float | None = None
    tokens: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    torch_peak_allocated_gib: float | None = None
    torch_peak_reserved_gib: float | None = None
    mfu: float | None = None
    elapsed_s: float | None = None
    time: float | None = None
    alloc_retries: float | None = None


METRIC_FIELDS = list(_kinds(MetricRow))  # metrics.jsonl's fields as the results read them
_kinds(CellDoc), _kinds(RunDoc)  # an annotation _KINDS does not know fails here, at import


# ---------------------------------------------------------------- the files of a run directory


def has_cell(rdir: Path) -> bool:
    return (Path(rdir) / CELL_JSON).exists()


def has_run(rdir: Path) -> bool:
    return (Path(rdir) / RUN_JSON).exists()


def _read(cls: type[R], path: Path, tolerant: bool) -> R | None:
    obj = read_json(path)
    if not isinstance(obj, dict):
        return None
    try:
        return cls.from_json(obj, path)
    except RecordError:
        if tolerant:
            return None
        raise


def read_cell(rdir: Path, tolerant: bool = False) -> CellDoc | None:
    """The run's cell.json; None when it is missing, not JSON or not an object (cell_unread says
    which). A field of the wrong type raises RecordError; ``tolerant``: reads as None."""
    return _read(CellDoc, Path(rdir) / CELL_JSON, tolerant)


def read_run(rdir: Path, tolerant: bool = False) -> RunDoc | None:
    """The run's run.json; None when it is missing, not JSON (a torn write) or not an object. A
    field of the wrong type raises RecordError; ``tolerant``: reads as None."""
    return _read(RunDoc, Path(rdir) / RUN_JSON, tolerant)


def cell_unread(rdir: Path) -> str:
    """Why read_cell found no cell.json: missing, not JSON, or JSON of another type than an object."""
    path = Path(rdir) / CELL_JSON
    obj = read_json(path)
    if obj is None:
        return (
            f"{CELL_JSON} is not a JSON object (empty, torn or not JSON)"
            if path.exists()
            else f"{CELL_JSON} missing"
        )
    return f"{CELL_JSON} is {_what(obj)}, not an object"


def write_cell(rdir: Path, doc: CellDoc) -> None:
    atomic_write_json(Path(rdir) / CELL_JSON, doc.to_json())


def write_run(rdir: Path, doc: RunDoc) -> None:
    atomic_write_json(Path(rdir) / RUN_JSON, doc.to_json())


def numbered_metrics(rdir: Path) -> list[tuple[int, dict]]:
    """(line number, object) of every complete JSON object of metrics.jsonl, unchecked (a torn
    line is skipped): the report's step checks name a bad value and its line (results/step_checks.py)."""
    out = []
    try:
        with open(Path(rdir) / METRICS_JSONL, errors="replace") as f:
            for n, line in enumerate(f, 1):
                try:
                    obj = json.loads(line) if line.strip() else None
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    out.append((n, obj))
    except OSError:
        return []
    return out


def read_metrics_counted(rdir: Path) -> tuple[list[MetricRow], int]:
    """(every row of metrics.jsonl, how many non-empty lines are no row: torn, not an object, or
    holding a field of the wrong type)."""
    path = Path(rdir) / METRICS_JSONL
    rows: list[MetricRow] = []
    try:
        with open(path, errors="replace") as f:
            lines = [line for line in f if line.strip()]
    except OSError:
        return [], 0
    for line in lines:
        try:
            rows.append(MetricRow.from_json(json.loads(line), path))
        except ValueError:  # not JSON (a torn line), or a RecordError
            continue
    return rows, len(lines) - len(rows)


def read_metrics(rdir: Path) -> list[MetricRow]:
    """Every row of metrics.jsonl; a torn or damaged line is skipped (read_metrics_counted counts them)."""
    return read_metrics_counted(rdir)[0]


class MetricsWriter:
    """metrics.jsonl of a run directory open for appending: ``write`` appends one line per row and
    flushes, so a killed run leaves every finished step."""

    def __init__(self, rdir: Path) -> None:
        self.path = Path(rdir) / METRICS_JSONL
        with writing(self.path):
            self._file = open(self.path, "a")

    def write(self, rows: Iterable[MetricRow]) -> None:
        with writing(self.path):
            for row in rows:
                self._file.write(json.dumps(row.to_json()) + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_turns(rdir: Path) -> dict[int, dict]:
    """A lockstep run's turns by step (LOCKSTEP_JSONL), {} for a run that took none; a line cut
    short or without a step number is skipped."""
    return {r["step"]: r for r in read_jsonl(Path(rdir) / LOCKSTEP_JSONL) if _is_int(r.get("step"))}
