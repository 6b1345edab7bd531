"""Anchors respect the loss mask; labels and weights follow the DFlash rule; the fused
linear cross-entropy equals a plain one in value and gradient."""

import math

import pytest
import torch

from specforge.objective import _LinearCE, decayed_ce, make_blocks, sample_anchors


def test_anchors_respect_loss_mask_and_are_sorted_distinct():
    gen = torch.Generator().manual_seed(0)
    s = 64
    mask = torch.zeros(3, s, dtype=torch.uint8)
    mask[0, 10:50] = 1
    mask[1, 30:34] = 1  # only 3 valid anchor positions
    mask[2, ::2] = 1  # no p with mask[p] and mask[p+1]
    anchors, keep = sample_anchors(mask, 8, gen)
    assert anchors.shape == (3, 8)
    a0 = anchors[0][keep[0]]
    assert len(a0) == 8 and len(set(a0.tolist())) == 8 and torch.all(a0[1:] > a0[:-1])
    assert all(mask[0, p] and mask[0, p + 1] for p in a0.tolist())
    assert sorted(anchors[1][keep[1]].tolist()) == [30, 31, 32] and keep[1].sum() == 3
    assert keep[2].sum() == 0


def test_anchors_deterministic_per_seed():
    mask = torch.ones(2, 128, dtype=torch.uint8)
    a1, _ = sample_anchors(mask, 16, torch.Generator().manual_seed(7))
    a2, _ = sample_anchors(mask, 16, torch.Generator().manual_seed(7))
    a3, _ = sample_anchors(mask, 16, torch.Generator().manual_seed(8))
    assert torch.equal(a1, a2) and not torch.equal(a1, a3)


def test_blocks_labels_and_weights():
    ids = torch.arange(100, 120)[None]  # S = 20
    mask = torch.ones(1, 20, dtype=torch.uint8)
    mask[0, 17] = 0
    anchors, keep = torch.tensor([[2, 15]]), torch.tensor([[True, True]])
    blk = make_blocks(ids, mask, anchors, keep, block_size=4, mask_token_id=999, gamma=7.0)
    assert blk.noise_ids.tolist() == [[102, 999, 999, 999, 115, 999, 999, 999]]
    assert blk.labels[0, 1:4].tolist() == [103, 104, 105]
    w = blk.weights[0]
    assert w[0] == 0 and w[4] == 0  # k = 0 (the given token) is not scored
    assert torch.allclose(w[1:4], torch.tensor([1.0, math.exp(-1 / 7), math.exp(-2 / 7)]))
    assert w[5] > 0 and w[6] == 0 and w[7] > 0  # position 17 has loss_mask 0
    late = make_blocks(ids, mask, torch.tensor([[18]]), torch.tensor([[True]]), 4, 999, 7.0)
    assert late.weights[0].tolist()[2:] == [0.0, 0.0]  # labels past the end are not scored
    padded = make_blocks(ids, mask, torch.tensor([[0]]), torch.tensor([[False]]), 4, 999, 7.0)
    assert padded.weights.sum() == 0


def test_fused_linear_ce_matches_plain_ce():
    gen = torch.Generator().manual_seed(0)
    n, h, v = 37, 16, 50
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v, h, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, v, (n,), generator=gen)
    w = torch.rand(n, generator=gen, dtype=torch.float64)
    w = w / w.sum()
    loss, correct = _LinearCE.apply(hidden, weight, labels, w, 8)  # several chunks
    loss.backward()
    ref_h = hidden.detach().clone().requires_grad_(True)
    logits = ref_h @ weight.T
    ref = (w * torch.nn.functional.cross_entropy(logits, labels, reduction="none")).sum()
    ref.backward()
    torch.testing.assert_close(loss.double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(hidden.grad, ref_h.grad, rtol=1e-5, atol=1e-6)  # logits in fp32
    assert int(correct) == int((logits.argmax(-1) == labels).sum())


def test_decayed_ce_only_scored_positions():
    """Loss and accuracy of a tiny case worked out by hand: an identity LM head makes the
    logits the hidden rows themselves, and only 3 of the 6 positions are scored."""
    ids = torch.tensor([[0, 1, 2, 3, 0, 1]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.uint8)  # position 5 is not scored
    anchors, keep = torch.tensor([[0, 3]]), torch.tensor([[True, True]])
    blk = make_blocks(ids, mask, anchors, keep, block_size=3, mask_token_id=3, gamma=7.0)
    # blocks: positions 0,1,2 (labels -, 1, 2) and 3,4,5 (labels -, 0, unscored)
    hidden = torch.tensor(
        [
            [
                [9.0, 0, 0, 0],  # k = 0: never scored (argmax 0 would count as wrong or right)
                [0, 2.0, 0, 0],  # label 1: right
                [1.0, 0, 0, 0],  # label 2: wrong (predicts 0)
                [0, 0, 0, 9.0],  # k = 0: never scored
                [1.0, 0, 0, 0],  # label 0: right
                [0, 5.0, 0, 0],  # label 1 but loss_mask 0: would be right, must not count
            ]
        ],
        dtype=torch.float64,
    )
    head = torch.eye(4, dtype=torch.float64)
    loss, acc, n = decayed_ce(hidden, head, blk, chunk=2)  # two chunks
    e = math.e
    ce = [math.log(3 + e**2) - 2, math.log(e + 3), math.log(e + 3) - 1]
    w = [1.0, math.exp(-1 / 7), 1.0]
    assert n == 3
    assert float(acc) == pytest.approx(2 / 3)  # 2 of the 3 scored positions
    assert float(loss) == pytest.approx(sum(wi * ci for wi, ci in zip(w, ce)) / sum(w), rel=1e-6)


def test_liger_fused_linear_ce_weights_per_token_losses_and_gives_the_same_loss(monkeypatch):
    """The liger_flce arm: one call of Liger's fused linear CE with per-token losses
    (reduction="none"), weighted by the decay, reproduces the chunked objective's loss, accuracy
    and gradient. Liger's Triton kernel cannot run on the CPU, so a stand-in with liger-kernel's
    functional signature and return type (CrossEntropyOutput; per-token accuracy with
    reduction "none") takes its place."""
    functional = pytest.importorskip("liger_kernel.transformers.functional")
    calls = []

    def fake_flce(input, weight, target, bias=None, ce_weight=None, ignore_index=-100, lse_square_scale=0.0,
                  label_smoothing=0.0, reduction="mean", softcap=None, return_z_loss=False, accum_dtype=None,
                  use_token_scaling=False, return_token_accuracy=False, return_predicted_tokens=False,
                  chunk_mem_const=1):  # fmt: skip
        calls.append((reduction, input.shape[0]))
        logits = (input @ weight.T).float()
        loss = torch.nn.functional.cross_entropy(logits, target, reduction=reduction)
        acc = (logits.argmax(-1) == target).float()
        acc = acc if reduction == "none" else acc.mean()
        return functional.CrossEntropyOutput(loss=loss, token_accuracy=acc) if return_token_accuracy else loss

    monkeypatch.setattr(functional, "liger_fused_linear_cross_entropy", fake_flce)
    gen = torch.Generator().manual_seed(1)
    b, s, block, v, h = 2, 40, 4, 30, 8
    ids = torch.randint(0, v, (b, s), generator=gen)
    mask = torch.ones(b, s, dtype=torch.uint8)
    mask[0, 7] = 0
    anchors, keep = sample_anchors(mask, 6, gen)
    blk = make_blocks(ids, mask, anchors, keep, block_size=block, mask_token_id=v - 1, gamma=7.0)
    hidden = torch.randn(b, 6 * block, h, generator=gen, dtype=torch.float64, requires_grad=True)
    head = torch.randn(v, h, generator=gen, dtype=torch.float64)
    ref_hidden = hidden.detach().clone().requires_grad_(True)

    loss, acc, n = decayed_ce(hidden, head, blk, chunk=8, fused_liger=True)
    loss.backward()
    ref_loss, ref_acc, ref_n = decayed_ce(ref_hidden, head, blk, chunk=8)
    ref_loss.backward()

    assert n == ref_n and float(acc) == pytest.approx(float(ref_acc))
    torch.testing.assert_close(loss.double(), ref_loss.double(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(hidden.grad, ref_hidden.grad, rtol=1e-5, atol=1e-7)
    assert calls == [("none", n)]  # one call over every scored row: Liger's chunking sees them all
