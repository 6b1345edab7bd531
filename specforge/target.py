"""The frozen target: a Hugging Face causal LM (online) or just its embedding and LM head.

Random-weight targets are built from the architecture numbers directly on the device in
bf16 with the model's own initializer (no slow CPU init); a pretrained target is read from a
local Hugging Face directory. Capture layer i is the output of decoder layer i, i.e.
``hidden_states[i + 1]`` (index 0 is the embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .config import ConfigError, TargetArch, TargetConfig, hf_arch_kwargs


@dataclass
class FrozenHead:
    """The target's frozen token embedding and LM head (the same tensor when tied)."""

    embed: torch.Tensor  # [V, H]
    lm_head: torch.Tensor  # [V, H]

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(ids, self.embed)


def hf_config(arch: TargetArch, max_positions: int):
    from transformers import AutoConfig

    return AutoConfig.for_model(
        arch.model_type,
        **hf_arch_kwargs(arch, max_positions),
        tie_word_embeddings=arch.tie_word_embeddings,
        initializer_range=arch.initializer_range,
    )


def build_target(
    arch: TargetArch, tcfg: TargetConfig, device: torch.device, dtype, seed: int, max_positions: int
):
    """The whole target model, frozen and in eval mode."""
    from transformers import AutoModelForCausalLM

    if tcfg.init == "pretrained":
        try:
            model = AutoModelForCausalLM.from_pretrained(tcfg.path, dtype=dtype, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ConfigError(f"target.path: cannot load a model from {tcfg.path!r} ({e})") from None
        model.to(device)
    else:
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(hf_config(arch, max_positions), dtype=dtype)
    model.eval().requires_grad_(False)
    return model


def head_of(model) -> FrozenHead:
    return FrozenHead(
        embed=model.get_input_embeddings().weight.detach(),
        lm_head=model.get_output_embeddings().weight.detach(),
    )


def random_head(arch: TargetArch, device, dtype, seed: int) -> FrozenHead:
    """An embedding / LM head with the target's shapes and the HF initializer's scale."""
    std = arch.initializer_range
    gen = torch.Generator(device=device).manual_seed(seed)
    embed = (torch.randn(arch.vocab_size, arch.hidden_size, generator=gen, device=device) * std).to(dtype)
    if arch.tie_word_embeddings:
        return FrozenHead(embed, embed)
    lm_head = (torch.randn(arch.vocab_size, arch.hidden_size, generator=gen, device=device) * std).to(dtype)
    return FrozenHead(embed, lm_head)


@torch.no_grad()
def capture_hidden(model, input_ids: torch.Tensor, layer_ids: list[int]) -> torch.Tensor:
    """[b, S, K*H]: outputs of the capture layers, concatenated along features.

    Runs the decoder stack only (no LM head: the target's logits are not needed).
    """
    out = model.get_decoder()(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
