"""The trainer's side of the kernel attribution, and the only module of bench/kernels that
imports the trainer (specforge): a cell's training config read by the trainer's own loader,
the stock and Liger modules built the way specforge/draft.py builds them (the Liger classes
through ``specforge.liger.liger_patch`` and ``modeling_qwen3``), the trainer's two LM head +
CE losses, whether Liger can run here, the versions, and the profiler's bucket table.

specforge and torch are imported where they are used: a bad option is refused before either
is loaded.
"""

from __future__ import annotations

import importlib.metadata

from bench.kernels.bridge import (
    Cell,
    SweepConfig,
    SweepError,
    format_set_value,
    liger_skip_reason,
    no_gpu_reason,
    our_trainer_importable,
)
from bench.kernels.shapes import CellPlan, Site, draft_shapes

our_trainer_importable()


def plan_cell(cfg: SweepConfig, cell: Cell, device_type: str) -> CellPlan:
    """The cell's training config as its runs see it (the driver's --set keys and the cell's `set`),
    validated by the trainer's own config loader; SweepError with one line on bad input."""
    from specforge.config import ConfigError
    from specforge.config import load_config as load_train_config

    sets = {"data.seq_len": cell.seq_len, "training.batch_size": cell.batch_size, **cell.overrides}
    where = f"{cfg.path}: cells[{cell.entry}] ({cell.cell_id})"
    try:
        train, profile = load_train_config(
            cell.train_config, [f"{k}={format_set_value(v)}" for k, v in sets.items()]
        )
    except ConfigError as e:
        raise SweepError(f"{where}: {e}") from None
    want = train.training.device
    if want == "cuda" and device_type != "cuda":
        raise SweepError(f"{where}: training.device: cuda requested but no CUDA or ROCm GPU is visible")
    device = "cpu" if want == "cpu" else device_type
    tr = train.training
    return CellPlan(
        cell=cell,
        profile=profile.name,
        mode=train.mode,
        shapes=draft_shapes(profile.draft, tr.batch_size, train.data.seq_len, tr.num_anchors),
        micro_batches=tr.accumulation_steps,
        dtype=train.model.dtype,
        device=device,
        arch=profile.draft,
        max_positions=train.data.seq_len + profile.draft.block_size + 1,  # as the trainer builds it
        loss_gamma=tr.loss_decay_gamma,
        loss_chunk=train.model.loss_chunk_size,
    )


def loss_head(plan: CellPlan, site: Site, liger: bool):
    """The trainer's LM head + decayed CE at this site as a module of the hidden rows (its output the
    loss): the chunked, compiled ``_LinearCE`` or, with ``liger``, ``liger_linear_ce``. The frozen
    head, labels and weights are random but shaped as in training: every block position k = 1..B-1
    scored, weighted exp(-(k-1)/gamma), normalized. Raises ConfigError when Liger's is unavailable."""
    import torch

    from specforge import objective
    from specforge.liger import fused_linear_ce_fn

    if liger:
        fused_linear_ce_fn()
    n, h = site.shape
    dev, dt = plan.device, getattr(torch, plan.dtype)
    gen = torch.Generator(device=dev).manual_seed(1)
    head = (torch.randn(plan.shapes.vocab, h, generator=gen, device=dev) * h**-0.5).to(dt)
    labels = torch.randint(0, plan.shapes.vocab, (n,), generator=gen, device=dev)
    k = torch.arange(n, device=dev) % (plan.shapes.block_size - 1)
    w = torch.exp(-k.float() / plan.loss_gamma)
    w = w / w.sum()

    class LigerFusedLinearCE(torch.nn.Module):
        def forward(self, x):
            return objective.liger_linear_ce(x, head, labels, w)[0]

    class ChunkedLinearCE(torch.nn.Module):
        def forward(self, x):
            return objective._LinearCE.apply(x, head, labels, w, plan.loss_chunk)[0]

    return LigerFusedLinearCE() if liger else ChunkedLinearCE()


def build_module(plan: CellPlan, site: Site, liger: bool):
    """The module a draft layer builds at this site, stock or under the trainer's Liger patch
    (specforge.liger.liger_patch; draft.py resolves the classes through ``modeling_qwen3``), or the
    loss (``loss_head``). Raises specforge's ConfigError when Liger cannot be patched in (missing,
    too old, two Tritons)."""
    import torch
    from transformers.models.qwen3 import modeling_qwen3

    from specforge.draft import qwen3_config, rms_norm
    from specforge.liger import liger_patch

    if site.kind == "loss":
        return loss_head(plan, site, liger)

    config = qwen3_config(plan.arch, plan.max_positions)
    with liger_patch(liger, "draft"), torch.device(plan.device):
        if site.kind == "rmsnorm":
            module = rms_norm(site.dim, plan.shapes.eps)
        else:
            module = modeling_qwen3.Qwen3MLP(config)
    return module.to(getattr(torch, plan.dtype))


def is_config_error(e: BaseException) -> bool:
    """Whether ``e`` is the trainer's ConfigError (Liger cannot be patched in: a skip, not an error)."""
    from specforge.config import ConfigError

    return isinstance(e, ConfigError)


def liger_class_names() -> dict[str, str]:
    """{kind: class name} the Liger patch puts in place (building them needs no GPU); {} when
    liger-kernel cannot be patched in here."""
    from transformers.models.qwen3 import modeling_qwen3

    from specforge.config import ConfigError
    from specforge.liger import liger_patch

    try:
        with liger_patch(True, "draft"):
            return {
                "rmsnorm": modeling_qwen3.Qwen3RMSNorm.__name__,
                "swiglu": modeling_qwen3.Qwen3MLP.__name__,
                "loss": "LigerFusedLinearCE",
            }
    except ConfigError:
        return {}


def liger_unavailable(device: str) -> str | None:
    """Why Liger's modules cannot run on this cell's device, or None (the sweep's skip reasons)."""
    if device == "cpu":
        import torch

        if torch.cuda.is_available():
            return "Liger's Triton kernels need a CUDA or ROCm GPU; this cell runs on the CPU (training.device: cpu)"
        return no_gpu_reason()
    return liger_skip_reason()


def versions() -> dict[str, str | None]:
    """torch_version, transformers_version, liger_version (None: not installed)."""
    out = {}
    for key, dist in (("torch_version", "torch"), ("transformers_version", "transformers")):
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = None
    from specforge.liger import liger_version

    out["liger_version"] = liger_version()
    return out


def bucket_names() -> tuple[str, ...]:
    """The profiler's buckets in order, ``other`` last (specforge/profiling.py)."""
    from specforge.profiling import BUCKET_NAMES

    return BUCKET_NAMES


def bucket_patterns() -> tuple[tuple[str, str], ...]:
    """(bucket, regex) as the profiler tries them (specforge/profiling.py's BUCKETS)."""
    from specforge.profiling import BUCKETS

    return BUCKETS
