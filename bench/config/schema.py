"""The sweep config's keys: one dataclass per section, each key with its type, default, bound and doc.

Sections: :class:`SweepKeys` (the top level), :class:`CellKeys` (one entry of ``cells:``),
:class:`UserArmKeys` (one arm of ``user_arms:``),
:class:`PrecisionKeys` (``precision:``, the sweep's or a cell's over it) and
:class:`CapacityKeys` (``capacity:``). The typed engine (bench/config/typed.py) validates a
raw mapping against one of them; what spans several keys (warmup_steps < steps, a launcher
for nodes > 1, ...) and the upper bounds with their own messages are checked in
bench/config/loader.py. The declaration order is the order of the resolved config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from bench.config.kinds import (
    Arms,
    Command,
    Endpoint,
    Folders,
    Hardware,
    Ints,
    Packages,
    Pairs,
    SectionList,
    SectionMapping,
    Sets,
    UserArms,
    Variables,
)
from bench.config.typed import key

# Unit roundoff of the dtypes a forward computes in (training parity's last-resort gradient-norm term).
UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}
COMPUTE_DTYPES = tuple(UNIT_ROUNDOFF)

ORDERS = ("interleaved", "shuffled")
PAIRINGS = ("sequential", "lockstep")
FOREIGN = ("warn", "refuse")  # what a run does when another process holds memory on the cards
MODES = ("offline", "online")
CAPACITY_AXES = ("batch_size", "seq_len")
# On a machine without GPUs, gpus_per_run > 1 means that many gloo processes on the CPU.
CPU_MAX_PROCS = 2
# Upper bounds, each checked with its own message (bench/config/loader.py).
MAX_PRIME_RUNS = 3
MAX_POLL_INTERVAL_S = 1.0
MAX_PAIRS = 100
MAX_CAPACITY = 2**20
MAX_STEPS = 1_000_000  # optimizer steps per run
MAX_RUNS = 10_000  # runs a sweep may plan (cells x arms x pairs), refused before anything is written
# Top-level keys whose null the loader fills from outside the config (trainer: the default trainer
# registered in bench/trainers; trainer_module: that trainer's module): a sweep started before the
# key existed ran with that value.
FILLED_KEYS = ("trainer", "trainer_module")
NAME_MAX = 255  # a run directory's name, in bytes (the usual file-name limit)


@dataclass(frozen=True, kw_only=True)
class PrecisionKeys:
    """Run pairs until the 95% CI of Δ samples/s has this half-width (Stein's two-stage rule)."""

    ci_halfwidth_pct: float = key(gt=0, doc="the CI's target half-width, in percentage points of Δ")
    min_pairs: int = key(5, ge=3, doc="Stein's pilot: pairs every cell runs before the rule decides")
    max_pairs: int = key(12, ge=3, doc=f"the cap on pairs per cell (at least min_pairs, at most {MAX_PAIRS})")


@dataclass(frozen=True, kw_only=True)
class CapacityKeys:
    """Find per arm the largest batch size (or sequence length) that trains without OOM."""

    axis: str = key(choices=CAPACITY_AXES, doc="the axis probed")
    start: int = key(ge=1, doc="the first value probed")
    max: int = key(ge=1, doc=f"the largest value probed (at least start, at most {MAX_CAPACITY})")
    granularity: int | None = key(
        None, ge=1, doc="probed values are multiples of it; null: 1 or 128 (seq_len)"
    )
    steps: int = key(4, ge=2, doc="optimizer steps per probe (the first is dropped as warm-up)")


@dataclass(frozen=True, kw_only=True)
class ParityKeys:
    """Training parity: each arm's divergence from the baseline, window by window, within the A/A
    floor (the aa arm's divergence); bench/results/training_parity.py says the rule."""

    margin: float = key(2.0, gt=0, doc="a window's RMS |Δ| may reach this many times the A/A floor's")
    window: int | None = key(None, ge=2, doc="steps per window; null: a tenth of the steps, at least 10")
    loss_atol: float = key(
        1e-3, ge=0, doc="|Δ loss| allowed on top of the floor (a deterministic floor is 0)"
    )
    accuracy_atol: float = key(5e-3, ge=0, doc="|Δ accuracy| allowed on top of the floor")
    grad_norm_rtol: float | None = key(
        None,
        ge=0,
        doc="|Δ grad norm| allowed on top, relative to the baseline's; null: one rounding step of "
        "compute_dtype (bfloat16 2^-8, float16 2^-11), at least 1e-3",
    )
    compute_dtype: str | None = key(
        None,
        choices=COMPUTE_DTYPES,
        doc="the dtype the forward computes in, for grad_norm_rtol; null: float32 in a hardware: cpu sweep, else bfloat16",
    )
    min_loss_drop_pct: float = key(
        30.0, ge=0, doc="no verdict unless the baseline's loss falls this much from its first step (%)"
    )
    at_steps: Ints = key([50, 100, 200], ge=1, doc="the steps report.md's parity table shows")


PrecisionMapping = Annotated[dict[str, Any], SectionMapping(PrecisionKeys)]
ParityMapping = Annotated[dict[str, Any], SectionMapping(ParityKeys)]
CapacityMapping = Annotated[dict[str, Any], SectionMapping(CapacityKeys)]


@dataclass(frozen=True, kw_only=True)
class CellKeys:
    """One entry of ``cells:``; it expands to batch_size x seq_len x gpus_per_run cells. A null
    per-cell key takes the sweep's value."""

    config: str = key(doc="the training config: a path from here, the sweep config's folder or its parent")
    batch_size: Ints = key(ge=1, doc="the batch sizes of the grid")
    seq_len: Ints = key(ge=1, doc="the sequence lengths of the grid")
    set: Sets = key({}, doc="training config overrides (dotted keys to scalars), not the driver's own keys")
    trainer: str | None = key(None, doc="the sweep's trainer, for this entry")
    label: str | None = key(None, doc="appended to the cell ids (letters, digits, '.', '_', '-')")
    steps: int | None = key(None, ge=1, doc="the sweep's steps, for this entry")
    warmup_steps: int | None = key(None, ge=0, doc="the sweep's warmup_steps, for this entry")
    timeout_s: float | None = key(None, gt=0, doc="the sweep's timeout_s, for this entry")
    gpus_per_run: Ints | None = key(None, ge=1, doc="the sweep's gpus_per_run, for this entry")
    precision: PrecisionMapping | None = key(None, doc="its keys over the sweep's precision (which it needs)")


Cells = Annotated[list, SectionList("cells", CellKeys)]


@dataclass(frozen=True, kw_only=True)
class UserArmKeys:
    """One arm of ``user_arms:`` (its name is the key): the baseline with the trainer's own keys set."""

    doc: str = key(doc="one line: what the arm changes against the baseline")
    set: Sets = key(
        {},
        doc="the cells' trainer's own dotted keys the arm sets, on top of each cell's `set:` (not the "
        "driver's own keys)",
    )
    base: str | None = key(
        None,
        doc="the built-in arm whose intent it keeps (e.g. liger: a Liger arm in another environment); "
        "null: the sweep's baseline",
    )
    python: str | None = key(
        None, doc="the interpreter its runs start (another environment); null: the sweep's"
    )
    path: Folders = key(
        [], doc="folders put first on its runs' import path (a checkout, a pip --target folder)"
    )
    env: Variables = key({}, doc="environment variables its runs get")
    differs: Packages = key(
        [],
        doc="the packages its environment changes (its runs must show them changed); empty: those "
        "imported from its path, else the trainer's",
    )


UserArmsMapping = Annotated[dict[str, Any], UserArms(UserArmKeys)]


@dataclass(frozen=True, kw_only=True)
class SweepKeys:
    """The top level of a sweep config."""

    name: str = key(doc="the sweep's name (letters, digits, '.', '_', '-')")
    hardware: Hardware = key(doc="the hardware it is meant for: GPU kinds such as [h100, h200], cpu or any")
    out: str | None = key(None, doc="the sweep directory; null: results/<name>")
    trainer: str | None = key(
        None, doc="the trainer that runs the cells: a name registered in bench/trainers; null: the first"
    )
    trainer_module: str | None = key(
        None, doc="the Python module each run launches (the run contract); null: the trainer's own"
    )
    trainer_python: str | None = key(
        None,
        doc="the interpreter of a trainer that runs in your own Python environment; null: the trainer's "
        "own lookup",
    )
    user_arms: UserArmsMapping = key(
        {},
        doc="arms of your own beside bench/arms.py's: {name: {doc, set: {dotted key: value}, base, "
        "python, path, env, differs}}",
    )
    baseline_arm: str = key(
        "baseline",
        doc="the built-in arm the baseline runs as (e.g. liger: every arm Liger on, to A/B two "
        "environments of it); baseline: the stock modules",
    )
    version_drift: str = key(
        "refuse",
        choices=("refuse", "allow"),
        doc="package versions that differ between an arm's environment and the baseline's without the "
        "arm declaring them (differs): refuse before anything runs, or allow (named in the report)",
    )
    arms: Arms = key(
        ["baseline", "liger"], doc="the A/B arms (bench/arms.py's, or user_arms'), run baseline first"
    )
    contrasts: Pairs = key(
        [], doc="arm-vs-arm comparisons beside each arm-vs-baseline one: [[arm, reference]]"
    )
    repeats: int = key(3, ge=1, doc=f"pairs per cell without a precision target (at most {MAX_PAIRS})")
    order: str = key("interleaved", choices=ORDERS, doc="the arms in config order, or shuffled per pair")
    order_seed: int = key(0, doc="the seed of the shuffled order")
    pairing: str = key(
        "sequential",
        choices=PAIRINGS,
        doc="sequential: a pair's runs one after the other; lockstep: both on the card at once, "
        "taking turns one optimizer step each (a trainer that can, one GPU, two arms)",
    )
    steps: int = key(ge=1, doc=f"optimizer steps per run (at most {MAX_STEPS})")
    warmup_steps: int = key(ge=0, doc="steps dropped before measuring (fewer than steps)")
    timeout_s: float = key(600.0, gt=0, doc="a run's wall-clock limit")
    prepare_timeout_s: float = key(600.0, gt=0, doc="an offline cache's preparation's wall-clock limit")
    poll_interval_s: float = key(
        0.05, gt=0, doc=f"the VRAM poller's period (at most {MAX_POLL_INTERVAL_S} s)"
    )
    poll_vram: bool = key(True, doc="false: no poller at all (to measure the poller's overhead)")
    foreign_processes: str = key(
        "warn",
        choices=FOREIGN,
        doc="another process on the cards: warn (the run is flagged) or refuse (the run is an error)",
    )
    loss_tolerance: float = key(0.01, ge=0, doc="the largest |Δ loss| at the last step for loss parity")
    gpus_per_run: Ints = key([1], ge=1, doc="GPUs per run (on the CPU: gloo processes)")
    nodes: int = key(1, ge=1, doc="nodes per run (docs/multinode.md)")
    rdzv_endpoint: Endpoint = key(None, doc="host:port of the c10d rendezvous; null: from the environment")
    launcher: Command | None = key(
        None,
        doc="nodes > 1: the command placed before each node's torchrun agent; null: each run a Slurm "
        "job step (srun, inside the allocation `bench submit` makes)",
    )
    precision: PrecisionMapping | None = key(None, doc="a precision target instead of repeats")
    equivalence_pct: float = key(1.0, gt=0, doc="a CI inside ±this reads 'within ±x%'")
    compile_cache: bool = key(
        True,
        doc="runs share the TorchInductor/Triton caches under cache/compile/ (and Python's bytecode where "
        "PYTHONDONTWRITEBYTECODE is set)",
    )
    fork_server: bool = key(True, doc="single-process runs fork from a server with the trainer imported")
    stop_after_last_step: bool = key(
        True, doc="a trainer in your own environment is stopped once its last measured step is logged"
    )
    trainer_python_fork: bool = key(
        False, doc="single-process runs in trainer_python fork from a warm server of it (torch imported once)"
    )
    trainer_gc_freeze: bool = key(
        False,
        doc="runs in trainer_python freeze Python's garbage collector's heap after their first step "
        "(gc.freeze(): no full collection walks it inside a measured step)",
    )
    prime_runs: int = key(
        0,
        ge=0,
        doc=f"discarded runs per cell and arm before the measured ones (at most {MAX_PRIME_RUNS}; "
        "with pairing: lockstep, discarded pairs taking turns)",
    )
    capacity: CapacityMapping | None = key(None, doc="an OOM boundary search instead of timed pairs")
    parity: ParityMapping | None = key(
        None, doc="training parity against the A/A floor (needs the aa arm; docs/method.md)"
    )
    cells: Cells = key(doc="the grid: a list of cell entries")
