"""DFlash anchors, block labels and the decayed cross-entropy objective.

The LM head is large (vocab 152k-248k), so logits are never materialised for all N*B
positions: only *scored* positions go through the head, in chunks, and each chunk's
gradient w.r.t. the hidden states is computed right away (a fused linear cross-entropy).
The backward pass then only scales the stored gradient: no logits are recomputed and no
chunk's logits outlive its loop iteration.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

OBJECTIVE = (
    "fused linear-CE over scored positions only, {chunk} positions per chunk, grad in forward "
    "(no logits recomputed; CE compiled on GPU)"
)


@dataclass
class Blocks:
    noise_ids: torch.Tensor  # [b, N*B]: anchor token then MASK ids
    labels: torch.Tensor  # [b, N*B] long (0 where unscored)
    weights: torch.Tensor  # [b, N*B] float32, 0 where unscored


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator):
    """Up to N distinct positions p with loss_mask[p] and loss_mask[p+1], uniformly, sorted.

    Returns (anchors [b, N] long, keep [b, N] bool); samples with fewer valid positions get
    fewer blocks, padded with keep=False.
    """
    b, s = loss_mask.shape
    valid = loss_mask[:, :-1].bool() & loss_mask[:, 1:].bool()  # p + 1 < S
    keys = torch.rand(valid.shape, generator=generator, device=loss_mask.device)
    keys = keys.masked_fill(~valid, 2.0)
    k = min(num_anchors, s - 1)
    picked_keys, picked = keys.topk(k, dim=-1, largest=False)
    picked = torch.where(picked_keys < 2.0, picked, torch.full_like(picked, s))
    anchors = picked.sort(dim=-1).values
    if k < num_anchors:
        anchors = torch.nn.functional.pad(anchors, (0, num_anchors - k), value=s)
    keep = anchors < s
    return torch.where(keep, anchors, torch.zeros_like(anchors)), keep


def make_blocks(
    input_ids, loss_mask, anchors, keep, block_size: int, mask_token_id: int, gamma: float
) -> Blocks:
    b, s = input_ids.shape
    offsets = torch.arange(block_size, device=input_ids.device)
    pos = anchors[:, :, None] + offsets  # [b, N, B]
    in_range = pos < s
    pos_c = pos.clamp(max=s - 1)
    scored = (
        keep[:, :, None]
        & in_range
        & (offsets >= 1)
        & loss_mask.bool().gather(1, pos_c.flatten(1)).view_as(pos)
    )
    labels = input_ids.gather(1, pos_c.flatten(1)).view_as(pos)
    decay = torch.exp(-(offsets.float() - 1.0) / gamma)  # w_k = exp(-(k-1)/gamma)
    weights = torch.where(scored, decay, torch.zeros((), device=input_ids.device))
    noise = torch.full_like(pos, mask_token_id)
    noise[:, :, 0] = input_ids.gather(1, anchors)
    return Blocks(
        noise_ids=noise.flatten(1),
        labels=torch.where(scored, labels, torch.zeros_like(labels)).flatten(1),
        weights=weights.flatten(1),
    )


def _ce_chunk(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor):
    """Weighted CE of one chunk, its correct count, and d(loss)/d(logits) in the logits' dtype.

    Compiled on the GPU into a few fused kernels that read the bf16 logits without an fp32
    copy; eager elsewhere.
    """
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    loss = (w * (lse - x.gather(1, y[:, None]).squeeze(1))).sum()
    correct = ((x.argmax(dim=-1) == y) & (w > 0)).sum()
    onehot = torch.arange(x.shape[1], device=x.device)[None, :] == y[:, None]
    grad = (torch.exp(x - lse[:, None]) - onehot.float()) * w[:, None]
    return loss, correct, grad.to(logits.dtype)


_compiled_ce = None


def _ce_fn(device: torch.device):
    global _compiled_ce
    if device.type != "cuda":
        return _ce_chunk
    if _compiled_ce is None:
        _compiled_ce = torch.compile(_ce_chunk, dynamic=False)
    return _compiled_ce


class _LinearCE(torch.autograd.Function):
    """sum_i w_i * CE(h_i @ W^T, y_i) with W frozen; gradient w.r.t. h computed in forward.

    Rows are padded to a whole number of chunks (padding has weight 0), so every chunk has
    the same shape and the compiled CE kernel is built once.
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, w, chunk: int):
        n = hidden.shape[0]
        pad = (-n) % chunk
        h = torch.nn.functional.pad(hidden, (0, 0, 0, pad))
        y = torch.nn.functional.pad(labels, (0, pad))
        wp = torch.nn.functional.pad(w, (0, pad))
        ce = _ce_fn(hidden.device)
        loss = torch.zeros((), device=hidden.device, dtype=torch.float32)
        correct = torch.zeros((), device=hidden.device, dtype=torch.int64)
        grad = torch.empty_like(h) if hidden.requires_grad else None
        for start in range(0, n + pad, chunk):
            end = start + chunk
            chunk_loss, chunk_correct, dlogits = ce(h[start:end] @ weight.T, y[start:end], wp[start:end])
            loss += chunk_loss
            correct += chunk_correct
            if grad is not None:
                grad[start:end] = dlogits @ weight
        ctx.save_for_backward(grad[:n] if grad is not None else None)
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss, _grad_correct):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None


def liger_linear_ce(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, w: torch.Tensor):
    """sum_i w_i * CE(h_i @ W^T, y_i) and the correct count, through Liger's fused linear
    cross-entropy: the same value and gradient as ``_LinearCE``.

    One call over all scored rows with per-token losses (``reduction="none"``), weighted here;
    Liger then takes the per-token upstream gradient in its backward, recomputing the logits
    chunk by chunk (one more pass over the LM head than ``_LinearCE``, which computes the input
    gradient in the forward). Versions whose backward cannot weight tokens are refused at start
    (``specforge.liger.fused_linear_ce_fn``).
    """
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    out = liger_fused_linear_cross_entropy(
        hidden, weight, labels, reduction="none", return_token_accuracy=True
    )
    loss = (out.loss.float() * w).sum()
    return loss, out.token_accuracy.detach().sum().round().long()


def decayed_ce(
    hidden: torch.Tensor, lm_head: torch.Tensor, blocks: Blocks, chunk: int, fused_liger: bool = False
):
    """Loss = sum(w*CE)/sum(w) over scored positions; also accuracy and the scored count.

    hidden [b, N*B, H]; lm_head [V, H] (frozen). ``fused_liger``: Liger's fused linear
    cross-entropy (``liger_linear_ce``) instead of the chunked, compiled LM head + CE.
    """
    sel = blocks.weights.flatten() > 0
    h = hidden.flatten(0, 1)[sel]
    w = blocks.weights.flatten()[sel]
    y = blocks.labels.flatten()[sel]
    n = int(w.numel())
    if n == 0:
        zero = hidden.sum() * 0.0
        return zero, zero.detach(), 0
    if fused_liger:
        loss, correct = liger_linear_ce(h, lm_head, y, w / w.sum())
    else:
        loss, correct = _LinearCE.apply(h, lm_head, y, w / w.sum(), chunk)
    return loss, correct.float() / n, n
