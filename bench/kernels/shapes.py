"""Where and at which shapes the DFlash draft calls the modules the Liger arms swap (pure
arithmetic, no torch): a cell's draft shapes, its sites, what each site costs, and the plan of
one cell that the timings and the report share.

Tokens the draft sees per micro-batch (from DFlashDraft.forward and Trainer.micro_step):
``anchors`` is always padded to ``training.num_anchors`` = N blocks per sample (padded blocks are
computed, then masked), so with batch b, sequence length S and block size B

    block tokens   b * N * B         queries: every layer's two RMSNorms, q_norm, the MLP, the final norm
    context tokens b * S             fc + hidden_norm over the target's hidden states
    key/value      b * (S + N * B)   k_proj / v_proj / k_norm over the context and the block tokens
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench.kernels import roofline
from bench.kernels.bridge import Cell

KINDS = {"rmsnorm": "RMSNorm", "swiglu": "SwiGLU MLP", "loss": "LM head + CE"}
IMPLS = ("stock", "liger")


@dataclass(frozen=True)
class DraftShapes:
    """What one micro-batch of a cell feeds the draft (per rank)."""

    batch: int
    seq_len: int
    num_anchors: int
    block_size: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    eps: float
    vocab: int = 0

    @property
    def scored_tokens(self) -> int:
        """b * N * (B - 1): at most this many positions are scored (k = 0 of a block never is)."""
        return self.batch * self.num_anchors * (self.block_size - 1)

    @property
    def block_tokens(self) -> int:
        """b * N * B: the noise blocks, the queries of every layer."""
        return self.batch * self.num_anchors * self.block_size

    @property
    def context_tokens(self) -> int:
        """b * S: the target's hidden states, projected by fc and normed by hidden_norm."""
        return self.batch * self.seq_len

    @property
    def kv_tokens(self) -> int:
        """b * (S + N * B): keys and values are the context and the block tokens."""
        return self.batch * (self.seq_len + self.num_anchors * self.block_size)


def draft_shapes(arch: Any, batch: int, seq_len: int, num_anchors: int) -> DraftShapes:
    """The shapes of a cell from its profile's draft architecture (specforge.config.DraftArch)."""
    return DraftShapes(
        batch=batch,
        seq_len=seq_len,
        num_anchors=num_anchors,
        block_size=arch.block_size,
        hidden=arch.hidden_size,
        intermediate=arch.intermediate_size,
        heads=arch.num_attention_heads,
        kv_heads=arch.num_key_value_heads,
        head_dim=arch.head_dim,
        layers=arch.num_hidden_layers,
        eps=arch.rms_norm_eps,
        vocab=arch.vocab_size,
    )


@dataclass(frozen=True)
class Site:
    """One shape at which the draft calls a swappable module, and how often per micro-batch."""

    name: str
    kind: str  # rmsnorm | swiglu | loss
    shape: tuple[int, ...]  # the module's input
    per_micro_batch: int
    draft_modules: str

    @property
    def dim(self) -> int:
        return self.shape[-1]

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])


def module_sites(s: DraftShapes) -> list[Site]:
    """Every RMSNorm and MLP call of DFlashDraft.forward, grouped by input shape."""
    b, n, ctx = s.batch, s.num_anchors * s.block_size, s.seq_len
    return [
        Site(
            "rmsnorm_block",
            "rmsnorm",
            (b, n, s.hidden),
            2 * s.layers + 1,
            "input_layernorm + post_attention_layernorm per layer, final norm",
        ),
        Site("rmsnorm_context", "rmsnorm", (b, ctx, s.hidden), 1, "hidden_norm (after fc)"),
        Site("rmsnorm_q", "rmsnorm", (b, n, s.heads, s.head_dim), s.layers, "self_attn.q_norm per layer"),
        Site(
            "rmsnorm_k",
            "rmsnorm",
            (b, ctx + n, s.kv_heads, s.head_dim),
            s.layers,
            "self_attn.k_norm per layer",
        ),
        Site("swiglu_mlp", "swiglu", (b, n, s.hidden), s.layers, "mlp per layer"),
    ]


def loss_site(s: DraftShapes) -> Site:
    """The LM head + decayed CE over the scored positions (the liger_flce arm swaps it)."""
    return Site(
        "lm_head_ce",
        "loss",
        (s.scored_tokens, s.hidden),
        1,
        "LM head + decayed CE over the scored positions (objective.decayed_ce)",
    )


def all_sites(s: DraftShapes) -> list[Site]:
    """The draft's modules, then the loss."""
    return [*module_sites(s), loss_site(s)]


def site_cost(site: Site, shapes: DraftShapes, elem_bytes: int) -> tuple[int, int]:
    """(FLOPs, bytes) of one forward + backward at a site (formulas: bench/kernels/roofline.py)."""
    if site.kind == "loss":
        return (
            roofline.linear_ce_flops(site.rows, site.dim, shapes.vocab),
            roofline.linear_ce_bytes(site.rows, site.dim, shapes.vocab, elem_bytes),
        )
    if site.kind == "rmsnorm":
        return roofline.rmsnorm_flops(site.rows, site.dim), roofline.rmsnorm_bytes(
            site.rows, site.dim, elem_bytes
        )
    return (
        roofline.mlp_flops(site.rows, shapes.hidden, shapes.intermediate),
        roofline.mlp_bytes(site.rows, shapes.hidden, shapes.intermediate, elem_bytes),
    )


@dataclass(frozen=True)
class CellPlan:
    """One cell as its training runs see it (bench/kernels/modules.py's plan_cell makes it)."""

    cell: Cell
    profile: str
    mode: str
    shapes: DraftShapes
    micro_batches: int  # training.accumulation_steps
    dtype: str
    device: str  # cuda | cpu
    arch: Any  # specforge.config.DraftArch
    max_positions: int
    loss_gamma: float = 7.0  # training.loss_decay_gamma
    loss_chunk: int = 1024  # model.loss_chunk_size
