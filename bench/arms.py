"""The A/B arms, as trainer-neutral intent: one frozen :class:`Arm` per name. Adding an arm is
one entry here.

An arm says what it changes against the baseline, in words every trainer can be asked about:
which Liger kernels it swaps in, whether it compiles the draft's layers, which attention it
uses, which optimizer implementation, whether it is polled for VRAM. It names no trainer's
config key: each trainer plug (bench/trainers/<name>/) translates the intent into its own keys,
or refuses the arm in one line naming what it cannot express. What the rest of the suite needs
to know about an arm (whether it runs Liger, which module kinds the kernel attribution can
predict for it, whether it needs a GPU) is derived from its entry.

A sweep may also declare arms of its own (its ``user_arms``, or ``bench ab --arm``): a
:class:`Arm` with ``sets``, the trainer's own dotted keys set as written on top of the cell's,
and no other intent. Every plug passes them through; each trainer's cell reader refuses the keys
its driver owns (bench/config/cellfacts.py). :func:`user_arm` makes one, :func:`arm_named`
finds an arm by name among the built-in ones and a sweep's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

# The Liger kernels an arm can swap in, in the order reports list them: the draft's RMSNorm,
# its SwiGLU MLP, and the fused linear cross-entropy of the LM head + loss ("loss").
KERNELS = ("rmsnorm", "swiglu", "loss")
LIGER_DEFAULT = frozenset({"rmsnorm", "swiglu"})  # what "Liger on" means: the seeds' two kernels
# The module class a kernel puts in the draft (both trainers build the draft from Liger's own
# modules): how a run's record of its module classes shows which kernels it really ran. The fused
# linear cross-entropy ("loss") is a function, not a module: no record shows it.
KERNEL_MODULES = {"rmsnorm": "LigerRMSNorm", "swiglu": "LigerSwiGLUMLP"}


@dataclass(frozen=True)
class ArmEnv:
    """Where an arm's runs run when it is not the sweep's environment: another interpreter
    (``python``), folders put first on the import path (``path``: a checkout of the trainer, or a
    ``pip install --target`` folder of another liger-kernel), environment variables (``vars``);
    ``differs``: the packages the arm means to change (the versions its runs must show changed),
    empty for one the driver works out (bench/run/armenv.py)."""

    python: str | None = None
    path: tuple[str, ...] = ()
    vars: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    differs: tuple[str, ...] = ()

    def declared(self) -> dict[str, Any]:
        """The declared difference as cell.json records it (and the workload digest covers)."""
        out: dict[str, Any] = {}
        if self.python:
            out["python"] = self.python
        if self.path:
            out["path"] = list(self.path)
        if self.vars:
            out["env"] = dict(self.vars)
        if self.differs:
            out["differs"] = list(self.differs)
        return out

    def command(self, argv: list[str], environ: Mapping[str, str]) -> list[str]:
        """``argv`` started under the arm's variables and with its folders first on PYTHONPATH
        (through ``env``, so that each run of a lockstep pair's one process tree gets its own)."""
        if not self.path and not self.vars:
            return argv
        sets = [f"{k}={v}" for k, v in self.vars.items()]
        if self.vars:  # which variables the run records from inside (codefacts.collect)
            sets.append(f"BENCH_ARM_VARS={','.join(self.vars)}")
        if self.path:
            rest = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            sets.append("PYTHONPATH=" + os.pathsep.join([*self.path, *rest]))
        return ["env", *sets, *argv]


@dataclass(frozen=True)
class Arm:
    name: str
    doc: str
    kernels: frozenset[str] = frozenset()  # the Liger kernels it swaps in (KERNELS)
    compile: bool = False  # torch.compile of each draft layer
    attention: str | None = None  # an attention backend instead of the cell's (None: the cell's)
    optimizer: str | None = None  # an AdamW implementation instead of the default: foreach | plain
    gpu_only: bool = False  # refused in a CPU sweep (Liger arms are recorded as skipped instead)
    polls_vram: bool = True
    perturb: bool = False  # the baseline's weights moved by one unit in the last place (a floor arm)
    lr_scale: float = 1.0  # the learning rate times this (a negative control: training parity must catch it)
    # a user arm's keys: the trainer's own dotted keys, set as written on every run of the arm
    sets: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    # a user arm's environment: another interpreter, import path or variables (None: the sweep's)
    env: ArmEnv | None = None
    base: str | None = None  # the built-in arm whose intent a declared arm keeps (None: the baseline)

    def __post_init__(self) -> None:
        unknown = set(self.kernels) - set(KERNELS)
        if unknown:
            raise ValueError(f"arm {self.name}: unknown kernels {sorted(unknown)} (known: {KERNELS})")

    def in_effect(self, module_types: list[str]) -> str:
        """Whether a run's model held the Liger modules this arm asks for and none it does not
        ("yes", or "no: " and what differs), from the module classes the run recorded."""
        held = set(module_types)
        missing = [KERNEL_MODULES[k] for k in KERNELS if k in KERNEL_MODULES and k in self.kernels]
        extra = [KERNEL_MODULES[k] for k in KERNELS if k in KERNEL_MODULES and k not in self.kernels]
        missing, extra = [c for c in missing if c not in held], [c for c in extra if c in held]
        if not missing and not extra:
            return "yes"
        said = ([f"no {', '.join(missing)} in the model"] if missing else []) + (
            [f"{', '.join(extra)} in the model, not asked for"] if extra else []
        )
        return "no: " + "; ".join(said)

    def keys_in_effect(self, resolved: Mapping[str, Any]) -> str:
        """Whether the trainer made of each key this arm sets what the arm asked ("yes", or "no: "
        and what differs), from what the run recorded it resolved (RunDoc.set_resolved: its
        validated config's value, and the modules holding an attribute of that name): a key its
        config does not hold, or a config or module value other than the one asked, is not in
        effect."""
        said = []
        for key, asked in self.sets.items():
            got = resolved.get(key) if isinstance(resolved.get(key), Mapping) else {}
            if "config" not in got:
                said.append(f"{key} is not in the trainer's resolved config")
                continue
            differ = [f"{key} resolved to {got['config']!r}"] if not same_value(got["config"], asked) else []
            differ += [
                f"{where} is {held!r}"
                for where, held in (got.get("model") or {}).items()
                if not same_value(held, asked)
            ]
            said += differ
        return "no: " + "; ".join(said) if said else "yes"

    @property
    def user(self) -> bool:
        """Whether a sweep declared it (user_arms): the trainer's own keys or its own environment
        on top of a built-in intent (its ``base``)."""
        return bool(self.sets) or self.env is not None or self.base is not None

    @property
    def liger(self) -> bool:
        """Whether the arm runs Liger at all."""
        return bool(self.kernels)

    @property
    def liger_switch_only(self) -> bool:
        """Whether one Liger switch expresses the arm: Liger off, or on with its default two
        kernels, and nothing else changed (a trainer with only such a switch can run it)."""
        return not self.changes and self.kernels in (frozenset(), LIGER_DEFAULT)

    @property
    def changes(self) -> tuple[str, ...]:
        """What it changes besides the kernels: compile, attention, optimizer (in that order)."""
        return tuple(
            what
            for what, on in (
                ("compile", self.compile),
                ("attention", self.attention),
                ("optimizer", self.optimizer),
                ("learning rate", self.lr_scale != 1.0),
            )
            if on
        )

    @property
    def swapped_kinds(self) -> tuple[str, ...]:
        """Module kinds the arm replaces by Liger's and nothing else; () for an arm that is not
        Liger or changes more than the Liger kernels (its Δ is not the swapped modules' alone)."""
        if not self.liger or self.changes:
            return ()
        return tuple(k for k in KERNELS if k in self.kernels)


def _arms(*arms: Arm) -> Mapping[str, Arm]:
    return MappingProxyType({a.name: a for a in arms})


ARMS: Mapping[str, Arm] = _arms(
    Arm("baseline", "the stock modules"),
    Arm("liger", "Liger's RMSNorm and SwiGLU", kernels=LIGER_DEFAULT),
    Arm("rmsnorm", "Liger's RMSNorm alone", kernels=frozenset({"rmsnorm"})),
    Arm("swiglu", "Liger's SwiGLU alone", kernels=frozenset({"swiglu"})),
    Arm("aa", "the baseline again: an A/A comparison, the suite's own noise floor"),
    Arm("nopoll", "the baseline with the VRAM poller off (what polling costs)", polls_vram=False),
    Arm(
        "aa_eps",
        "the baseline with every weight moved by one unit in the last place: how far training carries "
        "one rounding step (training parity's sensitivity floor)",
        perturb=True,
    ),
    Arm(
        "lr_off",
        "the baseline with a learning rate 1% higher: a negative control that training parity must "
        "catch (the rule's power on this cell; never a gain)",
        lr_scale=1.01,
    ),
    Arm("compile", "torch.compile of each draft layer", compile=True, gpu_only=True),
    Arm(
        "liger_compile",
        "Liger and torch.compile of each draft layer",
        kernels=LIGER_DEFAULT,
        compile=True,
        gpu_only=True,
    ),
    Arm(
        "liger_flce",
        "Liger, and Liger's fused linear cross-entropy for the LM head + loss",
        kernels=LIGER_DEFAULT | {"loss"},
        gpu_only=True,
    ),
    Arm("sdpa", "the baseline with SDPA attention instead of flex attention", attention="sdpa"),
    Arm(
        "adamw_foreach",
        "the baseline with foreach AdamW instead of the fused kernel (what fusing buys, sign flipped)",
        optimizer="foreach",
    ),
    Arm(
        "adamw_plain",
        "the baseline with AdamW's plain per-parameter loop instead of foreach (what the multi-tensor "
        "kernel buys, sign flipped; runs on the CPU too)",
        optimizer="plain",
    ),
)
ARM_NAMES = tuple(ARMS)
BASELINE = "baseline"
AA = "aa"
AA_EPS = "aa_eps"
FLOOR_ARMS = (AA, AA_EPS)  # training parity's floors: the baseline again, and nudged by one ulp
# Arms that change the training on purpose: training parity must call them not equivalent (its power)
NEGATIVE_CONTROLS = tuple(name for name, arm in ARMS.items() if arm.lr_scale != 1.0)
NOT_UNDER_TEST = (*FLOOR_ARMS, *NEGATIVE_CONTROLS)  # the yardsticks: no parity gate, never a gain
# Arms whose Δ the kernel attribution can predict from the swapped modules' timings.
LIGER_ARMS = tuple(name for name, arm in ARMS.items() if arm.swapped_kinds)

# The packages whose versions decide the work, as an arm's ``differs`` names them and each run records
# them from inside (its ``code``: version, the file it imported, a checkout's commit and dirty state).
VERSIONED = ("specforge", "liger-kernel", "torch", "triton", "transformers")
# Built-in arms a declared arm (or the sweep's baseline_arm) may keep the intent of: not the yardsticks
# (the A/A floors, the negative controls) nor the poller's own cost.
BASES = tuple(
    name for name, a in ARMS.items() if not a.perturb and a.lr_scale == 1.0 and a.polls_vram and name != AA
)

# A user arm's name ends each of its run directories' names (<cell_id>_<arm>_r<repeat>), where it is
# read back as the last word: letters and digits only.
USER_ARM_NAME = r"^[A-Za-z][A-Za-z0-9]*$"


def as_written(value: Any) -> str:
    """A key's value as a command line writes it: ``true``/``false`` for a bool, else its text."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def same_value(held: Any, asked: Any) -> bool:
    """Whether a value a trainer resolved is the one an arm asked for, whichever was typed how: a
    YAML ``true`` and a command line's ``true``, ``1e-4`` and ``0.0001``, ``sdpa`` and ``sdpa``."""
    if isinstance(held, list):  # several config objects that disagree: not one value
        return False
    a, b = as_written(held), as_written(asked)
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def user_arm(
    name: str, doc: str, sets: Mapping[str, Any], env: ArmEnv | None = None, base: str | None = None
) -> Arm:
    """A sweep's own arm: the built-in arm ``base`` (default the baseline) with the trainer's dotted
    keys ``sets`` set as written, run in ``env`` (None: the sweep's environment)."""
    intent = ARMS[base] if base else ARMS[BASELINE]
    return replace(
        intent, name=name, doc=doc, sets=MappingProxyType(dict(sets)), env=env, base=base, polls_vram=True
    )


def arm_named(name: str, user: Mapping[str, Arm] | None = None) -> Arm:
    """The arm called ``name``: a sweep's own (``user``) or a built-in one (KeyError: neither)."""
    if user and name in user:
        return user[name]
    return ARMS[name]
