"""The Liger arm: Liger's fused RMSNorm and SwiGLU for the Qwen3 modules of the draft.

``apply_liger_kernel_to_qwen3`` rebinds ``modeling_qwen3.Qwen3RMSNorm`` and
``modeling_qwen3.Qwen3MLP``; the draft resolves both through that module when it is built
(see draft.py), so the patch lands whatever the import order. RoPE is excluded (DFlash
applies its own asymmetric rotary embedding) and so are the CE kernels (the loss is
computed outside the Hugging Face forward).

Scope ``draft`` (the default) restores the two module attributes once the draft is built,
so a Qwen3 target built later in the same process keeps the stock modules whatever the arm.

Before patching, ``check_triton`` refuses an environment where two distributions provide
the ``triton`` module (on ROCm: torch's ``pytorch-triton-rocm`` plus a CUDA ``triton`` that
pip added for liger-kernel's ``triton>=2.3.1``); there Liger could run on a Triton that is
not torch's. On ROCm liger-kernel is installed with ``--no-deps`` (``make install`` does).
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Iterator
from importlib import metadata

from packaging.requirements import Requirement
from packaging.version import Version

from .config import ConfigError

MIN_LIGER_VERSION = "0.6.0"
INSTALL_HINT = "pip install '.[liger]'"
PATCHED_ATTRS = ("Qwen3RMSNorm", "Qwen3MLP")


def _install_hint() -> str:
    """How to install liger-kernel here: without its dependencies on ROCm (see check_triton)."""
    try:
        import torch

        rocm = bool(getattr(torch.version, "hip", None))
    except Exception:
        rocm = False
    return f"pip install --no-deps 'liger-kernel>={MIN_LIGER_VERSION}'" if rocm else INSTALL_HINT


def liger_version() -> str | None:
    try:
        return metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        return None


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def triton_providers() -> dict[str, str]:
    """{distribution: version} of every installed distribution that provides the ``triton``
    module (``triton`` on CUDA, ``pytorch-triton-rocm`` on ROCm; both when pip added a CUDA
    Triton beside ROCm's, e.g. to satisfy liger-kernel's ``triton>=2.3.1``)."""
    try:
        names = metadata.packages_distributions().get("triton") or []
    except Exception:
        return {}
    out: dict[str, str] = {}
    for name in names:
        key = _canonical(name)
        if key in out:
            continue
        try:
            out[key] = metadata.version(name)
        except Exception:
            out[key] = "?"
    return out


def _torch_triton() -> str | None:
    """The Triton distribution torch requires (canonical name), None when torch names none."""
    try:
        requires = metadata.requires("torch") or []
    except Exception:
        return None
    for line in requires:
        try:
            name = _canonical(Requirement(line).name)
        except Exception:
            continue
        if name in ("triton", "pytorch-triton-rocm", "pytorch-triton"):
            return name
    return None


def check_triton() -> None:
    """ConfigError when two distributions provide ``triton``: their files overwrite each other,
    so the Triton Liger imports need not be the one torch was built with."""
    providers = triton_providers()
    if len(providers) < 2:
        return
    keep = _torch_triton()
    if keep not in providers:
        keep = "pytorch-triton-rocm" if "pytorch-triton-rocm" in providers else None
    listed = ", ".join(f"{n} {v}" + (" (torch's)" if n == keep else "") for n, v in sorted(providers.items()))
    strays = [n for n in sorted(providers) if n != keep]
    if keep is None:
        fix = f"keep only the one torch was built with (pip uninstall {' / '.join(strays)})"
    else:
        fix = (
            f"pip uninstall {' '.join(strays)}, then pip install --force-reinstall --no-deps "
            f"{keep}=={providers[keep]} (they share the triton/ directory); on ROCm install liger-kernel "
            "with --no-deps (make install does)"
        )
    raise ConfigError(
        f"model.use_liger_kernel: {len(providers)} distributions provide the `triton` module ({listed}); "
        f"Liger could import a Triton that is not torch's. Fix: {fix}"
    )


def _require_liger(key: str) -> str:
    """The installed liger-kernel's version; ConfigError naming ``key`` when it is missing or old."""
    version = liger_version()
    if version is None:
        raise ConfigError(f"{key}: liger-kernel is not installed ({_install_hint()})")
    if Version(version) < Version(MIN_LIGER_VERSION):
        raise ConfigError(
            f"{key}: liger-kernel {version} is too old, need >= {MIN_LIGER_VERSION} ({_install_hint()})"
        )
    check_triton()
    return version


def fused_linear_ce_fn():
    """Liger's functional fused linear cross-entropy (objective.liger_linear_ce's kernel), checked
    up front: ConfigError when liger-kernel is missing or old, when its function gives no token
    accuracy, or when its per-token losses (reduction "none") cannot carry a per-token gradient
    back: before the fix of liger-kernel PR #1298 every row's gradient was scaled by the first
    row's weight, silently. The fixed forward takes ``token_grad_output``; that is what is checked."""
    key = "model.liger_fused_linear_ce"
    version = _require_liger(key)
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import fused_linear_cross_entropy_forward
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy as fn
    except ImportError as e:
        raise ConfigError(
            f"{key}: cannot import Liger's fused linear cross-entropy from liger-kernel {version} ({e})"
        ) from None
    if "return_token_accuracy" not in inspect.signature(fn).parameters:
        raise ConfigError(
            f"{key}: liger-kernel {version}'s liger_fused_linear_cross_entropy has no return_token_accuracy; "
            f"upgrade liger-kernel ({_install_hint()})"
        )
    if "token_grad_output" not in inspect.signature(fused_linear_cross_entropy_forward).parameters:
        raise ConfigError(
            f"{key}: liger-kernel {version} cannot weight per-token losses in its backward (reduction='none' "
            f"gradients are wrong before liger-kernel PR #1298); upgrade liger-kernel ({_install_hint()})"
        )
    return fn


def _load_patch_fn():
    version = _require_liger("model.use_liger_kernel")
    try:
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3
    except ImportError as e:
        hint = _install_hint()
        # a release built for another transformers (0.6.4 imports HybridCache, gone in transformers 5):
        # installing liger-kernel again would not help
        if (e.name or "").partition(".")[0] == "transformers":
            import transformers

            hint = f"this liger-kernel was not built for transformers {transformers.__version__}: pick a release that is"
        raise ConfigError(
            f"model.use_liger_kernel: cannot import apply_liger_kernel_to_qwen3 from liger-kernel "
            f"{version} ({e}); {hint}"
        ) from None
    return apply_liger_kernel_to_qwen3


@contextlib.contextmanager
def liger_patch(
    enabled: bool, scope: str = "draft", rms_norm: bool = True, swiglu: bool = True
) -> Iterator[None]:
    """Patch ``modeling_qwen3`` for the body of the block (build the draft inside it).

    ``rms_norm`` / ``swiglu`` choose the kernels (both by default: the ``liger`` arm; one
    alone tells which of the two buys the gain). With scope ``draft`` the module attributes
    are restored on exit; with ``all`` they stay patched, so a Qwen3 target built afterwards
    gets Liger modules too.
    """
    if not enabled:
        yield
        return
    apply = _load_patch_fn()
    from transformers.models.qwen3 import modeling_qwen3

    saved = {name: getattr(modeling_qwen3, name) for name in PATCHED_ATTRS}
    apply(rope=False, rms_norm=rms_norm, swiglu=swiglu, cross_entropy=False, fused_linear_cross_entropy=False)
    try:
        yield
    finally:
        if scope == "draft":
            for name, obj in saved.items():
                setattr(modeling_qwen3, name, obj)
