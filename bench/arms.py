"""The A/B arms, as data: one frozen :class:`Arm` per name. Adding an arm is one entry here.

An arm is a name for a set of trainer options; the first arm of a sweep is always the
baseline. What every other part of the suite needs to know about an arm is derived from its
entry: whether it runs Liger, which Liger kernels it swaps (the kernel attribution predicts
only arms that swap modules and change nothing else), the training keys a cell may not
override, whether it needs a GPU, whether its runs are polled for VRAM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# Keys through which an arm chooses Liger kernels, and the module kind each one swaps.
LIGER_KERNEL_KEYS: Mapping[str, tuple[str, bool]] = MappingProxyType(
    {  # key: (kind it swaps, the trainer's default with use_liger_kernel on)
        "model.liger_rms_norm": ("rmsnorm", True),
        "model.liger_swiglu": ("swiglu", True),
        "model.liger_fused_linear_ce": ("loss", False),
    }
)


@dataclass(frozen=True)
class Arm:
    name: str
    doc: str
    liger: bool = False  # the trainer's use_liger_kernel
    sets: Mapping[str, Any] = field(default_factory=dict)  # training keys the arm sets
    gpu_only: bool = False  # refused in a CPU sweep (Liger arms are recorded as skipped instead)
    polls_vram: bool = True
    # keys of ``sets`` a cell may still set for every arm (sdpa: a CPU cell trains with SDPA anyway)
    cell_may_set: tuple[str, ...] = ()

    @property
    def swapped_kinds(self) -> tuple[str, ...]:
        """Module kinds the arm replaces by Liger's and nothing else; () for an arm that is not
        Liger or changes more than the Liger kernels (its Δ is not the swapped modules' alone)."""
        if not self.liger or set(self.sets) - set(LIGER_KERNEL_KEYS):
            return ()
        return tuple(
            kind for key, (kind, default) in LIGER_KERNEL_KEYS.items() if self.sets.get(key, default)
        )


def _arms(*arms: Arm) -> Mapping[str, Arm]:
    return MappingProxyType({a.name: a for a in arms})


ARMS: Mapping[str, Arm] = _arms(
    Arm("baseline", "the stock modules"),
    Arm("liger", "Liger's RMSNorm and SwiGLU", liger=True),
    Arm("rmsnorm", "Liger's RMSNorm alone", liger=True, sets={"model.liger_swiglu": False}),
    Arm("swiglu", "Liger's SwiGLU alone", liger=True, sets={"model.liger_rms_norm": False}),
    Arm("aa", "the baseline again: an A/A comparison, the suite's own noise floor"),
    Arm("nopoll", "the baseline with the VRAM poller off (what polling costs)", polls_vram=False),
    Arm(
        "compile",
        "torch.compile of each draft layer",
        sets={"model.compile_layers": True},
        gpu_only=True,
    ),
    Arm(
        "liger_compile",
        "Liger and torch.compile of each draft layer",
        liger=True,
        sets={"model.compile_layers": True},
        gpu_only=True,
    ),
    Arm(
        "liger_flce",
        "Liger, and Liger's fused linear cross-entropy for the LM head + loss",
        liger=True,
        sets={"model.liger_fused_linear_ce": True},
        gpu_only=True,
    ),
    Arm(
        "sdpa",
        "the baseline with SDPA attention instead of flex attention",
        sets={"model.attention_backend": "sdpa"},
        cell_may_set=("model.attention_backend",),
    ),
    Arm(
        "adamw_foreach",
        "the baseline with foreach AdamW instead of the fused kernel (what fusing buys, sign flipped)",
        sets={"training.fused_adamw": False},
    ),
)
ARM_NAMES = tuple(ARMS)
BASELINE = "baseline"
AA = "aa"
# Arms whose Δ the kernel attribution can predict from the swapped modules' timings.
LIGER_ARMS = tuple(name for name, arm in ARMS.items() if arm.swapped_kinds)

# Training keys the driver sets itself; a cell's `set:` may not override them.
_FIXED_KEYS = {
    "profile": "use another training config",
    "mode": "use another training config",
    "data.seq_len": "use the cell's seq_len",
    "data.cache_dir": "the driver prepares the cache",
    "training.steps": "use steps",
    "training.batch_size": "use the cell's batch_size",
    "model.use_liger_kernel": "use arms",
    "training.profile_steps": "profiled steps are not for timing; use python -m bench kernels --profile",
}


def _driver_keys() -> Mapping[str, str]:
    """The fixed keys, and every key an arm sets, with the arms that set it in the hint. The
    RMSNorm / SwiGLU choices (on by default with Liger) name the arms that turn one of them off
    and ``liger``, which takes both."""
    default_on = {k for k, (_, on) in LIGER_KERNEL_KEYS.items() if on}
    kernel_choosers = [a.name for a in ARMS.values() if default_on & set(a.sets)] + ["liger"]
    keys = dict(_FIXED_KEYS)
    for key in dict.fromkeys(k for a in ARMS.values() for k in a.sets):
        owners = [a.name for a in ARMS.values() if key in a.sets and key not in a.cell_may_set]
        if owners:
            keys[key] = f"use arms ({', '.join(kernel_choosers if key in default_on else owners)})"
    return MappingProxyType(keys)


DRIVER_KEYS = _driver_keys()
