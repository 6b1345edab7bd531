"""GPU numerics checks: ``python -m specforge.numerics [--profile P] [--out FILE]``.

1. Liger exactness: one draft decoder layer built without and with the Liger patch from
   the same state dict; bf16 forward outputs must be bit-identical and fp32 gradients equal
   to float-reassociation level (max |delta| <= 2e-6).
2. Attention backends: a small draft trained one step with flex_attention and with sdpa
   on identical weights and data: loss and gradients must agree to bf16 tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.attention

from . import objective
from .config import load_profile
from .draft import DFlashDecoderLayer, DFlashDraft, qwen3_config
from .liger import liger_patch


def _layer_inputs(profile, device, dtype, seq_len: int, num_blocks: int, gen):
    d = profile.draft
    x = torch.randn(2, num_blocks * d.block_size, d.hidden_size, generator=gen, device=device, dtype=dtype)
    ctx = torch.randn(2, seq_len, d.hidden_size, generator=gen, device=device, dtype=dtype)
    mask = torch.ones(2, seq_len, dtype=torch.uint8, device=device)
    anchors, keep = objective.sample_anchors(mask, num_blocks, gen)
    return x, ctx, anchors, keep


def _run_layer(layer, draft, x, ctx, anchors, keep, backend):
    from . import attention

    b, s = ctx.shape[:2]
    eff = attention.effective_anchors(anchors, keep)
    pos_noise = (eff[:, :, None] + torch.arange(draft.block_size, device=x.device)).reshape(b, -1)
    pos_ctx = torch.arange(s, device=x.device).expand(b, -1)
    rope_q = draft.rotary(x, pos_noise)
    rope_k = draft.rotary(x, torch.cat([pos_ctx, pos_noise], dim=1))
    mask = attention.build_mask(backend, anchors, keep, s, draft.block_size)
    return layer(x, ctx, rope_q, rope_k, mask, backend)


def _compare(name: str, base: torch.nn.Module, fused: torch.nn.Module, run, shape, device) -> dict:
    """bf16 forward bit-identity and fp32 gradient deltas of two modules with equal weights."""
    gen = torch.Generator(device=device).manual_seed(11)
    x = torch.randn(shape, generator=gen, device=device)
    with torch.no_grad():
        out_b = run(base.to(torch.bfloat16), x.to(torch.bfloat16))
        out_f = run(fused.to(torch.bfloat16), x.to(torch.bfloat16))
    same = out_b == out_f
    grad_out = torch.randn(out_b.shape, generator=gen, device=device)
    grads = []
    for m in (base.float(), fused.float()):
        m.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        # Exact fp32 everywhere else: no TF32 matmuls, the math SDPA kernel.
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            run(m, xi).backward(grad_out)
        grads.append({"input": xi.grad, **{n: p.grad for n, p in m.named_parameters()}})
    deltas = {n: (grads[0][n] - grads[1][n]).abs().max().item() for n in grads[0]}
    scale = max(g.abs().max().item() for g in grads[0].values())
    worst = max(deltas, key=deltas.get)
    return {
        "module": name,
        "bf16_forward_bit_identical": bool(same.all()),
        "bf16_forward_fraction_identical": same.float().mean().item(),
        "bf16_forward_max_abs_delta": (out_b.float() - out_f.float()).abs().max().item(),
        "fp32_grad_max_abs_delta": deltas[worst],
        "fp32_grad_worst": worst,
        "fp32_grad_max_abs": scale,
        "fp32_grad_max_rel_delta": deltas[worst] / scale if scale else 0.0,
    }


def liger_exactness(
    profile_name: str, device: torch.device, seq_len: int = 1024, num_blocks: int = 64
) -> dict:
    """Stock vs Liger modules from the same state dict: RMSNorm, SwiGLU MLP, a whole layer."""
    profile = load_profile(profile_name)
    d = profile.draft
    cfg = qwen3_config(d, seq_len + d.block_size + 1)
    tokens = num_blocks * d.block_size
    with torch.device(device):
        helper = DFlashDraft(d, len(profile.target.capture_layer_ids), profile.target.hidden_size, 4096)
        torch.manual_seed(0)
        base = DFlashDecoderLayer(cfg)
        with liger_patch(True):
            fused = DFlashDecoderLayer(cfg)
    fused.load_state_dict(base.state_dict())
    gen = torch.Generator(device=device).manual_seed(1)
    _, ctx, anchors, keep = _layer_inputs(profile, device, torch.float32, seq_len, num_blocks, gen)

    def run_layer(layer, x):
        return _run_layer(layer, helper, x, ctx.to(x.dtype), anchors, keep, "sdpa")

    checks = [
        _compare(
            "RMSNorm",
            base.input_layernorm,
            fused.input_layernorm,
            lambda m, x: m(x),
            (2, tokens, d.hidden_size),
            device,
        ),
        _compare("SwiGLU MLP", base.mlp, fused.mlp, lambda m, x: m(x), (2, tokens, d.hidden_size), device),
        _compare("decoder layer", base, fused, run_layer, (2, tokens, d.hidden_size), device),
    ]
    passed = all(c["bf16_forward_bit_identical"] and c["fp32_grad_max_abs_delta"] <= 2e-6 for c in checks)
    return {
        "profile": profile_name,
        "liger_layer_modules": sorted({type(m).__name__ for m in fused.modules()}),
        "criterion": "bf16 forward bit-identical and fp32 grad max |delta| <= 2e-6 (README: Liger numerics)",
        "checks": checks,
        "passed": passed,
    }


def backend_parity(device: torch.device, seq_len: int = 512, num_blocks: int = 32) -> dict:
    profile = load_profile("tiny")
    profile.draft.block_size = 16
    losses, grads = {}, {}
    for backend in ("sdpa", "flex_attention"):
        with torch.device(device):
            draft = DFlashDraft(profile.draft, 2, profile.target.hidden_size, 4096).to(torch.bfloat16)
        draft.init_weights(0)
        gen = torch.Generator(device=device).manual_seed(3)
        feats = torch.randn(2, seq_len, 2 * profile.target.hidden_size, generator=gen, device=device)
        ids = torch.randint(0, 500, (2, seq_len), generator=gen, device=device)
        mask = torch.ones(2, seq_len, dtype=torch.uint8, device=device)
        mask[1, seq_len // 2 :] = 0  # fewer anchors: padded blocks
        anchors, keep = objective.sample_anchors(mask, num_blocks, gen)
        blocks = objective.make_blocks(ids, mask, anchors, keep, 16, profile.draft.mask_token_id, 7.0)
        head = (
            torch.randn(profile.draft.vocab_size, profile.draft.hidden_size, generator=gen, device=device)
            * 0.15
        )
        noise = torch.nn.functional.embedding(blocks.noise_ids, head).to(torch.bfloat16)
        out = draft(feats.to(torch.bfloat16), noise, anchors, keep, backend)
        loss, _, _ = objective.decayed_ce(out, head.to(torch.bfloat16), blocks, 1024)
        loss.backward()
        losses[backend] = loss.item()
        grads[backend] = torch.cat([p.grad.float().flatten() for _, p in sorted(draft.named_parameters())])
    rel = ((grads["sdpa"] - grads["flex_attention"]).norm() / grads["sdpa"].norm()).item()
    delta = abs(losses["sdpa"] - losses["flex_attention"])
    return {
        "losses": losses,
        "loss_abs_delta": delta,
        "grad_rel_l2_delta": rel,
        "passed": delta <= 1e-2 and rel <= 2e-2,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specforge.numerics")
    p.add_argument("--profile", default="qwen3.5-4b-dflash")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "error: numerics checks need a CUDA or ROCm GPU (Liger's kernels do not run on the CPU)",
            file=sys.stderr,
        )
        return 2
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    report = {"liger_exactness": liger_exactness(args.profile, dev), "backend_parity": backend_parity(dev)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if all(r["passed"] for r in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
