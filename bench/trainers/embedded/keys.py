"""Our trainer's keys for the arms' intent, and the keys a cell's ``set:`` may not touch.

Our trainer (specforge/config.py) takes Liger on or off through the run contract, and every
finer choice through its own config keys: which Liger kernels (RMSNorm and SwiGLU on by default
with Liger, the fused linear cross-entropy off), compiled draft layers, the attention backend,
fused or foreach AdamW. ``arm_sets`` turns an arm's intent into those keys; DRIVER_KEYS (the
contract's keys, our fixed ones, and every key an arm sets) are refused in a cell's ``set:``
with a hint naming the arms that set them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from bench.arms import ARMS, LIGER_DEFAULT, Arm
from bench.trainers.contract.facts import CELL_KEYS
from bench.trainers.contract.plug import CONTRACT_KEYS

# kernel (bench.arms.KERNELS) -> our trainer's key choosing it, with Liger on
KERNEL_KEYS = {
    "rmsnorm": "model.liger_rms_norm",
    "swiglu": "model.liger_swiglu",
    "loss": "model.liger_fused_linear_ce",
}
COMPILE_KEY = "model.compile_layers"
ATTENTION_KEY = "model.attention_backend"
FUSED_ADAMW_KEY = "training.fused_adamw"
FOREACH_ADAMW_KEY = "training.foreach_adamw"
PERTURB_KEY = "model.init_perturb_ulp"  # every weight moved by one ulp after its seeded init
LR_SCALE_KEY = "training.lr_scale"  # the learning rate times it (lr_off, the negative control)
# optimizer -> our keys: foreach instead of the fused kernel; the plain loop instead of either
OPTIMIZERS = {
    "foreach": {FUSED_ADAMW_KEY: False},
    "plain": {FUSED_ADAMW_KEY: False, FOREACH_ADAMW_KEY: False},
}

_FIXED_KEYS = {
    "profile": CELL_KEYS["profile"],
    "mode": CELL_KEYS["mode"],
    "data.seq_len": CONTRACT_KEYS["data.seq_len"],
    "data.cache_dir": CONTRACT_KEYS["data.cache_dir"],
    "training.steps": CONTRACT_KEYS["training.steps"],
    "training.batch_size": CONTRACT_KEYS["training.batch_size"],
    "model.use_liger_kernel": CONTRACT_KEYS["model.use_liger_kernel"],
    "training.profile_steps": "profiled steps are not for timing; use python -m bench kernels --profile",
}
# keys an arm sets that a cell may still set for every arm (a CPU cell trains with SDPA anyway)
CELL_MAY_SET = (ATTENTION_KEY,)


def arm_sets(arm: Arm) -> dict[str, Any]:
    """Our trainer's keys for the arm, beyond the contract's Liger switch: a Liger kernel left out
    of the default two turned off, the fused linear cross-entropy turned on, compile, attention,
    optimizer."""
    sets: dict[str, Any] = {}
    if arm.liger:
        for kernel, key in KERNEL_KEYS.items():
            default = kernel in LIGER_DEFAULT
            if (kernel in arm.kernels) != default:
                sets[key] = not default
    if arm.compile:
        sets[COMPILE_KEY] = True
    if arm.attention is not None:
        sets[ATTENTION_KEY] = arm.attention
    if arm.optimizer is not None:
        sets.update(OPTIMIZERS[arm.optimizer])
    if arm.perturb:
        sets[PERTURB_KEY] = True
    if arm.lr_scale != 1.0:
        sets[LR_SCALE_KEY] = arm.lr_scale
    return sets


def _driver_keys() -> Mapping[str, str]:
    """The fixed keys, and every key an arm sets, with the arms that set it in the hint. The
    RMSNorm / SwiGLU choices (on by default with Liger) name the arms that turn one of them off
    and ``liger``, which takes both."""
    default_on = {KERNEL_KEYS[k] for k in LIGER_DEFAULT}
    kernel_choosers = [a.name for a in ARMS.values() if default_on & set(arm_sets(a))] + ["liger"]
    keys = dict(_FIXED_KEYS)
    for key in dict.fromkeys(k for a in ARMS.values() for k in arm_sets(a)):
        owners = [a.name for a in ARMS.values() if key in arm_sets(a) and key not in CELL_MAY_SET]
        if owners:
            keys[key] = f"use arms ({', '.join(kernel_choosers if key in default_on else owners)})"
    return MappingProxyType(keys)


DRIVER_KEYS = _driver_keys()

# The keys a sweep's own arm (user_arms) may not set on our trainer: the fixed ones, and the Liger
# kernels' choices (Liger is the built-in arms' switch; a user arm runs with Liger off).
ARM_REFUSED_KEYS = MappingProxyType(
    {**_FIXED_KEYS, **{k: DRIVER_KEYS[k] for k in KERNEL_KEYS.values() if k in DRIVER_KEYS}}
)
