"""The block mask equals the DFlash rule checked by brute force; flex and SDPA agree."""

import pytest
import torch

from specforge import attention
from specforge.attention import block_mask, dense_mask, flex_kernel_options, make_mask_mod


def brute_force(anchors, keep, ctx_len, block):
    b, n = anchors.shape
    m = torch.zeros(b, n * block, ctx_len + n * block, dtype=torch.bool)
    for i in range(b):
        for q in range(n * block):
            j = q // block
            for k in range(ctx_len + n * block):
                if k < ctx_len:
                    m[i, q, k] = bool(keep[i, j]) and k < int(anchors[i, j])
                else:
                    m[i, q, k] = (k - ctx_len) // block == j
    return m


def expand_blocks(num, idx, q_len, kv_len):
    tiles = torch.zeros(num.shape[0], idx.shape[-1], dtype=torch.bool)
    for t in range(num.shape[0]):
        tiles[t, idx[t, : int(num[t])].long()] = True
    big = tiles.repeat_interleave(128, 0).repeat_interleave(128, 1)
    return big[:q_len, :kv_len]


@pytest.mark.parametrize(
    "ctx_len, block, n", [(64, 4, 8), (200, 16, 20), (300, 16, 9), (40, 8, 3), (130, 12, 5)]
)
def test_masks_match_the_rule(ctx_len, block, n):
    gen = torch.Generator().manual_seed(ctx_len + n)
    b = 2
    anchors = torch.sort(torch.randint(0, ctx_len - 1, (b, n), generator=gen), dim=-1).values
    keep = torch.rand(b, n, generator=gen) > 0.25
    ref = brute_force(anchors, keep, ctx_len, block)
    assert torch.equal(dense_mask(anchors, keep, ctx_len, block)[:, 0], ref)
    mask_mod = make_mask_mod(anchors, keep, ctx_len, block)
    q = torch.arange(n * block)[:, None]
    k = torch.arange(ctx_len + n * block)[None, :]
    bm = block_mask(anchors, keep, ctx_len, block)
    for i in range(b):
        assert torch.equal(mask_mod(torch.tensor(i), torch.tensor(0), q, k), ref[i])
        if 128 % block:
            continue  # generic builder, checked by torch itself
        shape = (n * block, ctx_len + n * block)
        partial = expand_blocks(bm.kv_num_blocks[i, 0], bm.kv_indices[i, 0], *shape)
        full = expand_blocks(bm.full_kv_num_blocks[i, 0], bm.full_kv_indices[i, 0], *shape)
        assert not (ref[i] & ~(partial | full)).any(), "an allowed key lies outside every listed block"
        assert not (full & ~ref[i]).any(), "a block marked full holds a masked key"
        assert not (partial & full).any()


def test_padded_blocks_see_only_themselves():
    anchors = torch.tensor([[5, 0]])
    keep = torch.tensor([[True, False]])
    m = dense_mask(anchors, keep, 10, 2)[0, 0]
    assert m[2:4, :10].sum() == 0 and m[2:4, 12:14].all()
    assert m[0:2, :5].all() and not m[0:2, 5:10].any()


def test_flex_and_sdpa_same_output():
    gen = torch.Generator().manual_seed(0)
    b, h, kvh, d, s, block, n = 2, 4, 2, 16, 96, 8, 6
    anchors = torch.sort(torch.randint(1, s - 1, (b, n), generator=gen), dim=-1).values
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[1, -2:] = False
    q = torch.randn(b, h, n * block, d, generator=gen)
    k = torch.randn(b, kvh, s + n * block, d, generator=gen)
    v = torch.randn(b, kvh, s + n * block, d, generator=gen)
    ref = attention.sdpa_attend(q, k, v, dense_mask(anchors, keep, s, block))
    out = attention.flex_attend(q, k, v, block_mask(anchors, keep, s, block))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "version, expected",
    [
        ("2.11.0+cu130", {"BACKEND": "TRITON"}),
        ("2.13.0+cpu", {"BACKEND": "TRITON"}),
        ("2.11.0a0+git1234", {"BACKEND": "TRITON"}),
        ("2.9.1+rocm7.2.0", {"FORCE_USE_FLEX_ATTENTION": True}),
        ("2.10.0", {"FORCE_USE_FLEX_ATTENTION": True}),
    ],
)
def test_flex_kernel_options_gate_on_version(version, expected):
    assert flex_kernel_options(version) == expected


def test_flex_and_sdpa_same_loss_through_the_draft():
    from specforge import objective
    from specforge.config import load_profile
    from specforge.draft import DFlashDraft

    profile = load_profile("tiny")
    draft = DFlashDraft(profile.draft, 2, profile.target.hidden_size, 512)
    draft.init_weights(0)
    gen = torch.Generator().manual_seed(5)
    s = 96
    ids = torch.randint(0, 500, (2, s), generator=gen)
    mask = torch.ones(2, s, dtype=torch.uint8)
    mask[1, 8:] = 0  # 7 valid anchor positions: padded blocks in sample 1
    anchors, keep = objective.sample_anchors(mask, 12, gen)
    blocks = objective.make_blocks(ids, mask, anchors, keep, profile.draft.block_size, 511, 7.0)
    feats = torch.randn(2, s, 2 * profile.target.hidden_size, generator=gen)
    head = torch.randn(512, profile.draft.hidden_size, generator=gen) * 0.15
    noise = torch.nn.functional.embedding(blocks.noise_ids, head)
    losses = {}
    with torch.no_grad():
        for backend in ("sdpa", "flex_attention"):
            out = draft(feats, noise, anchors, keep, backend)
            losses[backend] = objective.decayed_ce(out, head, blocks, 64)[0].item()
    assert keep[1].sum() < 12
    assert losses["sdpa"] == pytest.approx(losses["flex_attention"], abs=1e-5)


def test_draft_with_compiled_layers_traces_flex_attention():
    """model.compile_layers compiles each decoder layer, so torch.compile traces into flex_attend:
    one graph per layer, the same values as eager. Dynamo only (backend="eager"), forward, on the
    CPU. (On the H200, torch 2.11's Dynamo could not trace the version parse that flex_attend then
    made; the torch here can, so that failure itself does not reproduce on the CPU.)"""
    from specforge import objective
    from specforge.config import load_profile
    from specforge.draft import DFlashDraft

    torch._dynamo.reset()
    profile = load_profile("tiny")
    draft = DFlashDraft(profile.draft, 2, profile.target.hidden_size, 512)
    draft.init_weights(0)
    gen = torch.Generator().manual_seed(3)
    s = 96
    mask = torch.ones(2, s, dtype=torch.uint8)
    anchors, keep = objective.sample_anchors(mask, 8, gen)
    feats = torch.randn(2, s, 2 * profile.target.hidden_size, generator=gen)
    noise = torch.randn(2, 8 * profile.draft.block_size, profile.draft.hidden_size, generator=gen)
    with torch.no_grad():
        ref = draft(feats, noise, anchors, keep, "flex_attention")
        for layer in draft.layers:
            layer.compile(backend="eager", fullgraph=True)
        out = draft(feats, noise, anchors, keep, "flex_attention")
    torch._dynamo.reset()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
