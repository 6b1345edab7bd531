"""How much does compiling the draft's layers move its loss, with the weights and data fixed?

A CPU check behind results/h200-compile: the draft of a profile (default the 4B one, at its
real widths and vocabulary, fewer anchors and a shorter context so that it runs on a CPU) in
bf16, random weights, one micro-batch; the decayed loss eager, then with each decoder layer
under torch.compile (the trainer's model.compile_layers), for both attention backends.
No Liger (its kernels need a GPU).

    python scripts/compile_numerics_cpu.py [--profile qwen3.5-4b-dflash] [--anchors 32]
        [--seq-len 512] [--backend inductor|aot_eager|eager]
"""

from __future__ import annotations

import argparse
import time

import torch

from specforge import objective
from specforge.config import load_profile
from specforge.draft import DFlashDraft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="qwen3.5-4b-dflash")
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    args = ap.parse_args()

    prof = load_profile(args.profile)
    arch, s = prof.draft, args.seq_len
    n_capture = len(prof.target.capture_layer_ids)
    draft = DFlashDraft(arch, n_capture, prof.target.hidden_size, s + arch.block_size + 1)
    draft.init_weights(42)
    draft.to(torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, arch.vocab_size - 1, (2, s), generator=gen)
    mask = torch.ones(2, s, dtype=torch.uint8)
    anchors, keep = objective.sample_anchors(mask, args.anchors, gen)
    blocks = objective.make_blocks(ids, mask, anchors, keep, arch.block_size, arch.mask_token_id, 7.0)
    feats = torch.randn(2, s, n_capture * prof.target.hidden_size, generator=gen).bfloat16()
    head = (torch.randn(arch.vocab_size, arch.hidden_size, generator=gen) * 0.02).bfloat16()
    noise = torch.nn.functional.embedding(blocks.noise_ids, head)

    def loss(attention: str) -> float:
        with torch.no_grad():
            out = draft(feats, noise, anchors, keep, attention)
            return objective.decayed_ce(out, head, blocks, 1024)[0].item()

    backends = ("sdpa", "flex_attention")
    eager = {}
    for attention in backends:
        t0 = time.monotonic()
        eager[attention] = loss(attention)
        print(
            f"{attention:15s} eager              loss {eager[attention]:.6f}  ({time.monotonic() - t0:.0f} s)"
        )
    for layer in draft.layers:
        layer.compile(backend=args.backend)
    for attention in backends:
        t0 = time.monotonic()
        value = loss(attention)
        print(
            f"{attention:15s} compiled ({args.backend:9s}) loss {value:.6f}  |Δ| vs eager "
            f"{abs(value - eager[attention]):.2e}  ({time.monotonic() - t0:.0f} s)"
        )
    print(f"eager flex vs eager sdpa: |Δ| {abs(eager['flex_attention'] - eager['sdpa']):.2e}")


if __name__ == "__main__":
    main()
