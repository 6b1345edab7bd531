"""DFlash attention masks and the two attention backends.

Queries are the N*B noise tokens (N blocks of B); keys are the S context positions followed
by the N*B noise tokens. The rule: a query in block j sees context keys with index
< anchor_j (strictly) and every noise key of block j (bidirectional inside the block);
nothing else. A padded block (keep False) sees only its own noise keys: its rows are
excluded from the loss, and giving them one visible key keeps the dense-mask softmax
finite (a row with no visible key is NaN under SDPA).

* ``sdpa``: a dense boolean mask [b, 1, N*B, S + N*B] (the reference).
* ``flex_attention``: a BlockMask built directly from block-level bounds computed with
  tensor ops (no Python mask function evaluated per micro-batch), with ``mask_mod``
  applied only inside partial blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from packaging.version import Version

SPARSE_BLOCK = 128  # flex attention's default sparse block size (query and key)


def flex_kernel_options(torch_version: str | None = None) -> dict:
    """Kernel options that pin flex attention to the general Triton kernel.

    torch >= 2.11 understands ``BACKEND``; on older builds (ROCm wheels on 2.9) the string
    leaks into the generated kernel (``NameError: 'TRITON' is not defined``), and
    ``FORCE_USE_FLEX_ATTENTION`` (supported since 2.5) selects the same kernel.
    """
    release = Version(torch_version or torch.__version__).release
    if release >= (2, 11):
        return {"BACKEND": "TRITON"}
    return {"FORCE_USE_FLEX_ATTENTION": True}


def effective_anchors(anchors: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Anchor positions with padded blocks set to 0 (they see no context)."""
    return torch.where(keep, anchors, torch.zeros_like(anchors))


def dense_mask(anchors: torch.Tensor, keep: torch.Tensor, ctx_len: int, block_size: int) -> torch.Tensor:
    """Boolean mask [b, 1, N*B, S + N*B], True where a query may attend."""
    b, n = anchors.shape
    eff = effective_anchors(anchors, keep)
    ctx = torch.arange(ctx_len, device=anchors.device)[None, None, :] < eff[:, :, None]  # [b, N, S]
    ctx = ctx.repeat_interleave(block_size, dim=1)  # [b, N*B, S]
    qblk = torch.arange(n * block_size, device=anchors.device) // block_size
    noise = (qblk[:, None] == qblk[None, :]).expand(b, -1, -1)  # [b, N*B, N*B]
    return torch.cat([ctx, noise], dim=-1)[:, None]


def make_mask_mod(anchors: torch.Tensor, keep: torch.Tensor, ctx_len: int, block_size: int) -> Callable:
    """The rule as a flex ``mask_mod`` (element-wise, on index tensors)."""
    eff = effective_anchors(anchors, keep)
    n = eff.shape[1]
    pad = (-n) % max(1, SPARSE_BLOCK // block_size)
    eff = F.pad(eff, (0, pad + 1))  # rows of padded query tiles index safely

    def mask_mod(b, h, q_idx, kv_idx):
        j = q_idx // block_size
        sees_ctx = (kv_idx < ctx_len) & (kv_idx < eff[b, j])
        sees_block = (kv_idx >= ctx_len) & ((kv_idx - ctx_len) // block_size == j)
        return sees_ctx | sees_block

    return mask_mod


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(count, indices) of True blocks per query tile, True ones first, as BlockMask wants."""
    num = blocks.sum(-1, dtype=torch.int32)
    idx = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return num[:, None], idx[:, None]


def block_mask(anchors: torch.Tensor, keep: torch.Tensor, ctx_len: int, block_size: int):
    """BlockMask for flex attention, built from block-level bounds without a dense mask."""
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    b, n = anchors.shape
    q_len, kv_len = n * block_size, ctx_len + n * block_size
    mask_mod = make_mask_mod(anchors, keep, ctx_len, block_size)
    if SPARSE_BLOCK % block_size:  # a query tile would split a block: use the generic builder
        return create_block_mask(mask_mod, b, None, q_len, kv_len, device=anchors.device)

    per_tile = SPARSE_BLOCK // block_size
    nq, nk = math.ceil(q_len / SPARSE_BLOCK), math.ceil(kv_len / SPARSE_BLOCK)
    eff = F.pad(effective_anchors(anchors, keep), (0, nq * per_tile - n)).view(b, nq, per_tile)
    a_max, a_min = eff.max(-1).values, eff.min(-1).values  # [b, nq]
    k_start = torch.arange(nk, device=anchors.device) * SPARSE_BLOCK
    k_end = k_start + SPARSE_BLOCK
    # Context keys: some row of the tile sees the block if it starts below the largest anchor;
    # every row sees all of it if it ends at or below the smallest anchor.
    any_ctx = (k_start < ctx_len)[None, None, :] & (k_start[None, None, :] < a_max[:, :, None])
    full = (k_end[None, None, :] <= a_min[:, :, None]) & (k_end <= ctx_len)[None, None, :]
    # Noise keys: tile t holds blocks [t*per_tile, (t+1)*per_tile), i.e. noise keys
    # [t*128, (t+1)*128) shifted by ctx_len; a key block sees them if the ranges overlap.
    t_start = torch.arange(nq, device=anchors.device) * SPARSE_BLOCK + ctx_len
    any_noise = (k_start[None, :] < t_start[:, None] + SPARSE_BLOCK) & (k_end[None, :] > t_start[:, None])
    any_noise = any_noise & (k_end > ctx_len)[None, :]
    partial = (any_ctx | any_noise[None]) & ~full
    kv_num, kv_idx = _ordered(partial)
    full_num, full_idx = _ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=SPARSE_BLOCK,
        mask_mod=mask_mod,
        seq_lengths=(q_len, kv_len),
    )


_compiled_flex = None
# Read once, outside any trace: torch.compile cannot trace packaging's Version (model.compile_layers).
FLEX_KERNEL_OPTIONS = flex_kernel_options()


def flex_attend(q, k, v, mask) -> torch.Tensor:
    """Flex attention: eager on the CPU (forward only); on a GPU the pinned Triton kernel, through
    its own torch.compile, or through the enclosing one when the layer itself is compiled."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if torch.compiler.is_compiling():  # inside a compiled layer: no nested compile
        return flex_attention(q, k, v, block_mask=mask, enable_gqa=True, kernel_options=FLEX_KERNEL_OPTIONS)
    if q.device.type == "cpu":
        return flex_attention(q, k, v, block_mask=mask, enable_gqa=True)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex(q, k, v, block_mask=mask, enable_gqa=True, kernel_options=FLEX_KERNEL_OPTIONS)


def sdpa_attend(q, k, v, mask) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def build_mask(backend: str, anchors, keep, ctx_len: int, block_size: int):
    if backend == "flex_attention":
        return block_mask(anchors, keep, ctx_len, block_size)
    return dense_mask(anchors, keep, ctx_len, block_size)


def attend(backend: str, q, k, v, mask) -> torch.Tensor:
    return flex_attend(q, k, v, mask) if backend == "flex_attention" else sdpa_attend(q, k, v, mask)
