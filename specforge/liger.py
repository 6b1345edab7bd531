"""The Liger arm: Liger's fused RMSNorm and SwiGLU for the Qwen3 modules of the draft.

``apply_liger_kernel_to_qwen3`` rebinds ``modeling_qwen3.Qwen3RMSNorm`` and
``modeling_qwen3.Qwen3MLP``; the draft resolves both through that module when it is built
(see draft.py), so the patch lands whatever the import order. RoPE is excluded (DFlash
applies its own asymmetric rotary embedding) and so are the CE kernels (the loss is
computed outside the Hugging Face forward).

Scope ``draft`` (the default) restores the two module attributes once the draft is built,
so a Qwen3 target built later in the same process keeps the stock modules whatever the arm.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib import metadata

from packaging.version import Version

from .config import ConfigError

MIN_LIGER_VERSION = "0.6.0"
INSTALL_HINT = "pip install '.[liger]'"
PATCHED_ATTRS = ("Qwen3RMSNorm", "Qwen3MLP")


def liger_version() -> str | None:
    try:
        return metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        return None


def _load_patch_fn():
    version = liger_version()
    if version is None:
        raise ConfigError(f"model.use_liger_kernel: liger-kernel is not installed ({INSTALL_HINT})")
    if Version(version) < Version(MIN_LIGER_VERSION):
        raise ConfigError(
            f"model.use_liger_kernel: liger-kernel {version} is too old, need >= {MIN_LIGER_VERSION} "
            f"({INSTALL_HINT})"
        )
    try:
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3
    except ImportError as e:
        raise ConfigError(
            f"model.use_liger_kernel: cannot import apply_liger_kernel_to_qwen3 from liger-kernel "
            f"{version} ({e}); {INSTALL_HINT}"
        ) from None
    return apply_liger_kernel_to_qwen3


@contextlib.contextmanager
def liger_patch(enabled: bool, scope: str = "draft") -> Iterator[None]:
    """Patch ``modeling_qwen3`` for the body of the block (build the draft inside it).

    With scope ``draft`` the module attributes are restored on exit; with ``all`` they stay
    patched, so a Qwen3 target built afterwards gets Liger modules too.
    """
    if not enabled:
        yield
        return
    apply = _load_patch_fn()
    from transformers.models.qwen3 import modeling_qwen3

    saved = {name: getattr(modeling_qwen3, name) for name in PATCHED_ATTRS}
    apply(rope=False, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False)
    try:
        yield
    finally:
        if scope == "draft":
            for name, obj in saved.items():
                setattr(modeling_qwen3, name, obj)
