"""Model FLOPs per optimizer step and the devices' peak rates, for MFU.

Counted: matmuls of the draft (forward and backward), attention over the pairs the mask
allows (at the kernel's 128x128 tile granularity this under-counts the work done, never
over-counts), the frozen LM head on scored positions (forward plus input-gradient only),
and, online, the frozen target's forward. Recomputation is not counted (MFU, not HFU).
"""

from __future__ import annotations

from .config import Profile

# Dense bf16 peak TFLOP/s per device, vendor datasheets (no sparsity).
PEAK_TFLOPS = {
    "H200": 989.5,
    "H100": 989.5,
    "A100": 312.0,
    "MI355X": 2516.6,
    "MI350X": 2306.9,
    "MI325X": 1307.4,
    "MI300X": 1307.4,
}


def peak_tflops(device_name: str | None) -> float | None:
    name = (device_name or "").upper()
    for key, value in PEAK_TFLOPS.items():
        if key in name:
            return value
    return None


def draft_flops(
    profile: Profile, seq_len: int, num_blocks: float, scored: float, attended_pairs: float
) -> float:
    """FLOPs of one sample through the draft (forward + backward) and the LM head."""
    d, t = profile.draft, profile.target
    h, hd = d.hidden_size, d.head_dim
    noise = num_blocks * d.block_size
    q_o = 2 * h * d.num_attention_heads * hd
    kv = 2 * h * d.num_key_value_heads * hd
    mlp = 3 * h * d.intermediate_size
    per_layer = (
        2 * (noise * (q_o + mlp) + (seq_len + noise) * kv) + 4 * attended_pairs * d.num_attention_heads * hd
    )
    fc = 2 * seq_len * len(t.capture_layer_ids) * t.hidden_size * h
    trainable = d.num_hidden_layers * per_layer + fc
    lm_head = 2 * scored * h * d.vocab_size
    return 3 * trainable + 2 * lm_head  # backward = 2x forward; the frozen head has no weight grad


def target_flops(profile: Profile, seq_len: int) -> float:
    """Forward FLOPs of the frozen target for one sample (online mode), without its LM head."""
    t = profile.target
    per_token_params = t.num_hidden_layers * (
        2 * t.hidden_size * t.num_attention_heads * t.head_dim
        + 2 * t.hidden_size * t.num_key_value_heads * t.head_dim
        + 3 * t.hidden_size * t.intermediate_size
    )
    attn = (
        t.num_hidden_layers * 2 * seq_len * seq_len * t.num_attention_heads * t.head_dim
    )  # causal half of 4
    return 2 * per_token_params * seq_len + attn
