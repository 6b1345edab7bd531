"""The DFlash draft model (Qwen3-style decoder layers over context + noise tokens).

Qwen3RMSNorm and Qwen3MLP are looked up on the ``modeling_qwen3`` module when a layer is
*constructed*, never imported by name: Liger's patch rebinds those module attributes, and a
name captured by ``from ... import`` at import time would silently miss it depending on
import order.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3 import modeling_qwen3

from . import attention
from .config import DraftArch, hf_arch_kwargs


def qwen3_config(arch: DraftArch, max_positions: int) -> Qwen3Config:
    return Qwen3Config(**hf_arch_kwargs(arch, max_positions), hidden_act="silu", attention_bias=False)


def rms_norm(dim: int, eps: float) -> nn.Module:
    return modeling_qwen3.Qwen3RMSNorm(dim, eps=eps)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, L, d]; cos/sin [b, L, d]. Queries and keys get different positions."""
    return x * cos[:, None] + modeling_qwen3.rotate_half(x) * sin[:, None]


class DFlashAttention(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        h, qd, kvd = config.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(h, qd, bias=False)
        self.k_proj = nn.Linear(h, kvd, bias=False)
        self.v_proj = nn.Linear(h, kvd, bias=False)
        self.o_proj = nn.Linear(qd, h, bias=False)
        self.q_norm = rms_norm(self.head_dim, config.rms_norm_eps)
        self.k_norm = rms_norm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, ctx, rope_q, rope_k, mask, backend: str) -> torch.Tensor:
        b, n, _ = x.shape
        kv_in = torch.cat([ctx, x], dim=1)  # the same k/v projections for context and noise
        q = self.q_norm(self.q_proj(x).view(b, n, self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(kv_in).view(b, -1, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(kv_in).view(b, -1, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, *rope_q), apply_rope(k, *rope_k)
        out = attention.attend(backend, q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = modeling_qwen3.Qwen3MLP(config)
        self.input_layernorm = rms_norm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = rms_norm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, ctx, rope_q, rope_k, mask, backend: str) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope_q, rope_k, mask, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraft(nn.Module):
    """fc + hidden_norm over the concatenated target features, decoder layers, final norm.

    The frozen embedding and LM head belong to the target and live outside this module.
    """

    def __init__(self, arch: DraftArch, num_capture_layers: int, target_hidden: int, max_positions: int):
        super().__init__()
        self.config = qwen3_config(arch, max_positions)
        self.block_size = arch.block_size
        self.fc = nn.Linear(num_capture_layers * target_hidden, arch.hidden_size, bias=False)
        self.hidden_norm = rms_norm(arch.hidden_size, arch.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(self.config) for _ in range(arch.num_hidden_layers))
        self.norm = rms_norm(arch.hidden_size, arch.rms_norm_eps)
        self.rotary = modeling_qwen3.Qwen3RotaryEmbedding(self.config)

    @torch.no_grad()
    def init_weights(self, seed: int, std: float = 0.02, nudge_ulp: bool = False) -> None:
        """Deterministic init from ``seed`` on the parameters' device, independent of module
        classes (parameters are visited by name), so both arms start from the same weights;
        ``nudge_ulp``: then every weight moved by one ulp, up or down (nudge_one_ulp)."""
        gen = torch.Generator(device=next(self.parameters()).device).manual_seed(seed)
        for name, p in sorted(self.named_parameters()):
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, device=p.device) * std)
        if nudge_ulp:
            self.nudge_one_ulp(seed)

    @torch.no_grad()
    def nudge_one_ulp(self, seed: int) -> None:
        """Move every parameter by one unit in the last place of its dtype, up or down at random
        (a sign per element drawn from ``seed``, in parameter-name order): the aa_eps arm, whose
        divergence from the baseline measures how far training carries one rounding step
        (training parity's sensitivity floor). Without a direction, as rounding differences are:
        moved all towards +inf, every bfloat16 RMSNorm weight went from 1.0 to 1.0078, a model
        change that shifted the loss by 0.02 for 200 steps on the H200 (results/h200-parity-control)."""
        gen = torch.Generator(device=next(self.parameters()).device).manual_seed(seed + 1)
        for _, p in sorted(self.named_parameters()):
            up = torch.rand(p.shape, generator=gen, device=p.device) < 0.5
            towards = torch.where(up, float("inf"), float("-inf")).to(p.dtype)
            p.copy_(torch.nextafter(p, towards))

    def forward(self, target_hidden, noise_embeds, anchors, keep, backend: str) -> torch.Tensor:
        """target_hidden [b, S, K*Ht], noise_embeds [b, N*B, H] -> hidden [b, N*B, H]."""
        b, s, _ = target_hidden.shape
        ctx = self.hidden_norm(self.fc(target_hidden))
        eff = attention.effective_anchors(anchors, keep)
        offsets = torch.arange(self.block_size, device=anchors.device)
        pos_noise = (eff[:, :, None] + offsets).reshape(b, -1)
        pos_ctx = torch.arange(s, device=anchors.device).expand(b, -1)
        x = noise_embeds
        rope_q = self.rotary(x, pos_noise)
        rope_k = self.rotary(x, torch.cat([pos_ctx, pos_noise], dim=1))
        mask = attention.build_mask(backend, anchors, keep, s, self.block_size)
        for layer in self.layers:
            x = layer(x, ctx, rope_q, rope_k, mask, backend)
        return self.norm(x)
